"""A lean Llama-family causal LM for inference: the verifier forward in plain torch, loaded straight from a Hugging
Face folder (``config.json`` + safetensors), without importing transformers.

Why: a cold ``python jobs/generate.py`` spent ~3.4 s importing transformers' modelling code and ~2.7 s in its
tokenizer before the first token (2-core AVX2 EPYC); this module and ``specdiff.models.tokenizer`` load the same weights and
vocabulary in well under a second. It computes what transformers' ``LlamaForCausalLM`` computes (same module tree
and parameter names, so a checkpoint's state dict loads as-is and code that reads ``model.model.layers[i].mlp``
keeps working): RMSNorm in float32, RoPE from float32 inverse frequencies, grouped-query attention through
``scaled_dot_product_attention``, a SwiGLU MLP, tied or separate LM head. Tests compare logits, cache use and tapped
hidden states with transformers' model on the same weights.

It takes what the verifier needs (``HFModel``'s calling convention): ``input_ids``, an additive 4D mask or none
(causal), ``position_ids``, a ``KVCache``, ``logits_to_keep``, ``output_hidden_states``. No padding masks, no
training extras; ``load_llama`` returns None for a config outside what it computes exactly (another architecture,
RoPE scaling, biases), and the caller falls back to transformers.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn.functional as F
from torch import nn


class LlamaConfig(SimpleNamespace):
    """``config.json``'s fields as attributes (what code written against a transformers config reads)."""

    @property
    def rope_theta(self) -> float:
        params = getattr(self, "rope_parameters", None) or {}
        return float(params.get("rope_theta", self.__dict__.get("_rope_theta", 10000.0)))

    @property
    def head_size(self) -> int:
        return int(getattr(self, "head_dim", None) or self.hidden_size // self.num_attention_heads)


def unsupported_reason(config: dict) -> str | None:
    """Why this module cannot compute the model exactly (None: it can)."""
    if config.get("model_type") != "llama":
        return f"model_type {config.get('model_type')!r} (only 'llama')"
    if config.get("hidden_act", "silu") != "silu":
        return f"hidden_act {config.get('hidden_act')!r}"
    for flag in ("attention_bias", "mlp_bias"):
        if config.get(flag):
            return flag
    if int(config.get("pretraining_tp") or 1) != 1:
        return "pretraining_tp > 1"
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    kind = rope.get("rope_type", rope.get("type", "default"))
    if kind != "default":
        return f"rope_type {kind!r}"
    return None


class _CacheLayer:
    """One layer's keys and values in buffers with room to grow: ``keys`` / ``values`` are views of the first
    ``length`` positions. Appending writes after them (no copy of the cached positions, which ``torch.cat`` made at
    every step: a step's cost grew with the context), and assigning a prefix view (the verifier's commit dropping
    a tree's rejected nodes) only shortens ``length``. Assigning any other tensor adopts it."""

    __slots__ = ("_k", "_v", "length")

    def __init__(self):
        self._k = self._v = None
        self.length = 0

    @property
    def keys(self) -> torch.Tensor | None:
        return None if self._k is None else self._k[..., : self.length, :]

    @property
    def values(self) -> torch.Tensor | None:
        return None if self._v is None else self._v[..., : self.length, :]

    @keys.setter
    def keys(self, value: torch.Tensor | None) -> None:
        self._k = self._adopt(self._k, value)

    @values.setter
    def values(self, value: torch.Tensor | None) -> None:
        self._v = self._adopt(self._v, value)

    def _adopt(self, buffer: torch.Tensor | None, value: torch.Tensor | None) -> torch.Tensor | None:
        if value is None:
            self.length = 0
            return None
        if (buffer is not None and value.data_ptr() == buffer.data_ptr() and value.stride() == buffer.stride()
                and value.shape[:-2] == buffer.shape[:-2] and value.shape[-2] <= buffer.shape[-2]):
            self.length = int(value.shape[-2])  # a prefix of the buffer: keep the room after it
            return buffer
        self.length = int(value.shape[-2])
        return value.contiguous()

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        new = int(keys.shape[-2])
        end = self.length + new
        if self._k is None or end > self._k.shape[-2] or keys.shape[:-2] != self._k.shape[:-2]:
            room = max(end + end // 2, 16) if self._k is not None else max(end + 64, 16)
            grown_k = keys.new_empty(*keys.shape[:-2], room, keys.shape[-1])
            grown_v = values.new_empty(*values.shape[:-2], room, values.shape[-1])
            if self._k is not None and self.length:
                grown_k[..., : self.length, :] = self._k[..., : self.length, :]
                grown_v[..., : self.length, :] = self._v[..., : self.length, :]
            self._k, self._v = grown_k, grown_v
        self._k[..., self.length : end, :] = keys
        self._v[..., self.length : end, :] = values
        self.length = end
        return self.keys, self.values


class KVCache:
    """Keys and values per layer ([B, kv_heads, T, head_dim] each), laid out like transformers' ``DynamicCache``
    (``layers[i].keys`` / ``.values``, ``get_seq_length()``), so the verifier's commit works on either. Each layer
    keeps room to grow (``_CacheLayer``)."""

    def __init__(self, num_layers: int):
        self.layers = [_CacheLayer() for _ in range(num_layers)]

    def get_seq_length(self) -> int:
        return self.layers[0].length if self.layers else 0

    def update(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.layers[layer].append(keys, values)


class _Unset(nn.Linear):
    def reset_parameters(self) -> None:  # the weights come from the checkpoint: skip the random init
        pass


def _linear(inputs: int, outputs: int) -> nn.Linear:
    """A bias-free ``nn.Linear`` with uninitialised weights (loaded next). Built without the meta device: a module
    initialised there imports torch._dynamo, 1.4-3 s of a cold start."""
    layer = _Unset(inputs, outputs, bias=False)
    layer.__class__ = nn.Linear  # a plain Linear again (``specdiff.models.kernels`` swaps exact nn.Linear classes)
    return layer


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.variance_epsilon = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)
        return self.weight * x.to(dtype)


class MLP(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.gate_proj = _linear(c.hidden_size, c.intermediate_size)
        self.up_proj = _linear(c.hidden_size, c.intermediate_size)
        self.down_proj = _linear(c.intermediate_size, c.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), -1)


def folded_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None,
                     scale: float | None) -> torch.Tensor:
    """Grouped-query attention with the query heads of each key/value head folded into the rows (q [B, H, S, D],
    k/v [B, KV, T, D], ``mask`` additive [B or 1, 1, S, T] or None -> [B, H, S, D]): no copy of every key and value
    per query head. Same attention, another order of the same sums. Used by ``attend`` and ``hf._gqa_sdpa``."""
    batch, heads, rows, dim = q.shape
    kv, total = k.shape[1], k.shape[-2]
    groups = heads // kv
    folded = q.reshape(batch, kv, groups * rows, dim)  # head h = j * groups + r -> row r * rows + i
    fmask = None if mask is None else mask.expand(batch, 1, rows, total).repeat(1, 1, groups, 1)
    out = F.scaled_dot_product_attention(folded, k, v, attn_mask=fmask, scale=scale)
    return out.reshape(batch, heads, rows, v.shape[-1])


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float) -> torch.Tensor:
    """Grouped-query attention: q [B, H, S, D], k/v [B, KV, T, D], ``mask`` additive [B, 1, S, T] or None (causal,
    the S rows being the last S of the T positions) -> [B, H, S, D].

    A few rows without gradients (decoding steps, a verifier's tree pass) fold the query heads of each key/value
    head into the rows instead of copying every key and value per query head; same sums (see ``hf._gqa_sdpa``)."""
    batch, heads, rows, dim = q.shape
    kv, total = k.shape[1], k.shape[-2]
    groups = heads // kv
    if mask is None and rows > 1 and rows != total:  # a causal chunk after cached positions: explicit mask
        allowed = torch.ones(rows, total, dtype=torch.bool, device=q.device).tril(total - rows)
        mask = torch.zeros(rows, total, dtype=q.dtype, device=q.device).masked_fill_(~allowed, torch.finfo(q.dtype).min)
        mask = mask[None, None]
    if groups > 1 and rows <= 64 and (mask is not None or rows == 1) and not torch.is_grad_enabled():
        return folded_attention(q, k, v, mask, scale)
    if groups > 1:
        k = k[:, :, None].expand(batch, kv, groups, total, dim).reshape(batch, heads, total, dim)
        v = v[:, :, None].expand(batch, kv, groups, total, dim).reshape(batch, heads, total, dim)
    causal = mask is None and rows > 1
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, scale=scale)


class Attention(nn.Module):
    def __init__(self, c: LlamaConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.num_heads, self.num_kv_heads, self.head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_size
        self.num_key_value_groups = self.num_heads // self.num_kv_heads
        self.scaling = self.head_dim ** -0.5
        self.q_proj = _linear(c.hidden_size, self.num_heads * self.head_dim)
        self.k_proj = _linear(c.hidden_size, self.num_kv_heads * self.head_dim)
        self.v_proj = _linear(c.hidden_size, self.num_kv_heads * self.head_dim)
        self.o_proj = _linear(self.num_heads * self.head_dim, c.hidden_size)

    def forward(self, x, cos, sin, mask, cache: KVCache | None) -> torch.Tensor:
        batch, rows, _ = x.shape
        q = self.q_proj(x).view(batch, rows, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, rows, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, rows, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        if cache is not None:
            k, v = cache.update(self.layer, k, v)
        out = attend(q, k, v, mask, self.scaling)
        return self.o_proj(out.transpose(1, 2).reshape(batch, rows, self.num_heads * self.head_dim))

    def forward_ragged(self, x, cos, sin, spans, masks, caches, plan=None) -> torch.Tensor:
        """Several sequences' rows in one [1, R, H] block (``spans``: each one's (start, end) rows): the projections
        run once over all rows, attention per sequence against its own cache and mask -- or, with a ``plan``
        (caches in one ``KVPool``), per group of sequences in one call over the pool (``_attend_planned``)."""
        _, rows, _ = x.shape
        q = self.q_proj(x).view(1, rows, self.num_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(1, rows, self.num_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(1, rows, self.num_kv_heads, self.head_dim).transpose(1, 2)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        if plan is not None:
            out = self._attend_planned(q, k, v, plan)  # [R, H, D]
            return self.o_proj(out.reshape(1, rows, self.num_heads * self.head_dim))
        outs = []
        for (a, b), mask, cache in zip(spans, masks, caches):
            ki, vi = cache.update(self.layer, k[:, :, a:b], v[:, :, a:b])
            outs.append(attend(q[:, :, a:b], ki, vi, mask, self.scaling))
        out = torch.cat(outs, 2) if len(outs) > 1 else outs[0]  # [1, H, R, D]
        return self.o_proj(out.transpose(1, 2).reshape(1, rows, self.num_heads * self.head_dim))

    def _attend_planned(self, q, k, v, plan) -> torch.Tensor:
        """q [1, H, R, D], k/v [1, KV, R, D] of a step over pooled caches -> attention output [R, H, D]. Each group
        attends in one call: its padded query rows gathered [B, KV, groups * width, D] (query heads folded into the
        rows, as ``folded_attention``) against the pool's keys of its slots read in place, under its mask."""
        plan.write(self.layer, k, v)
        keys, values = plan.pool.k[self.layer], plan.pool.v[self.layer]
        heads, dim, kv = self.num_heads, self.head_dim, self.num_kv_heads
        rows_q = q[0].transpose(0, 1)  # [R, H, D]
        out = q.new_empty(rows_q.shape)
        for g in plan.groups:
            batch = g.hi - g.lo
            qg = rows_q.index_select(0, g.index).view(batch, g.width, heads, dim).transpose(1, 2)
            qg = qg.reshape(batch, kv, (heads // kv) * g.width, dim)
            kg, vg = keys[g.lo : g.hi, :, : g.length], values[g.lo : g.hi, :, : g.length]  # in place, no copy
            og = F.scaled_dot_product_attention(qg, kg, vg, attn_mask=g.mask, scale=self.scaling)
            og = og.reshape(batch, heads, g.width, dim).transpose(1, 2).reshape(batch * g.width, heads, dim)
            out.index_copy_(0, g.rows, og.index_select(0, g.places))
        for i in plan.alone:
            (a, b), end, slot = plan.spans[i], plan.ends[i], plan.caches[i].live_slot()
            ki, vi = keys[slot : slot + 1, :, :end], values[slot : slot + 1, :, :end]
            oi = attend(q[:, :, a:b], ki, vi, plan.masks[i], self.scaling)
            out[a:b] = oi[0].transpose(0, 1)
        return out


class DecoderLayer(nn.Module):
    def __init__(self, c: LlamaConfig, layer: int):
        super().__init__()
        self.self_attn = Attention(c, layer)
        self.mlp = MLP(c)
        self.input_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(c.hidden_size, c.rms_norm_eps)

    def forward(self, x, cos, sin, mask, cache):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache)
        return x + self.mlp(self.post_attention_layernorm(x))

    def forward_ragged(self, x, cos, sin, spans, masks, caches, plan=None):
        x = x + self.self_attn.forward_ragged(self.input_layernorm(x), cos, sin, spans, masks, caches, plan)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaModel(nn.Module):
    def __init__(self, c: LlamaConfig):
        super().__init__()
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size, _weight=torch.empty(c.vocab_size, c.hidden_size))
        self.layers = nn.ModuleList(DecoderLayer(c, i) for i in range(c.num_hidden_layers))
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        dim = c.head_size
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)


class Output(SimpleNamespace):
    """``logits`` [B, S or logits_to_keep, V]; ``hidden_states`` (when asked): the embeddings, then every layer's
    output, the last one after the final norm (transformers' convention); ``past_key_values``."""


class LlamaCausalLM(nn.Module):
    """Inference-only Llama causal LM with transformers' parameter names (see the module docstring)."""

    def __init__(self, config: LlamaConfig):
        super().__init__()
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = _linear(config.hidden_size, config.vocab_size)
        if getattr(config, "tie_word_embeddings", False):
            self.lm_head.weight = self.model.embed_tokens.weight

    def get_input_embeddings(self) -> nn.Module:
        return self.model.embed_tokens

    def get_output_embeddings(self) -> nn.Module:
        return self.lm_head

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.lm_head.weight.device

    def new_cache(self) -> KVCache:
        return KVCache(self.config.num_hidden_layers)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None, past_key_values: KVCache | None = None,
                use_cache: bool | None = None, logits_to_keep: int = 0,
                output_hidden_states: bool = False) -> Output:
        if attention_mask is not None and attention_mask.dim() != 4:
            raise ValueError("LlamaCausalLM takes an additive 4D attention mask [B, 1, S, T] or none (causal); "
                             f"got {attention_mask.dim()} dimensions (padding masks need the transformers model)")
        cache = past_key_values if use_cache is not False else None
        x = self.model.embed_tokens(input_ids)
        batch, rows = input_ids.shape
        if position_ids is None:
            start = cache.get_seq_length() if cache is not None else 0
            position_ids = torch.arange(start, start + rows, device=x.device)[None].expand(batch, rows)
        freqs = position_ids[..., None].float() * self.model.inv_freq  # [B, S, D/2], float32 as transformers
        angles = torch.cat((freqs, freqs), -1)
        cos, sin = angles.cos().to(x.dtype)[:, None], angles.sin().to(x.dtype)[:, None]
        if attention_mask is not None:
            attention_mask = attention_mask.to(x.dtype)
        hidden = [x] if output_hidden_states else None
        for layer in self.model.layers:
            x = layer(x, cos, sin, attention_mask, cache)
            if hidden is not None:
                hidden.append(x)
        x = self.model.norm(x)
        if hidden is not None:
            hidden[-1] = x
        keep = x[:, -logits_to_keep:] if logits_to_keep else x
        return Output(logits=self.lm_head(keep), hidden_states=tuple(hidden) if hidden is not None else None,
                      past_key_values=cache)

    @torch.no_grad()
    def forward_ragged(self, pieces: list[Piece], taps: tuple[int, ...] | None = None
                       ) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """One forward over several sequences, each with its own KV cache (continuous batching: a batch step of
        many sessions). Every piece's rows are laid end to end in one [1, R, H] block, so the linear layers and the
        LM head run once over all of them; attention runs per piece against its own cache and mask, so no sequence
        sees another. Per piece: (logits [last or S, V], tapped states [S, len(taps) * H] or None) -- what
        ``forward`` returns for that piece alone, up to the rounding of a product over more rows."""
        device = self.device
        ids = torch.cat([p.input_ids for p in pieces]).to(device)[None]  # [1, R]
        positions = []
        for p in pieces:
            if p.position_ids is not None:
                positions.append(p.position_ids.reshape(-1))
            else:
                start = p.cache.get_seq_length()
                positions.append(torch.arange(start, start + len(p.input_ids)))
        position_ids = torch.cat(positions).to(device)[None]  # [1, R]
        spans, start = [], 0
        for p in pieces:
            spans.append((start, start + len(p.input_ids)))
            start += len(p.input_ids)
        x = self.model.embed_tokens(ids)
        freqs = position_ids[..., None].float() * self.model.inv_freq
        angles = torch.cat((freqs, freqs), -1)
        cos, sin = angles.cos().to(x.dtype)[:, None], angles.sin().to(x.dtype)[:, None]
        masks = [None if p.mask is None else p.mask.to(device, x.dtype) for p in pieces]
        caches = [p.cache for p in pieces]
        plan = self._plan(pieces, spans, masks, x)
        hidden = [x] if taps else None
        for layer in self.model.layers:
            x = layer.forward_ragged(x, cos, sin, spans, masks, caches, plan)
            if hidden is not None:
                hidden.append(x)
        x = self.model.norm(x)
        if hidden is not None:
            hidden[-1] = x
        keep = [(b - p.last if p.last else a, b) for p, (a, b) in zip(pieces, spans)]
        rows = torch.cat([torch.arange(a, b) for a, b in keep]).to(device)
        logits = self.lm_head(x[0, rows])  # [kept rows, V]
        feats = torch.cat([hidden[i + 1] for i in taps], -1)[0] if taps else None  # [R, taps * H]
        out, at = [], 0
        for (a, b), (ka, kb) in zip(spans, keep):
            out.append((logits[at : at + kb - ka], None if feats is None else feats[a:b]))
            at += kb - ka
        return out

    def _plan(self, pieces, spans, masks, x):
        """A ``StepPlan`` when every piece's cache is a slot of one ``KVPool`` (a batched replica's sessions), else
        None (attention per piece against its own cache)."""
        from specdiff.models.kvpool import PooledCache, StepPlan

        pool = getattr(pieces[0].cache, "pool", None)
        if pool is None or not all(isinstance(p.cache, PooledCache) and p.cache.pool is pool for p in pieces):
            return None
        c = self.config
        like = x.new_empty(1, c.num_key_value_heads, 1, c.head_size)
        return StepPlan(pool, pieces, spans, masks, heads=c.num_attention_heads, kv_heads=c.num_key_value_heads,
                        dtype=x.dtype, device=x.device, like=like)


class Piece(SimpleNamespace):
    """One sequence's share of a ``forward_ragged`` batch: ``input_ids`` [S] long; ``position_ids`` [S] or None
    (following its cache); ``mask`` additive [1, 1, S, cached + S] or None (causal); ``cache`` (a ``KVCache``,
    extended in place); ``last``: logits for the last ``last`` rows only (None or 0: every row)."""

    def __init__(self, input_ids, cache, *, position_ids=None, mask=None, last=None):
        super().__init__(input_ids=input_ids, cache=cache, position_ids=position_ids, mask=mask, last=last)


def _read_state(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    state: dict[str, torch.Tensor] = {}
    for name in files:
        state.update(load_file(str(folder / name)))
    return state


def load_llama(path: str | Path, dtype: torch.dtype = torch.float32) -> LlamaCausalLM | None:
    """The model in a local Hugging Face folder as a ``LlamaCausalLM`` in ``dtype`` (eval mode, CPU), or None when
    the folder is not one it computes exactly (see ``unsupported_reason``; no safetensors weights)."""
    folder = Path(path)
    config_file = folder / "config.json"
    if not config_file.is_file() or not ((folder / "model.safetensors").is_file()
                                         or (folder / "model.safetensors.index.json").is_file()):
        return None
    raw = json.loads(config_file.read_text())
    if unsupported_reason(raw) is not None:
        return None
    return from_state(raw, _read_state(folder), dtype, where=str(folder))


def from_state(raw: dict, state: dict[str, torch.Tensor], dtype: torch.dtype = torch.float32, *,
               where: str = "the weights") -> LlamaCausalLM:
    """A ``LlamaCausalLM`` from a ``config.json``-shaped dict and a transformers-named state dict (a checkpoint's,
    or a transformers model's ``state_dict()``), in ``dtype``, eval mode."""
    raw = dict(raw)
    if "rope_theta" in raw:  # older config.json: a top-level rope_theta (the property reads it from here)
        raw["_rope_theta"] = raw.pop("rope_theta")
    raw.setdefault("num_key_value_heads", raw["num_attention_heads"])
    raw.setdefault("rms_norm_eps", 1e-6)
    config = LlamaConfig(**raw)
    model = LlamaCausalLM(config)
    state = {k: v.to(dtype) for k, v in state.items()}
    if getattr(config, "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    if getattr(config, "tie_word_embeddings", False):
        model.lm_head.weight = model.model.embed_tokens.weight
        missing = [k for k in missing if k != "lm_head.weight"]
    if missing or unexpected:
        raise ValueError(f"{where}: weights do not match its config.json (missing {missing[:3]}, "
                         f"unexpected {unexpected[:3]})")
    return model.eval()


__all__ = ["KVCache", "LlamaCausalLM", "LlamaConfig", "Piece", "load_llama", "unsupported_reason"]
