"""The decode loop: speculative decoding with a diffusion drafter, self-selection and exact verification.

One round: the drafter proposes marginals for a window of gamma positions (one pass); K candidates are sampled at
the draft temperature and merged into a trie; the verifier scores the trie in one pass (that pass is also the
verification pass); the candidate with the highest expected streak is verified; the accepted tokens plus one
recovered-or-bonus token are emitted and committed to the verifier's KV cache. The round is two halves
(``specdiff.core.rounds``): drafting (marginals -> candidates) and verifying (trie -> selection -> acceptance -> commit),
each drawing from its own per-round stream derived from the decode's seed, so a served decode can run each half on
the replica that holds its probabilities and still equal the in-process decode.

With ``SpecConfig.gamma`` / ``num_candidates`` left at None, a ``SpeculationPolicy`` (``policy``) picks them per
round from the decode's own acceptance history and a cost model measured once per decoder, and takes plain steps
when speculation does not pay; explicit values run exactly as given.

The engine knows nothing about text except for optional stop strings (which need a tokenizer to decode).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import torch

from specdiff.core import rounds as R
from specdiff.core.config import DecodeOptions, SamplingParams, SpecConfig
from specdiff.core.roles import Drafter, DrafterUnavailable, Verifier, VerifierSession
from specdiff.core.policy import SpeculationCosts, SpeculationPolicy, cached_calibrate
from specdiff.core.stats import DecodeStats


@dataclass
class GenerationResult:
    tokens: list[int]  # new tokens only (the stop token, if one ended generation, included)
    finish_reason: str  # "stop" (stop token/string), "length" (max_new_tokens) or "context" (verifier context full)
    stats: DecodeStats = field(default_factory=DecodeStats)


def make_generator(seed: int | None = None, generator: torch.Generator | None = None) -> torch.Generator:
    """The generator a decode draws from: the one passed in, else a fresh one from ``seed`` (or from the OS)."""
    if generator is not None:
        return generator
    gen = torch.Generator()
    if seed is None:
        gen.seed()
    else:
        gen.manual_seed(seed)
    return gen


class Stopper:
    """Truncates emitted tokens at max_new_tokens, the first stop token, or the end of the first stop string."""

    def __init__(self, options: DecodeOptions, decode: Callable[[list[int]], str] | None):
        if options.stop_strings and decode is None:
            raise ValueError(f"stop_strings={list(options.stop_strings)!r} need a tokenizer to decode; none was given")
        self.max_new_tokens = options.max_new_tokens
        self.stop_ids = frozenset(options.stop_token_ids)
        self.stop_strings = options.stop_strings
        self.decode = decode
        self.out: list[int] = []
        self.finish_reason: str | None = None

    @property
    def remaining(self) -> int:
        return self.max_new_tokens - len(self.out)

    def push(self, tokens: list[int]) -> list[int]:
        """Append a round's tokens; return the ones actually emitted (possibly fewer)."""
        start = len(self.out)
        for i, tok in enumerate(tokens):
            if tok in self.stop_ids:
                tokens, self.finish_reason = tokens[: i + 1], "stop"
                break
        tokens = tokens[: self.remaining]
        self.out.extend(tokens)
        if self.stop_strings:
            self._cut_at_stop_string(start)
        if self.finish_reason is None and self.remaining == 0:
            self.finish_reason = "length"
        return self.out[start:]

    def _cut_at_stop_string(self, start: int) -> None:
        if not any(s in self.decode(self.out) for s in self.stop_strings):
            return
        for end in range(max(start, 1), len(self.out) + 1):  # the shortest output that contains a stop string
            if any(s in self.decode(self.out[:end]) for s in self.stop_strings):
                del self.out[end:]
                self.finish_reason = "stop"
                return


class DecodeStream:
    """Iterator over the tokens each round emits (one list per round). While and after iterating, ``tokens``,
    ``finish_reason`` (None until done) and ``stats`` describe the decode; ``result()`` packs them.

    ``close()`` stops the decode between rounds (a client that went away)."""

    def __init__(self, rounds: Iterator[list[int]], stopper: Stopper, stats: DecodeStats):
        self._rounds = rounds
        self._stopper = stopper
        self._done = False
        self.stats = stats

    def __iter__(self) -> DecodeStream:
        return self

    def __next__(self) -> list[int]:
        try:
            return next(self._rounds)
        except StopIteration:
            self._done = True
            raise

    def close(self) -> None:
        self._rounds.close()

    @property
    def tokens(self) -> list[int]:
        return self._stopper.out

    @property
    def finish_reason(self) -> str | None:
        # Rounds that end without a stop token/string or max_new_tokens ended because the verifier's context is full.
        return self._stopper.finish_reason or ("context" if self._done else None)

    def result(self) -> GenerationResult:
        return GenerationResult(self.tokens, self.finish_reason or "context", self.stats)

    def run(self) -> GenerationResult:
        """Decode to completion and return the result."""
        for _ in self:
            pass
        return self.result()


def _plain_step(session: VerifierSession, sampling: SamplingParams, base: int, stats: DecodeStats) -> list[int]:
    t0 = time.perf_counter()
    out = R.rounds_of(session).step(sampling, R.round_seed(base, R.position(session.tokens), R.VERIFY))
    stats.verifier_s += time.perf_counter() - t0
    stats.record_plain_step()
    return out.tokens


MAX_PLAIN_RUN = 16  # plain steps a served session runs in one call: the first of a decode alone, then 2, 4, ... 16


def _plain_run(session: VerifierSession, sampling: SamplingParams, base: int, stats: DecodeStats, n: int,
               stop_ids) -> list[int]:
    """``n`` plain steps in one call where the session's rounds run elsewhere (a served session: one round trip
    instead of ``n``); each step draws from its own position's stream, so the tokens are those of ``n`` single
    steps. In process (no such call to save) ``n`` is 1: a single step."""
    if n == 1:
        return _plain_step(session, sampling, base, stats)
    pos = R.position(session.tokens)
    t0 = time.perf_counter()
    out = R.rounds_of(session).steps(sampling, [R.round_seed(base, pos + i, R.VERIFY) for i in range(n)],
                                     sorted(stop_ids))
    stats.verifier_s += time.perf_counter() - t0
    for _ in out.tokens:
        stats.record_plain_step()
    return out.tokens


class _Runs:
    """Lengths of the runs of plain steps a served decode takes in one call: 1 first (the first token as soon as
    possible), then doubling up to ``MAX_PLAIN_RUN``, so a streamed reply starts at once and then flows in chunks."""

    def __init__(self, session: VerifierSession):
        self.served = hasattr(R.rounds_of(session), "steps")
        self.next = 1

    def take(self, limit: int) -> int:
        if not self.served:
            return 1
        n = max(1, min(self.next, limit))
        self.next = min(self.next * 2, MAX_PLAIN_RUN)
        return n


def _room(session: VerifierSession, max_context: int | None) -> int:
    """Tokens that may still be emitted before the verifier's context is full."""
    return max_context - len(session.tokens) if max_context is not None else 1 << 62


def _decode_loop(
    verifier: Verifier,
    prompt,
    stopper: Stopper,
    stats: DecodeStats,
    step: Callable[[VerifierSession, int], list[int]],
) -> Iterator[list[int]]:
    """Prefill, then run ``step(session, room)`` until a stop condition or a full context; yield what is emitted."""
    t0 = time.perf_counter()
    session = verifier.start(prompt)
    stats.prefill_s += time.perf_counter() - t0
    try:
        while stopper.finish_reason is None:
            room = _room(session, verifier.max_context)
            if room <= 0:
                return
            out = stopper.push(step(session, room))
            if out:
                yield out
    finally:
        close = getattr(session, "close", None)  # a batched session leaves its replica's batch steps
        if close is not None:
            close()


class SpeculativeDecoder:
    """Speculative decoding with a diffusion drafter and self-selection; output distributed exactly as the verifier's.

    >>> decoder = SpeculativeDecoder(drafter, verifier)
    >>> result = decoder.generate(prompt_ids, max_new_tokens=64, spec=SpecConfig(gamma=8, num_candidates=4), seed=0)
    >>> result.tokens, result.stats.tau

    ``costs``: the adaptive policy's cost model; None measures it on the first adaptive decode (``calibrate``) and
    keeps it for this decoder's lifetime, and, given ``costs_cache`` (a folder), for later processes on the same
    machine with the same model shapes (``policy.cached_calibrate``); ``recalibrate`` measures anew and replaces the
    kept one. ``costs_measured`` says which happened (None until the first adaptive decode, or with ``costs`` given).

    ``gate``: asked before every round with the session; False runs plain steps instead (served: several to a call)
    until it says True again. The router turns speculation off while the verifier replica is busier than the
    measured crossover load (``router.speculation_max_load``). It must not look at a round's draws (it sees only the
    session), so the output stays exact; a seeded T>0 decode then depends on the load it met.
    """

    def __init__(
        self,
        drafter: Drafter,
        verifier: Verifier,
        *,
        decode: Callable[[list[int]], str] | None = None,
        costs: SpeculationCosts | None = None,
        costs_cache: str | Path | None = None,
        recalibrate: bool = False,
        gate: Callable[[VerifierSession], bool] | None = None,
    ):
        if drafter.vocab_size != verifier.vocab_size:
            raise ValueError(
                f"drafter vocab_size ({drafter.vocab_size}) must equal the verifier's vocab_size "
                f"({verifier.vocab_size}); drafter and verifier must share a tokenizer"
            )
        self.drafter = drafter
        self.verifier = verifier
        self.decode = decode
        self.costs = costs
        self.costs_cache = Path(costs_cache) if costs_cache is not None else None
        self.recalibrate = recalibrate
        self.costs_measured: bool | None = None
        self.gate = gate
        # The drafting half: a served drafter samples its candidates on its replica (``draft``); an in-process one
        # proposes marginals, sampled here. Chosen once.
        self._draft = self._draft_remote if hasattr(drafter, "draft") else self._draft_local
        self._features = False
        if getattr(drafter, "needs_features", False):
            wanted, have = tuple(drafter.tap_layers), tuple(getattr(verifier, "tap_layers", None) or ())
            if wanted != have:
                raise ValueError(
                    f"the drafter reads the verifier's layers {list(wanted)}, but the verifier taps {list(have)}; "
                    f"build it with tap_layers={list(wanted)} (e.g. HFVerifier(model, tap_layers=...))"
                )
            self._features = True

    def _draft_local(self, session: VerifierSession, spec: SpecConfig, seed: int, drafter=None) -> R.Draft:
        drafter = drafter if drafter is not None else self.drafter
        if self._features:  # the verifier's tapped states of every committed token: the feature drafter's context
            marginals = drafter.propose(session.tokens, spec.gamma, session.features)  # [gamma, V]
        else:
            marginals = drafter.propose(session.tokens, spec.gamma)
        return R.draft(marginals, spec, R.round_generator(seed))

    def _draft_remote(self, session: VerifierSession, spec: SpecConfig, seed: int, drafter=None) -> R.Draft:
        features = session.features if self._features else None
        return self.drafter.draft(session.tokens, spec, seed, features)

    def generate(self, prompt: Sequence[int], options: DecodeOptions | None = None, *,
                 generator: torch.Generator | None = None, **fields: Any) -> GenerationResult:
        """Decode to the end: ``options`` (``DecodeOptions``), its fields as keywords overriding it; ``generator``
        (a torch.Generator) instead of ``seed``."""
        return self.stream(prompt, options, generator=generator, **fields).run()

    def stream(self, prompt: Sequence[int], options: DecodeOptions | None = None, *,
               generator: torch.Generator | None = None, stats: DecodeStats | None = None,
               **fields: Any) -> DecodeStream:
        """Iterate the tokens emitted by each round; ``stats`` (if given) is updated as rounds complete."""
        opts = DecodeOptions.merge(options, fields)
        stopper = Stopper(opts, self.decode)
        stats = stats if stats is not None else DecodeStats()
        rounds = self._rounds(prompt, stopper, opts.sampling, opts.spec, make_generator(opts.seed, generator), stats)
        return DecodeStream(rounds, stopper, stats)

    def _rounds(self, prompt, stopper: Stopper, sampling, spec: SpecConfig, gen, stats: DecodeStats):
        policy: SpeculationPolicy | None = None
        base = R.draw_base_seed(gen)  # every round's streams derive from it (specdiff.core.rounds)

        runs: _Runs | None = None
        # A drafter with per-decode state (a feature drafter's context cache) opens a view of its own for this decode,
        # when the decode starts; it is closed when the decode ends (a batched view then leaves its batch steps).
        opened = None

        def step(session: VerifierSession, room: int) -> list[int]:
            nonlocal policy, runs
            if self.gate is not None and not self.gate(session):  # speculation is off for now (a busy verifier)
                runs = runs or _Runs(session)
                n = runs.take(min(stopper.remaining, room))
                tokens = _plain_run(session, sampling, base, stats, n, stopper.stop_ids)
                stats.gated_plain_steps += len(tokens)
                return tokens
            if spec.adaptive and policy is None:
                policy = SpeculationPolicy.from_spec(spec, self._costs(spec, session.tokens, stats))
            # The policy decides from earlier rounds and the batch's load only (never this round's draws), so each
            # round stays exact. A batched session reports the others' load and hears what this round expects.
            if policy is None:
                window, k = spec.gamma, spec.num_candidates
            else:
                load = session.batch_load() if hasattr(session, "batch_load") else None
                window, k = policy.choose(load)
                if load is not None:
                    session.expected = policy.expected((window, k))
            # Emit at most min(remaining, room) tokens: the window leaves one slot for the recovered/bonus token.
            gamma = min(window, stopper.remaining - 1, room - 1)
            if gamma < 1:
                if window == 0:
                    runs = runs or _Runs(session)
                    n = policy.plain_run(runs.take(min(stopper.remaining, room)))  # served: several in one call
                    tokens = _plain_run(session, sampling, base, stats, n, stopper.stop_ids)
                    stats.policy_plain_steps += len(tokens)
                    return tokens
                return _plain_step(session, sampling, base, stats)
            round_spec = replace(spec, gamma=gamma, num_candidates=k)
            tokens, seen = self._round(session, sampling, round_spec, base, stats, opened)
            if policy is not None and seen is not None:  # not a drafter fallback
                draft, looked_up, out = seen
                policy.observe(gamma, k, out.num_accepted, out.tree_nodes, candidates=draft.candidates,
                               streak_probs=out.streak_probs, lookup=looked_up)
            return tokens

        def decode() -> Iterator[list[int]]:
            nonlocal opened
            opened = self.drafter.open() if hasattr(self.drafter, "open") else None
            try:
                yield from _decode_loop(self.verifier, prompt, stopper, stats, step)
            finally:
                close = getattr(opened, "close", None)
                if close is not None:
                    close()

        return decode()

    def _costs(self, spec: SpecConfig, prompt: list[int], stats: DecodeStats) -> SpeculationCosts:
        """The cost model: given, kept from an earlier process (``costs_cache``), or measured once (on a throwaway
        session of the first adaptive prompt)."""
        if self.costs is None:
            t0 = time.perf_counter()
            gamma, k = spec.gamma or spec.max_gamma, spec.num_candidates or spec.max_candidates
            self.costs, self.costs_measured = cached_calibrate(self.drafter, self.verifier, prompt, gamma, k,
                                                               self.costs_cache, refresh=self.recalibrate)
            stats.calibration_s += time.perf_counter() - t0
        return self.costs

    def _round(self, session: VerifierSession, sampling, spec: SpecConfig, base: int,
               stats, drafter=None) -> tuple[list[int], tuple[R.Draft, bool, R.Outcome] | None]:
        """One round with the window ``spec.gamma`` and ``spec.num_candidates`` candidates -> the emitted tokens, and
        (the draft scored, whether its last row is the copied candidate, the outcome); None after a plain step that
        stood in for an unavailable drafter."""
        pos = R.position(session.tokens)
        t0 = time.perf_counter()
        try:
            draft = self._draft(session, spec, R.round_seed(base, pos, R.DRAFT), drafter)  # candidates [K, gamma]
        except DrafterUnavailable:
            # A verifier-only step samples from p itself, so the output stays exact.
            stats.drafter_s += time.perf_counter() - t0
            stats.fallbacks += 1
            return _plain_step(session, sampling, base, stats), None
        drafted = draft.candidates.shape[0]
        draft = R.with_lookup(draft, session.tokens, spec)  # + one copied from the context, if it has a match
        looked_up = draft.candidates.shape[0] > drafted
        t1 = time.perf_counter()
        # Trie, scores, self-selection, acceptance and commit: wherever the session's log-probs live.
        out = R.rounds_of(session).verify(draft, sampling, spec, R.round_seed(base, pos, R.VERIFY))
        stats.drafter_s += t1 - t0
        stats.verifier_s += time.perf_counter() - t1
        stats.record_round(spec.gamma, out.num_accepted, out.candidates, out.tree_nodes, spec.num_candidates)
        if looked_up:  # the copy is distinct from every draft, so it is the last distinct candidate
            stats.lookup_rounds += 1
            stats.lookup_selected += out.selected == out.candidates - 1
        return out.tokens, (draft, looked_up, out)


def stream_plain(verifier: Verifier, prompt: Sequence[int], options: DecodeOptions | None = None, *,
                 decode: Callable[[list[int]], str] | None = None, generator: torch.Generator | None = None,
                 stats: DecodeStats | None = None, **fields: Any) -> DecodeStream:
    """Verifier-only decoding with the same KV cache and sampling, one token per step: the reference and the
    fallback. ``options`` as for ``SpeculativeDecoder.stream`` (its ``spec`` is ignored); ``decode`` (token ids ->
    text) is needed only for stop strings."""
    opts = DecodeOptions.merge(options, fields)
    stopper = Stopper(opts, decode)
    stats = stats if stats is not None else DecodeStats()
    sampling = opts.sampling
    base = R.draw_base_seed(make_generator(opts.seed, generator))

    runs: _Runs | None = None

    def step(session: VerifierSession, room: int) -> list[int]:
        nonlocal runs
        runs = runs or _Runs(session)
        n = runs.take(min(stopper.remaining, room))  # served: several steps in one call
        return _plain_run(session, sampling, base, stats, n, stopper.stop_ids)

    return DecodeStream(_decode_loop(verifier, prompt, stopper, stats, step), stopper, stats)


def generate_plain(verifier: Verifier, prompt: Sequence[int], options: DecodeOptions | None = None, *,
                   decode: Callable[[list[int]], str] | None = None, generator: torch.Generator | None = None,
                   **fields: Any) -> GenerationResult:
    """Verifier-only decoding to completion (see ``stream_plain``)."""
    return stream_plain(verifier, prompt, options, decode=decode, generator=generator, **fields).run()
