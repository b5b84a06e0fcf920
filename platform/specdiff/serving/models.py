"""Model loading for the Serve deployments, from a ``ModelSource``.

The default source is the embedded default pair (SmolLM2-135M-Instruct and its default feature drafter, see
``resolve_default``). ``demo`` is a TINY RANDOM-INIT model pair (a 2-layer Llama verifier over a byte-level tokenizer
and a ``build_small_drafter``): it exercises the whole serving path offline, on CPU, in seconds, and writes
gibberish.

A feature drafter (``specdiff.models.feature_drafter``) has no embeddings or LM head of its own: its replica loads the
verifier's weights to take them, and the verifier replica taps the layers the drafter's record names.
"""

from __future__ import annotations

import importlib
from functools import lru_cache

import torch

import json
import os
from pathlib import Path

from specdiff.models.drafter import DRAFTER_META, Drafter, HFDiffusionDrafter, build_small_drafter
from specdiff.models.drafter import load_drafter as load_saved_drafter
from specdiff.models.dtypes import resolve_dtype
from specdiff.models.feature_drafter import FEATURE_DRAFTER_META, FeatureDrafterConfig, is_feature_drafter, load_feature_drafter
from specdiff.models.sources import DEFAULT_VERIFIER, resolve_model_path, state_dir
from specdiff.models.verifier import HFVerifier
from specdiff.serving.config import DEFAULT_DRAFTER, DEMO, ModelSource

DEFAULT_FAMILY = "smollm2"  # the default pair's registry family (jobs/build_drafter.py --register)
BUILD_HINT = "python jobs/build_drafter.py"

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character map (what the ByteLevel pre-tokenizer emits)."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


@lru_cache(maxsize=1)
def byte_tokenizer():
    """A Hugging Face fast tokenizer with one token per byte (ids 0..255), three specials and a ChatML template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: b for b, c in _bytes_to_unicode().items()}
    vocab.update({tok: 256 + i for i, tok in enumerate(SPECIALS)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        bos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIALS[1:],
        chat_template=CHATML,
    )


def default_drafter_dir() -> Path:
    """Where ``jobs/build_drafter.py`` puts the default drafter: ``$SPECDIFF_HOME/drafters/default``."""
    return state_dir() / "drafters" / "default"


def resolve_default(source: ModelSource) -> ModelSource:
    """``drafter='default'`` -> the built default drafter's folder if there is one, else the registry's production
    pair of family smollm2 if one was promoted, else a ValueError that says how to build it. Building it here
    instead would make ``serve run`` sit silently for ~20 minutes (a teacher pass and a Ray Train job on the same
    CPUs the app is about to use), so it is the user's explicit step."""
    if source.drafter != DEFAULT_DRAFTER:
        return source
    folder = default_drafter_dir()
    if is_feature_drafter(folder) or (folder / DRAFTER_META).is_file():
        return source.model_copy(update={"drafter": str(folder)})
    alias = f"models:/specdiff-drafter-{DEFAULT_FAMILY}@production"
    store = source.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
    if store or (state_dir() / "mlflow.db").is_file():  # never create an empty store just to look
        from specdiff.registry import Registry

        if Registry(store).production(DEFAULT_FAMILY) is not None:
            verifier = DEMO if source.verifier == DEFAULT_VERIFIER else source.verifier  # the pair's own verifier
            return source.model_copy(update={"drafter": DEMO, "pair": alias, "verifier": verifier})
    raise ValueError(
        f"models.drafter='default': the default drafter of {DEFAULT_VERIFIER} is not built ({str(folder)!r} is "
        f"missing) and the registry has no {alias}. Build it once with `{BUILD_HINT}` (about 20 minutes on 2 CPU "
        "cores; `--register` also promotes it in the registry), or serve another drafter (models.drafter=<folder>), "
        "or the tiny random-init demo pair (models.demo=true)"
    )


def resolve_pair(source: ModelSource) -> tuple[ModelSource, str | None]:
    """With ``source.pair``: the source pointed at local folders of the registered pair it names now (downloaded
    once, verifier digest checked), and the drafter version's label (``specdiff-drafter-tiny/3``). Without: as is
    (a ``default`` drafter resolved first, see ``resolve_default``)."""
    source = resolve_default(source)
    if source.pair is None:
        return source, None
    from specdiff.registry import Registry

    override = None if source.verifier == DEMO else resolve_model_path(source.verifier)
    pair = Registry(source.tracking_uri).resolve_pair(source.pair, override)
    folders = {"verifier": str(pair.verifier_dir), "drafter": str(pair.drafter_dir), "pair": None,
               "tokenizer": source.tokenizer or str(pair.verifier_dir)}
    return source.model_copy(update=folders), f"{pair.drafter.name}/{pair.drafter.version}"


def pair_label(source: ModelSource) -> str:
    """Which drafter version ``source.pair`` names now (one registry read; nothing is downloaded)."""
    from specdiff.registry import Registry

    version = Registry(source.tracking_uri).get(source.pair)
    return f"{version.name}/{version.version}"


def _dtype(source: ModelSource) -> torch.dtype:
    # Serving verifies trees of many rows per round: the "batched" rule of the platform's one policy.
    return resolve_dtype(source.dtype, phase="batched", device=_device())


def _device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def load_tokenizer(source: ModelSource):
    if source.verifier == DEMO and source.tokenizer is None:
        return byte_tokenizer()
    from transformers import AutoTokenizer

    path = resolve_model_path(source.tokenizer or source.verifier)
    return AutoTokenizer.from_pretrained(path, trust_remote_code=source.trust_remote_code)


def demo_verifier_model(source: ModelSource, vocab_size: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=source.max_context or 1024,
        initializer_range=0.2,  # peaky, so greedy text is not decided by float noise
        attn_implementation="sdpa",
    )
    with torch.random.fork_rng():
        torch.manual_seed(source.demo_seed)
        return LlamaForCausalLM(config).eval()


def verifier_model(source: ModelSource) -> torch.nn.Module:
    if source.verifier == DEMO:
        model = demo_verifier_model(source, len(byte_tokenizer()))
        if source.backend == "specdiff":  # the same weights in the lean forward (what a real Llama verifier runs)
            from specdiff.models.llama import from_state

            return from_state(model.config.to_dict(), model.state_dict())
        return model
    if source.backend != "transformers" and source.device_map is None:
        from specdiff.models.llama import load_llama

        path = resolve_model_path(source.verifier)
        model = load_llama(path, _dtype(source))  # None: not a local folder it computes exactly
        if model is not None:
            return model.to(_device()).eval()
        if source.backend == "specdiff":
            raise ValueError(f"models.backend 'specdiff' needs a local Llama-family folder with safetensors weights "
                             f"(specdiff.models.llama.unsupported_reason); models.verifier {source.verifier!r} is not one")
    elif source.backend == "specdiff":
        raise ValueError("models.backend 'specdiff' loads onto one device: leave models.device_map unset")
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        resolve_model_path(source.verifier),  # the embedded default name, a local folder or a hub id
        dtype=_dtype(source),
        device_map=source.device_map,
        trust_remote_code=source.trust_remote_code,
    )
    if source.device_map is None:
        model = model.to(_device())
    return model.eval()


def feature_drafter_config(source: ModelSource) -> FeatureDrafterConfig | None:
    """The drafter's config when ``source.drafter`` is a feature drafter folder (read from its record), else None."""
    if source.drafter in (DEMO, DEFAULT_DRAFTER) or source.drafter.startswith(("hf:", "import:")):
        return None
    if not is_feature_drafter(source.drafter):
        return None
    meta_file = Path(source.drafter) / FEATURE_DRAFTER_META
    try:
        return FeatureDrafterConfig(**json.loads(meta_file.read_text())["config"])
    except (json.JSONDecodeError, KeyError, TypeError) as err:
        raise ValueError(f"corrupt drafter file {str(meta_file)!r}: {err}") from None


def load_verifier(source: ModelSource, model: torch.nn.Module | None = None) -> HFVerifier:
    """The verifier (over ``model`` when given); with a feature drafter, tapping the layers the drafter reads."""
    config = feature_drafter_config(source)
    taps = config.target_layer_ids if config is not None else None
    return HFVerifier(model if model is not None else verifier_model(source), max_context=source.max_context,
                      tap_layers=taps)


def load_pair(source: ModelSource) -> tuple[HFVerifier, Drafter]:
    """Verifier and drafter for one replica (``colocate=true``): a feature drafter shares the verifier's model (its
    embeddings and LM head), as in an in-process decode."""
    model = verifier_model(source)
    return load_verifier(source, model), load_drafter(source, model)


def check_pair(source: ModelSource) -> None:
    """Before deploying: a feature drafter must fit the verifier (hidden size, its tapped layers, vocabulary). Reads
    configs only (no weights); a ValueError names the mismatch. The replicas check again when they load."""
    config = feature_drafter_config(source)
    if config is None:
        return
    if source.verifier == DEMO:
        hidden, layers, vocab = 64, 2, len(byte_tokenizer())  # demo_verifier_model's shape
    else:
        from transformers import AutoConfig

        vc = AutoConfig.from_pretrained(resolve_model_path(source.verifier), trust_remote_code=source.trust_remote_code)
        hidden, layers, vocab = int(vc.hidden_size), int(vc.num_hidden_layers), int(vc.vocab_size)
    where = f"models.drafter {source.drafter!r}"
    if config.target_hidden_size != hidden:
        raise ValueError(f"{where} is a feature drafter for a verifier of hidden size {config.target_hidden_size}; "
                         f"models.verifier {source.verifier!r} has hidden size {hidden}")
    if max(config.target_layer_ids) >= layers:
        raise ValueError(f"{where} reads the verifier's layers {list(config.target_layer_ids)} "
                         f"({len(config.target_layer_ids)} taps); models.verifier {source.verifier!r} has only "
                         f"{layers} layers")
    if config.vocab_size != vocab:
        raise ValueError(f"{where} was built for a vocabulary of {config.vocab_size}; models.verifier "
                         f"{source.verifier!r} has {vocab}")


def load_drafter(source: ModelSource, model: torch.nn.Module | None = None) -> Drafter:
    """The drafter; a feature drafter reads the embeddings and LM head of ``model`` (the verifier's; loaded here
    when not given)."""
    if source.drafter.startswith("import:"):
        _, module, name = source.drafter.split(":")
        return getattr(importlib.import_module(module), name)(source)
    if source.drafter == DEMO:
        if source.verifier != DEMO:
            raise ValueError("drafter='demo' only pairs with verifier='demo'; give a drafter folder for a real verifier")
        return build_small_drafter(
            len(byte_tokenizer()), hidden_size=64, num_layers=1, num_heads=4, seed=source.demo_seed + 1
        )
    if source.drafter.startswith("hf:"):
        drafter = HFDiffusionDrafter.from_pretrained(
            source.drafter[3:], dtype=_dtype(source), trust_remote_code=source.trust_remote_code, **source.drafter_options
        )
    elif is_feature_drafter(source.drafter):
        # It reads the verifier's embeddings and LM head (frozen, shared): load the verifier and keep only those
        # (the decoder layers are dropped with the model object).
        return load_feature_drafter(source.drafter, model if model is not None else verifier_model(source),
                                    dtype=_dtype(source))
    else:
        drafter = load_saved_drafter(source.drafter, dtype=_dtype(source))
    return HFDiffusionDrafter(drafter.model.to(_device()), drafter.config)  # re-wrapped: HFModel records the device


def stop_token_ids(tokenizer, chat: bool) -> list[int]:
    """Tokens that end a completion: the tokenizer's EOS, plus the end-of-turn token of a chat template."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    if chat:
        end = tokenizer.convert_tokens_to_ids("<|im_end|>")
        if isinstance(end, int) and end != tokenizer.unk_token_id:
            ids.add(end)
    return sorted(ids)
