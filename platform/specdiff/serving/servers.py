"""The drafter and verifier replicas as plain classes, with the model injected (testable without Serve).

Each replica runs its half of a round where its probabilities live (``specdiff.core.rounds``), so only token ids travel:

- ``DrafterServer``: ``draft_many``: prefix -> marginals -> K candidates [K, gamma] sampled here from the round's
  drafting stream; concurrent calls batched (one forward per window size) by the Serve deployment
  (``app.DrafterDeployment``, ``serve.batch``). A standalone drafter is stateless. A feature drafter
  (``needs_features``) keeps one draft cache per session (the context's keys/values, LRU-bounded like the
  verifier's): each call brings only the feature rows the replica lacks; a replica without them answers
  ``NeedFeatures`` and the router sends the whole prefix's rows (docs/serve.md). ``propose*`` return the marginals.
- ``VerifierServer``: ``verify``: trie, scores, self-selection, acceptance and commit over per-session KV caches
  (LRU-bounded by a session count and a memory budget); returns the emitted tokens. Calls carry the session's
  length and digest (``TokenSync``); a replica that lacks the session at that state (evicted, restarted, a new
  replica after a re-route) answers ``NeedTokens`` and is sent the tokens once, recomputes the prefix and stays
  exact. A verifier with tap layers also returns the committed nodes' tapped features (from the scoring pass) and
  keeps every committed token's, so a drafter replica that lost a session can be given the whole prefix's rows
  again (``features``).
- ``DecodeServer`` (``colocate=true``): both models on one replica, which runs whole decodes with the in-process
  engine (``SpeculativeDecoder`` / ``stream_plain``, the same code and the same draws as a local decode) and streams
  each round's tokens back: no call per round, so a served decode runs at the in-process speed. The router keeps
  the stop strings and resumes a decode on another replica when its replica dies (``remote.remote_decode``).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import AsyncIterator, Callable, Iterator, Sequence

import torch

from specdiff.core import rounds
from specdiff.core.config import DecodeOptions, SamplingParams, SpecConfig
from specdiff.models.drafter import Drafter
from specdiff.core.engine import SpeculativeDecoder, stream_plain
from specdiff.core.policy import SpeculationCosts
from specdiff.core.stats import DecodeStats
from specdiff.core.tree import TokenTree
from specdiff.models.verifier import HFVerifierSession, Verifier
from specdiff.serving.aio import iterate_in_thread
from specdiff.serving.wire import (FeatureRows, NeedFeatures, NeedTokens, TokenSync, room_error, room_needed,
                                   token_digest)


def _build(obj, kind):
    """An injected object, or a zero-argument factory that builds it (deployments build models on the replica)."""
    return obj if hasattr(obj, kind) else obj()


@dataclass
class _Draft:
    kv: list | None  # per draft layer (keys, values) [1, kv_heads, n, head_dim]; None: no context yet
    n: int  # context rows held
    nbytes: int = 0


class DrafterServer:
    def __init__(self, drafter: Drafter | Callable[[], Drafter], *, max_sessions: int = 256,
                 cache_budget_mb: float = 512):
        self.drafter: Drafter = _build(drafter, "propose_batch")
        self.vocab_size = self.drafter.vocab_size
        self.needs_features = bool(getattr(self.drafter, "needs_features", False))
        self.batch_sizes: list[int] = []  # recent batch sizes (observability and tests)
        self.pair: str | None = None  # the registered drafter version served, when it comes from the registry
        self.max_sessions = max_sessions
        self.budget_bytes = int(cache_budget_mb * 2**20)
        self._drafts: OrderedDict[str, _Draft] = OrderedDict()  # feature drafter: session -> draft cache, LRU first
        self._lock = threading.Lock()
        self.counts = {"hits": 0, "new": 0, "misses": 0, "evictions": 0, "feature_bytes": 0}

    @property
    def tap_layers(self) -> tuple[int, ...] | None:
        return tuple(self.drafter.tap_layers) if self.needs_features else None

    def swap(self, drafter: Drafter, pair: str | None = None) -> None:
        """Serve ``drafter`` from the next call on (a promoted pair); calls already running finish on the old one.
        The vocabulary and the tap layers are the router's contract and must not change; draft caches are
        dropped (they belong to the old model)."""
        if drafter.vocab_size != self.vocab_size:
            raise ValueError(f"drafter vocab_size must stay {self.vocab_size} across a swap, got {drafter.vocab_size}")
        taps = tuple(drafter.tap_layers) if getattr(drafter, "needs_features", False) else None
        if taps != self.tap_layers:
            raise ValueError(f"drafter tap layers must stay {self.tap_layers} across a swap, got {taps}")
        with self._lock:
            self.drafter, self.pair = drafter, pair
            self._drafts.clear()

    async def propose(self, prefix: list[int], gamma: int) -> torch.Tensor:
        """Marginals [gamma, V] for one prefix (unbatched; the deployment batches)."""
        return (await asyncio.to_thread(self.propose_many, [prefix], [gamma]))[0]

    def propose_many(self, prefixes: Sequence[Sequence[int]], gammas: Sequence[int]) -> list[torch.Tensor]:
        """One forward per distinct gamma among the batched calls."""
        if self.needs_features:
            raise ValueError("this drafter is a feature drafter: call propose_features (the router does)")
        self.batch_sizes = (self.batch_sizes + [len(prefixes)])[-1000:]
        out: list[torch.Tensor | None] = [None] * len(prefixes)
        for gamma in sorted(set(gammas)):
            rows = [i for i, g in enumerate(gammas) if g == gamma]
            marginals = self.drafter.propose_batch([prefixes[i] for i in rows], gamma)  # [B, gamma, V]
            for i, m in zip(rows, marginals):
                out[i] = m.clone()
        return out

    def draft(self, prefix: list[int], spec: SpecConfig, seed: int) -> rounds.Draft:
        """One round's drafting half (unbatched; the deployment batches)."""
        return self.draft_many([prefix], [spec], [seed])[0]

    def draft_features(self, session_id: str | None, anchor: int, n: int, rows: FeatureRows | None,
                       spec: SpecConfig, seed: int) -> rounds.Draft | NeedFeatures:
        """``draft`` for a feature drafter (``propose_features``' session, anchor, position and rows)."""
        return self.draft_features_many([session_id], [anchor], [n], [rows], [spec], [seed])[0]

    def draft_many(self, prefixes: Sequence[Sequence[int]], specs: Sequence[SpecConfig],
                   seeds: Sequence[int]) -> list[rounds.Draft]:
        """The drafting half of a batch of rounds: marginals (one forward per window size), then each call's K
        candidates sampled here from its own round stream (``seeds``); only the candidates leave the replica."""
        marginals = self.propose_many(prefixes, [s.gamma for s in specs])
        return [rounds.draft(m, s, rounds.round_generator(seed)) for m, s, seed in zip(marginals, specs, seeds)]

    def draft_features_many(self, session_ids, anchors, ns, rows, specs, seeds) -> list[rounds.Draft | NeedFeatures]:
        """``draft_many`` for a feature drafter (``propose_features_many``'s arguments, windows from ``specs``)."""
        out = self.propose_features_many(session_ids, anchors, ns, [s.gamma for s in specs], rows)
        return [m if isinstance(m, NeedFeatures) else rounds.draft(m, s, rounds.round_generator(seed))
                for m, s, seed in zip(out, specs, seeds)]

    def propose_features(self, session_id: str | None, anchor: int, n: int, gamma: int,
                         rows: FeatureRows | None) -> torch.Tensor | NeedFeatures:
        """Marginals [gamma, V] for the window after the pending token ``anchor`` at position ``n``, reading the
        session's context rows 0..n-1: those held in its draft cache plus ``rows`` (None: nothing new). Without
        the rows before ``rows.start``, answers ``NeedFeatures(have)``. ``session_id`` None: no cache (the rows must
        start at 0)."""
        return self.propose_features_many([session_id], [anchor], [n], [gamma], [rows])[0]

    def propose_features_many(self, session_ids, anchors, ns, gammas, rows) -> list[torch.Tensor | NeedFeatures]:
        """A batch of feature calls, one window each (contexts differ in length; each extends its own cache)."""
        if not self.needs_features:
            raise ValueError("this drafter reads no verifier features: call propose")
        self.batch_sizes = (self.batch_sizes + [len(session_ids)])[-1000:]
        with self._lock:  # one batch at a time: a session's cache is never extended twice at once
            drafter = self.drafter
            out = [self._one(drafter, *call) for call in zip(session_ids, anchors, ns, gammas, rows)]
            self._evict()
            return out

    def _one(self, drafter, session_id, anchor, n, gamma, rows) -> torch.Tensor | NeedFeatures:
        entry = self._drafts.pop(session_id, None) if session_id is not None else None
        have = entry.n if entry is not None else 0
        start, stop = (rows.start, rows.stop) if rows is not None else (n, n)
        if stop != n:
            raise ValueError(f"feature rows must end at the anchor's position {n}, got rows {start}..{stop - 1}")
        if have < start or have > n:
            # A new replica, an evicted session, or rows this replica never got: the router sends them again.
            self.counts["misses"] += 1
            if entry is not None and have < start:
                self._drafts[session_id] = entry  # still valid: the missing rows will be appended to it
            return NeedFeatures(have if have <= n else 0)
        self.counts["hits" if entry is not None else "new"] += 1
        kv = entry.kv if entry is not None else None
        if have < stop:
            fresh = rows.decode()[have - start:]
            self.counts["feature_bytes"] += rows.nbytes
            kv = drafter.extend_context(kv, fresh, have)
        marginals = drafter.window(anchor, n, gamma, kv)  # [gamma, V]
        if session_id is not None:
            nbytes = sum(k.numel() * k.element_size() * 2 for k, _ in kv) if kv else 0
            self._drafts[session_id] = _Draft(kv, n, nbytes)
        return marginals

    def _evict(self) -> None:
        total = sum(d.nbytes for d in self._drafts.values())
        while len(self._drafts) > 1 and (len(self._drafts) > self.max_sessions or total > self.budget_bytes):
            _, entry = self._drafts.popitem(last=False)
            total -= entry.nbytes
            self.counts["evictions"] += 1

    def close(self, session_id: str) -> bool:
        """Free a session's draft cache (its request finished)."""
        with self._lock:
            return self._drafts.pop(session_id, None) is not None

    def sessions(self) -> dict[str, int]:
        """Live draft caches -> context rows held (observability and tests)."""
        with self._lock:
            return {sid: d.n for sid, d in self._drafts.items()}

    def cache_stats(self) -> dict:
        with self._lock:
            return {**self.counts, "sessions": len(self._drafts), "bytes": sum(d.nbytes for d in self._drafts.values())}

    def info(self) -> dict:
        return {"vocab_size": self.vocab_size, "pair": self.pair, "tap_layers": self.tap_layers}


@dataclass(frozen=True)
class Advanced:
    """A verifier call's answer: the round's (or plain steps') ``Outcome``; the committed tokens' tapped features
    (None without tap layers); and the replica's ``load`` (sessions decoding on it), which gates speculation."""

    outcome: rounds.Outcome
    rows: FeatureRows | None
    load: int


@dataclass
class _Entry:
    session: HFVerifierSession
    scored: bool  # a tree was scored and awaits its commit
    nbytes: int
    generation: int = 0  # the verifier model it was built on (``VerifierServer.swap`` counts them)


def _cache_bytes(session) -> int:
    """KV cache plus kept features."""
    cache = getattr(session, "cache", None)
    features = getattr(session, "features", None)
    total = features.numel() * features.element_size() if features is not None else 0
    if cache is None:
        return total
    return total + sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values)
                       if t is not None)


class VerifierServer:
    def __init__(
        self,
        verifier: Verifier | Callable[[], Verifier],
        *,
        max_sessions: int = 256,
        kv_cache_budget_mb: float = 2048,
        feature_dtype: str = "float16",
        load_window_s: float = 1.0,
        batching: bool = False,
    ):
        self.batching = batching
        self.verifier: Verifier = self._batched(_build(verifier, "start"))
        self.load_window_s = load_window_s
        self._seen: dict[str, float] = {}  # session id -> when its last call began (``load``)
        self.feature_dtype = feature_dtype  # of the tapped features sent back (specdiff.serving.wire)
        self.max_sessions = max_sessions
        self.budget_bytes = int(kv_cache_budget_mb * 2**20)
        self._sessions: OrderedDict[str, _Entry] = OrderedDict()  # least recently used first
        self._busy: dict[str, list[int]] = {}  # session id -> [calls in flight, tokens]: live, out of the LRU
        self._closed: set[str] = set()  # closed while a call was in flight: that call must not put it back
        self._lock = threading.Lock()  # score() runs in Serve's thread pool
        self.counts = {"hits": 0, "misses": 0, "evictions": 0}
        self.pair: str | None = None  # the registered pair served, when it comes from the registry
        self.generation = 0

    def _batched(self, verifier: Verifier) -> Verifier:
        """``batching``: concurrent calls' passes share batch steps (``specdiff.models.batched``, per call: a pass
        that finds no step running starts one; those arriving meanwhile share the next). The lean forward only."""
        from specdiff.models.batched import batched

        return batched(verifier, per_call=True) if self.batching else verifier

    def info(self) -> dict:
        return {"vocab_size": self.verifier.vocab_size, "max_context": self.verifier.max_context, "pair": self.pair,
                "tap_layers": getattr(self.verifier, "tap_layers", None),
                "batching": hasattr(self.verifier, "batcher")}

    def swap(self, verifier: Verifier, pair: str | None = None) -> None:
        """Score with ``verifier`` from now on (a promoted pair). Every KV cache belongs to the old model, so all
        sessions are dropped; their next call recomputes its prefix on the new verifier."""
        verifier = self._batched(verifier)
        if verifier.vocab_size != self.verifier.vocab_size:
            raise ValueError(f"verifier vocab_size must stay {self.verifier.vocab_size} across a swap, got "
                             f"{verifier.vocab_size}")
        taps, new_taps = getattr(self.verifier, "tap_layers", None), getattr(verifier, "tap_layers", None)
        if taps != new_taps:
            raise ValueError(f"verifier tap layers must stay {taps} across a swap, got {new_taps}")
        with self._lock:
            self.verifier, self.pair = verifier, pair
            self.generation += 1
            self._sessions.clear()

    def verify(self, session_id: str, sync: TokenSync, draft: rounds.Draft | None, sampling: SamplingParams,
               spec: SpecConfig | None, seed: int) -> Advanced | NeedTokens:
        """The verifying half of a round on the session at ``sync`` (``draft`` None: a plain step): trie, scores,
        self-selection, acceptance and commit all run here, from the round stream ``seed``. Returns what the router
        needs: the emitted tokens (``Outcome``) and, with tap layers, the committed nodes' features (root + accepted
        nodes, the feature drafter's next rows); or ``NeedTokens`` when this replica lacks the session at ``sync``.
        A retried call finds the session advanced, asks for the tokens, rebuilds and draws the same numbers again."""
        return self._advance(session_id, sync, lambda session: rounds.verify(
            session, draft, sampling, spec, rounds.round_generator(seed)))

    def steps(self, session_id: str, sync: TokenSync, sampling: SamplingParams, seeds: list[int],
              stop_ids: list[int]) -> Advanced | NeedTokens:
        """A run of plain steps in one call (``rounds.plain_steps``: one per seed, ending after a stop token): what
        ``verify`` with no draft returns for each, merged; the committed tokens' features with tap layers."""
        return self._advance(session_id, sync, lambda session: rounds.plain_steps(session, sampling, seeds, stop_ids))

    def _advance(self, session_id: str, sync: TokenSync, run) -> Advanced | NeedTokens:
        """``run(session)`` on the session at ``sync`` (it commits what it emits) -> its ``Outcome``, with tap
        layers the features of every token it committed, from the old pending token (the root) on, and this
        replica's ``load``."""
        with self._session(session_id, sync) as entry:
            if entry is None:
                return NeedTokens()
            start = len(entry.session.tokens) - 1  # the root's position
            out = run(entry.session)
            rows = None
            if entry.session.features is not None:
                rows = FeatureRows.encode(entry.session.features[start:], start, self.feature_dtype)
        return Advanced(out, rows, self.load())

    def load(self) -> int:
        """Sessions decoding on this replica now: those with a call in flight or begun within ``load_window_s``
        (a decode calls every round; the gap between its calls is a round trip). The router turns speculation off
        for a decode whose replica is busier than ``router.speculation_max_load`` (``docs/serve.md``)."""
        now = time.monotonic()
        with self._lock:
            for sid in [sid for sid, t in self._seen.items() if now - t > self.load_window_s
                        and sid not in self._busy]:
                del self._seen[sid]
            return len(self._seen)

    def score(self, session_id: str, tokens: list[int], commit: tuple[list[int], int] | None,
              tree: TokenTree) -> torch.Tensor:
        """Log-probs [N+1, V] at every node of ``tree`` after the session's ``tokens``: the whole distribution,
        for callers that select and accept themselves (not the router, which calls ``verify``). ``commit`` =
        (path, next_token) settles the tree this session scored last; ``tokens`` is the state after it."""
        with self._session(session_id, TokenSync.of(tokens, full=True), commit) as entry:
            logp = entry.session.score(tree)
            entry.scored = True
            return logp

    def features(self, session_id: str, sync: TokenSync, start: int) -> FeatureRows | NeedTokens:
        """The session's features of tokens ``start .. n - 2`` (all committed tokens but the pending one): what a
        drafter replica that lost the session needs. A replica without the session asks for the tokens and
        prefills it (the prefill the next ``verify`` would do anyway)."""
        with self._session(session_id, sync) as entry:
            if entry is None:
                return NeedTokens()
            if entry.session.features is None:
                raise ValueError("this verifier taps no layers, so it has no features (the drafter is not a "
                                 "feature drafter)")
            return FeatureRows.encode(entry.session.features[start:], start, self.feature_dtype)

    @contextlib.contextmanager
    def _session(self, session_id: str, sync: TokenSync, commit: tuple[list[int], int] | None = None):
        """The session's entry at state ``sync`` (after applying ``commit``), rebuilt from ``sync.tokens`` on a
        miss, None on a miss without tokens; out of the LRU while in use, put back after a call that did not
        fail."""
        with self._lock:
            self._seen[session_id] = time.monotonic()
            entry = self._sessions.pop(session_id, None)
            busy = self._busy.setdefault(session_id, [0, sync.n])
            busy[0] += 1
        keep = False
        try:
            if entry is not None and entry.scored and commit is not None:
                entry.session.commit(commit[0], commit[1])
                entry.scored = False
            if (entry is None or entry.scored or entry.generation != self.generation
                    or len(entry.session.tokens) != sync.n or token_digest(entry.session.tokens) != sync.digest):
                # Miss (never seen, evicted, this replica lost track, or a swap replaced the model): recompute.
                self.counts["misses"] += 1
                if sync.tokens is None:
                    yield None
                    return
                entry = _Entry(self.verifier.start(sync.tokens), scored=False, nbytes=0, generation=self.generation)
            else:
                self.counts["hits"] += 1
            yield entry
            entry.nbytes = _cache_bytes(entry.session)
            keep = True
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
            self._seen.pop(session_id, None)
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


class DecodeServer:
    """Verifier and drafter on one replica, whole decodes run here (``colocate=true``; docs/serve.md).

    ``decode`` is an async generator over ``(tokens, stats)``: each round's emitted tokens and a snapshot of the
    decode's ``DecodeStats``. It runs ``SpeculativeDecoder.stream`` (``speculative``) or ``stream_plain`` over the
    local pair in a worker thread, one per decode in flight.

    ``batching`` (the default): the decodes in flight share batch steps (``specdiff.models.batched``): every
    session's next verifier pass (prefill, plain step or speculative tree) runs in one forward per step, so a replica
    serving 16 requests pays about one pass per step instead of 16. Each decode's adaptive policy then weighs its
    choice against the step it joins (``load_view``): a tree's extra rows cost every session of a full step, so under
    load the policy takes plain steps or small trees, alone it speculates as before. The cost model is measured once
    per replica on the unbatched verifier (``warm_costs``: the Serve app's replica does it at start, before it takes
    traffic; else before the replica's first adaptive decode), and kept in ``costs_cache``
    (a folder; the Serve app's: ``$SPECDIFF_HOME/costs``) for later replicas on the same machine and models: measuring
    held every other decode of a busy replica for about 1.7 s (AVX-512 EPYC, 16 requests at once).
    ``max_load``: speculate only while at most that many decodes run on this replica (the router's
    ``speculation_max_load``)."""

    def __init__(self, pair: tuple[Verifier, Drafter] | Callable[[], tuple[Verifier, Drafter]], *,
                 max_decodes: int = 256, batching: bool = True, max_batch_rows: int = 4096,
                 batch_wait_s: float = 0.003, costs_cache: Path | None = None, kv_budget_mb: float | None = None):
        self.verifier, self.drafter = pair if isinstance(pair, tuple) else pair()
        self._check(self.verifier, self.drafter)
        self.kv_budget_mb = kv_budget_mb
        self.token_bytes = _token_bytes(self.verifier) if kv_budget_mb is not None else None
        self._needs: list[int] = []  # tokens of room of each decode admitted (``decode``)
        self._room: tuple | None = None  # (event loop, asyncio.Condition): made at the replica's first decode
        self.batching = batching
        self._batch_options = {"max_rows": max_batch_rows, "max_wait_s": batch_wait_s}
        self.batched = self._batched(self.verifier)
        self.batched_drafter = self._batched_drafter(self.drafter, self.batched)
        self.pair: str | None = None
        self.costs: SpeculationCosts | None = None
        self.costs_cache = costs_cache
        self._active = 0
        self._lock = threading.Lock()
        self._calibrating = threading.Lock()
        self._pool = ThreadPoolExecutor(max_decodes, thread_name_prefix="decode")

    def _batched(self, verifier: Verifier) -> Verifier:
        # transformers' models have no ragged forward: their passes stay one per session, in parallel threads
        from specdiff.models.batched import batched

        return batched(verifier, **self._batch_options) if self.batching else verifier

    def _batched_drafter(self, drafter: Drafter, batched: Verifier) -> Drafter:
        # a feature drafter's windows go into batch steps of their own, which fire in turn with the verifier's
        # (the decodes alternate between them); other drafters draft one call per decode
        from specdiff.models.batched import batched_drafter

        if not self.batching:
            return drafter
        return batched_drafter(drafter, max_wait_s=self._batch_options["max_wait_s"],
                               peer=getattr(batched, "batcher", None))

    @staticmethod
    def _check(verifier: Verifier, drafter: Drafter) -> None:
        SpeculativeDecoder(drafter, verifier)  # raises ValueError on a vocabulary or tap-layer mismatch

    def info(self) -> dict:
        return {"vocab_size": self.verifier.vocab_size, "max_context": self.verifier.max_context, "pair": self.pair,
                "tap_layers": getattr(self.verifier, "tap_layers", None), "colocated": True,
                "batching": self.batched is not self.verifier, "kv_budget_tokens": self.budget_tokens,
                "kv_budget_mb": self.kv_budget_mb, "token_bytes": self.token_bytes}

    @property
    def budget_tokens(self) -> int | None:
        """Tokens of KV cache (and kept features) the decodes on this replica may hold at once; None: no limit."""
        if self.kv_budget_mb is None:
            return None
        return int(self.kv_budget_mb * 2**20 // max(1, self.token_bytes))

    @contextlib.asynccontextmanager
    async def _admitted(self, need: int):
        """Hold ``need`` tokens of the budget while the decode runs; wait while the decodes admitted hold too
        much for it (the request waits, as a full replica's do; a client that leaves stops waiting)."""
        if self.budget_tokens is None:
            yield
            return
        message = room_error(need, self.budget_tokens, self.kv_budget_mb, self.token_bytes)
        if message is not None:
            from specdiff.serving.protocol import ApiError

            raise ApiError(message, param="max_tokens", status=503, kind="server_error")
        loop = asyncio.get_running_loop()
        if self._room is None or self._room[0] is not loop:  # Serve runs every decode on one loop; tests may not
            self._room = (loop, asyncio.Condition())
        room = self._room[1]
        async with room:
            await room.wait_for(lambda: self._fits(need))
            self._needs.append(need)
        try:
            yield
        finally:
            async with room:
                self._needs.remove(need)
                room.notify_all()

    @property
    def _reserved(self) -> int:
        return sum(self._needs)

    def _fits(self, need: int) -> bool:
        """Whether a decode needing ``need`` tokens of room fits beside those admitted. Batch steps over a KV pool
        (``specdiff.models.kvpool``) give every slot the room of the longest decode, so there the decodes hold
        ``count x longest``; else the sum of their rooms. A decode alone always fits (``room_error`` refused the
        rest), so no request waits forever."""
        needs = [*self._needs, need]
        if getattr(self.batched, "pool", None) is not None:
            return len(needs) * max(needs) <= self.budget_tokens
        return sum(needs) <= self.budget_tokens

    def swap(self, pair: tuple[Verifier, Drafter], label: str | None = None) -> None:
        """Decode with a promoted pair from the next request on (decodes in flight finish on the old one); the
        vocabulary is the router's contract and must not change. The cost model is measured again."""
        verifier, drafter = pair
        if verifier.vocab_size != self.verifier.vocab_size:
            raise ValueError(f"verifier vocab_size must stay {self.verifier.vocab_size} across a swap, got "
                             f"{verifier.vocab_size}")
        self._check(verifier, drafter)
        batched = self._batched(verifier)
        batched_drafter = self._batched_drafter(drafter, batched)
        token_bytes = _token_bytes(verifier) if self.kv_budget_mb is not None else None
        with self._lock:
            self.verifier, self.drafter, self.batched, self.pair, self.costs = verifier, drafter, batched, label, None
            self.batched_drafter, self.token_bytes = batched_drafter, token_bytes

    def load(self) -> int:
        """Decodes running on this replica now."""
        return self._active

    def _costs(self, verifier, drafter, prompt: Sequence[int], spec: SpecConfig) -> SpeculationCosts | None:
        """The replica's cost model, measured once on the unbatched verifier (a calibration inside batch steps
        would time other sessions' rows too); None for a decode with fixed γ and K."""
        if not spec.adaptive:
            return None
        with self._calibrating:
            with self._lock:
                if self.costs is not None and self.verifier is verifier:
                    return self.costs
            from specdiff.core.policy import cached_calibrate

            gamma, k = spec.gamma or spec.max_gamma, spec.num_candidates or spec.max_candidates
            costs, _ = cached_calibrate(drafter, verifier, prompt, gamma, k, self.costs_cache)
            with self._lock:
                if self.verifier is verifier:
                    self.costs = costs
            return costs

    def warm_costs(self, max_gamma: int, max_candidates: int, context_tokens: int = 128) -> SpeculationCosts:
        """The cost model for adaptive decodes within ``max_gamma`` / ``max_candidates`` (the router's bounds), read
        from ``costs_cache`` or measured now on a synthetic prompt of ``context_tokens`` ids: a replica that calls
        this before it takes traffic does not make its first adaptive request, and every decode in flight beside
        it, wait for the measurement."""
        vocab = self.verifier.vocab_size
        ids = torch.randint(0, vocab, (context_tokens,), generator=torch.Generator().manual_seed(0)).tolist()
        spec = SpecConfig(max_gamma=max_gamma, max_candidates=max_candidates)
        return self._costs(self.verifier, self.drafter, ids, spec)

    def stream(self, prompt: Sequence[int], options: DecodeOptions, speculative: bool = True,
               max_load: int | None = None) -> Iterator[tuple[list[int], DecodeStats]]:
        """The blocking decode behind ``decode``: ``(tokens, stats snapshot)`` per round."""
        with self._lock:
            verifier, batched, drafter, batched_drafter = (self.verifier, self.batched, self.drafter,
                                                           self.batched_drafter)
            self._active += 1
        try:
            if speculative:
                gate = None if max_load is None else (lambda session: self.load() <= max_load)
                costs = self._costs(verifier, drafter, prompt, options.spec)
                decoder = SpeculativeDecoder(batched_drafter, batched, costs=costs, gate=gate)
                stream = decoder.stream(prompt, options)
            else:  # no drafter to feed: skip the taps
                without_taps = getattr(batched, "without_taps", None)
                stream = stream_plain(without_taps() if without_taps else batched, prompt, options)
            try:
                for tokens in stream:
                    yield tokens, copy.deepcopy(stream.stats)
            finally:
                stream.close()
        finally:
            with self._lock:
                self._active -= 1

    async def decode(self, prompt: list[int], options: DecodeOptions, speculative: bool = True,
                     max_load: int | None = None) -> AsyncIterator[tuple[list[int], DecodeStats]]:
        """Stream a decode (``stream``) from a worker thread; a caller that goes away stops it after the round in
        progress. With ``kv_budget_mb``, the decode first waits for its room in the budget (``wire.room_needed``); one
        that could never fit is refused (503, naming the limit)."""
        async with self._admitted(room_needed(len(prompt), options, speculative)):
            async for item in iterate_in_thread(self.stream(prompt, options, speculative, max_load), self._pool,
                                                merge=_merge_rounds):
                yield item


def _token_bytes(verifier: Verifier, probe: int = 16) -> int:
    """Bytes of KV cache (and kept features) a session holds per token, measured on a throwaway session."""
    session = verifier.start([int(t) % verifier.vocab_size for t in range(1, probe + 1)])
    try:
        return max(1, -(-_cache_bytes(session) // probe))
    finally:
        close = getattr(session, "close", None)
        if close is not None:
            close()


def _merge_rounds(a: tuple[list[int], DecodeStats], b: tuple[list[int], DecodeStats]) -> tuple[list[int], DecodeStats]:
    """Two rounds' ``(tokens, stats snapshot)`` streamed as one: both rounds' tokens, the later snapshot."""
    return a[0] + b[0], b[1]
