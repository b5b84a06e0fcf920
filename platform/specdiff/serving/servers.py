"""The drafter and verifier replicas as plain classes, with the model injected (testable without Serve).

- ``DrafterServer``: stateless prefix -> marginals; ``propose_many`` runs a batch of calls (one forward per window
  size). The Serve deployment (``app.DrafterDeployment``) feeds it concurrent calls through ``serve.batch``.
- ``VerifierServer``: tree scoring over per-session KV caches, LRU-bounded by a session count and a memory budget.
  Each call carries the session's full token list, so a replica that lacks the session (evicted, restarted, or a
  new replica after a re-route) recomputes the prefix and stays exact.
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from ..drafter import Drafter
from ..tree import TokenTree
from ..verifier import HFVerifierSession, Verifier


def _build(obj, kind):
    """An injected object, or a zero-argument factory that builds it (deployments build models on the replica)."""
    return obj if hasattr(obj, kind) else obj()


class DrafterServer:
    def __init__(self, drafter: Drafter | Callable[[], Drafter]):
        self.drafter: Drafter = _build(drafter, "propose_batch")
        self.vocab_size = self.drafter.vocab_size
        self.batch_sizes: list[int] = []  # recent batch sizes (observability and tests)
        self.pair: str | None = None  # the registered drafter version served, when it comes from the registry

    def swap(self, drafter: Drafter, pair: str | None = None) -> None:
        """Serve ``drafter`` from the next call on (a promoted pair); calls already running finish on the old one.
        The vocabulary is the router's contract and must not change."""
        if drafter.vocab_size != self.vocab_size:
            raise ValueError(f"drafter vocab_size must stay {self.vocab_size} across a swap, got {drafter.vocab_size}")
        self.drafter, self.pair = drafter, pair

    async def propose(self, prefix: list[int], gamma: int) -> torch.Tensor:
        """Marginals [gamma, V] for one prefix (unbatched; the deployment batches)."""
        return (await asyncio.to_thread(self.propose_many, [prefix], [gamma]))[0]

    def propose_many(self, prefixes: Sequence[Sequence[int]], gammas: Sequence[int]) -> list[torch.Tensor]:
        """One forward per distinct gamma among the batched calls."""
        self.batch_sizes = (self.batch_sizes + [len(prefixes)])[-1000:]
        out: list[torch.Tensor | None] = [None] * len(prefixes)
        for gamma in sorted(set(gammas)):
            rows = [i for i, g in enumerate(gammas) if g == gamma]
            marginals = self.drafter.propose_batch([prefixes[i] for i in rows], gamma)  # [B, gamma, V]
            for i, m in zip(rows, marginals):
                out[i] = m.clone()
        return out

    def info(self) -> dict:
        return {"vocab_size": self.vocab_size, "pair": self.pair}


@dataclass
class _Entry:
    session: HFVerifierSession
    scored: bool  # a tree was scored and awaits its commit
    nbytes: int
    generation: int = 0  # the verifier model it was built on (``VerifierServer.swap`` counts them)


def _cache_bytes(session) -> int:
    cache = getattr(session, "cache", None)
    if cache is None:
        return 0
    return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values) if t is not None)


class VerifierServer:
    def __init__(
        self,
        verifier: Verifier | Callable[[], Verifier],
        *,
        max_sessions: int = 256,
        kv_cache_budget_mb: float = 2048,
    ):
        self.verifier: Verifier = _build(verifier, "start")
        self.max_sessions = max_sessions
        self.budget_bytes = int(kv_cache_budget_mb * 2**20)
        self._sessions: OrderedDict[str, _Entry] = OrderedDict()  # least recently used first
        self._busy: dict[str, list[int]] = {}  # session id -> [calls in flight, tokens]: live, out of the LRU
        self._closed: set[str] = set()  # closed while a call was in flight: that call must not put it back
        self._lock = threading.Lock()  # score() runs in Serve's thread pool
        self.counts = {"hits": 0, "misses": 0, "evictions": 0}
        self.pair: str | None = None  # the registered pair served, when it comes from the registry
        self.generation = 0

    def info(self) -> dict:
        return {"vocab_size": self.verifier.vocab_size, "max_context": self.verifier.max_context, "pair": self.pair}

    def swap(self, verifier: Verifier, pair: str | None = None) -> None:
        """Score with ``verifier`` from now on (a promoted pair). Every KV cache belongs to the old model, so all
        sessions are dropped; their next call recomputes its prefix on the new verifier."""
        if verifier.vocab_size != self.verifier.vocab_size:
            raise ValueError(f"verifier vocab_size must stay {self.verifier.vocab_size} across a swap, got "
                             f"{verifier.vocab_size}")
        with self._lock:
            self.verifier, self.pair = verifier, pair
            self.generation += 1
            self._sessions.clear()

    def score(
        self,
        session_id: str,
        tokens: list[int],
        commit: tuple[list[int], int] | None,
        tree: TokenTree,
    ) -> torch.Tensor:
        """Log-probs [N+1, V] at every node of ``tree`` after the session's ``tokens``.

        ``commit`` = (path, next_token) settles the tree this session scored last; ``tokens`` is the state after it.
        The session is taken out of the LRU while in use, so an overlapping retry builds its own and cannot corrupt
        this one.
        """
        with self._lock:
            entry = self._sessions.pop(session_id, None)
            busy = self._busy.setdefault(session_id, [0, len(tokens)])
            busy[0] += 1
        keep = False
        try:
            if entry is not None and entry.scored and commit is not None:
                entry.session.commit(commit[0], commit[1])
                entry.scored = False
            if entry is None or entry.scored or entry.session.tokens != tokens or entry.generation != self.generation:
                # Miss (never seen, evicted, this replica lost track, or a swap replaced the model): recompute.
                self.counts["misses"] += 1
                entry = _Entry(self.verifier.start(tokens), scored=False, nbytes=0, generation=self.generation)
            else:
                self.counts["hits"] += 1
            logp = entry.session.score(tree)
            entry.scored = True
            entry.nbytes = _cache_bytes(entry.session)
            keep = True
            return logp
        finally:
            with self._lock:
                busy[0] -= 1
                if busy[0] == 0:
                    del self._busy[session_id]
                closed = session_id in self._closed
                if closed and busy[0] == 0:
                    self._closed.discard(session_id)
                # A failed call, a session scored across a swap, or one closed meanwhile is not kept.
                if keep and not closed and entry.generation == self.generation:
                    self._sessions[session_id] = entry
                    self._evict()

    def _evict(self) -> None:
        total = sum(e.nbytes for e in self._sessions.values())
        while self._sessions and (len(self._sessions) > self.max_sessions or total > self.budget_bytes):
            if len(self._sessions) == 1 and len(self._sessions) <= self.max_sessions:
                break  # one session over budget is kept: evicting it would only force a recompute next round
            _, entry = self._sessions.popitem(last=False)
            total -= entry.nbytes
            self.counts["evictions"] += 1

    def close(self, session_id: str) -> bool:
        """Free a session's KV cache (the request finished or its client went away)."""
        with self._lock:
            found = self._sessions.pop(session_id, None) is not None
            if session_id in self._busy and session_id not in self._closed:  # its call in flight drops it at the end
                self._closed.add(session_id)
                found = True
            return found

    def sessions(self) -> dict[str, int]:
        """Live sessions -> tokens held (observability and tests), including those in the middle of a call."""
        with self._lock:
            live = {sid: len(e.session.tokens) for sid, e in self._sessions.items()}
            live.update({sid: b[1] for sid, b in self._busy.items() if sid not in self._closed})
            return live

    def cache_stats(self) -> dict:
        with self._lock:
            return {**self.counts, "sessions": len(self._sessions), "bytes": sum(e.nbytes for e in self._sessions.values())}
