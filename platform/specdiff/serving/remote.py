"""The engine's drafter and verifier roles over Serve deployment handles.

``SpeculativeDecoder`` runs unchanged over these adapters; each half of a round (``specdiff.core.rounds``) runs on the
replica that holds its probabilities, so a round sends token ids, not distributions: the drafter replica returns K
candidates sampled from its marginals, the verifier replica builds the trie, scores it, selects, accepts, commits
and returns the emitted tokens. Both draw from per-round streams the router derives from the request's seed, so
the served output for a seed is the in-process output for that seed. The handles are called synchronously
(``.result()``); the router runs each decode loop in a worker thread.

- ``RemoteDrafter``: a drafter call that fails or exceeds ``timeout_s`` raises ``DrafterUnavailable``, on which the
  engine takes a verifier-only step (exact, sampled on the verifier replica) and counts a fallback. After a failure
  the drafter is skipped for ``cooldown_s``, so a dead pool costs one timeout, not one per round.
- ``RemoteVerifier``: one per request. Every call carries the session id (Serve's consistent-hash router sends all
  calls of a session to the replica that holds its KV cache) and the session's length + digest (``TokenSync``); the
  token list itself travels once (the prompt), or again when a replica lacks the session (``NeedTokens``: it then
  recomputes the prefix). Failed calls are retried; a retry draws the same numbers, so it cannot change the output.

Feature drafters (the verifier replica taps layers): each ``verify`` also returns the tapped features of the
committed nodes (root + accepted) from the scoring pass; the session keeps them in its ``RemoteFeatures``, and the
next drafter call carries just those rows (``FeatureRows``, float16 bytes), routed by session id to the drafter
replica that holds the session's draft cache. A drafter replica that lacks earlier rows (new, restarted, or evicted
the session) answers ``NeedFeatures``; the router then reads the whole prefix's rows from the verifier replica,
which keeps them with the KV cache (or recomputes them with the prefix), and sends them once. The first round of a
request works the same way (its prompt's rows come from the verifier's prefill).

``remote_decode`` (``colocate=true``): the whole decode runs on one replica that holds both models
(``servers.DecodeServer``); this side receives each round's tokens and applies the stop conditions.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import uuid
from typing import Callable, Iterator, Sequence

import torch
from ray import exceptions as ray_errors
from ray.serve import exceptions as serve_errors

from specdiff.core.config import DecodeOptions
from specdiff.models.drafter import DrafterUnavailable
from specdiff.core.engine import DecodeStream, Stopper
from specdiff.core.rounds import Draft, Outcome
from specdiff.core.stats import DecodeStats
from specdiff.serving.metrics import NullMetrics
from specdiff.serving.wire import FeatureRows, NeedFeatures, NeedTokens, TokenSync

logger = logging.getLogger(__name__)

# Failures of the machinery (replica died, overloaded, too slow), never of the model code: worth a retry.
RETRYABLE = (
    ray_errors.RayActorError,
    ray_errors.ActorUnavailableError,
    ray_errors.WorkerCrashedError,
    ray_errors.NodeDiedError,
    serve_errors.BackPressureError,
    serve_errors.DeploymentUnavailableError,
    TimeoutError,  # ray.exceptions.GetTimeoutError included
)


class RemoteDrafter:
    """The drafter role over the drafter deployment's handle, shared by a router's requests. ``tap_layers`` (from the
    replicas' ``info``): set for a feature drafter, whose calls go through ``propose(prefix, gamma, features)``."""

    def __init__(self, handle, vocab_size: int, *, timeout_s: float = 2.0, cooldown_s: float = 1.0, metrics=None,
                 tap_layers: Sequence[int] | None = None):
        self.handle = handle
        self.vocab_size = vocab_size
        self.timeout_s = timeout_s
        self.cooldown_s = cooldown_s
        self.metrics = metrics or NullMetrics()
        self.tap_layers = tuple(tap_layers) if tap_layers else None
        self.needs_features = self.tap_layers is not None
        self._skip_until = 0.0
        self._lock = threading.Lock()

    def propose(self, prefix: Sequence[int], gamma: int, features=None) -> torch.Tensor:
        """Marginals [gamma, V] (the adaptive policy's calibration; rounds call ``draft``)."""
        if self.needs_features:
            if not isinstance(features, RemoteFeatures):  # a plain tensor (calibration): one stateless call
                n = len(prefix) - 1
                if features is None or features.shape[0] != n:
                    raise ValueError(f"a feature drafter needs features of the prefix's first {n} tokens, got "
                                     f"{None if features is None else tuple(features.shape)}")
                rows = FeatureRows.encode(features, 0, "float32") if n else None
                return self._call(self.handle, "propose_features", None, int(prefix[-1]), n, gamma, rows)
            return self._with_rows(prefix, features, lambda h, sid, anchor, n, rows: self._call(
                h, "propose_features", sid, anchor, n, gamma, rows))
        return self._call(self.handle, "propose", list(prefix), gamma)  # [gamma, V]

    def draft(self, prefix: Sequence[int], spec, seed: int, features=None) -> Draft:
        """The drafting half of a round on a drafter replica: K candidates [K, gamma] sampled there from the
        round's drafting stream ``seed`` (``specdiff.core.rounds``); its marginals stay there."""
        if self.needs_features:
            return self._with_rows(prefix, features, lambda h, sid, anchor, n, rows: self._call(
                h, "draft_features", sid, anchor, n, rows, spec, seed))
        return self._call(self.handle, "draft", list(prefix), spec, seed)

    def _with_rows(self, prefix: Sequence[int], features: RemoteFeatures, call):
        """A feature drafter call with the rows its replica lacks: normally the last round's committed ones."""
        n = len(prefix) - 1  # context rows: every token but the pending one (the anchor)
        if len(features) != n:
            raise ValueError(f"features cover {len(features)} tokens, the prefix has {n} before its pending token")
        self._cooling_down()
        handle = self.handle.options(session_id=features.session_id)  # the replica holding its draft cache
        features.drafter_close = lambda: handle.close.remote(features.session_id)
        out = call(handle, features.session_id, int(prefix[-1]), n, features.rows(features.drafter_has))
        if isinstance(out, NeedFeatures):  # that replica lacks earlier rows: send them from where it stands
            self.metrics.drafter_cache_miss()
            out = call(handle, features.session_id, int(prefix[-1]), n, features.rows(out.have))
            if isinstance(out, NeedFeatures):
                raise DrafterUnavailable(f"drafter replica lost session {features.session_id} twice in one round")
        features.acknowledge(n)
        return out

    def _cooling_down(self) -> None:
        if time.monotonic() < self._skip_until:
            self.metrics.fallback("cooldown")
            raise DrafterUnavailable("drafter is cooling down after a failure")

    def _call(self, handle, method: str, *args):
        self._cooling_down()
        t0 = time.perf_counter()
        response = getattr(handle, method).remote(*args)
        try:
            out = response.result(timeout_s=self.timeout_s)
        except Exception as err:  # any failure degrades to a verifier-only round, which stays exact
            reason = "timeout" if isinstance(err, TimeoutError) else "error"
            if reason == "timeout":
                response.cancel()
            with self._lock:
                self._skip_until = time.monotonic() + self.cooldown_s
            self.metrics.fallback(reason)
            logger.warning("drafter %s (%s); verifier-only for %.1fs", reason, type(err).__name__, self.cooldown_s)
            raise DrafterUnavailable(f"drafter {reason}: {type(err).__name__}") from err
        self.metrics.drafter_latency(time.perf_counter() - t0)
        return out

    def propose_batch(self, prefixes: Sequence[Sequence[int]], gamma: int, features=None) -> torch.Tensor:
        if features is None:
            return torch.stack([self.propose(p, gamma) for p in prefixes])
        return torch.stack([self.propose(p, gamma, f) for p, f in zip(prefixes, features)])


class RemoteFeatures:
    """Router-side view of a remote verifier session's tapped features [n, taps*H] (n = tokens but the pending one),
    what the engine hands a feature drafter. It keeps only the rows the drafter replica has not acknowledged yet
    (normally the last round's committed nodes; at most ``max_kept`` rows); older rows are read from the verifier
    replica when needed."""

    def __init__(self, session: RemoteVerifierSession, max_kept: int = 512):
        self.session = session
        self.session_id = session.id
        self.max_kept = max_kept
        self.drafter_has = 0  # rows the drafter replica acknowledged
        self.drafter_close = None  # set by the RemoteDrafter once it has opened a draft cache for this session
        self.bytes_sent = 0  # feature bytes sent to the drafter
        self.fetches = 0  # reads of earlier rows from the verifier replica
        self._rows: torch.Tensor | None = None  # [k, width]: rows start .. n-1 (wire dtype)
        self._start = 0
        self._dtype = "float16"

    def __len__(self) -> int:
        return len(self.session.tokens) - 1

    @property
    def shape(self) -> tuple[int, int]:
        return (len(self), -1 if self._rows is None else int(self._rows.shape[1]))

    def append(self, rows: torch.Tensor, start: int, dtype: str) -> None:
        """Rows of tokens start .. start+k-1, just committed."""
        if self._rows is not None and self._start + len(self._rows) == start:
            self._rows = torch.cat([self._rows, rows])
        else:
            self._rows, self._start = rows, start
        if len(self._rows) > self.max_kept:  # the drafter has been away long: the verifier has them too
            cut = len(self._rows) - self.max_kept
            self._rows, self._start = self._rows[cut:], self._start + cut
        self._dtype = dtype

    def acknowledge(self, n: int) -> None:
        """The drafter replica now holds rows 0..n-1: drop them here."""
        self.drafter_has = n
        if self._rows is not None:
            cut = min(max(n - self._start, 0), len(self._rows))
            self._rows, self._start = self._rows[cut:], self._start + cut

    def rows(self, start: int) -> FeatureRows | None:
        """Rows start .. n-1 for the drafter (None: nothing new), from here or from the verifier replica."""
        n = len(self)
        if start >= n:
            return None
        if self._rows is not None and self._start <= start and self._start + len(self._rows) == n:
            out = FeatureRows.encode(self._rows[start - self._start :], start, self._dtype)
        else:
            self.fetches += 1
            out = self.session.fetch_features(start)
        self.bytes_sent += out.nbytes
        return out

    def __getitem__(self, index) -> torch.Tensor:
        """A plain tensor of all rows, indexed (calibration reads ``features[:k]``); read from the verifier."""
        return self.session.fetch_features(0).decode()[index]

    def close(self) -> None:
        if self.drafter_close is not None:
            self.drafter_close()
            self.drafter_close = None


class RemoteVerifier:
    """Verifier role for ONE request: its sessions are closed on the replicas by ``close()``."""

    def __init__(self, handle, vocab_size: int, max_context: int | None, *, timeout_s=60.0, retries=2, metrics=None,
                 tap_layers: Sequence[int] | None = None):
        self.handle = handle
        self.vocab_size = vocab_size
        self.max_context = max_context
        self.tap_layers = tuple(tap_layers) if tap_layers else None  # the replicas tap these layers for a drafter
        self.timeout_s = timeout_s
        self.retries = retries
        self.metrics = metrics or NullMetrics()
        self.sessions: list[RemoteVerifierSession] = []

    def start(self, prompt: Sequence[int]) -> RemoteVerifierSession:
        from specdiff.models.verifier import check_prompt

        session = RemoteVerifierSession(self, check_prompt(prompt, self.max_context, self.vocab_size))
        self.sessions.append(session)
        return session

    def close(self) -> None:
        """Free every session's KV cache on its replica (best effort: an unreachable replica has lost it anyway)."""
        for session in self.sessions:
            if session.features is not None:  # the drafter replica's draft cache: fire and forget
                try:
                    session.features.close()
                except Exception as err:
                    logger.warning("closing draft session %s failed: %s", session.id, type(err).__name__)
            try:
                session.handle.close.remote(session.id).result(timeout_s=self.timeout_s)
            except Exception as err:
                logger.warning("closing verifier session %s failed: %s", session.id, type(err).__name__)
        self.sessions.clear()


class RemoteVerifierSession:
    """A verifier session held by a replica: rounds run there (``verify`` / ``step``, the engine's verifying half);
    this side keeps the token list, from the tokens each call returns."""

    def __init__(self, verifier: RemoteVerifier, prompt: list[int]):
        self.verifier = verifier
        self.id = uuid.uuid4().hex
        self.handle = verifier.handle.options(session_id=self.id)  # routed by Serve's consistent-hash router
        self.tokens = list(prompt)
        self._synced = False  # the replica was sent the tokens once (the first call carries the prompt)
        self.load = 0  # sessions decoding on its replica, as of the last call (``SpeculativeDecoder``'s gate)
        self.features = RemoteFeatures(self) if verifier.tap_layers else None

    def _call(self, method: str, *args):
        """A verifier call at the session's state, retried on failures of the machinery; a replica that lacks the
        session (``NeedTokens``) is sent the whole token list once."""
        v = self.verifier
        full = not self._synced
        for attempt in range(v.retries + 1):
            t0 = time.perf_counter()
            response = getattr(self.handle, method).remote(self.id, TokenSync.of(self.tokens, full), *args)
            try:
                out = response.result(timeout_s=v.timeout_s)
                if isinstance(out, NeedTokens) and not full:
                    full = True
                    response = getattr(self.handle, method).remote(self.id, TokenSync.of(self.tokens, True), *args)
                    out = response.result(timeout_s=v.timeout_s)
                break
            except RETRYABLE as err:
                if isinstance(err, TimeoutError):
                    response.cancel()
                if attempt == v.retries:
                    raise
                v.metrics.verifier_retry()
                logger.warning("verifier call failed (%s); retry %d/%d", type(err).__name__, attempt + 1, v.retries)
                time.sleep(0.05 * 2**attempt)
        if isinstance(out, NeedTokens):
            raise RuntimeError(f"verifier replica asked for the tokens of session {self.id} after it was sent them")
        v.metrics.verifier_latency(time.perf_counter() - t0)
        self._synced = True
        return out

    def verify(self, draft: Draft, sampling, spec, seed: int) -> Outcome:
        """A round's verifying half on the replica: only the emitted tokens (and committed feature rows) return."""
        return self._advance(self._call("verify", draft, sampling, spec, seed))

    def step(self, sampling, seed: int) -> Outcome:
        """A plain (verifier-only) step, sampled on the replica."""
        return self._advance(self._call("verify", None, sampling, None, seed))

    def steps(self, sampling, seeds: Sequence[int], stop_ids: Sequence[int] = ()) -> Outcome:
        """A run of plain steps (one per seed, ending after a stop token) in ONE call to the replica: a plain step
        served costs a round trip, which on a 2-core box was a quarter of the step (``jobs/loadtest.py
        --in-process``)."""
        return self._advance(self._call("steps", sampling, [int(s) for s in seeds], [int(t) for t in stop_ids]))

    def _advance(self, result) -> Outcome:
        """A ``servers.Advanced``: the tokens emitted, the committed tokens' features, the replica's load."""
        out, rows = result.outcome, result.rows
        if self.features is not None:  # the root (the old pending token) and the accepted nodes, now committed
            self.features.append(rows.decode(), rows.start, rows.dtype)
        self.tokens.extend(out.tokens)
        self.load = result.load
        return out

    def fetch_features(self, start: int) -> FeatureRows:
        """Features of tokens start .. len(tokens)-2, read from the verifier replica (prefilled there if needed)."""
        return self._call("features", start)


def remote_decode(handle, prompt: Sequence[int], options: DecodeOptions, *, speculative: bool = True,
                  max_load: int | None = None, decode: Callable[[list[int]], str] | None = None, retries: int = 2,
                  metrics=None) -> DecodeStream:
    """A decode run by a ``DecodeServer`` replica (``handle``: its deployment), as a ``DecodeStream``: each round's
    tokens as the replica streams them, ``stats`` as of the last round. The stop strings are applied here (the
    replica needs no tokenizer); the replica stops at the stop tokens and ``max_new_tokens`` as this side does, and
    is cancelled when this side stops first (a stop string, ``close()``). A replica that dies mid-decode is replaced
    by another (up to ``retries`` times): it resumes from the prompt plus the tokens emitted so far, with the same
    seed, so a T=0 decode is unchanged (each round draws from its position's stream; a T>0 one stays exact in
    distribution)."""
    stopper = Stopper(options, decode)
    stats = DecodeStats()
    return DecodeStream(_remote_rounds(handle, list(prompt), options, speculative, max_load, stopper, stats, retries,
                                       metrics or NullMetrics()), stopper, stats)


def _remote_rounds(handle, prompt: list[int], options: DecodeOptions, speculative: bool, max_load: int | None,
                   stopper: Stopper, stats: DecodeStats, retries: int, metrics) -> Iterator[list[int]]:
    done = DecodeStats()  # of the attempts that died
    for attempt in range(retries + 1):
        call = dataclasses.replace(options, max_new_tokens=stopper.remaining, stop_strings=())
        response = handle.options(stream=True).decode.remote(prompt + stopper.out, call, speculative, max_load)
        last = DecodeStats()
        try:
            for tokens, snapshot in response:
                last = snapshot
                _assign(stats, done.merge(snapshot))
                out = stopper.push(tokens)
                if out:
                    yield out
                if stopper.finish_reason is not None:
                    return
            return  # the replica's decode ended: a stop condition, or the context is full
        except RETRYABLE as err:
            if attempt == retries:
                raise
            metrics.verifier_retry()
            logger.warning("decoder replica failed (%s) after %d tokens; resuming on another (%d/%d)",
                           type(err).__name__, len(stopper.out), attempt + 1, retries)
            done = done.merge(last)
        finally:
            response.cancel()  # no-op once it ended; else the replica stops after its round in progress


def _assign(stats: DecodeStats, value: DecodeStats) -> None:
    for f in dataclasses.fields(DecodeStats):
        setattr(stats, f.name, getattr(value, f.name))
