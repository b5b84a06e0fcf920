"""Masked-diffusion drafters: one forward pass over ``prefix ∥ [MASK]×γ`` yields the marginals q_1..q_γ.

``HFDiffusionDrafter`` runs any Hugging Face model that maps input ids to logits. With ``force_bidirectional``
(default) it passes an all-visible 4D attention mask, which turns a causal architecture (Llama, Qwen2, ...) into a
bidirectional one; natively bidirectional models (Dream/DiffuCoder, DiffuLLaMA) can take a plain padding mask
instead and usually need ``shifted_logits=True``.

``build_small_drafter`` / ``drafter_from_verifier`` make the built-in drafter: a few-layer Llama-shaped
transformer run bidirectionally, whose mask token is appended after the verifier's vocabulary.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, Sequence, runtime_checkable

import torch

from .config import DrafterConfig
from .hf import HFModel

DRAFTER_META = "specdiff_drafter.json"


class DrafterUnavailable(RuntimeError):
    """Raised by a drafter that cannot answer (remote replica gone, timed out): the decoder then takes a
    verifier-only step for that round and counts it in ``DecodeStats.fallbacks``."""


@runtime_checkable
class Drafter(Protocol):
    """Role interface: stateless prefix -> marginals."""

    vocab_size: int

    def propose(self, prefix: Sequence[int], gamma: int) -> torch.Tensor:
        """Marginals [gamma, V] (float32 probabilities) for the gamma positions after ``prefix``."""
        ...

    def propose_batch(self, prefixes: Sequence[Sequence[int]], gamma: int) -> torch.Tensor:
        """Marginals [B, gamma, V] for a batch of prefixes of any lengths."""
        ...


class HFDiffusionDrafter:
    def __init__(self, model: torch.nn.Module, config: DrafterConfig):
        self.hf = HFModel(model)
        self.config = config
        self.vocab_size = config.vocab_size
        embed_rows = int(model.get_input_embeddings().weight.shape[0])
        if config.mask_token_id >= embed_rows:
            raise ValueError(
                f"mask_token_id must index the drafter's embedding table ({embed_rows} rows), got {config.mask_token_id}"
            )
        if self.hf.vocab_size < config.vocab_size:
            raise ValueError(
                f"vocab_size must be <= the drafter's output vocabulary ({self.hf.vocab_size}), got {config.vocab_size}"
            )

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        *,
        mask_token_id: int | None = None,
        vocab_size: int | None = None,
        dtype: torch.dtype | None = None,
        trust_remote_code: bool = False,
        **options,
    ) -> HFDiffusionDrafter:
        """Wrap a Hugging Face masked-diffusion model (a local folder or hub id). The mask token comes from
        ``mask_token_id``, else the tokenizer, else the model config. ``options``: the other DrafterConfig fields."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, trust_remote_code=trust_remote_code)
        if mask_token_id is None:
            tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code)
            mask_token_id = find_mask_token_id(model, tokenizer)
        vocab = vocab_size or int(model.get_output_embeddings().weight.shape[0])
        return cls(model, DrafterConfig(mask_token_id=mask_token_id, vocab_size=vocab, **options))

    @property
    def model(self) -> torch.nn.Module:
        return self.hf.model

    def propose(self, prefix: Sequence[int], gamma: int) -> torch.Tensor:
        return self.propose_batch([prefix], gamma)[0]

    def propose_batch(self, prefixes: Sequence[Sequence[int]], gamma: int) -> torch.Tensor:
        if gamma < 1:
            raise ValueError(f"gamma must be an integer >= 1, got {gamma!r}")
        if not prefixes or any(len(p) == 0 for p in prefixes):
            raise ValueError("prefix must contain at least one token, got an empty prefix")
        cfg = self.config
        prefixes = bound_prefixes(prefixes, gamma, cfg.max_context)
        batch = window_inputs(prefixes, gamma, cfg.mask_token_id)
        ids = batch.ids
        window = slice(ids.shape[1] - gamma, ids.shape[1])
        marginals = torch.zeros(len(prefixes), gamma, cfg.vocab_size)
        still_masked = torch.ones(len(prefixes), gamma, dtype=torch.bool)
        steps = min(cfg.denoising_steps, gamma)
        for step in range(steps):
            probs = window_logits(self.hf, batch, cfg, grad=False).softmax(-1).cpu()  # [B, gamma, V]
            if step == steps - 1:
                marginals[still_masked] = probs[still_masked]
                break
            # Unmask the most confident still-masked positions; their marginals are final, and their argmax token
            # conditions the next pass.
            n_unmask = math.ceil(int(still_masked[0].sum()) / (steps - step))
            confidence = probs.max(-1).values.masked_fill(~still_masked, -1.0)
            chosen = confidence.topk(n_unmask, dim=-1).indices  # [B, n_unmask]
            rows = torch.arange(len(prefixes))[:, None]
            marginals[rows, chosen] = probs[rows, chosen]
            still_masked[rows, chosen] = False
            window_ids = ids[:, window].clone()
            window_ids[rows, chosen] = probs[rows, chosen].argmax(-1).to(ids.device)
            ids[:, window] = window_ids
        return marginals


def bound_prefixes(prefixes: Sequence[Sequence[int]], gamma: int, max_context: int | None) -> list[list[int]]:
    """Left-truncate prefixes so that prefix + window fits ``max_context`` (None: unbounded). Bounded context keeps
    drafter cost flat as the text grows; room is kept for the window itself."""
    if max_context is None:
        return [list(p) for p in prefixes]
    keep = max(1, max_context - gamma)
    return [list(p)[-keep:] for p in prefixes]


@dataclass(frozen=True)
class WindowInputs:
    """One drafter pass over left-padded ``prefix ∥ window``; the window is the last ``gamma`` columns."""

    ids: torch.Tensor  # [B, L] long; pads hold the mask token id
    valid: torch.Tensor  # [B, L] bool; False on left padding
    positions: torch.Tensor  # [B, L] long; position ids, counted from each row's first real token
    gamma: int


def window_inputs(
    prefixes: Sequence[Sequence[int]], window: int | torch.Tensor, mask_token_id: int
) -> WindowInputs:
    """Build ``prefix ∥ [MASK]×γ`` (``window`` an int γ) or ``prefix ∥ window`` (``window`` a [B, γ] id tensor,
    e.g. a partially masked window for masked-diffusion training), left-padded to one length.

    Shared by inference (``HFDiffusionDrafter.propose``) and training (``specdiff.distill``), so both see exactly
    the same layout.
    """
    gamma = int(window) if isinstance(window, int) else int(window.shape[1])
    length = max(len(p) for p in prefixes) + gamma
    ids = torch.full((len(prefixes), length), mask_token_id, dtype=torch.long)
    valid = torch.zeros(len(prefixes), length, dtype=torch.bool)
    for b, p in enumerate(prefixes):
        start = length - gamma - len(p)
        ids[b, start : length - gamma] = torch.as_tensor(list(p), dtype=torch.long)
        valid[b, start:] = True
    if not isinstance(window, int):
        ids[:, length - gamma :] = window.to(torch.long)
    positions = (valid.long().cumsum(-1) - 1).clamp_min(0)
    return WindowInputs(ids=ids, valid=valid, positions=positions, gamma=gamma)


def window_logits(hf: HFModel, batch: WindowInputs, config: DrafterConfig, *, grad: bool) -> torch.Tensor:
    """Drafter logits [B, γ, vocab_size] (float32) for the window positions; the mask token, if inside the
    vocabulary, is set to -inf. ``grad=True`` keeps the autograd graph (training)."""
    gamma = batch.gamma
    if config.force_bidirectional:
        # Every query attends to every real (non-pad) key: [B, 1, L, L].
        allowed = batch.valid[:, None, :].expand(-1, batch.ids.shape[1], -1)
        mask = hf.additive_mask(allowed)
    else:
        mask = batch.valid.long().to(hf.device)
    last = gamma + 1 if config.shifted_logits else gamma
    forward = hf.forward if grad else hf.logits
    logits = forward(batch.ids, attention_mask=mask, position_ids=batch.positions.to(hf.device), last=last)
    logits = logits[:, :gamma] if config.shifted_logits else logits  # shifted: position i from output i-1
    logits = logits[..., : config.vocab_size].float()
    if config.mask_token_id < config.vocab_size:
        logits = logits.masked_fill(
            torch.arange(config.vocab_size, device=logits.device) == config.mask_token_id, float("-inf")
        )
    return logits


def find_mask_token_id(model: torch.nn.Module, tokenizer=None) -> int:
    """The mask token id declared by the tokenizer or the model config; a clear error when neither has one."""
    for source in (tokenizer, getattr(model, "config", None), getattr(model, "generation_config", None)):
        token_id = getattr(source, "mask_token_id", None)
        if token_id is not None:
            return int(token_id)
    raise ValueError(
        "mask_token_id is missing: neither the tokenizer nor the model config defines a mask token; "
        "pass mask_token_id=<id> (a diffusion drafter needs one)"
    )


def build_small_drafter(
    vocab_size: int,
    *,
    hidden_size: int = 256,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int | None = None,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 2048,
    rope_theta: float = 10000.0,
    tie_word_embeddings: bool = True,
    seed: int = 0,
) -> HFDiffusionDrafter:
    """A small bidirectional drafter (random init) over ``vocab_size`` tokens, mask token appended at id V."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size + 1,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads or num_heads,
        max_position_embeddings=max_position_embeddings,
        rope_theta=rope_theta,
        tie_word_embeddings=tie_word_embeddings,
        attn_implementation="sdpa",
    )
    with torch.random.fork_rng():  # seeding is local to construction; the caller's global RNG is untouched
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return HFDiffusionDrafter(model, DrafterConfig(mask_token_id=vocab_size, vocab_size=vocab_size))


def drafter_from_verifier(
    verifier: torch.nn.Module, num_layers: int = 2, *, seed: int = 0, shifted_logits: bool = True
) -> HFDiffusionDrafter:
    """A Llama-shaped drafter that inherits a Llama-family verifier's embeddings, LM head, final norm and
    ``num_layers`` of its decoder layers (evenly spaced), with one appended mask-token row.

    ``shifted_logits`` (default, as DiffuCoder/Dream and DiffuLLaMA, which are adapted from AR models too): window
    position i is read from the output at i-1, which is what the inherited layers and head were trained to
    predict. Unshifted, each masked position would have to predict its own token, which they never did."""
    from transformers import LlamaConfig, LlamaForCausalLM

    vconf = verifier.config
    vocab = int(verifier.get_output_embeddings().weight.shape[0])
    config = LlamaConfig(**{**vconf.to_dict(), "vocab_size": vocab + 1, "num_hidden_layers": num_layers})
    config.tie_word_embeddings = bool(getattr(vconf, "tie_word_embeddings", False))
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(next(verifier.parameters()).dtype)
    src_layers = verifier.model.layers
    picks = torch.linspace(0, len(src_layers) - 1, num_layers).round().long().tolist()
    with torch.no_grad():
        for dst, i in zip(model.model.layers, picks):
            dst.load_state_dict(src_layers[i].state_dict())
        model.model.norm.load_state_dict(verifier.model.norm.state_dict())
        emb = verifier.get_input_embeddings().weight
        model.model.embed_tokens.weight[:vocab] = emb
        model.model.embed_tokens.weight[vocab] = emb.mean(0)
        if not config.tie_word_embeddings:
            head = verifier.get_output_embeddings().weight
            model.lm_head.weight[:vocab] = head
            model.lm_head.weight[vocab] = 0
    return HFDiffusionDrafter(
        model, DrafterConfig(mask_token_id=vocab, vocab_size=vocab, shifted_logits=shifted_logits)
    )


def save_drafter(drafter: HFDiffusionDrafter, path: str | Path, **record) -> Path:
    """Weights (safetensors) + ``specdiff_drafter.json`` (drafter config and any lineage ``record``)."""
    path = Path(path)
    drafter.model.save_pretrained(path)
    meta = {"drafter_config": drafter.config.__dict__, **record}
    (path / DRAFTER_META).write_text(json.dumps(meta, indent=2, sort_keys=True))
    return path


def load_drafter(path: str | Path, *, dtype: torch.dtype | None = None) -> HFDiffusionDrafter:
    from transformers import AutoModelForCausalLM

    path = Path(path)
    meta_file = path / DRAFTER_META
    if not meta_file.is_file():
        raise ValueError(f"drafter path must hold {DRAFTER_META} (written by save_drafter), got {str(path)!r}")
    meta = json.loads(meta_file.read_text())
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return HFDiffusionDrafter(model, DrafterConfig(**meta["drafter_config"]))
