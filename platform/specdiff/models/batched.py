"""Continuous batching for a replica that decodes many sessions at once: every session's next verifier pass (a
prefill, a plain step or a speculative tree) goes into one forward.

Each decode still runs as it does alone, in its own thread, with its own ``VerifierSession`` and KV cache; only
the session's forward passes change hands. ``BatchedVerifier.start`` returns a session whose prefill and ``score``
hand their pass to a ``StepBatcher``; the batcher runs one step as soon as every session of the replica is waiting
on it (or after a short wait for stragglers), as one ragged forward (``LlamaCausalLM.forward_ragged``: the rows of
all sessions end to end for the linear layers and the LM head; attention per group of sessions in one call, their
KV caches being slots of one ``KVPool``, ``specdiff.models.kvpool``), and hands each session its own rows back. Sessions join and leave between steps. So the engine, its policy, streaming,
stop strings and cancellation stay as they are, and each session's tokens are what it would decode alone, up to
the rounding of a product over more rows (float32: equal but at near-ties; docs/serve.md).

A model without ``forward_ragged`` (transformers' models) runs the step's passes one after another: exact, not
faster.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from specdiff.core.policy import Load
from specdiff.models.feature_drafter import FeatureDrafter, FeatureDraftSession
from specdiff.models.kvpool import KVPool, PooledCache
from specdiff.models.llama import Piece
from specdiff.models.verifier import HFVerifier, HFVerifierSession, check_prompt


@dataclass
class _Request:
    item: Any
    rows: int
    member: int | None
    expected: float
    arrived: float = field(default_factory=time.perf_counter)
    done: bool = False
    result: Any = None
    error: BaseException | None = None


@dataclass(frozen=True)
class StepRecord:
    """One batch step: how many passes, their rows, and how long the step's forward took."""

    requests: int
    rows: int
    seconds: float


class StepBatcher:
    """Rendezvous of the sessions of one replica: ``submit(item)`` blocks until ``item`` has run in a step.

    A step fires when every joined session is waiting (nothing more can come), or when no request has arrived for
    ``max_wait_s`` (the rest are busy with something longer, such as drafting), and at the latest ``max_delay_s``
    after its oldest request. It takes requests in arrival order up to ``max_rows`` rows (at least one request), so
    one long prefill cannot grow a step without bound. ``run(items) -> results`` runs in the thread of the
    request that fired the step; if it raises, the step is rolled back by ``rollback(items)`` and each request runs
    alone, so a bad request fails only itself."""

    def __init__(self, run: Callable[[list], list], *, rollback: Callable[[list], None] | None = None,
                 max_wait_s: float = 0.003, max_delay_s: float = 0.05, max_rows: int = 4096,
                 peer: StepBatcher | None = None):
        if max_rows < 1:
            raise ValueError(f"max_rows must be >= 1, got {max_rows}")
        self._run, self._rollback = run, rollback
        self.max_wait_s, self.max_delay_s, self.max_rows = max_wait_s, max_delay_s, max_rows
        # ``peer``: another batcher the same sessions alternate with (a drafter's, beside the verifier's). They share
        # one lock, and a step of either fires when every session waits in one of them.
        self._cond = threading.Condition() if peer is None else peer._cond
        self._group: list[StepBatcher] = [self] if peer is None else peer._group
        if peer is not None:
            self._group.append(self)
        self._pending: list[_Request] = []
        self._members: dict[int, tuple[int, float]] = {}  # member -> (rows, expected tokens) of its last request
        self._next_member = 0
        self._busy = False
        self._last_arrival = 0.0
        self._last_end = 0.0
        self.last_step: StepRecord | None = None
        self.steps = 0

    # -- membership: a session is a member from its start to its close ------------------------------------------
    def join(self) -> int:
        with self._cond:
            self._next_member += 1
            self._members[self._next_member] = (1, 1.0)
            return self._next_member

    def leave(self, member: int) -> None:
        with self._cond:
            if self._members.pop(member, None) is not None:
                self._cond.notify_all()

    @property
    def members(self) -> int:
        return len(self._members)

    def others(self, member: int | None) -> tuple[int, int, float]:
        """(sessions, rows, expected tokens) of the other members' latest passes: the load a session's choice joins."""
        with self._cond:
            rows = expected = 0.0
            n = 0
            for m, (r, e) in self._members.items():
                if m != member:
                    n, rows, expected = n + 1, rows + r, expected + e
            return n, int(rows), expected

    # -- the step ------------------------------------------------------------------------------------------------
    def submit(self, item, rows: int = 1, *, member: int | None = None, expected: float = 1.0):
        """Run ``item`` in the next step it fits; returns its result (or raises its error). ``rows``: its share of
        the step's rows; ``expected``: the tokens its pass is expected to emit (what ``others`` reports)."""
        req = _Request(item, rows, member, expected)
        cond = self._cond
        with cond:
            if member is not None and member in self._members:
                self._members[member] = (rows, expected)
            self._pending.append(req)
            self._last_arrival = req.arrived
            # No notify: an arrival that completes a step is fired by its own thread (below), and one that does not
            # only moves the others' deadlines later (they look again at the earlier one). Waking every waiter at
            # every arrival cost n^2 wake-ups a step, each taking the lock and the GIL.
            while not req.done:
                wait = self._wait_s()
                if wait <= 0:
                    self._step()
                else:
                    cond.wait(wait)
        if req.error is not None:
            raise req.error
        return req.result

    def _wait_s(self) -> float:
        """0: fire now; else how long to wait before looking again (with the lock held). In a group (``peer``) the
        batchers take turns: none fires while another's step runs, and every count below is over the group."""
        group = self._group
        if any(b._busy for b in group) or not self._pending:
            return 1.0  # woken by notify when the step in flight ends or a request arrives
        if any(r.member is None for r in self._pending):
            return 0.0
        waiting = sum(1 for b in group for r in b._pending if r.member is not None)
        if waiting >= max(len(b._members) for b in group):
            return 0.0
        # Waits count from the end of the last step too: the sessions of the step that just ended need a moment to
        # come back, and a request that arrived during that step must not fire a step of its own meanwhile (a
        # replica would then alternate between two half batches). Stragglers get a tenth of a step's time.
        gap = max(self.max_wait_s, 0.1 * self.last_step.seconds) if self.last_step is not None else self.max_wait_s
        ended = max(b._last_end for b in group)
        start = max(self._pending[0].arrived, ended)
        now = time.perf_counter()
        return min(max(max(b._last_arrival for b in group), ended) + gap, start + self.max_delay_s) - now

    def _step(self) -> None:
        """Take a step's requests and run them, releasing the lock meanwhile (called with it held)."""
        batch, rows = [], 0
        while self._pending and (not batch or rows + self._pending[0].rows <= self.max_rows):
            req = self._pending.pop(0)
            batch.append(req)
            rows += req.rows
        self._busy = True
        self._cond.release()
        t0 = time.perf_counter()
        try:
            self._run_batch(batch)
        finally:
            seconds = time.perf_counter() - t0
            self._cond.acquire()
            self._busy = False
            self._last_end = time.perf_counter()
            self.steps += 1
            self.last_step = StepRecord(len(batch), rows, seconds)
            for req in batch:
                req.done = True
            self._cond.notify_all()

    def _run_batch(self, batch: list[_Request]) -> None:
        items = [r.item for r in batch]
        try:
            results = self._run(items)
        except BaseException as err:
            if self._rollback is not None:
                self._rollback(items)
            if len(batch) == 1:
                batch[0].error = err
                return
            for req in batch:  # alone, each request fails only itself (and leaves its session as it was)
                try:
                    req.result = self._run([req.item])[0]
                except BaseException as one:
                    if self._rollback is not None:
                        self._rollback([req.item])
                    req.error = one
            return
        for req, result in zip(batch, results):
            req.result = result


def _cache_state(cache) -> tuple[int, list]:
    if isinstance(cache, PooledCache):  # its rows stay where they are: the lengths say it all (and cost no views)
        return len(cache.layers), [layer.length for layer in cache.layers]
    return len(cache.layers), [(layer.keys, layer.values) for layer in cache.layers]


def _restore(cache, state) -> None:
    count, kv = state
    if isinstance(cache, PooledCache):
        for layer, length in zip(cache.layers, kv):
            layer.length = length
        return
    del cache.layers[count:]
    for layer, (keys, values) in zip(cache.layers, kv):
        layer.keys, layer.values = keys, values


class _Pass:
    """One session's pass in a step: the piece to run, the cache state to return to if the step fails."""

    def __init__(self, piece: Piece, taps: bool):
        self.piece, self.taps = piece, taps
        self.state = _cache_state(piece.cache)


class BatchedVerifier:
    """An ``HFVerifier`` whose sessions share one ``StepBatcher``: ``start`` as ``HFVerifier.start``; the sessions'
    passes run batched. ``without_taps()`` shares the batcher (plain decodes batch with speculative ones).

    ``per_call``: the sessions are not members of the steps between their passes (a Verifier replica of split
    placement, whose sessions live across network round trips and an LRU): a pass then fires a step at once when
    none is running, and the passes that arrive while one runs share the next."""

    def __init__(self, verifier: HFVerifier, *, batcher: StepBatcher | None = None, per_call: bool = False,
                 **batcher_options):
        self.verifier = verifier
        self.per_call = per_call
        self.vocab_size = verifier.vocab_size
        self.max_context = verifier.max_context
        self.tap_layers = verifier.tap_layers
        self.hidden_size = verifier.hidden_size
        self.small_rows = verifier.small_rows
        self.packed_rows = verifier.packed_rows
        self.hf = verifier.hf
        model = verifier.hf.model
        self._ragged = getattr(model, "forward_ragged", None)
        self.batched = self._ragged is not None  # else the step's passes run one by one
        # The sessions' KV caches in one pool (``specdiff.models.kvpool``): a step attends for them in a few calls.
        # Not per call: a split replica's sessions idle in an LRU between calls, and would hold slots of the longest.
        self.pool = None
        if self.batched and not per_call and hasattr(model, "config"):
            self.pool = KVPool(int(model.config.num_hidden_layers))
        self.batcher = batcher or StepBatcher(self._run, rollback=self._rollback, **batcher_options)

    @property
    def model(self) -> torch.nn.Module:
        return self.verifier.model

    def without_taps(self) -> BatchedVerifier:
        if self.tap_layers is None:
            return self
        view = BatchedVerifier(self.verifier.without_taps(), batcher=self.batcher, per_call=self.per_call)
        view.pool = self.pool  # one pool for every session of the batch steps
        return view

    def start(self, prompt: Sequence[int]) -> BatchedSession:
        return BatchedSession(self, check_prompt(prompt, self.max_context, self.vocab_size))

    # -- one step --------------------------------------------------------------------------------------------------
    def _run(self, passes: list[_Pass]) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        taps = next((p.taps for p in passes if p.taps), None)  # a plain decode's passes want none
        if self._ragged is not None and len(passes) > 1:
            out = self._ragged([p.piece for p in passes], taps)
            return [(logits, feats if p.taps else None) for p, (logits, feats) in zip(passes, out)]
        results = []
        for p in passes:  # a pass alone takes the model's own forward, as unbatched (transformers: one at a time)
            piece = p.piece
            out = self.hf.logits(piece.input_ids[None], attention_mask=piece.mask,
                                 position_ids=None if piece.position_ids is None else piece.position_ids[None],
                                 cache=piece.cache, last=piece.last or None, taps=taps if p.taps else None)
            logits, feats = (out if p.taps and taps else (out, None))
            results.append((logits[0], None if feats is None else feats[0]))
        return results

    @staticmethod
    def _rollback(passes: list[_Pass]) -> None:
        for p in passes:
            _restore(p.piece.cache, p.state)


class BatchedSession(HFVerifierSession):
    """A verifier session whose passes run in its verifier's batch steps. ``close()`` leaves the batcher (the engine
    calls it when the decode ends); until then the batcher waits for this session at every step."""

    def __init__(self, owner: BatchedVerifier, prompt: list[int]):
        super().__init__(owner.verifier, prompt, prefill=False)
        if owner.pool is not None:
            self.cache = owner.pool.cache()
        self.pool = owner.pool
        self.batcher = owner.batcher
        self.member = None if owner.per_call else self.batcher.join()
        self.expected = 1.0  # the tokens this session's next pass is expected to emit (the adaptive policy sets it)
        try:
            if len(prompt) > 1:  # prefill everything but the pending token: one piece of a step
                piece = Piece(torch.tensor(prompt[:-1]), self.cache, last=1)
                _, features = self.batcher.submit(_Pass(piece, self.taps), len(prompt) - 1, member=self.member)
                if self.taps:
                    self.features = features.cpu()
        except BaseException:
            self.close()
            raise

    def score(self, tree) -> torch.Tensor:
        mask, positions = self.tree_inputs(tree)
        piece = Piece(tree.tokens, self.cache, position_ids=positions, mask=mask)
        logits, features = self.batcher.submit(_Pass(piece, self.taps), tree.num_nodes, member=self.member,
                                               expected=self.expected)
        return self.scored(tree, logits, features)

    def commit(self, path, next_token: int) -> None:
        if self.pool is None:
            return super().commit(path, next_token)
        with self.pool.lock:  # its writes must not race a step that grows (moves) the pool's buffers
            return super().commit(path, next_token)

    def batch_load(self) -> Load:
        """The other sessions' share of the next step (``SpeculationPolicy.rates``)."""
        return Load(*self.batcher.others(self.member))

    def close(self) -> None:
        if self.member is not None:
            self.batcher.leave(self.member)
            self.member = None
        if self.pool is not None:  # the decode is over: its slot goes to the next session
            self.cache.release()


def batched(verifier, *, per_call: bool = False, **batcher_options):
    """``verifier`` with its passes in batch steps where it can batch: an ``HFVerifier`` over a model with a ragged
    forward (the lean Llama); anything else (transformers' models, a remote verifier) is returned as it is."""
    if isinstance(verifier, HFVerifier) and hasattr(verifier.model, "forward_ragged"):
        return BatchedVerifier(verifier, per_call=per_call, **batcher_options)
    return verifier


class BatchedDrafter:
    """A feature drafter whose decodes draft in batch steps: ``open()`` gives each decode a view with its own
    context cache (as ``FeatureDrafter.open``) whose ``propose`` hands its window to a ``StepBatcher``; a step runs
    every waiting decode's window in one pass (``FeatureDrafter.propose_many``). Alone, a decode drafts as it would
    unbatched. Sixteen decodes drafting one call each spent as much CPU as their verifier step (the draft layer is
    small, so a call is mostly per-call overhead); batched, they pay about one call."""

    needs_features = True

    def __init__(self, drafter, **batcher_options):
        self.drafter = drafter
        self.vocab_size, self.tap_layers = drafter.vocab_size, drafter.tap_layers
        self.batcher = StepBatcher(drafter.propose_many, **batcher_options)

    def open(self) -> BatchedDraftSession:
        return BatchedDraftSession(self)

    def propose(self, prefix: Sequence[int], gamma: int, features: torch.Tensor | None = None) -> torch.Tensor:
        return self.drafter.propose(prefix, gamma, features)


class BatchedDraftSession(FeatureDraftSession):
    """``BatchedDrafter.open()``: one decode's context cache, its windows drafted in the drafter's batch steps.
    ``close()`` leaves them (the engine calls it when the decode ends); until then each step waits for this
    decode a moment (``StepBatcher``: at most ``max_wait_s`` after the last arrival)."""

    def __init__(self, owner: BatchedDrafter):
        super().__init__(owner.drafter)
        self.batcher = owner.batcher
        self.member: int | None = self.batcher.join()

    def propose(self, prefix: Sequence[int], gamma: int, features: torch.Tensor | None = None) -> torch.Tensor:
        self._check_call(prefix, gamma, features)
        if self.member is None:  # closed: draft alone
            return super().propose(prefix, gamma, features)
        return self.batcher.submit((self, list(prefix), gamma, features), gamma + 1, member=self.member)

    def close(self) -> None:
        if self.member is not None:
            self.batcher.leave(self.member)
            self.member = None


def batched_drafter(drafter, **batcher_options):
    """``drafter`` with its decodes' windows in batch steps where it can batch (a ``FeatureDrafter``); any other
    drafter is returned as it is (its decodes draft one call each, in parallel threads)."""
    if isinstance(drafter, FeatureDrafter):
        return BatchedDrafter(drafter, **batcher_options)
    return drafter
