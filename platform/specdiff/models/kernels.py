"""Few-row linear layers on a CPU: pick, by measurement on this machine, the fastest of three equal products.

A verifier step multiplies every weight matrix by a handful of rows: one (a plain step), 1 + γK (a tree pass), or
many sessions' rows at once (a replica's batch step, ``specdiff.models.batched``). The forms:

- ``x @ W.T`` (``F.linear``, MKL): the default, and always the form with gradients (training);
- ``(W @ x.T).T`` (``transposed_linear``): on a 2-core AMD EPYC with AVX2 only (torch 2.13, float32, SmolLM2-135M's
  weights streamed as in a forward) 26-33 against 70-87 ms at 2-5 rows, F.linear level from 13 rows; a one-row
  product padded to two takes it too (a plain step: 63 -> 52 ms, the whole forward);
- oneDNN's matmul on a copy of the weight prepacked in its blocked layout (``packed_linear``, what vLLM's CPU
  backend runs): on a 2-core AMD EPYC with AVX-512, 34 against 59 (transposed) and 65 ms (F.linear) at 16 rows,
  29 against 45 / 54 at 8, while at 1-2 rows the transposed form was fastest (20 against 25). The packed copies
  take as much memory as the weights, so the form is timed only where they fit in ``PACK_MEMORY_SHARE`` of the
  free memory.

Other CPUs, BLAS builds and dtypes differ, so nothing is assumed: ``tune_small_rows`` times the forms on the
model's own weights for the row counts of ``ROWS`` (about 6 s on the AVX-512 machine, once) and switches only the
counts where another form wins; the plan is memoised per process and, given a folder, on disk.

The forms compute the same sums in another order: results differ in the last bits, as they do between any two
BLAS kernels (a one-row GEMV and a nine-row GEMM already do).
"""

from __future__ import annotations

import bisect
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from specdiff.runtime import machine_cache
# Row counts timed: a decoding step or tree pass (1-12) and a batch step of many sessions' rows (16-256; a
# replica's continuous batching, ``specdiff.models.batched``: 16 sessions' trees of 5-9 nodes are 80-144 rows). A
# count between two timed ones follows the lower one. Above the last (a prefill), the packed form where it won at
# the last count (a blocked matmul: on the AVX-512 EPYC 1108 against F.linear's 1175 ms at 1024 rows), else F.linear.
ROWS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
WIN = 0.9  # a form other than F.linear must take at most this fraction of F.linear's time


class SmallRowsLinear(torch.nn.Linear):
    """``nn.Linear`` whose forward takes the transposed product for the row counts in ``small_rows`` and oneDNN's
    product on a prepacked copy of the weight for those in ``packed_rows`` (no gradients wanted). The packed copy
    is made on first use and again whenever the weight changes (another tensor, or an in-place update); it is not
    part of the state dict, and a copy or pickle of the module leaves it behind."""

    small_rows: tuple[int, ...] = ()
    packed_rows: tuple[int, ...] = ()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed_rows and takes_packed(self.packed_rows, _rows(x)) and not torch.is_grad_enabled():
            return packed_linear(x, self._packed_weight(), self.bias)
        return planned_linear(x, self.weight, self.bias, self.small_rows)

    def _packed_weight(self) -> torch.Tensor:
        w = self.weight
        stamp = (w.data_ptr(), w._version, w.dtype, tuple(w.shape))
        kept = self.__dict__.get("_packed")
        if kept is None or kept[0] != stamp:
            kept = (stamp, pack_weight(w))
            self.__dict__["_packed"] = kept
        return kept[1]

    def __getstate__(self):
        state = dict(super().__getstate__())
        state.pop("_packed", None)
        return state


def _rows(x: torch.Tensor) -> int:
    return x.numel() // x.shape[-1] if x.shape[-1] else 0


def planned_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   small_rows: tuple[int, ...]) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, as the transposed product where the plan ``small_rows`` says so and no
    gradients are wanted (training always takes ``F.linear``)."""
    rows = _rows(x)
    if not takes_form(small_rows, rows) or torch.is_grad_enabled():
        return F.linear(x, weight, bias)
    out = transposed_linear(x.reshape(rows, x.shape[-1]), weight, bias)
    return out.reshape(*x.shape[:-1], out.shape[-1])


PACK_FOR_ROWS = 64  # the batch size oneDNN packs for: 8-32 rows ran fastest so packed (AVX-512 EPYC, float32)


def pack_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` [out, in] in oneDNN's blocked layout for ``packed_linear`` (an opaque tensor, a copy)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_FOR_ROWS)


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` with ``packed = pack_weight(weight)``: oneDNN's matmul on the prepacked weight
    (what vLLM's CPU backend runs for its dense layers), row-major out, no gradients."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def transposed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for 2-D ``x`` as ``(weight @ x.T).T``; one row is padded to two.

    The result is row-major, as ``F.linear``'s is (a copy of rows x outputs, small next to the product). Left as the
    column-major view, it reached attention with a head-dim stride above one, which sends CPU attention from its
    flash kernel to the math path: a 16-session batch step took 208 ms instead of about 140 (AVX-512 EPYC)."""
    x = x.contiguous()
    one = x.shape[0] == 1
    out = (weight @ (torch.cat([x, x]) if one else x).T).T
    out = out[:1] if one else out
    out = out.contiguous()
    return out.add_(bias) if bias is not None else out


def takes_form(counts: tuple[int, ...], rows: int) -> bool:
    """Whether a product of ``rows`` rows takes the form planned for the row counts ``counts`` (a count between two
    timed ones follows the lower one; outside ``ROWS``, never)."""
    if not ROWS[0] <= rows <= ROWS[-1]:
        return False
    return ROWS[bisect.bisect_right(ROWS, rows) - 1] in counts


def takes_packed(counts: tuple[int, ...], rows: int) -> bool:
    """``takes_form`` for the packed form, which also takes every count above the last timed one if it took that."""
    return takes_form(counts, rows) or (rows > ROWS[-1] and ROWS[-1] in counts)


def _linears(model: torch.nn.Module) -> list[torch.nn.Linear]:
    return [m for m in model.modules() if type(m) in (torch.nn.Linear, SmallRowsLinear)]


FORMS = ("F.linear", "transposed", "oneDNN packed")  # what a plan chooses between, per row count
PACK_MEMORY_SHARE = 0.25  # the packed copies (as large as the linear weights) must fit in this share of free memory


def plan_key(model: torch.nn.Module) -> str:
    """What a plan depends on: the machine (CPU, torch, threads), the forms and row counts timed, the weights'
    shapes and dtype."""
    return machine_cache.key("small_rows", list(FORMS), list(ROWS),
                             sorted({(tuple(m.weight.shape), str(m.weight.dtype)) for m in _linears(model)}))


_PLANS: dict[str, tuple[tuple[int, ...], tuple[int, ...]]] = {}


def _available_memory() -> int:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _packs(weights: list[torch.Tensor]) -> list[torch.Tensor] | None:
    """Packed copies of ``weights``, or None where oneDNN cannot pack them or their copies would not fit in
    ``PACK_MEMORY_SHARE`` of the free memory."""
    if not torch.backends.mkldnn.is_available():
        return None
    if sum(w.numel() * w.element_size() for w in weights) > PACK_MEMORY_SHARE * _available_memory():
        return None
    try:
        packed = [pack_weight(w) for w in weights]
        packed_linear(torch.zeros(2, weights[0].shape[1], dtype=weights[0].dtype), packed[0])
        return packed
    except RuntimeError:  # a dtype or CPU this torch's oneDNN does not pack for
        return None


@torch.no_grad()
def measure_small_rows(model: torch.nn.Module, repeats: int = 2) -> dict[int, tuple[float, float, float]]:
    """{rows: seconds with each of ``FORMS``} over all of ``model``'s linear weights, best of ``repeats``, the forms
    interleaved (a noisy machine slows them alike); inf for the packed form where it cannot run (``_packs``)."""
    weights = [m.weight for m in _linears(model)]
    packed = _packs(weights)
    forms = [lambda x, i: F.linear(x, weights[i]), lambda x, i: transposed_linear(x, weights[i])]
    if packed is not None:
        forms.append(lambda x, i: packed_linear(x, packed[i]))
    best: dict[int, list[float]] = {r: [float("inf")] * len(FORMS) for r in ROWS}
    for _ in range(repeats):
        for r in ROWS:
            xs = {w.shape[1]: torch.randn(r, w.shape[1], dtype=w.dtype) for w in weights}
            for form, fn in enumerate(forms):
                began = time.perf_counter()
                for i, w in enumerate(weights):
                    fn(xs[w.shape[1]], i)
                best[r][form] = min(best[r][form], time.perf_counter() - began)
    return {r: tuple(t) for r, t in best.items()}


def choose_forms(timings: dict[int, tuple]) -> tuple[list[int], list[int]]:
    """(counts that take the transposed form, counts that take the packed one): a form other than F.linear is
    chosen where it takes at most ``WIN`` of F.linear's time and is the fastest of the three."""
    transposed, packed = [], []
    for r, t in timings.items():
        stock, flipped = t[0], t[1]
        pack = t[2] if len(t) > 2 else float("inf")
        if min(flipped, pack) > WIN * stock:
            continue
        (packed if pack < flipped else transposed).append(int(r))
    return transposed, packed


def tune_small_rows(model: torch.nn.Module, cache_dir: Path | None = None) -> tuple[int, ...]:
    """Time the forms on ``model``'s weights (CPU only; memoised per process and in ``cache_dir`` when given),
    switch its ``nn.Linear`` modules to ``SmallRowsLinear`` with the row counts where each form won, and return
    the counts that take the transposed form (``packed_rows(model)``: those that take the packed one)."""
    linears = _linears(model)
    if not linears or linears[0].weight.device.type != "cpu":
        return ()
    key = plan_key(model)
    plan = _PLANS.get(key)
    if plan is None:
        def measure() -> dict:
            timings = measure_small_rows(model)
            transposed, packed = choose_forms(timings)
            return {"small_rows": transposed, "packed_rows": packed, "forms": list(FORMS), "seconds": timings}

        def read(kept: dict) -> tuple[tuple[int, ...], tuple[int, ...]]:
            return tuple(int(r) for r in kept["small_rows"]), tuple(int(r) for r in kept["packed_rows"])

        path = cache_dir / f"small_rows-{key}.json" if cache_dir is not None else None
        plan, _ = machine_cache.cached(path, measure, read)
    _PLANS[key] = plan
    small, packed = plan
    for m in linears:
        m.__class__ = SmallRowsLinear if small or packed else torch.nn.Linear
        m.small_rows, m.packed_rows = small, packed
        m.__dict__.pop("_packed", None)
    return small


def packed_rows(model: torch.nn.Module) -> tuple[int, ...]:
    """The row counts that take oneDNN's packed product in ``model`` (after ``tune_small_rows``)."""
    return next((m.packed_rows for m in model.modules() if isinstance(m, SmallRowsLinear)), ())
