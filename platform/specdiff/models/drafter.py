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
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from specdiff.core.config import DrafterConfig
from specdiff.core.roles import Drafter, DrafterUnavailable  # noqa: F401 (the roles, importable from here too)
from specdiff.models.hf import HFModel
from specdiff.runtime.extras import require

DRAFTER_META = "specdiff_drafter.json"


class HFDiffusionDrafter:
    """``cache_prefix`` (block attention only, one prefix at a time): keep the prefix's keys/values between calls;
    when the next prefix extends the last one, only the new tokens and the γ masks are run. The marginals equal a
    full pass over the same context (tested); a bounded context then slides in jumps of half ``max_context``."""

    def __init__(self, model: torch.nn.Module, config: DrafterConfig, *, cache_prefix: bool = True):
        self.hf = HFModel(model)
        self.config = config
        self.vocab_size = config.vocab_size
        self._cache = _PrefixCache() if cache_prefix and config.causal_prefix and config.force_bidirectional else None
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
        require("hf", "a Hugging Face diffusion drafter (HFDiffusionDrafter.from_pretrained)", "transformers")
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
        if self._cache is not None and len(prefixes) == 1 and cfg.denoising_steps == 1:
            return self._cache.propose(self.hf, cfg, list(prefixes[0]), gamma)[None]
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


class _PrefixCache:
    """Keys/values of ``tokens`` = prefix[start:] from the last call (block attention: a prefix token's keys and
    values do not depend on what follows it)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.start, self.tokens, self.kv = 0, [], None

    def propose(self, hf: HFModel, cfg: DrafterConfig, prefix: list[int], gamma: int) -> torch.Tensor:
        from transformers import DynamicCache

        with self.lock:
            room = None if cfg.max_context is None else max(1, cfg.max_context - gamma)
            # Reuse the longest common prefix; the last prefix token is always run (its output drafts x_1).
            n = _common_length(self.tokens, prefix[self.start : len(prefix) - 1]) if self.kv is not None else 0
            if n == 0 or (room is not None and len(prefix) - self.start > room):
                # Start over; a bounded context restarts half full, so it slides in jumps of room // 2.
                self.start = 0 if room is None or len(prefix) <= room else len(prefix) - max(1, room // 2)
                self.kv, n = DynamicCache(), 0
            for layer in self.kv.layers:
                layer.keys, layer.values = layer.keys[..., :n, :], layer.values[..., :n, :]
            new = prefix[self.start + n :]
            q = len(new) + gamma
            allowed = torch.ones(q, n + q, dtype=torch.bool)
            allowed[:, n:] = block_attention(q, gamma)
            ids = torch.tensor([new + [cfg.mask_token_id] * gamma])
            positions = torch.arange(n, n + q)[None].to(hf.device)
            last = gamma + 1 if cfg.shifted_logits else gamma
            logits = hf.logits(ids, attention_mask=hf.additive_mask(allowed[None]), position_ids=positions,
                               cache=self.kv, last=last)
            self.tokens = self.tokens[:n] + new  # the masks' keys/values are cut at the next call
        return window_from_outputs(logits, cfg)[0].softmax(-1).cpu()


def _common_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


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
    return window_from_outputs(window_outputs(hf, batch, config, grad=grad), config)


def window_outputs(
    hf: HFModel, batch: WindowInputs, config: DrafterConfig, *, grad: bool, prefix_outputs: int = 0
) -> torch.Tensor:
    """Raw model logits at the last γ (+1 if shifted) + ``prefix_outputs`` positions. With ``causal_prefix`` the
    extra prefix rows are next-token predictions of the prefix itself (an auxiliary AR loss in training)."""
    gamma = batch.gamma
    if config.force_bidirectional:
        # Every query attends to every real (non-pad) key: [B, 1, L, L] (causal_prefix: prefix rows causally).
        allowed = batch.valid[:, None, :].expand(-1, batch.ids.shape[1], -1)
        if config.causal_prefix:
            allowed = allowed & block_attention(batch.ids.shape[1], gamma)
        mask = hf.additive_mask(allowed)
    else:
        mask = batch.valid.long().to(hf.device)
    last = (gamma + 1 if config.shifted_logits else gamma) + prefix_outputs
    forward = hf.forward if grad else hf.logits
    return forward(batch.ids, attention_mask=mask, position_ids=batch.positions.to(hf.device), last=last)


def window_from_outputs(logits: torch.Tensor, config: DrafterConfig) -> torch.Tensor:
    """Model outputs at the last γ (+1 if shifted) positions -> window logits [B, γ, vocab_size], float32."""
    if config.shifted_logits:  # position i is read from output i-1
        logits = logits[:, :-1]
    logits = logits[..., : config.vocab_size].float()
    if config.mask_token_id < config.vocab_size:
        logits = logits.masked_fill(
            torch.arange(config.vocab_size, device=logits.device) == config.mask_token_id, float("-inf")
        )
    return logits


def block_attention(length: int, gamma: int) -> torch.Tensor:
    """bool [L, L]: rows of the prefix (the first L-γ) see keys up to themselves; window rows see every key."""
    allowed = torch.ones(length, length, dtype=torch.bool).tril()
    allowed[length - gamma :] = True
    return allowed


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
    require("hf", "a small Llama-shaped drafter (build_small_drafter)", "transformers")
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
    verifier: torch.nn.Module,
    num_layers: int = 2,
    *,
    layers: Sequence[int] | None = None,
    causal_prefix: bool = False,
    seed: int = 0,
    shifted_logits: bool = True,
) -> HFDiffusionDrafter:
    """A Llama-shaped drafter that inherits a Llama-family verifier's embeddings, LM head, final norm and
    ``num_layers`` of its decoder layers (evenly spaced; ``layers`` names them explicitly), with one appended
    mask-token row. ``causal_prefix``: block attention (see ``DrafterConfig``).

    ``shifted_logits`` (default, as DiffuCoder/Dream and DiffuLLaMA, which are adapted from AR models too): window
    position i is read from the output at i-1, which is what the inherited layers and head were trained to
    predict. Unshifted, each masked position would have to predict its own token, which they never did."""
    require("hf", "a drafter built from the verifier's layers (drafter_from_verifier)", "transformers")
    from transformers import LlamaConfig, LlamaForCausalLM

    vconf = verifier.config
    vocab = int(verifier.get_output_embeddings().weight.shape[0])
    src_layers = verifier.model.layers
    if layers is None:
        layers = torch.linspace(0, len(src_layers) - 1, num_layers).round().long().tolist()
    bad = [i for i in layers if not 0 <= i < len(src_layers)]
    if not layers or bad:
        raise ValueError(f"layers must be indices into the verifier's {len(src_layers)} layers, got {list(layers)}")
    config = LlamaConfig(**{**vconf.to_dict(), "vocab_size": vocab + 1, "num_hidden_layers": len(layers)})
    config.tie_word_embeddings = bool(getattr(vconf, "tie_word_embeddings", False))
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).to(next(verifier.parameters()).dtype)
    model.to(next(verifier.parameters()).device)  # built on the host (same weights everywhere), used beside the verifier
    with torch.no_grad():
        for dst, i in zip(model.model.layers, layers):
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
        model,
        DrafterConfig(mask_token_id=vocab, vocab_size=vocab, shifted_logits=shifted_logits, causal_prefix=causal_prefix),
    )


def save_drafter(drafter: HFDiffusionDrafter, path: str | Path, **record) -> Path:
    """Weights (safetensors) + ``specdiff_drafter.json`` (drafter config and any lineage ``record``)."""
    path = Path(path)
    drafter.model.save_pretrained(path)
    meta = {"drafter_config": drafter.config.__dict__, **record}
    (path / DRAFTER_META).write_text(json.dumps(meta, indent=2, sort_keys=True))
    return path


def drafter_meta(path: str | Path) -> dict:
    """The JSON record of a drafter folder of either kind (drafter config or feature config, plus lineage)."""
    from specdiff.models.feature_drafter import FEATURE_DRAFTER_META

    for name in (DRAFTER_META, FEATURE_DRAFTER_META):
        if (Path(path) / name).is_file():
            return json.loads((Path(path) / name).read_text())
    raise ValueError(f"drafter path must hold {DRAFTER_META} or {FEATURE_DRAFTER_META}, got {str(path)!r}")


def load_drafter(path: str | Path, *, dtype: torch.dtype | None = None, verifier: torch.nn.Module | None = None,
                 verifier_digest: str | None = None):
    """A drafter folder: a standalone diffusion drafter (``save_drafter``), or a feature drafter
    (``save_feature_drafter``), which reads ``verifier``'s hidden states, embeddings and head and so needs it."""
    from specdiff.models.feature_drafter import is_feature_drafter, load_feature_drafter

    path = Path(path)
    if is_feature_drafter(path):
        if verifier is None:
            raise ValueError(f"drafter {str(path)!r} is conditioned on its verifier's hidden states: pass "
                             "verifier=<the verifier model> to load it")
        return load_feature_drafter(path, verifier, dtype=dtype, verifier_digest=verifier_digest)
    meta_file = path / DRAFTER_META
    if not meta_file.is_file():
        raise ValueError(f"drafter path must hold {DRAFTER_META} (written by save_drafter) or a feature drafter's "
                         f"specdiff_feature_drafter.json, got {str(path)!r}")
    require("hf", f"loading the Hugging Face drafter in {str(path)!r}", "transformers")
    from transformers import AutoModelForCausalLM  # here: a feature drafter loads without transformers

    meta = json.loads(meta_file.read_text())
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return HFDiffusionDrafter(model, DrafterConfig(**meta["drafter_config"]))
