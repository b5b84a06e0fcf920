"""Prometheus metrics through Ray Serve's metrics API, fed by the engine's ``DecodeStats``.

Ray exports them with a ``ray_`` prefix on every node's metrics endpoint (``ray_specdiff_accepted_tokens_total``,
...). ``NullMetrics`` has the same methods and records nothing (plain-class tests, local use).
"""

from __future__ import annotations

from specdiff.core.stats import DecodeStats

LATENCY_BUCKETS_S = [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10]


class NullMetrics:
    def fallback(self, reason: str) -> None: ...
    def drafter_latency(self, seconds: float) -> None: ...
    def verifier_latency(self, seconds: float) -> None: ...
    def verifier_retry(self) -> None: ...
    def acceptance_length(self, tokens: int) -> None: ...
    def request(self, endpoint: str, status: str, stats: DecodeStats | None, speculative: bool) -> None: ...
    def disconnect(self) -> None: ...
    def drafter_cache_miss(self) -> None: ...


class ServeMetrics(NullMetrics):
    """Create inside a replica (Ray Serve tags each series with deployment, replica and application)."""

    def __init__(self, max_gamma: int = 64):
        from ray.serve.metrics import Counter, Histogram

        def counter(name, description, tags=()):
            return Counter(f"specdiff_{name}", description=description, tag_keys=tuple(tags))

        self._drafted = counter("drafted_tokens", "Tokens in the selected (verified) draft candidates.")
        self._accepted = counter("accepted_tokens", "Drafted tokens accepted by the verifier.")
        self._emitted = counter("emitted_tokens", "Tokens emitted (accepted + recovered/bonus).")
        self._verifier_calls = counter("verifier_calls", "Verifier forward calls after prefill (rounds + plain steps).")
        self._accepted_at = counter("accepted_at_position", "Rounds that accepted draft position j.", ["position"])
        self._reached_at = counter("reached_at_position", "Rounds that verified draft position j.", ["position"])
        self._fallbacks = counter("fallbacks", "Rounds decoded verifier-only: drafter failed/slow/cooling.", ["reason"])
        self._retries = counter("verifier_retries", "Verifier calls retried after a failure.")
        self._requests = counter("requests", "Finished requests.", ["endpoint", "status", "mode"])
        self._disconnects = counter("client_disconnects", "Requests whose client went away; session freed.")
        self._draft_misses = counter(
            "drafter_cache_misses", "Feature-drafter calls that found no draft cache for their session (rows resent)."
        )
        self._accept_len = Histogram(
            "specdiff_acceptance_length",
            description="Tokens emitted per verifier call of speculative requests (accepted + 1).",
            boundaries=[float(b) for b in range(1, min(max_gamma, 32) + 2)],
        )
        self._drafter_s = Histogram(
            "specdiff_drafter_latency_s", description="Drafter call latency seen by the router.", boundaries=LATENCY_BUCKETS_S
        )
        self._verifier_s = Histogram(
            "specdiff_verifier_latency_s", description="Verifier call latency seen by the router.", boundaries=LATENCY_BUCKETS_S
        )

    def fallback(self, reason: str) -> None:
        self._fallbacks.inc(tags={"reason": reason})

    def drafter_latency(self, seconds: float) -> None:
        self._drafter_s.observe(seconds)

    def verifier_latency(self, seconds: float) -> None:
        self._verifier_s.observe(seconds)

    def verifier_retry(self) -> None:
        self._retries.inc()

    def acceptance_length(self, tokens: int) -> None:
        self._accept_len.observe(tokens)

    def disconnect(self) -> None:
        self._disconnects.inc()

    def drafter_cache_miss(self) -> None:
        self._draft_misses.inc()

    def request(self, endpoint: str, status: str, stats: DecodeStats | None, speculative: bool) -> None:
        self._requests.inc(tags={"endpoint": endpoint, "status": status, "mode": "spec" if speculative else "plain"})
        if stats is None:
            return
        for counter, value in (
            (self._drafted, stats.drafted),
            (self._accepted, stats.accepted),
            (self._emitted, stats.emitted),
            (self._verifier_calls, stats.verifier_calls),
        ):
            if value:
                counter.inc(value)
        for j, (acc, reached) in enumerate(zip(stats.accepted_per_position, stats.reached_per_position), start=1):
            if reached:
                self._reached_at.inc(reached, tags={"position": str(j)})
            if acc:
                self._accepted_at.inc(acc, tags={"position": str(j)})
