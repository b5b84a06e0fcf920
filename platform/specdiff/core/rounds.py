"""One speculative round, cut where the probabilities live: the drafting half (marginals -> K candidates) and the
verifying half (tree -> scores -> self-selection -> acceptance -> commit).

In process both halves run in the engine. Served, the drafter replica runs ``draft`` on its own marginals and the
verifier replica runs ``verify`` on its own log-probs, so only token ids cross the network (specdiff.serving).

Randomness: a decode draws ONE base seed from its generator; every round then draws from fresh generators seeded
by (base, position of the round's pending token, role). The drafting half and the verifying half therefore need no
shared generator and can run on different machines, a retried call draws the same numbers again, and a served
decode equals the in-process decode with the same seed. Positions grow by at least one token per round, so no
two rounds of a decode share a stream. Selection never reads the verifying half's stream (the acceptance coins),
which is what keeps greedy acceptance exact (see ``acceptance``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from specdiff.core.acceptance import greedy_accept, speculative_accept
from specdiff.core.config import SamplingParams, SpecConfig
from specdiff.core.lookup import lookup_continuation
from specdiff.core.sampling import sample, target_probs
from specdiff.core.selection import path_probs as candidate_probs
from specdiff.core.selection import sample_candidates, select
from specdiff.core.tree import build_tree, chain

DRAFT, VERIFY = 1, 2  # roles: each draws from its own stream
_MASK = (1 << 64) - 1


def _mix(x: int) -> int:
    """splitmix64's finaliser: a well-spread 64-bit function of x."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


def draw_base_seed(generator: torch.Generator) -> int:
    """The one number a decode draws from its generator; every round's streams derive from it."""
    return int(torch.randint(0, 1 << 62, (1,), generator=generator))


def round_seed(base: int, position: int, role: int) -> int:
    """Seed of the stream of ``role`` (DRAFT or VERIFY) in the round whose pending token sits at ``position``."""
    return _mix(_mix(_mix(base & _MASK) ^ position) ^ role) >> 1  # 63 bits: manual_seed takes it as is


def round_generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@dataclass(frozen=True)
class Draft:
    """What the drafting half hands the verifying half."""

    candidates: torch.Tensor  # [K, gamma] long
    # [gamma, V]: the distribution the single candidate was drawn from; only for acceptance="speculative", whose
    # residual norm(max(p - q, 0)) needs the whole row at the first rejection (greedy acceptance needs no q at all).
    draft_probs: torch.Tensor | None = None

    def __reduce__(self):
        # Pickled (Ray ships it between replicas) as int32 bytes: 128 B at K=4, gamma=8 instead of ~660 B.
        return _draft_from_bytes, (_packed(self.candidates, torch.int32), self.draft_probs)


def _packed(t: torch.Tensor | None, dtype: torch.dtype) -> tuple[tuple[int, ...], bytes] | None:
    """A small tensor as (shape, raw bytes in ``dtype``): what travels instead of a pickled tensor's storage."""
    return None if t is None else (tuple(t.shape), t.to(dtype).numpy().tobytes())


def _unpacked(packed: tuple[tuple[int, ...], bytes] | None, dtype: torch.dtype) -> torch.Tensor | None:
    if packed is None:
        return None
    shape, data = packed
    return torch.frombuffer(bytearray(data), dtype=dtype).view(shape) if data else torch.zeros(shape, dtype=dtype)


def _draft_from_bytes(packed, draft_probs) -> Draft:
    return Draft(_unpacked(packed, torch.int32).long(), draft_probs)


def draft(marginals: torch.Tensor, spec: SpecConfig, generator: torch.Generator) -> Draft:
    """marginals [gamma, V] -> K candidates (candidate 0 the argmax window under greedy acceptance with
    ``include_argmax``)."""
    speculative = spec.acceptance == "speculative"
    candidates, draft_probs = sample_candidates(
        marginals, spec.num_candidates, spec.draft_temperature, generator, spec.draft_top_k,
        include_argmax=spec.include_argmax and not speculative,
    )
    return Draft(candidates, draft_probs if speculative else None)


def with_lookup(d: Draft, context: Sequence[int], spec: SpecConfig) -> Draft:
    """``d`` plus one candidate copied from ``context`` (``specdiff.core.lookup``), when the context has a match and
    greedy acceptance is on; positions past the copy's end take candidate 0's tokens (the argmax window with
    ``include_argmax``). A function of the context and the drafted candidates only, so acceptance stays exact."""
    if not spec.prompt_lookup or spec.acceptance == "speculative" or d.candidates.shape[0] == 0:
        return d
    gamma = d.candidates.shape[1]
    copied = lookup_continuation(context, gamma, max_ngram=spec.lookup_ngram)
    if not copied:
        return d
    row = d.candidates[0].clone()
    row[: len(copied)] = torch.tensor(copied, dtype=row.dtype)
    if bool((d.candidates == row).all(-1).any()):  # already a candidate
        return d
    return Draft(torch.cat([d.candidates, row[None]]), d.draft_probs)


@dataclass(frozen=True)
class Outcome:
    """What a verifying half (a round, or a plain step with ``draft`` None) did to the session."""

    tokens: list[int]  # emitted: the accepted tokens, then the recovered-or-bonus token
    num_accepted: int
    path: list[int]  # tree nodes committed after the root (the accepted ones)
    candidates: int = 0  # distinct candidates scored (0: a plain step)
    tree_nodes: int = 0  # trie nodes scored, root excluded
    selected: int = 0  # row of the kept candidate among the distinct ones (first occurrences, in draft order)
    # Greedy acceptance: [rows of the draft, gamma] float32, entry (r, j) = prod_{i<=j} p(x_i | s, x_<i) for draft row
    # r: the probability that row r's first j+1 tokens would all be accepted. What the adaptive policy learns from:
    # it tells what a round with fewer candidates would have accepted too (``SpeculationPolicy.observe``).
    streak_probs: torch.Tensor | None = None

    def __reduce__(self):
        # Pickled (a served round returns it to the router) with ``streak_probs`` as float32 bytes: 160 B at K=4,
        # gamma=8, not a tensor's ~1 KB of pickled storage.
        return _outcome_from, (self.tokens, self.num_accepted, self.path, self.candidates, self.tree_nodes,
                               self.selected, _packed(self.streak_probs, torch.float32))


def _outcome_from(tokens, num_accepted, path, candidates, tree_nodes, selected, packed) -> Outcome:
    return Outcome(tokens, num_accepted, path, candidates, tree_nodes, selected, _unpacked(packed, torch.float32))


def verify(session, draft: Draft | None, sampling: SamplingParams, spec: SpecConfig | None,
           generator: torch.Generator) -> Outcome:
    """Score the draft's trie on ``session`` (a ``VerifierSession``), select the candidate with the highest expected
    streak, accept with ``spec.acceptance``, commit; ``draft`` None: a plain step (one token sampled from p)."""
    if draft is None:
        logp = session.score(chain(session.tokens[-1], []))  # [1, V]
        if sampling.greedy:  # what sampling the one-hot on the argmax draws, without building it over V
            token = int(logp[0].argmax())
        else:
            token = int(sample(target_probs(logp[0], sampling), generator))
        session.commit([], token)
        return Outcome([token], 0, [])
    tree = build_tree(session.tokens[-1], draft.candidates)
    probs = target_probs(session.score(tree), sampling)  # [N+1, V]
    best = select(tree, probs)[0] if tree.candidates.shape[0] > 1 else 0
    path = tree.paths[best]  # [gamma] node indices
    chosen = tree.candidates[best]  # [gamma]
    path_probs = probs[torch.cat([torch.zeros(1, dtype=torch.long), path])]  # [gamma+1, V]
    if spec.acceptance == "speculative":
        if draft.draft_probs is None:
            raise ValueError("acceptance='speculative' needs the draft's probabilities (Draft.draft_probs)")
        verdict = speculative_accept(chosen, path_probs, draft.draft_probs, generator)
    else:
        verdict = greedy_accept(chosen, path_probs, generator)
    committed = path[: verdict.num_accepted].tolist()
    session.commit(committed, verdict.next_token)
    streaks = None
    if spec.acceptance != "speculative":  # every draft row's chance of keeping its first j+1 tokens
        streaks = candidate_probs(tree, probs).float().cumprod(-1)[tree.candidate_of]
    return Outcome(verdict.emitted(chosen.tolist()), verdict.num_accepted, committed,
                   int(tree.candidates.shape[0]), tree.num_nodes - 1, int(best), streaks)


def plain_steps(session, sampling: SamplingParams, seeds: Sequence[int], stop_ids: Sequence[int] = ()) -> Outcome:
    """One plain step per seed on ``session`` (``verify`` with no draft, each from its own round stream), ending after
    a token of ``stop_ids``: the tokens those steps emit one by one, as one ``Outcome``. A served session runs a
    run of plain steps in one call this way (``engine``)."""
    stop, tokens = set(stop_ids), []
    for seed in seeds:
        token = verify(session, None, sampling, None, round_generator(seed)).tokens[0]
        tokens.append(token)
        if token in stop:
            break
    return Outcome(tokens, 0, [])


class LocalRounds:
    """The verifying half run here, on an in-process ``VerifierSession`` (a served session runs it on its replica
    and has the same two methods)."""

    def __init__(self, session):
        self.session = session

    def verify(self, draft: Draft, sampling: SamplingParams, spec: SpecConfig, seed: int) -> Outcome:
        return verify(self.session, draft, sampling, spec, round_generator(seed))

    def step(self, sampling: SamplingParams, seed: int) -> Outcome:
        return verify(self.session, None, sampling, None, round_generator(seed))


def rounds_of(session) -> LocalRounds:
    """The session's verifying half: its own when it has one (a remote session), else run here."""
    return session if hasattr(session, "verify") and hasattr(session, "step") else LocalRounds(session)


def position(tokens: Sequence[int]) -> int:
    """A round's key: the position of its pending token."""
    return len(tokens) - 1
