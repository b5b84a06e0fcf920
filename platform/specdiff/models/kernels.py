"""Few-row linear layers on a CPU: pick, by measurement on this machine, the faster of two equal products.

A verifier step multiplies every weight matrix by a handful of rows: one (a plain step) or 1 + γK (a tree pass).
Measured on a 2-core AMD EPYC with AVX2 only (torch 2.13, MKL, float32, two threads, SmolLM2-135M's weights
streamed as in a forward): ``x @ W.T`` (``F.linear``) took 40 ms over all matrices at one row and 70-87 ms at 2-5
rows, while the same product computed as ``(W @ x.T).T`` took 26-33 ms at 2-5 rows (2.5x less) and 51 against
81 ms at 9 rows; at 13 rows and more the two were equal or ``F.linear`` won there, while on a 2-core AMD EPYC
with AVX-512 the transposed form won up to 96 rows (a 16-session batch step's products: 59 against 82 ms). A
one-row product padded to two rows took the transposed path too (a plain decoding step: 63 -> 52 ms, the whole
forward). Other CPUs, BLAS builds and dtypes differ (bf16 goes through oneDNN), so nothing is assumed:
``tune_small_rows`` times both forms on the model's own weights for the row counts of ``ROWS`` (about 4 s on the
AVX-512 machine, once) and switches only the counts where the transposed form wins; the plan is memoised per
process and, given a folder, on disk.

The two forms compute the same sums in another order: results differ in the last bits, as they do between any two
BLAS kernels (a one-row GEMV and a nine-row GEMM already do).
"""

from __future__ import annotations

import bisect
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from specdiff.runtime import machine_cache
# Row counts timed: a decoding step or tree pass (1-12) and a batch step of many sessions' rows (16-96; a replica's
# continuous batching, ``specdiff.models.batched``). A count between two timed ones follows the lower one; above
# the last, F.linear (where the two forms were level on every machine measured).
ROWS = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96)
WIN = 0.9  # the transposed form must take at most this fraction of F.linear's time


class SmallRowsLinear(torch.nn.Linear):
    """``nn.Linear`` whose forward takes the transposed product for the row counts in ``small_rows``."""

    small_rows: tuple[int, ...] = ()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return planned_linear(x, self.weight, self.bias, self.small_rows)


def planned_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   small_rows: tuple[int, ...]) -> torch.Tensor:
    """``F.linear(x, weight, bias)``, as the transposed product where the plan ``small_rows`` says so and no
    gradients are wanted (training always takes ``F.linear``)."""
    rows = x.numel() // x.shape[-1] if x.shape[-1] else 0
    if not takes_transposed(small_rows, rows) or torch.is_grad_enabled():
        return F.linear(x, weight, bias)
    out = transposed_linear(x.reshape(rows, x.shape[-1]), weight, bias)
    return out.reshape(*x.shape[:-1], out.shape[-1])


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


def takes_transposed(small_rows: tuple[int, ...], rows: int) -> bool:
    """Whether a product of ``rows`` rows takes the transposed form under the plan ``small_rows``."""
    if not ROWS[0] <= rows <= ROWS[-1]:
        return False
    return ROWS[bisect.bisect_right(ROWS, rows) - 1] in small_rows


def _linears(model: torch.nn.Module) -> list[torch.nn.Linear]:
    return [m for m in model.modules() if type(m) in (torch.nn.Linear, SmallRowsLinear)]


def plan_key(model: torch.nn.Module) -> str:
    """What a plan depends on: the machine (CPU, torch, threads), the row counts timed, the weights' shapes and
    dtype."""
    return machine_cache.key("small_rows", list(ROWS), sorted({(tuple(m.weight.shape), str(m.weight.dtype))
                                                               for m in _linears(model)}))


_PLANS: dict[str, tuple[int, ...]] = {}


@torch.no_grad()
def measure_small_rows(model: torch.nn.Module, repeats: int = 2) -> dict[int, tuple[float, float]]:
    """{rows: (seconds with F.linear, seconds transposed)} over all of ``model``'s linear weights, best of
    ``repeats``, the two forms interleaved (a noisy machine slows both alike)."""
    weights = [m.weight for m in _linears(model)]
    best: dict[int, list[float]] = {r: [float("inf"), float("inf")] for r in ROWS}
    for _ in range(repeats):
        for r in ROWS:
            xs = {w.shape[1]: torch.randn(r, w.shape[1], dtype=w.dtype) for w in weights}
            for form, fn in enumerate((F.linear, transposed_linear)):
                began = time.perf_counter()
                for w in weights:
                    fn(xs[w.shape[1]], w)
                best[r][form] = min(best[r][form], time.perf_counter() - began)
    return {r: (a, b) for r, (a, b) in best.items()}


def tune_small_rows(model: torch.nn.Module, cache_dir: Path | None = None) -> tuple[int, ...]:
    """Time both forms on ``model``'s weights (CPU only; memoised per process and in ``cache_dir`` when given),
    switch its ``nn.Linear`` modules to ``SmallRowsLinear`` with the row counts where the transposed form won, and
    return those counts (empty: nothing changes)."""
    linears = _linears(model)
    if not linears or linears[0].weight.device.type != "cpu":
        return ()
    key = plan_key(model)
    plan = _PLANS.get(key)
    if plan is None:
        def measure() -> dict:
            timings = measure_small_rows(model)
            won = [r for r, (stock, transposed) in timings.items() if transposed <= WIN * stock]
            return {"small_rows": won, "seconds": timings}

        path = cache_dir / f"small_rows-{key}.json" if cache_dir is not None else None
        plan, _ = machine_cache.cached(path, measure, lambda kept: tuple(int(r) for r in kept["small_rows"]))
    _PLANS[key] = plan
    for m in linears:
        m.__class__ = SmallRowsLinear if plan else torch.nn.Linear
        m.small_rows = plan
    return plan
