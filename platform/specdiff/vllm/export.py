"""Write a feature drafter in the layout vLLM loads for speculative method ``dflash`` (pure file writing).

vLLM 0.32 (``vllm/model_executor/models/qwen3_dflash.py``) reads from the export folder:

- ``config.json``: a Qwen3 config with ``architectures: ["DFlashDraftModel"]``, ``num_target_layers``,
  ``block_size`` and ``dflash_config: {mask_token_id, target_layer_ids}``. Our layer ids are written as they are:
  vLLM adds 1 when it taps, and its tap ``i + 1`` is the input of decoder layer ``i + 1``, i.e. the output of
  layer ``i`` (Hugging Face's ``hidden_states[i + 1]``), which is what our ids mean.
- ``model.safetensors``: the draft weights under vLLM's key names (no ``model.`` prefix: vLLM adds it), no
  embeddings (the verifier's are shared).
- ``mask_embedding.pt``: our trained mask vector. vLLM feeds masked slots as ``mask_token_id`` and, when this file
  is present, replaces the embedding of every input equal to ``mask_token_id`` by the vector. The verifier has no
  mask token, so the id is a real token: the default is the highest id outside the draft vocabulary (a rare
  token). Should the pending token ever be that id, the drafter sees the mask vector in its place: a weaker draft
  for that round, never a wrong output (verification is unchanged).
- The draft vocabulary: vLLM's ``DFlashQwen3ForCausalLM`` takes EAGLE-3's mapping (``draft_vocab_size`` in the
  config, ``d2t`` [V_draft] with ``target_id = draft_index + d2t[draft_index]``) and then needs its own
  ``lm_head.weight`` [V_draft, H]: the verifier's head rows for the draft ids, copied from the verifier's weights.
  With ``full_vocab=True`` neither is written and vLLM shares the verifier's whole head (the drafter may then
  draft tokens it was never trained on).
- ``dflash_config.specdiff_prompt_lookup: {min_ngram, max_ngram}`` (unless ``prompt_lookup=None``): read by our vLLM
  plugin (``specdiff.vllm.plugin``), which puts a candidate copied from the context in place of the drafter's
  window where the context has one; vLLM ignores the key where the plugin is not installed.
- ``dflash_config.specdiff_min_draft_confidence: c`` (unless ``min_draft_confidence=None``): the plugin cuts the
  drafter's window before the first position where the running product of its top-1 probabilities falls below
  ``c``, so that vLLM verifies only the tokens likely to be accepted (copied chains stay whole).

No vLLM import here: the folder is written with torch, safetensors and json only.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from specdiff.models.drafter import DRAFTER_META
from specdiff.models.feature_drafter import FEATURE_DRAFTER_META, WEIGHTS_FILE, FeatureDrafterConfig

VLLM_ARCHITECTURE = "DFlashDraftModel"
MASK_EMBEDDING_FILE = "mask_embedding.pt"
EXPORT_META = "specdiff_vllm_export.json"
LOOKUP_CONFIG_KEY = "specdiff_prompt_lookup"  # read by specdiff.vllm.plugin inside vLLM
CONFIDENCE_CONFIG_KEY = "specdiff_min_draft_confidence"  # idem
# Our training-only tensors: the mask vector goes to mask_embedding.pt, the draft ids become d2t.
_NOT_VLLM_KEYS = ("mask_embedding", "draft_ids")


@dataclass(frozen=True)
class VllmExport:
    """What was written. ``num_speculative_tokens``: the longest window the drafter was built for (vLLM's
    ``num_speculative_tokens`` may be anything up to it)."""

    path: Path
    num_speculative_tokens: int
    mask_token_id: int
    draft_vocab_size: int | None  # None: vLLM uses the verifier's whole LM head
    target_layer_ids: tuple[int, ...]
    prompt_lookup: tuple[int, int] | None = None  # (min_ngram, max_ngram) of the plugin's copied candidate
    min_draft_confidence: float | None = None  # the plugin's cut of the drafter's window

    def speculative_config(self, num_speculative_tokens: int | None = None) -> dict:
        """The ``speculative_config`` argument of ``vllm.LLM`` for this export."""
        n = self.num_speculative_tokens if num_speculative_tokens is None else num_speculative_tokens
        if not isinstance(n, int) or not 1 <= n <= self.num_speculative_tokens:
            raise ValueError(f"num_speculative_tokens must be an integer in [1, {self.num_speculative_tokens}] for "
                             f"this drafter, got {n!r}")
        return {"method": "dflash", "model": str(self.path), "num_speculative_tokens": n}


DEFAULT_PROMPT_LOOKUP = (2, 4)  # n-gram sizes: the best of 1-4 / 2-4 / 3-4 teacher-forced (docs/vllm.md)
DEFAULT_MIN_DRAFT_CONFIDENCE = 0.3  # docs/vllm.md, "Confidence cut"; docs/studies.md, vllm-lookup


def checked_confidence(value: object, name: str, alternatives: str = "") -> float:
    """``value`` as a float when it is a probability in (0, 1), else a ValueError naming ``name``: the one check of
    the confidence cut's setting, for the export that writes it and the plugin that reads it."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1:
        raise ValueError(f"{name} must be a probability in (0, 1){alternatives}, got {value!r}")
    return float(value)


def export_vllm(drafter_dir: str | Path, out_dir: str | Path, *, verifier_dir: str | Path,
                full_vocab: bool = False, mask_token_id: int | None = None,
                prompt_lookup: tuple[int, int] | None = DEFAULT_PROMPT_LOOKUP,
                min_draft_confidence: float | None = DEFAULT_MIN_DRAFT_CONFIDENCE) -> VllmExport:
    """Write the feature drafter saved in ``drafter_dir`` as a vLLM ``dflash`` draft model in ``out_dir``.

    ``prompt_lookup``: (min_ngram, max_ngram) of the copied candidate our vLLM plugin splices in; None: the drafter
    alone. ``min_draft_confidence``: the plugin verifies the drafter's tokens only while the running product of
    its top-1 probabilities stays at or above it; None: every window whole.

    ``verifier_dir``: the verifier's Hugging Face folder (config.json + safetensors): its shape is checked against
    the drafter's, and the LM head rows of the draft vocabulary are copied from it. Errors name the file or the
    mismatch."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file, save_file

    drafter_dir, out_dir, verifier_dir = Path(drafter_dir), Path(out_dir), Path(verifier_dir)
    config, meta = _read_drafter_config(drafter_dir)
    weights = drafter_dir / WEIGHTS_FILE
    if not weights.is_file():
        raise ValueError(f"feature drafter weights missing: {str(weights)!r}")
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError) as e:
        raise ValueError(f"corrupt drafter file {str(weights)!r}: {e}") from None
    if "mask_embedding" not in state:
        raise ValueError(f"drafter file {str(weights)!r} has no mask_embedding")
    verifier = _read_verifier_config(verifier_dir)
    _check_pair(config, verifier, drafter_dir, verifier_dir)

    sliced = config.draft_vocab_size is not None and not full_vocab
    draft_ids = state.get("draft_ids")
    if config.draft_vocab_size is not None and draft_ids is None:
        raise ValueError(f"drafter file {str(weights)!r} has draft_vocab_size={config.draft_vocab_size} but no "
                         "draft_ids")
    if mask_token_id is None:
        mask_token_id = _default_mask_token_id(config.vocab_size, draft_ids)
    if not isinstance(mask_token_id, int) or not 0 <= mask_token_id < config.vocab_size:
        raise ValueError(f"mask_token_id must be a token id in [0, {config.vocab_size}), got {mask_token_id!r}")
    if prompt_lookup is not None:
        if (len(prompt_lookup) != 2 or not all(isinstance(n, int) for n in prompt_lookup)
                or not 1 <= prompt_lookup[0] <= prompt_lookup[1]):
            raise ValueError(f"prompt_lookup must be (min_ngram, max_ngram) with 1 <= min_ngram <= max_ngram, got "
                             f"{prompt_lookup!r}")
        prompt_lookup = (int(prompt_lookup[0]), int(prompt_lookup[1]))
    if min_draft_confidence is not None:
        min_draft_confidence = checked_confidence(min_draft_confidence, "min_draft_confidence", " or None")

    tensors = {k: v.contiguous() for k, v in state.items() if k not in _NOT_VLLM_KEYS}
    if sliced:
        ids = draft_ids.to(torch.long)  # [V_draft] target ids, most frequent first
        head = _verifier_head(verifier_dir, tied=bool(verifier.get("tie_word_embeddings", False)))  # [V, H]
        tensors["lm_head.weight"] = head[ids].to(state["fc.weight"].dtype).contiguous()
        tensors["d2t"] = (ids - torch.arange(len(ids))).contiguous()  # target = draft index + d2t

    out_dir.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(out_dir / WEIGHTS_FILE))
    torch.save({"mask_token_id": mask_token_id, "embedding": state["mask_embedding"].float().contiguous()},
               out_dir / MASK_EMBEDDING_FILE)
    hf_config = vllm_config_dict(config, verifier, mask_token_id=mask_token_id, sliced=sliced,
                                 dtype=state["fc.weight"].dtype, prompt_lookup=prompt_lookup,
                                 min_draft_confidence=min_draft_confidence)
    (out_dir / "config.json").write_text(json.dumps(hf_config, indent=2, sort_keys=True))
    export = VllmExport(path=out_dir, num_speculative_tokens=config.max_gamma, mask_token_id=mask_token_id,
                        draft_vocab_size=config.draft_vocab_size if sliced else None,
                        target_layer_ids=config.target_layer_ids, prompt_lookup=prompt_lookup,
                        min_draft_confidence=min_draft_confidence)
    record = {k: v for k, v in meta.items() if k not in ("kind", "config")}
    export_meta = {"source": str(drafter_dir), "verifier_dir": str(verifier_dir), "full_vocab": bool(full_vocab),
                   "export": {**asdict(export), "path": str(out_dir)}, "drafter_config": asdict(config),
                   "record": record}
    (out_dir / EXPORT_META).write_text(json.dumps(export_meta, indent=2, sort_keys=True, default=list))
    return export


def vllm_config_dict(config: FeatureDrafterConfig, verifier: dict, *, mask_token_id: int, sliced: bool,
                     dtype: torch.dtype = torch.float32, prompt_lookup: tuple[int, int] | None = None,
                     min_draft_confidence: float | None = None) -> dict:
    """config.json of the export: Qwen3 fields from the drafter's shape, plus DFlash's fields."""
    out = {
        "architectures": [VLLM_ARCHITECTURE],
        "model_type": "qwen3",
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "attention_bias": False,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rope_theta},
        "max_position_embeddings": int(verifier.get("max_position_embeddings") or 32768),
        "vocab_size": config.vocab_size,
        "tie_word_embeddings": False,
        "use_sliding_window": False,
        "dtype": str(dtype).removeprefix("torch."),
        "target_hidden_size": config.target_hidden_size,
        "num_target_layers": int(verifier["num_hidden_layers"]),
        "block_size": config.max_gamma + 1,  # [anchor, MASK x gamma]
        "dflash_config": {"mask_token_id": mask_token_id, "target_layer_ids": list(config.target_layer_ids)},
    }
    if sliced:
        out["draft_vocab_size"] = config.draft_vocab_size
    if prompt_lookup is not None:
        out["dflash_config"][LOOKUP_CONFIG_KEY] = {"min_ngram": prompt_lookup[0], "max_ngram": prompt_lookup[1]}
    if min_draft_confidence is not None:
        out["dflash_config"][CONFIDENCE_CONFIG_KEY] = min_draft_confidence
    return out


def _default_mask_token_id(vocab_size: int, draft_ids: torch.Tensor | None) -> int:
    """The highest token id the drafter never drafts (outside its draft vocabulary), else the last id."""
    if draft_ids is None:
        return vocab_size - 1
    used = torch.zeros(vocab_size, dtype=torch.bool)
    used[draft_ids.to(torch.long)] = True
    free = (~used).nonzero().flatten()
    return int(free[-1]) if len(free) else vocab_size - 1


def _read_drafter_config(path: Path) -> tuple[FeatureDrafterConfig, dict]:
    meta_file = path / FEATURE_DRAFTER_META
    if not path.is_dir():
        raise ValueError(f"drafter folder {str(path)!r} does not exist")
    if not meta_file.is_file():
        if (path / DRAFTER_META).is_file():
            raise ValueError(f"{str(path)!r} is not a feature drafter (no {FEATURE_DRAFTER_META}): only feature "
                             "drafters (drafter.init: feature) read the verifier's hidden states, as vLLM's dflash "
                             "method needs")
        raise ValueError(f"feature drafter folder must hold {FEATURE_DRAFTER_META}, missing in {str(path)!r}")
    try:
        meta = json.loads(meta_file.read_text())
        config = FeatureDrafterConfig(**meta["config"])
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise ValueError(f"corrupt drafter file {str(meta_file)!r}: {e}") from None
    if meta.get("kind", "feature") != "feature":
        raise ValueError(f"{str(meta_file)!r} describes a {meta.get('kind')!r} drafter, not a feature drafter")
    return config, meta


def _read_verifier_config(path: Path) -> dict:
    config_file = path / "config.json"
    if not config_file.is_file():
        raise ValueError(f"verifier folder must hold config.json (a Hugging Face model folder), missing in "
                         f"{str(path)!r}")
    try:
        config = json.loads(config_file.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"corrupt verifier config {str(config_file)!r}: {e}") from None
    config = config.get("text_config", config)
    for key in ("hidden_size", "num_hidden_layers", "vocab_size"):
        if not isinstance(config.get(key), int):
            raise ValueError(f"verifier config {str(config_file)!r} has no integer {key!r}")
    return config


def _check_pair(config: FeatureDrafterConfig, verifier: dict, drafter_dir: Path, verifier_dir: Path) -> None:
    if config.target_hidden_size != verifier["hidden_size"] or config.hidden_size != verifier["hidden_size"]:
        raise ValueError(f"drafter {str(drafter_dir)!r} has hidden size {config.hidden_size} (target "
                         f"{config.target_hidden_size}); verifier {str(verifier_dir)!r} has {verifier['hidden_size']}")
    if max(config.target_layer_ids) >= verifier["num_hidden_layers"]:
        raise ValueError(f"drafter {str(drafter_dir)!r} taps layers {list(config.target_layer_ids)}; verifier "
                         f"{str(verifier_dir)!r} has only {verifier['num_hidden_layers']} layers")
    if config.vocab_size != verifier["vocab_size"]:
        raise ValueError(f"drafter {str(drafter_dir)!r} was built for a vocabulary of {config.vocab_size}; "
                         f"verifier {str(verifier_dir)!r} has {verifier['vocab_size']}")


def _verifier_head(path: Path, *, tied: bool) -> torch.Tensor:
    """The verifier's LM head [V, H] from its safetensors (the input embedding when the two are tied)."""
    from safetensors import safe_open

    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"verifier folder {str(path)!r} holds no *.safetensors weights (the draft vocabulary's LM "
                         "head rows are copied from them)")
    names = ("lm_head.weight",) + (("model.embed_tokens.weight", "embed_tokens.weight") if tied else ())
    for name in names:
        for file in files:
            with safe_open(str(file), "pt") as f:
                if name in f.keys():
                    return f.get_tensor(name)
    raise ValueError(f"verifier folder {str(path)!r} has none of {list(names)} in its safetensors")
