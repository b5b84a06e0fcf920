"""Measurements that hold for one machine and one model shape, kept on disk so later processes skip them.

Two things are measured rather than assumed on a CPU: which form a few-row linear product takes (``kernels``) and
what a drafter call and a verifier pass cost (``policy.calibrate``). Both depend on the CPU, the torch build, the
thread count and the shapes and dtypes of the weights, never on the weights' values; both are cheap to redo and
wrong to reuse on another machine. ``key`` hashes exactly those facts (plus whatever the caller adds), and
``read_json`` / ``write_json`` keep one small JSON file per key, written atomically so two processes starting at
once never read half a file. A read-only or missing folder only means measuring again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
from pathlib import Path
from typing import Any, Callable, TypeVar

import torch

from specdiff.runtime.publish import write_text

T = TypeVar("T")


@functools.lru_cache(maxsize=None)
def cpuinfo_value(*keys: str) -> str:
    """The value of the first /proc/cpuinfo line whose key is one of ``keys`` ("" where the file or the key is
    missing, e.g. macOS)."""
    path = Path("/proc/cpuinfo")
    if not path.is_file():
        return ""
    for line in path.read_text(errors="replace").splitlines():
        key, _, value = line.partition(":")
        if key.strip() in keys:
            return value.strip()
    return ""


def machine() -> list:
    """The facts a CPU measurement depends on besides the model: processor, torch build, threads, SIMD level."""
    return [platform.processor() or platform.machine(), cpuinfo_value("model name"), torch.__version__,
            torch.get_num_threads(), torch.backends.cpu.get_cpu_capability()]


def shapes(*objects: Any, depth: int = 2) -> list:
    """Sorted (shape, dtype) of the tensors of ``objects``: modules (their parameters and buffers), tensors, and
    the modules and tensors found among a plain object's attributes, ``depth`` wrappers deep (a drafter holding an
    ``HFModel`` holding the module)."""
    seen: set[tuple] = set()
    visited: set[int] = set()

    def add(x: Any, depth: int) -> None:
        if id(x) in visited:
            return
        visited.add(id(x))
        if isinstance(x, torch.nn.Module):
            for t in (*x.parameters(), *x.buffers()):
                seen.add((tuple(t.shape), str(t.dtype)))
        elif isinstance(x, torch.Tensor):
            seen.add((tuple(x.shape), str(x.dtype)))
        elif depth > 0 and hasattr(x, "__dict__") and not isinstance(x, type):
            for value in vars(x).values():
                add(value, depth - 1)

    for obj in objects:
        add(obj, depth)
    return sorted(seen)


def key(*parts: Any) -> str:
    """16 hex digits naming a measurement: the machine (``machine``) and ``parts`` (JSON-able)."""
    text = json.dumps([machine(), *parts], default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def read_json(path: Path | None) -> dict | None:
    """The JSON object at ``path``; None when there is none or it cannot be read."""
    if path is None:
        return None
    try:
        value = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def write_json(path: Path | None, value: dict) -> bool:
    """Write ``value`` to ``path`` atomically (a temporary file beside it, then a rename). False when the folder
    cannot be written (the caller measures again next time)."""
    if path is None:
        return False
    try:
        write_text(path, json.dumps(value))
        return True
    except OSError:
        return False


def cached(path: Path | None, measure: Callable[[], dict], parse: Callable[[dict], T], *,
           refresh: bool = False) -> tuple[T, bool]:
    """(``parse`` of the value kept at ``path``, False); or, when there is none, it cannot be read or parsed (a
    damaged file, another version's layout) or ``refresh``: (``parse(measure())``, True), written there first."""
    if not refresh:
        value = read_json(path)
        if value is not None:
            try:
                return parse(value), False
            except (KeyError, IndexError, TypeError, ValueError):
                pass
    value = measure()
    write_json(path, value)
    return parse(value), True
