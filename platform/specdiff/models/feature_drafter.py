"""A diffusion drafter conditioned on the verifier's hidden states (DFlash-style), pure torch.

The drafter has no embeddings or LM head of its own: it reads the verifier's (frozen, shared). Its inputs are

- **context**: for every token whose verifier hidden states are known (all tokens but the pending one), the states
  of a few tapped verifier layers, concatenated ``[n, taps * H_t]``, fused by ``hidden_norm(fc(.))`` into ``[n, H]``.
  Each draft layer turns them into extra keys/values with its own ``k_proj``/``v_proj`` (then ``k_norm`` and RoPE
  at the tokens' absolute positions);
- **block**: ``[pending token, MASK x gamma]`` at positions ``n .. n + gamma``. The block attends non-causally to
  the whole context and to itself; the gamma mask rows, after the final norm and the verifier's LM head, are the
  marginals q_1..q_gamma: ONE pass per window.

The mask is a trained embedding vector (``mask_embedding``), not a vocabulary row: the verifier has no mask
token and its embedding table stays frozen. vLLM loads the same vector from ``mask_embedding.pt`` (see
``export``-side notes in docs/feature_drafter.md).

Weight names follow vLLM's ``qwen3_dflash.py`` layout (``fc``, ``hidden_norm``, ``norm``,
``layers.N.self_attn.{q,k,v,o}_proj``, ``layers.N.self_attn.{q,k}_norm``, ``layers.N.mlp.{gate,up,down}_proj``,
``layers.N.{input,post_attention}_layernorm``), so a trained drafter can be written for vLLM's ``dflash`` method.

A context's keys/values depend only on the context's features and positions, so they are cached across rounds
(``FeatureDrafter``): each round only the newly committed tokens' features are projected.
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from specdiff.models.llama import RMSNorm  # the verifier's norm (float32 statistics): the draft layers use the same

FEATURE_DRAFTER_META = "specdiff_feature_drafter.json"
WEIGHTS_FILE = "model.safetensors"


@dataclass(frozen=True)
class FeatureDrafterConfig:
    """Shape of a feature drafter. ``target_layer_ids``: verifier layers tapped (0-based decoder layer index i
    means the output of layer i, Hugging Face's ``hidden_states[i + 1]``)."""

    target_layer_ids: tuple[int, ...]
    target_hidden_size: int
    vocab_size: int
    hidden_size: int
    num_layers: int = 1
    num_heads: int = 9
    num_kv_heads: int = 3
    head_dim: int = 64
    intermediate_size: int = 1536
    rms_norm_eps: float = 1e-5
    rope_theta: float = 100000.0
    max_gamma: int = 16  # block size - 1: the longest window the drafter was built for
    # Draft vocabulary: the drafter scores only these many target tokens (the most frequent in its training data,
    # ids in the ``draft_ids`` buffer; EAGLE-3's d2t). Every other token gets probability 0 in the marginals, which
    # only means it is never drafted; verification is unchanged. None: the whole vocabulary.
    draft_vocab_size: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "target_layer_ids", tuple(int(i) for i in self.target_layer_ids))
        if not self.target_layer_ids or any(i < 0 for i in self.target_layer_ids):
            raise ValueError(f"target_layer_ids must be non-empty layer indices >= 0, got {self.target_layer_ids}")
        for name in ("target_hidden_size", "vocab_size", "hidden_size", "num_layers", "num_heads", "num_kv_heads",
                     "head_dim", "intermediate_size", "max_gamma"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")

    @property
    def feature_size(self) -> int:
        """Width of one context row: taps * target hidden size."""
        return len(self.target_layer_ids) * self.target_hidden_size

    @classmethod
    def for_verifier(cls, verifier: nn.Module, *, num_layers: int = 1,
                     target_layer_ids: Sequence[int] | None = None, **overrides) -> FeatureDrafterConfig:
        """Draft layers shaped like the verifier's (hidden size, heads, MLP width, RoPE base). Default taps: evenly
        spaced from layer 1 to N - 3 (z-lab's choice), three of them."""
        c = verifier.config
        n = int(c.num_hidden_layers)
        if target_layer_ids is None:
            target_layer_ids = default_tap_layers(n)
        bad = [i for i in target_layer_ids if not 0 <= int(i) < n]
        if bad:
            raise ValueError(f"target_layer_ids must index the verifier's {n} layers, got {list(target_layer_ids)}")
        heads = int(c.num_attention_heads)
        hidden = int(c.hidden_size)
        fields = dict(
            target_layer_ids=tuple(int(i) for i in target_layer_ids),
            target_hidden_size=hidden,
            vocab_size=int(verifier.get_output_embeddings().weight.shape[0]),
            hidden_size=hidden,
            num_layers=num_layers,
            num_heads=heads,
            num_kv_heads=int(getattr(c, "num_key_value_heads", None) or heads),
            head_dim=int(getattr(c, "head_dim", None) or hidden // heads),
            intermediate_size=int(c.intermediate_size),
            rms_norm_eps=float(getattr(c, "rms_norm_eps", 1e-5)),
            rope_theta=float(_rope_theta(c)),
        )
        fields.update(overrides)
        return cls(**fields)


def default_tap_layers(num_layers: int) -> list[int]:
    """Three verifier layers evenly spaced from layer 1 to N - 3 (z-lab's DFlash choice); fewer on tiny models."""
    lo, hi = min(1, num_layers - 1), max(min(1, num_layers - 1), num_layers - 3)
    return sorted(set(torch.linspace(lo, hi, 3).round().long().tolist()))


def _rope_theta(config) -> float:
    theta = getattr(config, "rope_theta", None)
    if theta is None:
        params = getattr(config, "rope_parameters", None) or {}
        theta = params.get("rope_theta", 10000.0)
    return float(theta)


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding (rotate-half layout, as Llama/Qwen). x: [B, heads, S, D]; positions: [B, S] long."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))  # [D/2]
    angles = positions.to(x.device, torch.float32)[:, None, :, None] * inv  # [B, 1, S, D/2]
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    rotated = torch.cat([-x2, x1], -1)
    return (x.float() * cos + rotated.float() * sin).to(x.dtype)


class Attention(nn.Module):
    def __init__(self, c: FeatureDrafterConfig):
        super().__init__()
        self.c = c
        self.q_proj = nn.Linear(c.hidden_size, c.num_heads * c.head_dim, bias=False)
        self.k_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=False)
        self.v_proj = nn.Linear(c.hidden_size, c.num_kv_heads * c.head_dim, bias=False)
        self.o_proj = nn.Linear(c.num_heads * c.head_dim, c.hidden_size, bias=False)
        self.q_norm = RMSNorm(c.head_dim, c.rms_norm_eps)
        self.k_norm = RMSNorm(c.head_dim, c.rms_norm_eps)

    def keys_values(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x [B, S, H] -> keys, values [B, kv_heads, S, D] (keys normed and rotated)."""
        b, s, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, s, self.c.num_kv_heads, self.c.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.c.num_kv_heads, self.c.head_dim).transpose(1, 2)
        return rope(k, positions, self.c.rope_theta), v

    def forward(self, x, positions, ctx_k, ctx_v, mask):
        """x [B, Q, H] block rows; ctx_k/ctx_v [B, kv, C, D]; mask bool [B or 1, Q, C + Q] (True = attend)."""
        b, q_len, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, q_len, self.c.num_heads, self.c.head_dim)).transpose(1, 2)
        q = rope(q, positions, self.c.rope_theta)
        k, v = self.keys_values(x, positions)
        k, v = torch.cat([ctx_k, k], 2), torch.cat([ctx_v, v], 2)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None], enable_gqa=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, q_len, -1))


class MLP(nn.Module):
    def __init__(self, c: FeatureDrafterConfig):
        super().__init__()
        self.gate_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.up_proj = nn.Linear(c.hidden_size, c.intermediate_size, bias=False)
        self.down_proj = nn.Linear(c.intermediate_size, c.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    """A Qwen3-shaped decoder layer whose attention also reads the context's keys/values."""

    def __init__(self, c: FeatureDrafterConfig):
        super().__init__()
        self.self_attn = Attention(c)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x, positions, ctx_k, ctx_v, mask):
        x = x + self.self_attn(self.input_layernorm(x), positions, ctx_k, ctx_v, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class FeatureDraftModel(nn.Module):
    """The trainable weights. ``embed`` and ``head`` (the verifier's, frozen) are passed in, never owned."""

    def __init__(self, c: FeatureDrafterConfig):
        super().__init__()
        self.config = c
        self.fc = nn.Linear(c.feature_size, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.layers = nn.ModuleList(DraftLayer(c) for _ in range(c.num_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.mask_embedding = nn.Parameter(torch.zeros(c.hidden_size))
        if c.draft_vocab_size is not None:
            self.register_buffer("draft_ids", torch.arange(c.draft_vocab_size))

    def context(self, features: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """features [B, C, taps*H_t], positions [B, C] -> per layer (keys, values) [B, kv, C, D]."""
        w = self.fc.weight  # features arrive from the host (a session keeps them there); projected where the weights are
        ctx = self.hidden_norm(self.fc(features.to(w.device, w.dtype)))
        return [layer.self_attn.keys_values(ctx, positions) for layer in self.layers]

    def forward(self, features, ctx_positions, embeds, positions, mask) -> torch.Tensor:
        """Context and blocks in one call (the training path; DDP wraps ``forward``): -> hidden [B, Q, H]."""
        return self.block(embeds, positions, self.context(features, ctx_positions), mask)

    def block(self, embeds: torch.Tensor, positions: torch.Tensor, ctx_kv, mask: torch.Tensor) -> torch.Tensor:
        """embeds [B, Q, H] (mask rows already replaced), positions [B, Q] -> final-normed hidden [B, Q, H]."""
        x = embeds
        for layer, (k, v) in zip(self.layers, ctx_kv):
            x = layer(x, positions, k, v, mask)
        return self.norm(x)


def block_embeds(embed: nn.Module, mask_embedding: torch.Tensor, anchors: torch.Tensor, gamma: int) -> torch.Tensor:
    """[B] anchor ids -> [B, 1 + gamma, H]: the anchor's embedding, then gamma copies of the mask embedding."""
    first = embed(anchors)[:, None]  # [B, 1, H]
    masks = mask_embedding.to(first.dtype).expand(first.shape[0], gamma, -1)
    return torch.cat([first, masks], 1)


class FeatureDrafter:
    """Inference wrapper: ``propose(prefix, gamma, features)`` -> marginals [gamma, V].

    ``features`` [n, taps*H_t] are the verifier's tapped states of ``prefix[:n]`` (n = len(prefix) - 1 in the
    engine: every token but the pending one). The context's keys/values are cached; a call whose prefix extends
    the cached tokens projects only the new rows, one that diverges starts over (exact either way)."""

    needs_features = True

    def __init__(self, model: FeatureDraftModel, embed: nn.Module, head: nn.Module, *, record: dict | None = None):
        c = model.config
        if embed.weight.shape[1] != c.hidden_size or head.weight.shape[1] != c.hidden_size:
            raise ValueError(f"verifier hidden size {embed.weight.shape[1]} must equal the drafter's hidden_size "
                             f"{c.hidden_size}")
        if head.weight.shape[0] < c.vocab_size:
            raise ValueError(f"verifier vocabulary ({head.weight.shape[0]}) is smaller than the drafter's "
                             f"vocab_size ({c.vocab_size})")
        self.model = model.eval()
        self.embed, self.head = embed, head
        self.config = c
        self.head_weight = head.weight  # [V or V_draft, H]: the rows of the verifier's head the drafter scores
        if c.draft_vocab_size is not None:
            self.head_weight = head.weight.detach()[model.draft_ids]
        self.vocab_size = c.vocab_size
        self.tap_layers = c.target_layer_ids
        self.record = record or {}
        self.small_rows: tuple[int, ...] = ()  # row counts that take the transposed product (``tune_kernels``)
        self.packed_rows: tuple[int, ...] = ()  # and those that take oneDNN's product on packed weights
        self._lock = threading.Lock()
        self._tokens: list[int] = []
        self._kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    @property
    def dtype(self) -> torch.dtype:
        return self.model.fc.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.model.fc.weight.device

    def reset(self) -> None:
        with self._lock:
            self._tokens, self._kv = [], None

    def propose(self, prefix: Sequence[int], gamma: int, features: torch.Tensor | None = None) -> torch.Tensor:
        return self.propose_batch([prefix], gamma, [features])[0]

    def propose_batch(self, prefixes: Sequence[Sequence[int]], gamma: int,
                      features: Sequence[torch.Tensor | None] | None = None) -> torch.Tensor:
        if not isinstance(gamma, int) or gamma < 1:
            raise ValueError(f"gamma must be an integer >= 1, got {gamma!r}")
        if features is None or any(f is None for f in features):
            raise ValueError("a feature drafter needs the verifier's tapped hidden states (features); build the "
                             f"verifier with tap_layers={list(self.tap_layers)}")
        if not prefixes or any(len(p) == 0 for p in prefixes):
            raise ValueError("prefix must contain at least one token, got an empty prefix")
        if len(prefixes) == 1:
            return self._propose_cached(list(prefixes[0]), gamma, features[0])[None]
        return torch.stack([self._marginals(list(p), gamma, f) for p, f in zip(prefixes, features)])

    def open(self) -> FeatureDraftSession:
        """A view with its own context cache, for one decode: concurrent decodes on one replica then extend their
        own caches instead of evicting each other's (the engine opens one per decode)."""
        return FeatureDraftSession(self)

    @torch.no_grad()
    def _propose_cached(self, prefix: list[int], gamma: int, feats: torch.Tensor, state=None) -> torch.Tensor:
        state = state if state is not None else self
        with state._lock:
            n = self._check_features(prefix, feats)
            keep = _kept(state, prefix, n)
            new = feats[keep:n]
            kv = self.model.context(new[None], torch.arange(keep, n)[None]) if len(new) else None
            _store_context(state, prefix, keep, n, kv)
            return self.window(prefix[-1], len(prefix) - 1, gamma, state._kv)

    @torch.no_grad()
    def propose_many(self, calls: Sequence[tuple[FeatureDraftSession, Sequence[int], int, torch.Tensor]]
                     ) -> list[torch.Tensor]:
        """Several decodes' windows in one pass: ``calls`` of (session, prefix, gamma, features), each session a
        ``FeatureDraftSession`` whose context cache is extended as its own ``propose`` would -> each call's marginals
        [gamma, V]. The new context rows of all calls go through one projection, the windows through one block
        forward (contexts and windows padded to the longest and masked) and one head product, so a batch of 16
        costs about what one call does (the drafter's layers are small: per-call overhead, not arithmetic, is most
        of a call). Each call's marginals equal its own ``propose`` up to the rounding of products over more rows;
        the verifier decides what is emitted, so outputs are unaffected either way."""
        if len(calls) == 1:
            state, prefix, gamma, feats = calls[0]
            return [self._propose_cached(list(prefix), gamma, feats, state)]
        m, c, device = self.model, self.config, self.device
        calls = [(state, list(prefix), gamma, feats) for state, prefix, gamma, feats in calls]
        news = []
        for state, prefix, _, feats in calls:
            n = self._check_features(prefix, feats)
            keep = _kept(state, prefix, n)
            news.append((keep, n, feats[keep:n]))
        fresh = [(keep, n, f) for keep, n, f in news if len(f)]
        if fresh:  # every call's new context rows in one projection
            positions = torch.cat([torch.arange(keep, n) for keep, n, _ in fresh])[None]
            projected = m.context(torch.cat([f for *_, f in fresh])[None], positions)
        offset = 0
        for (state, prefix, _, _), (keep, n, f) in zip(calls, news):
            kv = None
            if len(f):
                kv = [(k[:, :, offset:offset + len(f)], v[:, :, offset:offset + len(f)]) for k, v in projected]
                offset += len(f)
            _store_context(state, prefix, keep, n, kv)
        # The windows: [anchor, MASK x gamma] at positions start .. start + gamma, as ``window``, padded to the
        # longest window; each row attends to its own context and its own window only.
        gammas = [gamma for _, _, gamma, _ in calls]
        q = max(gammas) + 1
        lengths = [0 if state._kv is None else int(state._kv[0][0].shape[2]) for state, *_ in calls]
        width = max(lengths)
        anchors = torch.tensor([prefix[-1] for _, prefix, _, _ in calls], device=self.embed.weight.device)
        embeds = block_embeds(self.embed, m.mask_embedding, anchors, q - 1).to(device, self.dtype)
        starts = torch.tensor([len(prefix) - 1 for _, prefix, _, _ in calls], device=device)
        positions = starts[:, None] + torch.arange(q, device=device)
        mask = torch.zeros(len(calls), q, width + q, dtype=torch.bool, device=device)
        ctx = []
        for layer in range(c.num_layers):
            keys = torch.zeros(len(calls), c.num_kv_heads, width, c.head_dim, dtype=self.dtype, device=device)
            values = torch.zeros_like(keys)
            for b, (state, *_) in enumerate(calls):
                if lengths[b]:
                    keys[b, :, : lengths[b]] = state._kv[layer][0][0]
                    values[b, :, : lengths[b]] = state._kv[layer][1][0]
            ctx.append((keys, values))
        for b, (length, gamma) in enumerate(zip(lengths, gammas)):
            mask[b, :, :length] = True
            mask[b, :, width: width + gamma + 1] = True
        hidden = m.block(embeds, positions, ctx, mask)  # [B, Q, H]
        rows = torch.cat([hidden[b, 1: gamma + 1] for b, gamma in enumerate(gammas)])
        probs = self.to_vocab(self.logits(rows).float().softmax(-1)).cpu()
        return list(probs.split(gammas))

    @torch.no_grad()
    def _marginals(self, prefix: list[int], gamma: int, feats: torch.Tensor) -> torch.Tensor:
        """One window without the cache (batched calls: evaluation)."""
        n = self._check_features(prefix, feats)
        kv = self.model.context(feats[:n][None], torch.arange(n)[None]) if n else None
        return self.window(prefix[-1], len(prefix) - 1, gamma, kv)

    @torch.no_grad()
    def extend_context(self, kv: list[tuple[torch.Tensor, torch.Tensor]] | None, features: torch.Tensor,
                       start: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """A context cache ``kv`` (per layer keys, values [1, kv, start, D]; None: empty) extended by the rows
        ``features`` [k, taps*H_t] of tokens start .. start+k-1. The caller owns the cache (one per session: the
        Serve drafter replica keeps one per request)."""
        if features.dim() != 2 or features.shape[1] != self.config.feature_size:
            raise ValueError(f"features must have shape [n, {self.config.feature_size}] ({len(self.tap_layers)} taps "
                             f"x {self.config.target_hidden_size}), got {tuple(features.shape)}")
        new = self.model.context(features[None], torch.arange(start, start + len(features))[None])
        if kv is None:
            return new
        return [(torch.cat([k0, k1], 2), torch.cat([v0, v1], 2)) for (k0, v0), (k1, v1) in zip(kv, new)]

    def _check_features(self, prefix: list[int], feats: torch.Tensor) -> int:
        if feats.dim() != 2 or feats.shape[1] != self.config.feature_size:
            raise ValueError(f"features must have shape [n, {self.config.feature_size}] ({len(self.tap_layers)} taps "
                             f"x {self.config.target_hidden_size}), got {tuple(feats.shape)}")
        n = int(feats.shape[0])
        if n > len(prefix):
            raise ValueError(f"features cover {n} tokens, more than the prefix's {len(prefix)}")
        return n

    @torch.no_grad()
    def window(self, anchor: int, start: int, gamma: int, kv) -> torch.Tensor:
        """Marginals [gamma, V] of one pass over [anchor, MASK x gamma] at positions start .. start + gamma, reading
        the context cache ``kv`` (rows 0..n-1, n from the cache; None: no context). The engine's anchor is the
        pending token, so n = start; tokens between n and the anchor, if any, are not seen."""
        m = self.model
        n = 0 if kv is None else int(kv[0][0].shape[2])
        device = self.device
        anchor = torch.tensor([int(anchor)], device=self.embed.weight.device)
        embeds = block_embeds(self.embed, m.mask_embedding, anchor, gamma).to(device, self.dtype)
        positions = torch.arange(start, start + gamma + 1, device=device)[None]
        q = gamma + 1
        if kv is None:
            c = self.config
            empty = torch.zeros(1, c.num_kv_heads, 0, c.head_dim, dtype=self.dtype, device=device)
            kv = [(empty, empty)] * c.num_layers
            n = 0
        mask = torch.ones(1, q, n + q, dtype=torch.bool, device=device)
        hidden = m.block(embeds, positions, kv, mask)  # [1, Q, H]
        probs = self.logits(hidden[:, 1:])[0].float().softmax(-1)  # [gamma, V or V_draft]
        # To the host once per round: candidates are sampled there from per-round CPU generators (core.rounds).
        return self.to_vocab(probs).cpu()

    def tune_kernels(self, cache_dir: Path | None = None) -> tuple[int, ...]:
        """Decoding on a CPU: time the two forms of the few-row products on the draft layers' weights (once per
        machine, ``specdiff.models.kernels``) and use the faster one there and in the head. Training is unaffected
        (products with gradients always take ``F.linear``)."""
        from specdiff.models.kernels import packed_rows, tune_small_rows

        self.small_rows = tune_small_rows(self.model, cache_dir)
        self.packed_rows = packed_rows(self.model)
        return self.small_rows

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Final hidden states [..., H] -> logits [..., V or V_draft] through the verifier's (sliced) head.

        As one 2-D product: a sliced N-D input (the mask rows of a block) sent torch 2.13's CPU bf16 matmul down a
        path 9x slower (measured: 4.7 vs 0.5 ms per round for 8 rows x 8192, and 79 vs 5 ms for the full head)."""
        from specdiff.models.kernels import planned_linear

        w = self.head_weight
        flat = hidden.reshape(-1, hidden.shape[-1]).to(w.dtype)
        out = planned_linear(flat, w, None, self.small_rows)[:, : self.vocab_size]
        return out.reshape(*hidden.shape[:-1], out.shape[-1])

    def to_vocab(self, probs: torch.Tensor) -> torch.Tensor:
        """[..., V_draft] draft-vocabulary probabilities -> [..., V] (0 outside the draft vocabulary)."""
        if self.config.draft_vocab_size is None:
            return probs
        full = probs.new_zeros(*probs.shape[:-1], self.vocab_size)
        return full.index_copy_(-1, self.model.draft_ids, probs)

    def draft_labels(self, labels: torch.Tensor) -> torch.Tensor:
        """Target token ids -> draft-vocabulary indices (-1 where the token is outside the draft vocabulary)."""
        if self.config.draft_vocab_size is None:
            return labels
        ids = self.model.draft_ids
        table = torch.full((self.vocab_size,), -1, dtype=torch.long, device=ids.device)
        table[ids] = torch.arange(self.config.draft_vocab_size, device=ids.device)
        return table[labels.to(ids.device)].to(labels.device)

    def set_draft_vocabulary(self, token_ids: torch.Tensor) -> None:
        """Fix the draft vocabulary (before training): ``token_ids`` [V_draft] target ids, most frequent first."""
        if self.config.draft_vocab_size != len(token_ids):
            raise ValueError(f"draft vocabulary must have draft_vocab_size={self.config.draft_vocab_size} ids, got "
                             f"{len(token_ids)}")
        self.model.draft_ids.copy_(token_ids.to(torch.long))
        self.head_weight = self.head.weight.detach()[self.model.draft_ids]


class FeatureDraftSession:
    """``FeatureDrafter.open()``: the drafter's weights with a context cache of its own (one decode's)."""

    needs_features = True

    def __init__(self, drafter: FeatureDrafter):
        self.drafter = drafter
        self.vocab_size, self.tap_layers = drafter.vocab_size, drafter.tap_layers
        self._lock = threading.Lock()
        self._tokens: list[int] = []
        self._kv: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    def propose(self, prefix: Sequence[int], gamma: int, features: torch.Tensor | None = None) -> torch.Tensor:
        self._check_call(prefix, gamma, features)
        return self.drafter._propose_cached(list(prefix), gamma, features, self)

    def _check_call(self, prefix: Sequence[int], gamma: int, features: torch.Tensor | None) -> None:
        if not isinstance(gamma, int) or gamma < 1:
            raise ValueError(f"gamma must be an integer >= 1, got {gamma!r}")
        if features is None:
            raise ValueError("a feature drafter needs the verifier's tapped hidden states (features); build the "
                             f"verifier with tap_layers={list(self.tap_layers)}")
        if len(prefix) == 0:
            raise ValueError("prefix must contain at least one token, got an empty prefix")


def _kept(state, prefix: list[int], n: int) -> int:
    """Rows of ``state``'s context cache (a drafter or one of its sessions) still valid for ``prefix[:n]``."""
    return _common_length(state._tokens, prefix[:n]) if state._kv is not None else 0


def _store_context(state, prefix: list[int], keep: int, n: int, kv) -> None:
    """``state``'s context cache for ``prefix[:n]``: its first ``keep`` rows, then ``kv`` (the projected rows
    keep .. n-1, per layer keys/values [1, kv, n - keep, D]; None: no new rows)."""
    old = state._kv if keep else None
    if kv is None:
        state._kv = None if old is None else [(k[:, :, :keep], v[:, :, :keep]) for k, v in old]
    else:
        state._kv = kv if old is None else [(torch.cat([k0[:, :, :keep], k1], 2), torch.cat([v0[:, :, :keep], v1], 2))
                                            for (k0, v0), (k1, v1) in zip(old, kv)]
    state._tokens = prefix[:n]


def _common_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def verifier_embeddings(verifier: nn.Module) -> tuple[nn.Module, nn.Module]:
    """The verifier's (input embedding, LM head), frozen."""
    embed, head = verifier.get_input_embeddings(), verifier.get_output_embeddings()
    return embed, head


def build_feature_drafter(verifier: nn.Module, *, num_layers: int = 1, target_layer_ids=None, seed: int = 0,
                          init_from_verifier: bool = True, **overrides) -> FeatureDrafter:
    """A fresh feature drafter for ``verifier``. ``init_from_verifier``: the draft layers start from the verifier's
    last decoder layers (attention and MLP weights where shapes match; q/k norms start at 1), ``norm`` from its
    final norm, and ``fc`` from an average of the taps — a far better start than random on a CPU budget."""
    c = FeatureDrafterConfig.for_verifier(verifier, num_layers=num_layers, target_layer_ids=target_layer_ids,
                                          **overrides)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = FeatureDraftModel(c)
        for mod in model.modules():
            if isinstance(mod, nn.Linear):
                nn.init.normal_(mod.weight, std=0.02)
    if init_from_verifier:
        _init_from_verifier(model, verifier)
    dtype = next(verifier.parameters()).dtype
    embed, head = verifier_embeddings(verifier)
    with torch.no_grad():
        model.mask_embedding.copy_(embed.weight.float().mean(0))
    return FeatureDrafter(model.to(embed.weight.device, dtype), embed, head)  # beside the verifier's embeddings


@torch.no_grad()
def _init_from_verifier(model: FeatureDraftModel, verifier: nn.Module) -> None:
    c = model.config
    src_layers = verifier.model.layers
    start = len(src_layers) - c.num_layers
    for dst, src in zip(model.layers, src_layers[start:]):
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            s, d = getattr(src.self_attn, name).weight, getattr(dst.self_attn, name).weight
            if s.shape == d.shape:
                d.copy_(s)
        for name in ("gate_proj", "up_proj", "down_proj"):
            s, d = getattr(src.mlp, name).weight, getattr(dst.mlp, name).weight
            if s.shape == d.shape:
                d.copy_(s)
        dst.input_layernorm.weight.copy_(src.input_layernorm.weight)
        dst.post_attention_layernorm.weight.copy_(src.post_attention_layernorm.weight)
    model.norm.weight.copy_(verifier.model.norm.weight)
    taps, h = len(c.target_layer_ids), c.target_hidden_size
    if c.hidden_size == h:  # fc starts as the mean of the tapped states
        model.fc.weight.copy_(torch.cat([torch.eye(h) / taps] * taps, 1))


def save_feature_drafter(drafter: FeatureDrafter, path: str | Path, **record) -> Path:
    """``model.safetensors`` (vLLM's key names, no embeddings or head) + ``specdiff_feature_drafter.json``."""
    from safetensors.torch import save_file

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in drafter.model.state_dict().items()}
    save_file(state, str(path / WEIGHTS_FILE))
    meta = {"kind": "feature", "config": asdict(drafter.config), **{**drafter.record, **record}}
    (path / FEATURE_DRAFTER_META).write_text(json.dumps(meta, indent=2, sort_keys=True, default=list))
    return path


def is_feature_drafter(path: str | Path) -> bool:
    return (Path(path) / FEATURE_DRAFTER_META).is_file()


def load_feature_drafter(path: str | Path, verifier: nn.Module, *, dtype: torch.dtype | None = None,
                         verifier_digest: str | None = None, tune_kernels: bool = True) -> FeatureDrafter:
    """Load a feature drafter for ``verifier``. Errors name the file or the mismatch (hidden size, taps, vocab,
    verifier digest when ``verifier_digest`` is given). ``tune_kernels``: on a CPU, pick the faster few-row product
    form for decoding (``FeatureDrafter.tune_kernels``, plans kept in ``$SPECDIFF_HOME/kernels``)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = Path(path)
    meta_file, weights = path / FEATURE_DRAFTER_META, path / WEIGHTS_FILE
    if not meta_file.is_file():
        raise ValueError(f"feature drafter folder must hold {FEATURE_DRAFTER_META}, missing in {str(path)!r}")
    try:
        meta = json.loads(meta_file.read_text())
        config = FeatureDrafterConfig(**meta["config"])
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"corrupt drafter file {str(meta_file)!r}: {e}") from None
    vc = verifier.config
    hidden, layers = int(vc.hidden_size), int(vc.num_hidden_layers)
    vocab = int(verifier.get_output_embeddings().weight.shape[0])
    if config.target_hidden_size != hidden:
        raise ValueError(f"drafter {str(path)!r} was built for a verifier of hidden size {config.target_hidden_size}, "
                         f"this verifier has {hidden}")
    if max(config.target_layer_ids) >= layers:
        raise ValueError(f"drafter {str(path)!r} taps layers {list(config.target_layer_ids)}, this verifier has only "
                         f"{layers} layers")
    if config.vocab_size != vocab:
        raise ValueError(f"drafter {str(path)!r} was built for a vocabulary of {config.vocab_size}, this verifier "
                         f"has {vocab}")
    recorded = (meta.get("verifier") or {}).get("digest")
    if verifier_digest is not None and recorded is not None and recorded != verifier_digest:
        raise ValueError(f"drafter {str(path)!r} was aligned to verifier {recorded}, this verifier is "
                         f"{verifier_digest}; re-align it (jobs/realign.py) or pass the matching verifier")
    if not weights.is_file():
        raise ValueError(f"feature drafter weights missing: {str(weights)!r}")
    try:
        state = load_file(str(weights))
    except (SafetensorError, OSError) as e:
        raise ValueError(f"corrupt drafter file {str(weights)!r}: {e}") from None
    model = FeatureDraftModel(config)
    try:
        model.load_state_dict(state)
    except RuntimeError as e:
        raise ValueError(f"drafter file {str(weights)!r} does not match its config: {e}") from None
    dtype = dtype or next(verifier.parameters()).dtype
    embed, head = verifier_embeddings(verifier)
    record = {k: v for k, v in meta.items() if k not in ("kind", "config")}
    drafter = FeatureDrafter(model.to(embed.weight.device, dtype), embed, head, record=record)
    if tune_kernels:
        from specdiff.models.sources import state_dir

        drafter.tune_kernels(state_dir() / "kernels")
    return drafter


@dataclass
class AnchorBatch:
    """Training blocks cut from full sequences: ``A`` anchors per sequence, each block [anchor, MASK x gamma]
    sees the context strictly before its anchor and its own block."""

    anchors: torch.Tensor  # [B, A] long: position of each block's anchor token
    labels: torch.Tensor  # [B, A, gamma] long: tokens at anchor+1 .. anchor+gamma
    valid: torch.Tensor  # [B, A] bool
    extra: dict = field(default_factory=dict)


def sample_anchors(lengths: Sequence[int], starts: Sequence[int], tokens: torch.Tensor, gamma: int,
                   num_anchors: int, generator: torch.Generator | None, *, greedy: torch.Tensor | None = None,
                   prompt_anchors: int = 0) -> AnchorBatch:
    """Anchors drawn without replacement from [start - 1, length - 1 - gamma] of each row (the completion: its
    labels are the teacher's tokens; start is the first completion position). tokens: [B, L] (right-padded).

    ``greedy`` [B, L] (row t: the verifier's argmax after token t) adds ``prompt_anchors`` more anchors per row,
    drawn from [0, start - 2] (inside the prompt), labelled with the verifier's greedy continuation as far as it
    is known: the prompt's own tokens while they equal the verifier's argmax, then the argmax at the first
    position where they differ, then -1 (unknown: no loss). With a greedy teacher the completion's labels are the
    same rule's, so both kinds of anchor teach one thing: what greedy decoding emits next."""
    b = len(lengths)
    width = num_anchors + (prompt_anchors if greedy is not None else 0)
    anchors = torch.zeros(b, width, dtype=torch.long)
    valid = torch.zeros(b, width, dtype=torch.bool)
    for i, (length, start) in enumerate(zip(lengths, starts)):
        lo, hi = max(0, start - 1), length - 1 - gamma
        if hi >= lo:
            choice = lo + torch.randperm(hi - lo + 1, generator=generator)[:num_anchors]
            anchors[i, : len(choice)] = choice.sort().values
            valid[i, : len(choice)] = True
        if width > num_anchors and start >= 2:
            choice = torch.randperm(start - 1, generator=generator)[:prompt_anchors]
            anchors[i, num_anchors : num_anchors + len(choice)] = choice.sort().values
            valid[i, num_anchors : num_anchors + len(choice)] = True
    offsets = torch.arange(1, gamma + 1)
    last = tokens.shape[1] - 1
    idx = (anchors[..., None] + offsets).clamp_max(last)  # [B, A, gamma]: the positions the block predicts
    if greedy is None:
        labels = tokens.gather(1, idx.view(b, -1)).view(b, width, gamma)
        return AnchorBatch(anchors=anchors, labels=labels, valid=valid)
    labels = greedy_labels(tokens, greedy, anchors, gamma)
    return AnchorBatch(anchors=anchors, labels=labels, valid=valid)


def greedy_labels(tokens: torch.Tensor, greedy: torch.Tensor, anchors: torch.Tensor, gamma: int) -> torch.Tensor:
    """Labels [B, A, gamma] of blocks anchored at ``anchors`` [B, A]: greedy decoding's next gamma tokens after
    each anchor, as far as ``tokens`` [B, L] follow ``greedy`` [B, L] (row t: argmax after token t); -1 after the
    first token that differs from the argmax (that one is labelled with the argmax)."""
    b, a = anchors.shape
    last = tokens.shape[1] - 1
    pred = (anchors[..., None] + torch.arange(gamma)).clamp_max(last)  # [B, A, gamma]: position t predicts t + 1
    labels = greedy.gather(1, pred.view(b, -1)).view(b, a, gamma)
    nxt = (pred + 1).clamp_max(last)
    follows = tokens.gather(1, nxt.view(b, -1)).view(b, a, gamma) == labels  # the text went on greedily
    known = torch.cat([torch.ones(b, a, 1, dtype=torch.bool), follows[..., :-1].cumprod(-1).bool()], -1)
    known &= (anchors[..., None] + torch.arange(1, gamma + 1)) <= last
    return torch.where(known, labels, torch.full_like(labels, -1))


def anchor_logits(drafter: FeatureDrafter, model: nn.Module, tokens: torch.Tensor, features: torch.Tensor,
                  batch: AnchorBatch, gamma: int) -> torch.Tensor:
    """Many windows per sequence in ONE forward: logits [B, A, gamma, V] (float32) of every block's mask rows.

    tokens [B, L]; features [B, L, taps*H_t] (row t: verifier states at token t). ``model`` is the module the
    forward goes through (``drafter.model`` or its DDP wrapper); gradients flow into it."""
    return drafter.logits(anchor_hidden(drafter, model, tokens, features, batch, gamma)).float()


def anchor_hidden(drafter: FeatureDrafter, model: nn.Module, tokens: torch.Tensor, features: torch.Tensor,
                  batch: AnchorBatch, gamma: int) -> torch.Tensor:
    """``anchor_logits`` before the head: final hidden states [B, A, gamma, H] of every block's mask rows. Training
    selects the valid windows here, before the head: indexing the [.., V_draft] logits instead made a step of the
    default recipe 12-20% slower in a standalone A/B (the backward of that index writes a zero-filled tensor of the
    full logits' size; 2-core Xeon with AMX, bf16 autocast, glibc tuned as the train workers are)."""
    b, length = tokens.shape
    a = batch.anchors.shape[1]
    q = gamma + 1
    positions = torch.arange(length)[None].expand(b, -1)
    anchor_ids = tokens.gather(1, batch.anchors)  # [B, A]
    core = drafter.model  # the parameters (``model`` may be a DDP wrapper around it)
    device = core.fc.weight.device  # index tensors are built on the host; they meet the weights here
    embeds = block_embeds(drafter.embed, core.mask_embedding, anchor_ids.reshape(-1).to(drafter.embed.weight.device),
                          gamma)
    embeds = embeds.view(b, a * q, -1).to(device, core.fc.weight.dtype)
    block_pos = (batch.anchors[..., None] + torch.arange(q)).view(b, a * q)  # [B, A*Q]
    # Block i sees context positions < its anchor, and its own Q rows.
    ctx_ok = torch.arange(length)[None, None, :] < batch.anchors.repeat_interleave(q, 1)[..., None]  # [B, AQ, L]
    block_id = torch.arange(a).repeat_interleave(q)
    own = (block_id[:, None] == block_id[None, :])[None].expand(b, -1, -1)  # [B, AQ, AQ]
    mask = torch.cat([ctx_ok, own], -1).to(device)
    return model(features, positions, embeds, block_pos, mask).view(b, a, q, -1)[:, :, 1:]  # [B, A, gamma, H]
