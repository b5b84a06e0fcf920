"""Many sessions' KV caches in one buffer per layer, so that a batch step attends for all of them in a few calls.

``KVPool`` holds, per layer, keys and values as [slots, kv_heads, room, head_dim]; a session's cache
(``PooledCache``, what ``KVPool.cache()`` gives) owns one slot and reads and writes the first ``length`` positions
of it, with the same interface as ``llama.KVCache`` (``layers[i].keys`` / ``.values`` views, assignment of a
prefix view to drop positions, ``update``), so the verifier's commit, a lone forward and a step's rollback work on
it unchanged.

Why: a batch step of 16 plain decodes spent ~44 of its ~103 ms attending session by session (30 layers x 16
small attention calls, each mostly call overhead; 2-core AVX-512 EPYC, float32, SmolLM2). With every session's
keys in one tensor, ``StepPlan`` groups the step's small pieces (plain steps, trees) by their row count and runs
each group as one attention call over the slots it spans, with padded query rows and a mask that keeps every
session to its own slot and its own positions; a piece that would pad too much (a prefill) attends alone against
its slot's view. No keys are copied for attention: the group reads the pool in place.

Memory: every slot has the room of the longest session (the buffers grow by half when one needs more, by
doubling when more slots are needed, and are freed when the last session leaves). Sessions of very different
lengths waste room; the replica's admission budget counts tokens, not room (docs/serve.md).

Thread safety: the buffers move when they grow. Growth (``reserve``) and anything that writes a session's
positions outside a step (the verifier's commit) hold ``lock``; a step reserves what it needs once, before its
first layer.
"""

from __future__ import annotations

import heapq
import threading
import weakref
from dataclasses import dataclass

import torch


class KVPool:
    """Slots of keys and values for up to any number of sessions (see the module docstring)."""

    def __init__(self, num_layers: int, *, min_room: int = 64):
        self.num_layers = num_layers
        self.min_room = min_room
        self.lock = threading.RLock()
        self.k: list[torch.Tensor] = []  # per layer [slots, KV, room, D], or empty before the first write
        self.v: list[torch.Tensor] = []
        self._free: list[int] = []  # released slots below ``_next``, smallest first
        self._next = 0  # slots ever handed out since the buffers were last freed
        self._used = 0

    # -- slots -----------------------------------------------------------------------------------------------------
    def cache(self) -> PooledCache:
        """A new session's cache, in the lowest free slot (sessions of a replica stay packed at the low slots, so a
        step's groups span few idle ones)."""
        with self.lock:
            slot = heapq.heappop(self._free) if self._free else self._next
            self._next = max(self._next, slot + 1)
            self._used += 1
        return PooledCache(self, slot)

    def release(self, slot: int) -> None:
        with self.lock:
            self._used -= 1
            if self._used == 0:  # the last session left: give the memory back
                self.k, self.v, self._free, self._next = [], [], [], 0
            else:
                heapq.heappush(self._free, slot)

    @property
    def slots(self) -> int:
        return self.k[0].shape[0] if self.k else 0

    @property
    def room(self) -> int:
        return self.k[0].shape[2] if self.k else 0

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k, *self.v))

    def reserve(self, slot: int, length: int, like: torch.Tensor) -> None:
        """Make slot ``slot`` hold ``length`` positions; ``like``: keys of shape [1, KV, n, D] (shape, dtype, device
        of the buffers, at the first write). Grows (and moves) every layer's buffers when needed."""
        with self.lock:
            if self.k and slot < self.slots and length <= self.room:
                return
            kv, dim = like.shape[1], like.shape[-1]
            old_slots, old_room = self.slots, self.room
            slots = max(old_slots, slot + 1, self._next)
            if old_slots and slots > old_slots:  # more sessions than slots: double, not one more at a time
                slots = max(slots, 2 * old_slots)
            room = old_room if length <= old_room else max(length + length // 2, self.min_room)
            grown_k, grown_v = [], []
            for i in range(self.num_layers):
                k = like.new_zeros(slots, kv, room, dim)
                v = like.new_zeros(slots, kv, room, dim)
                if old_slots:
                    k[:old_slots, :, :old_room] = self.k[i]
                    v[:old_slots, :, :old_room] = self.v[i]
                grown_k.append(k)
                grown_v.append(v)
            self.k, self.v = grown_k, grown_v


class _SlotLayer:
    """One layer of a ``PooledCache``: the interface of ``llama._CacheLayer`` over the pool's slot."""

    __slots__ = ("owner", "layer", "length")

    def __init__(self, owner: PooledCache, layer: int):
        self.owner, self.layer, self.length = owner, layer, 0

    def _buffers(self) -> tuple[torch.Tensor, torch.Tensor]:
        pool, slot = self.owner.pool, self.owner.live_slot()
        return pool.k[self.layer][slot : slot + 1], pool.v[self.layer][slot : slot + 1]

    @property
    def keys(self) -> torch.Tensor | None:
        return self._buffers()[0][:, :, : self.length] if self.length else None

    @property
    def values(self) -> torch.Tensor | None:
        return self._buffers()[1][:, :, : self.length] if self.length else None

    @keys.setter
    def keys(self, value: torch.Tensor | None) -> None:
        self._assign(0, value)

    @values.setter
    def values(self, value: torch.Tensor | None) -> None:
        self._assign(1, value)

    def _assign(self, which: int, value: torch.Tensor | None) -> None:
        if value is None:
            self.length = 0
            return
        n = int(value.shape[-2])
        with self.owner.pool.lock:
            pool = self.owner.pool
            if pool.k:
                buffer = self._buffers()[which]
                if value.data_ptr() == buffer.data_ptr() and value.stride() == buffer.stride() and n <= buffer.shape[2]:
                    self.length = n  # a prefix of the slot (the commit dropping rejected nodes): keep it in place
                    return
            pool.reserve(self.owner.live_slot(), n, value)
            self._buffers()[which][:, :, :n] = value  # any other tensor (a rollback across growth): copied in
            self.length = n

    def append(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        end = self.length + int(keys.shape[-2])
        with self.owner.pool.lock:
            self.owner.pool.reserve(self.owner.live_slot(), end, keys)
            k, v = self._buffers()
            k[:, :, self.length : end] = keys
            v[:, :, self.length : end] = values
        self.length = end
        return self.keys, self.values


class PooledCache:
    """A session's KV cache in one slot of a ``KVPool`` (``llama.KVCache``'s interface). ``release()`` gives the slot
    back (also done when the cache is garbage-collected); the cache is unusable afterwards."""

    def __init__(self, pool: KVPool, slot: int):
        self.pool, self.slot = pool, slot
        self.layers = [_SlotLayer(self, i) for i in range(pool.num_layers)]
        self._finalizer = weakref.finalize(self, pool.release, slot)

    def live_slot(self) -> int:
        if self.slot is None:
            raise RuntimeError("this KV cache was released: its slot may belong to another session now")
        return self.slot

    def get_seq_length(self) -> int:
        return self.layers[0].length if self.layers else 0

    def update(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.layers[layer].append(keys, values)

    def release(self) -> None:
        if self.slot is not None:
            self.slot = None
            self._finalizer()


@dataclass
class _Group:
    """Pieces attended in one call: slots [lo, hi), each member's rows padded to ``width``; ``index`` [B * width]:
    the step row each padded query row takes (pads: row 0); ``rows`` / ``places``: members' step rows and where
    they sit among the padded ones; ``mask``: additive [B, 1, groups * width, length], folded for GQA."""

    lo: int
    hi: int
    width: int
    length: int
    index: torch.Tensor
    rows: torch.Tensor
    places: torch.Tensor
    mask: torch.Tensor


# A group may pad its query rows (idle slots in its span, shorter pieces) to at most this many times its real rows
# (plus a few): beyond that the padded attention costs more than the calls it saves.
_MAX_PADDING = 2.0
_MAX_GROUP_ROWS = 64  # pieces with more rows (prefills) attend alone


class StepPlan:
    """How one ``forward_ragged`` step over pooled caches writes and attends, computed once for all its layers.

    ``slot_rows`` / ``positions`` [R]: where each step row's keys go in the pool; ``groups``: batched attention
    calls; ``alone``: indices of the pieces that attend by themselves."""

    def __init__(self, pool: KVPool, pieces, spans, masks, *, heads: int, kv_heads: int, dtype: torch.dtype,
                 device: torch.device, like: torch.Tensor):
        self.pool = pool
        self.caches = [p.cache for p in pieces]
        self.spans = spans
        self.masks = masks
        cached = [c.get_seq_length() for c in self.caches]
        slots = [c.live_slot() for c in self.caches]
        self.ends = [c + (b - a) for c, (a, b) in zip(cached, spans)]
        pool.reserve(max(slots), max(self.ends), like)  # grow once, before the first layer: no move mid-step
        rows = spans[-1][1]
        slot_rows = torch.empty(rows, dtype=torch.long)
        positions = torch.empty(rows, dtype=torch.long)
        for (a, b), c, s in zip(spans, cached, slots):
            slot_rows[a:b] = s
            positions[a:b] = torch.arange(c, c + b - a)
        self.slot_rows, self.positions = slot_rows.to(device), positions.to(device)
        self.groups_per_kv = heads // kv_heads
        self.groups: list[_Group] = []
        self.alone: list[int] = []
        small = sorted((i for i, (a, b) in enumerate(spans) if b - a <= _MAX_GROUP_ROWS), key=self._width)
        self.alone.extend(i for i, (a, b) in enumerate(spans) if b - a > _MAX_GROUP_ROWS)
        members: list[int] = []
        for i in small:  # greedy, by row count: extend the group while its padding stays within bounds
            trial = [*members, i]
            if members and not self._worth(trial, slots):
                self._close(members, slots, cached, dtype, device)
                trial = [i]
            members = trial
        if members:
            self._close(members, slots, cached, dtype, device)

    def _width(self, i: int) -> int:
        a, b = self.spans[i]
        return b - a

    def _worth(self, members: list[int], slots: list[int]) -> bool:
        span = max(slots[i] for i in members) - min(slots[i] for i in members) + 1
        width = max(self._width(i) for i in members)
        real = sum(self._width(i) for i in members)
        return span * width <= _MAX_PADDING * real + 8

    def _close(self, members: list[int], slots: list[int], cached: list[int], dtype, device) -> None:
        if len(members) == 1:
            self.alone.append(members[0])
            return
        lo, hi = min(slots[i] for i in members), max(slots[i] for i in members) + 1
        width = max(self._width(i) for i in members)
        length = max(self.ends[i] for i in members)
        batch = hi - lo
        index = torch.zeros(batch * width, dtype=torch.long)
        allowed = torch.zeros(batch, width, length, dtype=torch.bool)
        allowed[:, :, 0] = True  # pad rows attend to one position: no row is all masked (they are dropped anyway)
        rows, places = [], []
        for i in members:
            a, b = self.spans[i]
            s, n, c = slots[i] - lo, b - a, cached[i]
            index[s * width : s * width + n] = torch.arange(a, b)
            rows.append(torch.arange(a, b))
            places.append(torch.arange(s * width, s * width + n))
            mask = self.masks[i]
            if mask is None:  # causal: row j sees the cached positions and the piece's rows up to itself
                allowed[s, :n, : c + n] = torch.ones(n, c + n, dtype=torch.bool).tril(c)
            else:  # additive [1, 1, n, c + n]
                allowed[s, :n, : c + n] = mask[0, 0].to("cpu") == 0
        additive = torch.zeros(batch, 1, width, length, dtype=dtype)
        additive.masked_fill_(~allowed[:, None], torch.finfo(dtype).min)
        folded = additive.repeat(1, 1, self.groups_per_kv, 1)  # query head j * groups + r -> row r * width + i
        self.groups.append(_Group(lo, hi, width, length, index.to(device), torch.cat(rows).to(device),
                                  torch.cat(places).to(device), folded.to(device)))

    def write(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """The step's new keys/values (k, v [1, KV, R, D]) into their slots, then every piece's length."""
        self.pool.k[layer][self.slot_rows, :, self.positions] = k[0].transpose(0, 1)  # [R, KV, D]
        self.pool.v[layer][self.slot_rows, :, self.positions] = v[0].transpose(0, 1)
        for cache, end in zip(self.caches, self.ends):
            cache.layers[layer].length = end


__all__ = ["KVPool", "PooledCache", "StepPlan"]
