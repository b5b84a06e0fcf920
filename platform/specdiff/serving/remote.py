"""The engine's drafter and verifier roles over Serve deployment handles.

``SpeculativeDecoder`` runs unchanged over these adapters, so the served path uses the very same round logic
(selection, acceptance, stopping) as a local decode. The handles are called synchronously (``.result()``); the
router runs each decode loop in a worker thread.

- ``RemoteDrafter``: a drafter call that fails or exceeds ``timeout_s`` raises ``DrafterUnavailable``, on which the
  engine takes a verifier-only step (exact) and counts a fallback. After a failure the drafter is skipped for
  ``cooldown_s``, so a dead pool costs one timeout, not one per round.
- ``RemoteVerifier``: one per request. Every call carries the session id (Serve's consistent-hash router sends all
  calls of a session to the replica that holds its KV cache), the full token list (a replica without the session
  recomputes it) and the previous round's commit (one round trip per round). Failed calls are retried.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from typing import Sequence

import torch
from ray import exceptions as ray_errors
from ray.serve import exceptions as serve_errors

from ..drafter import DrafterUnavailable
from ..tree import TokenTree
from .metrics import NullMetrics

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
    def __init__(self, handle, vocab_size: int, *, timeout_s: float = 2.0, cooldown_s: float = 1.0, metrics=None):
        self.handle = handle
        self.vocab_size = vocab_size
        self.timeout_s = timeout_s
        self.cooldown_s = cooldown_s
        self.metrics = metrics or NullMetrics()
        self._skip_until = 0.0
        self._lock = threading.Lock()

    def propose(self, prefix: Sequence[int], gamma: int) -> torch.Tensor:
        if time.monotonic() < self._skip_until:
            self.metrics.fallback("cooldown")
            raise DrafterUnavailable("drafter is cooling down after a failure")
        t0 = time.perf_counter()
        response = self.handle.propose.remote(list(prefix), gamma)
        try:
            marginals = response.result(timeout_s=self.timeout_s)  # [gamma, V]
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
        return marginals

    def propose_batch(self, prefixes: Sequence[Sequence[int]], gamma: int) -> torch.Tensor:
        return torch.stack([self.propose(p, gamma) for p in prefixes])


class RemoteVerifier:
    """Verifier role for ONE request: its sessions are closed on the replicas by ``close()``."""

    def __init__(self, handle, vocab_size: int, max_context: int | None, *, timeout_s=60.0, retries=2, metrics=None):
        self.handle = handle
        self.vocab_size = vocab_size
        self.max_context = max_context
        self.timeout_s = timeout_s
        self.retries = retries
        self.metrics = metrics or NullMetrics()
        self.sessions: list[RemoteVerifierSession] = []

    def start(self, prompt: Sequence[int]) -> RemoteVerifierSession:
        from ..verifier import check_prompt

        session = RemoteVerifierSession(self, check_prompt(prompt, self.max_context, self.vocab_size))
        self.sessions.append(session)
        return session

    def close(self) -> None:
        """Free every session's KV cache on its replica (best effort: an unreachable replica has lost it anyway)."""
        for session in self.sessions:
            try:
                session.handle.close.remote(session.id).result(timeout_s=self.timeout_s)
            except Exception as err:
                logger.warning("closing verifier session %s failed: %s", session.id, type(err).__name__)
        self.sessions.clear()


class RemoteVerifierSession:
    def __init__(self, verifier: RemoteVerifier, prompt: list[int]):
        self.verifier = verifier
        self.id = uuid.uuid4().hex
        self.handle = verifier.handle.options(session_id=self.id)  # routed by Serve's consistent-hash router
        self.tokens = list(prompt)
        self._scored: TokenTree | None = None
        self._commit: tuple[list[int], int] | None = None

    def score(self, tree: TokenTree) -> torch.Tensor:
        v = self.verifier
        for attempt in range(v.retries + 1):
            t0 = time.perf_counter()
            response = self.handle.score.remote(self.id, self.tokens, self._commit, tree)
            try:
                logp = response.result(timeout_s=v.timeout_s)  # [N+1, V]
                break
            except RETRYABLE as err:
                if isinstance(err, TimeoutError):
                    response.cancel()
                if attempt == v.retries:
                    raise
                v.metrics.verifier_retry()
                logger.warning("verifier call failed (%s); retry %d/%d", type(err).__name__, attempt + 1, v.retries)
                time.sleep(0.05 * 2**attempt)
        v.metrics.verifier_latency(time.perf_counter() - t0)
        self._scored, self._commit = tree, None
        return logp

    def commit(self, path: Sequence[int], next_token: int) -> None:
        if self._scored is None:
            raise RuntimeError("commit() needs a scored tree; call score() first")
        path = [int(i) for i in path]
        self.tokens.extend(int(self._scored.tokens[i]) for i in path)
        self.tokens.append(int(next_token))
        self._commit, self._scored = (path, int(next_token)), None  # sent with the next score()
