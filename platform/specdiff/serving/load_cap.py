"""The vLLM app's load cap: how many requests at once speculation keeps up with vLLM plain, measured once per machine.

vLLM 0.32 has a per-batch-size schedule (``speculative_config.num_speculative_tokens_per_batch_size``; the app's
``speculation_max_batch``), but at K=0 it still runs the drafter's forward on every step to keep the drafter's KV
cache in sync (``vllm/v1/spec_decode/llm_base_proposer.py``: "The prefill forward pass above already ran"), so a
capped engine stays slower than plain under load (measured 0.69x at 16 requests, docs/vllm.md). The app therefore
deploys a plain engine beside the speculative one and its ingress sends a new request to the plain engine while
more than ``cap`` requests are in flight, or any is still on the plain engine (``LoadGate``): below the cap speculation runs as before, above it requests
take the plain engine. A request never moves between engines once started, so outputs stay exact either way.

``cap`` comes from ``jobs/bench_vllm.py --find-cap`` (vLLM plain and vLLM + the drafter side by side at 1, 2, 4 ...
requests at once; the crossover is the largest count up to which speculation kept up at every smaller count), kept
under ``$SPECDIFF_HOME/vllm-cap`` per machine, verifier, drafter, γ and dtype (``specdiff.runtime.machine_cache``).
Without a measurement the app uses ``FALLBACK_CAP``: speculation only for a request that is alone.
"""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

from specdiff.runtime import machine_cache

FALLBACK_CAP = 1  # no measurement on this machine: speculate only while one request is in flight


def cap_key(verifier_dir: Path, drafter_dir: Path, gamma: int, dtype: str) -> str:
    """The measurement's name: this machine (``machine_cache.machine``), the two models' folders, γ and the dtype."""
    return machine_cache.key("vllm-cap", 1, _folder_digest(verifier_dir), _folder_digest(drafter_dir), int(gamma),
                             str(dtype))


def cap_path(state: Path, verifier_dir: Path, drafter_dir: Path, gamma: int, dtype: str) -> Path:
    return Path(state) / "vllm-cap" / f"{cap_key(verifier_dir, drafter_dir, gamma, dtype)}.json"


def read_cap(path: Path) -> tuple[int, str]:
    """(cap, where it came from): the measured cap kept at ``path``, else ``FALLBACK_CAP``."""
    value = machine_cache.read_json(path)
    try:
        cap = int(value["cap"]) if value is not None else None
    except (KeyError, TypeError, ValueError):
        cap = None
    if cap is None or cap < 1:
        return FALLBACK_CAP, f"fallback {FALLBACK_CAP} (no measurement at {path}; run jobs/bench_vllm.py --find-cap)"
    return cap, f"measured ({path})"


def cap_from_throughput(throughput: dict[int, dict[str, float]], name: str, plain: str = "vllm_plain") -> int:
    """The largest measured count of requests at once up to which ``name`` was at least as fast as ``plain`` at
    every measured count; at least 1 (a request alone keeps speculating: the app's batch-1 speed is unchanged)."""
    cap = 0
    for n in sorted(throughput):
        if throughput[n][name] < throughput[n][plain]:
            break
        cap = n
    return max(1, cap)


class LoadGate:
    """Counts the requests in flight; ``enter()`` says whether a new one may speculate and must be paired with
    ``leave(speculated)``. A request speculates while at most ``cap`` are in flight (itself included) and none is on
    the plain engine: once load has sent requests there, new ones follow until it drains, so under sustained load the
    two engines do not run side by side (on one machine they share its cores)."""

    def __init__(self, cap: int):
        if cap < 1:
            raise ValueError(f"load cap must be >= 1, got {cap}")
        self.cap = cap
        self.ongoing = 0
        self.plain = 0  # of ``ongoing``, on the plain engine
        self.counts = {"speculative": 0, "plain": 0}
        self._lock = threading.Lock()

    def enter(self) -> bool:
        with self._lock:
            self.ongoing += 1
            speculate = self.ongoing <= self.cap and self.plain == 0
            self.plain += not speculate
            self.counts["speculative" if speculate else "plain"] += 1
            return speculate

    def leave(self, speculated: bool) -> None:
        with self._lock:
            self.ongoing -= 1
            self.plain -= not speculated


def _folder_digest(folder: Path) -> str:
    """Names and sizes of a folder's files (not modification times: a copied folder is the same model)."""
    folder = Path(folder)
    h = hashlib.sha256()
    for f in sorted(folder.iterdir()) if folder.is_dir() else ():
        if f.is_file():
            h.update(f"{f.name}:{f.stat().st_size}".encode())
    return h.hexdigest()[:16]
