"""Adaptive speculation: choose the window γ, the number of candidates K, or a plain step, round by round.

A round with window γ and K candidates costs one drafter call plus one verifier pass over a trie of about 1 + γK
nodes, and emits on average ``1 + Σ_{m≤γ} Π_{j≤m} α_j`` tokens (α_j: acceptance of position j given it was
reached, for that K). A plain step costs one verifier pass over a single node and emits one token. The policy
keeps running estimates of α_j per K from the decode's own rounds and picks the (γ, K) that maximises expected
tokens per second under a fixed cost model; when no choice beats a plain step it decodes plain, and now and then
spends a cheap probe round (small γ, one candidate) to notice a drafter that has become useful. Probes are spaced
so that failed ones cost at most ``probe_budget`` of the plain decoding time, and the spacing doubles while they
keep failing.

Exactness. The choice for a round is a function of the fixed costs and of the outcomes of earlier rounds only; it
is made before the round draws anything, so it never looks at the current round's candidates or acceptance
coins. Given the whole history H up to a round (which fixes the prefix s and the choice d), every rule the engine
may run (a plain step, or greedy acceptance with self-selection for any γ and K, see ``acceptance``) emits its
first token from p(·|s) and each later token of the round from p(·|s, tokens emitted before it). So
P(x_t | x_<t, H) = p(x_t | x_<t) for every emitted token, whatever H besides the prefix contains, and the output
follows the verifier exactly. The same holds for the fixed cost model: it is measured once (or given) before any
decision and never changes with the tokens.

Reproducibility. With the costs fixed, a seeded decode makes the same choices and draws the same numbers every
time. Calibration times real forwards, so two decoders that calibrate separately may choose differently (same
distribution, different samples); pass ``costs`` explicitly where that matters.
"""

from __future__ import annotations

import bisect
import math
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Sequence

import torch

from specdiff.runtime import machine_cache
from specdiff.core import rounds as R
from specdiff.core.config import SamplingParams, SpecConfig
from specdiff.core.roles import DrafterUnavailable

PLAIN = (0, 0)  # the policy's "take a plain step" choice: window 0
CALIBRATION_VERSION = 2  # bump when ``calibrate`` measures something else: kept cost models are then measured again


@dataclass(frozen=True)
class Load:
    """The other sessions of the batch step a round joins: how many, their rows, their expected tokens."""

    sessions: int
    rows: int
    expected: float


@dataclass(frozen=True)
class SpeculationCosts:
    """Fixed cost model. ``verify_s``: (trie nodes including the root, seconds per verifier pass) points, sorted
    by nodes, interpolated piecewise-linearly (CPU forwards are far from affine at small sizes: one row runs as a
    matrix-vector product, a few rows as a matrix product). ``draft_s``: one drafter call with its argmax window
    (K=1) and the copied candidate's search; ``sample_s``: what a round with drawn candidates (K > 1) adds to it
    (tempering the marginals over the vocabulary, the draws). Measured together before, a K=1 round was priced with
    K=4's draws: 7-9 ms where the bench's K=1 rounds spent 4 ms drafting (2-core Xeon, bf16), so the policy saw
    speculation dearer than it was (replayed held-out rounds: math 1.94x -> 2.03x plain with the K=1 price)."""

    draft_s: float
    verify_s: tuple[tuple[int, float], ...]
    sample_s: float = 0.0

    def __post_init__(self) -> None:
        nodes = [n for n, _ in self.verify_s]
        if not self.verify_s or nodes != sorted(set(nodes)) or nodes[0] != 1:
            raise ValueError(f"verify_s must be (nodes, seconds) points with distinct increasing nodes starting at 1, "
                             f"got {self.verify_s!r}")
        if (any(not (s > 0 and math.isfinite(s)) for _, s in self.verify_s) or not self.draft_s >= 0
                or not (self.sample_s >= 0 and math.isfinite(self.sample_s))):
            raise ValueError(f"costs must be finite and positive, got draft_s={self.draft_s!r}, "
                             f"sample_s={self.sample_s!r}, verify_s={self.verify_s!r}")

    @classmethod
    def affine(cls, draft_s: float, base_s: float, per_node_s: float) -> SpeculationCosts:
        """Verifier pass = ``base_s + per_node_s * nodes``."""
        return cls(draft_s, ((1, base_s + per_node_s), (2, base_s + 2 * per_node_s)))

    def to_dict(self) -> dict:
        return {"draft_s": self.draft_s, "sample_s": self.sample_s, "verify_s": [list(p) for p in self.verify_s]}

    @classmethod
    def from_dict(cls, value: dict) -> SpeculationCosts:
        return cls(float(value["draft_s"]), tuple((int(n), float(s)) for n, s in value["verify_s"]),
                   float(value.get("sample_s", 0.0)))

    def describe(self) -> str:
        """One line for logs: the plain step, the drafter call (and what K > 1 draws add), each verifier pass size."""
        return (f"plain step {self.plain_s * 1e3:.1f} ms, drafter {self.draft_s * 1e3:.1f} ms "
                f"(+{self.sample_s * 1e3:.1f} ms for K > 1 draws), verify "
                + ", ".join(f"{n} nodes {s * 1e3:.1f} ms" for n, s in self.verify_s))

    def draft(self, k: int) -> float:
        """Seconds of drafting a round with ``k`` candidates."""
        return self.draft_s + (self.sample_s if k > 1 else 0.0)

    @property
    def plain_s(self) -> float:
        return self.verify_s[0][1]

    def verify(self, nodes: float) -> float:
        """Seconds of one verifier pass over ``nodes`` trie nodes (root included)."""
        pts = self.verify_s
        if len(pts) == 1:
            return pts[0][1]
        i = min(max(bisect.bisect_right([n for n, _ in pts], nodes) - 1, 0), len(pts) - 2)
        (n0, t0), (n1, t1) = pts[i], pts[i + 1]
        return max(t0 + (t1 - t0) * (nodes - n0) / (n1 - n0), pts[0][1])


def calibration_sizes(max_gamma: int, max_candidates: int) -> list[int]:
    """Trie sizes (root included) that ``calibrate`` times: 1, 2, and 1 + γ/2, 1 + γ, 1 + 3γ/2, 1 + γK for
    γ = ``max_gamma``, K = ``max_candidates``.

    The points between 2 and 1 + γK matter: a CPU's cost per pass is far from linear in the nodes there. On a 2-core
    AVX2 EPYC (float32, SmolLM2, few-row products from ``specdiff.models.kernels``, 200-token context) forwards over 1, 2,
    5, 9 and 13 nodes took about 60, 66, 75, 111 and 141 ms, 33 nodes 150-210 ms: flat to 5 nodes, then steep. Interpolated from 1, 2, 9 and 33 alone,
    5 nodes looked 15% dearer and 13 nodes 10% cheaper than they were; and a K=1 round with its copied candidate
    (``specdiff.core.lookup``) scores about 1 + 1.6γ nodes, right where that error sits."""
    g = max_gamma
    return sorted({1, 2, 1 + max(g // 2, 1), 1 + g, 1 + g + g // 2, 1 + g * max_candidates})


@torch.no_grad()
def calibrate(drafter, verifier, prompt: Sequence[int], max_gamma: int, max_candidates: int,
              repeats: int = 3) -> SpeculationCosts:
    """Time whole verifying halves (``rounds.verify``: trie, pass, softmax at every node, selection, acceptance,
    commit) over the trie sizes of ``calibration_sizes`` on a throwaway session of ``prompt``, and the drafter's call
    at γ_max with the copied candidate's search, drafting one candidate (the argmax window) and ``max_candidates``
    (the draws' price: ``sample_s``) (after a warm-up each; medians). Draws from no shared generator.

    The sizes are timed round-robin (1, 2, 5, 9, 13, 33, 1, 2, ...), so a noisy stretch of a shared machine hits them
    alike: measured sequentially, 3 repeats each, four calibrations in a row on a 2-core VM put the 9-node pass at
    1.00-1.20x a plain step, and a policy that believed 1.00x speculated with K=4 on chat (0.89x plain).

    Served (a session whose rounds run on a verifier replica, a drafter with ``draft``: ``specdiff.serving``), each
    timed half is the call a served round makes, round trip included: what the policy must weigh there."""
    sizes = calibration_sizes(max_gamma, max_candidates)
    prompt = [int(t) for t in prompt]
    if verifier.max_context is not None:  # leave room for the trees and the most tokens each pass may commit
        deepest = [1 + (n - 1) // max(1, (n - 1) // max_gamma) if n > 1 else 1 for n in sizes]
        room = verifier.max_context - sizes[-1] - (repeats + 1) * sum(deepest) - 1
        prompt = prompt[-max(room, 1):]
    session = verifier.start(prompt)
    try:
        return _calibrate(drafter, verifier, session, sizes, max_gamma, max_candidates, repeats)
    finally:
        close = getattr(session, "close", None)
        if close is not None:
            close()


def _calibrate(drafter, verifier, session, sizes, max_gamma, max_candidates, repeats) -> SpeculationCosts:
    rounds = R.rounds_of(session)  # in-process, or on a verifier replica (a served session)
    vocab = verifier.vocab_size

    def draft_of(nodes: int) -> R.Draft | None:
        width = nodes - 1
        if width == 0:
            return None  # a plain step
        k = max(1, width // max_gamma)  # distinct first tokens: no sharing, exactly `nodes` nodes
        g = width // k
        return R.Draft((torch.arange(k * g).view(k, g) + 1 + session.tokens[-1]) % vocab)

    # Whole verifying halves (trie, scores, softmax at every node, selection, acceptance, commit), sampled at T=1:
    # what a round costs beyond the forward pass is part of its price (a plain step pays its share too). Served,
    # each is a call to the verifier replica: its round trip is part of the price too.
    sampling, spec = SamplingParams(temperature=1.0), SpecConfig()
    times: dict[int, list[float]] = {n: [] for n in sizes}
    seed = 0
    for _ in range(repeats + 1):
        for nodes in sizes:
            draft = draft_of(nodes)
            seed += 1
            t0 = time.perf_counter()
            rounds.step(sampling, seed) if draft is None else rounds.verify(draft, sampling, spec, seed)
            times[nodes].append(time.perf_counter() - t0)
    points = [(n, statistics.median(times[n][1:])) for n in sizes]  # the first round warms up
    prefix = list(session.tokens)
    features = getattr(drafter, "needs_features", False)  # a feature drafter reads the session's tapped states
    served = hasattr(drafter, "draft")  # a served drafter samples its candidates on its replica
    ks = sorted({1, max_candidates})  # K=1 drafts the argmax window; more candidates add the draws
    draft: dict[int, list[float]] = {k: [] for k in ks}
    gen = torch.Generator().manual_seed(0)
    try:
        for i in range(repeats + 1):  # growing prefix, as in decoding (a prefix-caching drafter runs the new part)
            for k in ks:  # interleaved: a noisy stretch hits both alike
                round_spec = replace(spec, gamma=max_gamma, num_candidates=k)
                t0 = time.perf_counter()
                if served:  # the call a served round makes (the session's rows travel once, then none are new)
                    p = prefix
                    d = drafter.draft(p, round_spec, i, session.features if features else None)
                else:
                    p = prefix[: len(prefix) - repeats + i]
                    if features:
                        marginals = drafter.propose(p, max_gamma, session.features[: len(p) - 1])
                    else:
                        marginals = drafter.propose(p, max_gamma)
                    d = R.draft(marginals, round_spec, gen)
                R.with_lookup(d, p, spec)  # the copied candidate's search is part of drafting
                draft[k].append(time.perf_counter() - t0)
        draft_s = statistics.median(draft[1][1:])
        sample_s = max(statistics.median(draft[ks[-1]][1:]) - draft_s, 0.0)
    except DrafterUnavailable:
        draft_s, sample_s = points[0][1], 0.0  # unknown: assume a drafter call costs a plain step
    for i in range(1, len(points)):  # timing noise must not make a bigger tree look cheaper
        points[i] = (points[i][0], max(points[i][1], points[i - 1][1]))
    return SpeculationCosts(draft_s, tuple(points), sample_s)


def costs_key(drafter, verifier, max_gamma: int, max_candidates: int) -> str:
    """What a cost model depends on: the machine, the verifier's and the drafter's kinds, weight shapes and dtypes,
    their kernel plans and taps, and the largest γ and K (the sizes ``calibrate`` times)."""
    def kind(x) -> list:
        return [type(x).__qualname__, getattr(x, "small_rows", None), getattr(x, "packed_rows", None),
                getattr(x, "tap_layers", None)]

    transformers = sys.modules.get("transformers")  # its attention and cache code are part of a pass's price
    return machine_cache.key("costs", CALIBRATION_VERSION, getattr(transformers, "__version__", None),
                             kind(verifier), machine_cache.shapes(verifier),
                             kind(drafter), machine_cache.shapes(drafter), calibration_sizes(max_gamma, max_candidates))


def cached_calibrate(drafter, verifier, prompt: Sequence[int], max_gamma: int, max_candidates: int,
                     cache_dir: Path | None, *, refresh: bool = False) -> tuple[SpeculationCosts, bool]:
    """(cost model, whether it was measured now): ``calibrate``'s result kept in ``cache_dir`` per machine and model
    shape (``costs_key``), so a later process on the same machine starts decoding at once (calibrating took 2.7-3 s
    of a 7-12 s start on a 2-core AVX2 EPYC). ``refresh`` measures again and replaces the kept one (a machine that
    was busy while it calibrated: see ``jobs/generate.py --recalibrate``)."""
    path = None
    if cache_dir is not None:
        path = Path(cache_dir) / f"costs-{costs_key(drafter, verifier, max_gamma, max_candidates)}.json"

    def measure() -> dict:
        costs = calibrate(drafter, verifier, prompt, max_gamma, max_candidates)
        return {**costs.to_dict(), "context_tokens": len(prompt), "measured_at": time.time()}

    return machine_cache.cached(path, measure, SpeculationCosts.from_dict, refresh=refresh)


class SpeculationPolicy:
    """Per-decode state: acceptance estimates and the plain/probe schedule. ``choose()`` before each round,
    ``observe()`` after each speculative round (not after plain steps).

    α_j for K is ``(accepted_j + w·prior_j) / (reached_j + w)`` with counts discounted by ``discount`` per round
    of that K (recent rounds weigh more: a prompt where the drafter is good is noticed). The prior weighs as
    ``w = prior_weight`` rounds (3 by default): the first round of a decode, often at the hardest token of the answer,
    must not settle the policy alone. With w=1 a failed first round made every position's estimate 0.25, the policy
    went plain and its failed probes spaced out (10, 20, 40 steps): replayed over per-position rounds of the 12
    held-out math prompts (trained feature drafter, T=0, this machine's cost model; 8 of 12 first rounds kept
    nothing) 20% of the tokens were plain and the decode ran 1.66x plain against 1.85x with w=3 and 1.90x for fixed
    γ=8 (an untrained drafter: 1.14x / 1.11x, chat 1.00x / 1.00x). Priors: for K=1,
    ``alpha0`` at j=1 and ``decay``·α_{j-1} beyond (a position never reached inherits its predecessor's estimate;
    ``decay`` is 1.0 by default: a trained drafter accepts later positions more often once reached, and with 0.9
    the policy stayed at γ 3-5 and never learned otherwise: adaptive 1.28x plain on math against 1.94x with 1.0,
    5 held-out prompts); for a larger K, the next smaller K's α_j raised by ``boost``·α(1-α). ``boost`` is 0 by
    default: a K never tried is assumed as good as the next smaller one, no better, so it costs its larger trie
    until its own rounds show a gain (with 0.5, half the gain of an independent extra draw, the policy kept
    choosing K=2 at T=0, where the drawn candidates beside the argmax window rarely won: same α, more nodes). Each
    K's estimate is capped by the next larger K's (selecting among fewer candidates does not accept more), and a
    round at K also teaches every smaller K what it would have accepted (``observe``).

    Speculation must beat a plain step by ``min_gain`` (1.1: 10%) in expected tokens per second. Near the break-even
    point a round gains nothing in expectation and loses to what the cost model leaves out (a drafter call's
    variance, the estimates' noise); measured without the margin (2-core AVX2 EPYC, trained feature drafter, chat,
    where held-out α_1 is about 0.35): 0.94x plain at T=0 and 0.90x at T=1.
    """

    def __init__(
        self,
        costs: SpeculationCosts,
        *,
        gammas: Sequence[int],
        ks: Sequence[int],
        allow_plain: bool,
        alpha0: float = 0.5,
        prior_weight: float = 3.0,
        decay: float = 1.0,
        boost: float = 0.0,
        discount: float = 0.95,
        min_gain: float = 1.1,
        probe_gamma: int = 2,
        probe_budget: float = 0.03,
        min_probe_interval: int = 4,
        max_probe_interval: int = 512,
    ):
        self.costs = costs
        self.gammas = sorted(set(gammas))
        self.ks = sorted(set(ks))
        self.allow_plain = allow_plain
        self.min_gain = min_gain
        self.alpha0, self.prior_weight, self.decay = alpha0, prior_weight, decay
        self.boost, self.discount = boost, discount
        size = self.gammas[-1]
        self._accepted = {k: [0.0] * size for k in self.ks}  # discounted counts per K and position
        self._reached = {k: [0.0] * size for k in self.ks}
        # observed trie nodes / (γK): shared prefixes make tries smaller, a prompt-lookup candidate larger
        self._share = {k: 1.0 for k in self.ks}
        self._rounds = {k: 0 for k in self.ks}
        self.probe = (min(probe_gamma, size) if min(probe_gamma, size) in self.gammas else self.gammas[0], self.ks[0])
        g, k = self.probe
        extra = costs.draft(k) + costs.verify(1 + g * k) - costs.plain_s  # what a failed probe costs over a plain step
        self._base_interval = max(min_probe_interval, math.ceil(extra / (probe_budget * costs.plain_s)))
        self._max_interval = max_probe_interval
        self._fails = 0  # probes in a row after which plain still won
        self._sharing = 1  # sessions of the batch step the last choice joined, this one included
        self._since_probe = 0  # plain steps since the last probe
        self._probing = False
        self._menu: dict | None = None  # the menu the last ``rates`` priced

    @classmethod
    def from_spec(cls, spec: SpecConfig, costs: SpeculationCosts, **kwargs) -> SpeculationPolicy:
        """γ free when ``spec.gamma`` is None (1..max_gamma, plain allowed), else fixed; K free when
        ``spec.num_candidates`` is None (powers of two up to max_candidates; 1 under speculative acceptance)."""
        gammas = range(1, spec.max_gamma + 1) if spec.gamma is None else [spec.gamma]
        if spec.num_candidates is not None:
            ks = [spec.num_candidates]
        elif spec.acceptance == "speculative":
            ks = [1]
        else:
            ks = [1 << i for i in range(spec.max_candidates.bit_length()) if 1 << i <= spec.max_candidates]
        return cls(costs, gammas=gammas, ks=ks, allow_plain=spec.gamma is None, **kwargs)

    def alphas(self) -> dict[int, list[float]]:
        """Current α_1..α_γmax estimates per K."""
        out: dict[int, list[float]] = {}
        smaller: list[float] | None = None
        for k in self.ks:  # upwards: priors inherited from the next smaller K
            acc, reach, w = self._accepted[k], self._reached[k], self.prior_weight
            est: list[float] = []
            for j in range(len(acc)):
                if smaller is not None:
                    prior = smaller[j] + self.boost * smaller[j] * (1 - smaller[j])
                else:
                    prior = self.alpha0 if j == 0 else self.decay * est[j - 1]
                est.append((acc[j] + w * prior) / (reach[j] + w))
            out[k] = smaller = est
        for lo, hi in zip(self.ks[-2::-1], self.ks[:0:-1]):  # downwards: fewer candidates never accept more
            out[lo] = [min(a, b) for a, b in zip(out[lo], out[hi])]
        return out

    def menu(self) -> dict[tuple[int, int], tuple[float, float, float]]:
        """Every choice on the menu -> (expected tokens, trie nodes with the root, drafting seconds); plain as
        (0, 0) when allowed."""
        out = {PLAIN: (1.0, 1.0, 0.0)} if self.allow_plain else {}
        for k, alpha in self.alphas().items():
            streak = 1.0
            expected = 1.0
            for g in range(1, self.gammas[-1] + 1):
                streak *= alpha[g - 1]
                expected += streak
                if g in self.gammas:
                    out[(g, k)] = (expected, 1 + g * k * self._share[k], self.costs.draft(k))
        return out

    def rates(self, load: Load | None = None) -> dict[tuple[int, int], float]:
        """Expected tokens per second of every choice on the menu (plain as (0, 0) when allowed).

        ``load``: the other sessions of the batch step this round joins (continuous batching). A choice is then
        worth what it adds to the whole step's tokens per second: (E + e) / (T(R + n) + d) - E / T(R), with E, R
        the others' expected tokens and rows, e, n, d this choice's tokens, trie nodes and drafting time, and T the
        verifier pass over that many rows (``costs.verify``). Alone (no others) that is e / (d + T(n)), the rate
        without load. Busy, a tree's extra rows slow every session's step, so plain steps or small trees win where
        the verifier's pass grows with its rows; with few others, speculation still pays."""
        others = load is not None and load.sessions > 0
        base = load.expected / self.costs.verify(load.rows) if others and load.rows > 0 else 0.0
        out = {}
        self._menu = self.menu()  # ``expected`` reads the chosen entry back (no second pass over the estimates)
        for choice, (expected, nodes, draft_s) in self._menu.items():
            if others:
                out[choice] = (load.expected + expected) / (draft_s + self.costs.verify(load.rows + nodes)) - base
            else:
                out[choice] = expected / (draft_s + self.costs.verify(nodes))
        return out

    def expected(self, choice: tuple[int, int]) -> float:
        """Expected tokens of ``choice`` (a round's, or 1 for a plain step), as the last ``rates`` priced it."""
        menu = self._menu if self._menu is not None else self.menu()
        return menu.get(choice, (1.0, 1.0, 0.0))[0]

    def choose(self, load: Load | None = None) -> tuple[int, int]:
        """(γ, K) for the next round, or ``PLAIN`` = (0, 0); ``load``: see ``rates``."""
        rates = self.rates(load)
        plain_rate = rates.pop(PLAIN, None)
        best = max(rates, key=lambda c: (rates[c], -c[0] * c[1]))  # ties: the smaller tree
        if plain_rate is None or rates[best] > self.min_gain * plain_rate:
            self._fails, self._since_probe, self._probing = 0, 0, False
            return best
        if self._probing:  # the probe did not make speculation worth it: wait longer before the next one
            self._fails += 1
            self._probing = False
        self._sharing = 1 + (load.sessions if load is not None else 0)
        interval = self._interval()
        if self._since_probe >= interval:
            self._since_probe, self._probing = 0, True
            return self.probe
        self._since_probe += 1
        return PLAIN

    def _interval(self) -> int:
        """Plain steps between probes: doubling after each failed one; in a batch step of n sessions n times as many
        (a probe's drafter step and tree rows delay every session of the step, so the batch, not each session, keeps
        to ``probe_budget``: on the AVX-512 EPYC 16 concurrent decodes probed about 70 times in 1024 tokens, each
        stalling 15 others)."""
        return min(self._base_interval << min(self._fails, 20), self._max_interval) * self._sharing

    def plain_run(self, limit: int) -> int:
        """Right after ``choose()`` returned ``PLAIN``: how many plain steps in a row, this one included and at most
        ``limit``, it would choose before its next probe, all taken at once (a served session runs them in one call:
        ``specdiff.core.engine``). Only rounds change its estimates, so those choices are already fixed."""
        n = max(1, min(limit, self._interval() - self._since_probe + 1))
        self._since_probe += n - 1
        return n

    def observe(self, gamma: int, k: int, num_accepted: int, tree_nodes: int, *,
                candidates: torch.Tensor | None = None, streak_probs: torch.Tensor | None = None,
                lookup: bool = False) -> None:
        """A speculative round ran with window ``gamma`` and ``k`` candidates; ``tree_nodes`` excludes the root.

        Given the draft's ``candidates`` [rows, γ] (the copied candidate last when ``lookup``) and ``streak_probs``
        (greedy acceptance, ``rounds.Outcome``: row r's chance of keeping its first j+1 tokens), the round also tells
        what every smaller K on the menu would have done: a K'-round's candidates are distributed as this round's
        first K' rows (the argmax window, then independent draws), so self-selection among those rows and the copy is
        replayed and K' learns the kept row's per-position chances (expected counts, not the one realised streak) and
        the trie it would have scored. Without them (speculative acceptance), K alone learns from ``num_accepted``.

        Measured before (2-core AVX2 EPYC, trained feature drafter, T=0): K=2 rounds, never informing K=1, looked as
        good as their prior and kept the policy at γ 2-3 with K=2 on math (1.56x plain against 1.95x for fixed γ=4,
        K=1)."""
        if k not in self._accepted:
            return
        if candidates is None or streak_probs is None:
            reach = [1.0] * min(num_accepted + 1, gamma)
            self._learn(k, gamma, reach, [1.0] * min(num_accepted, gamma), tree_nodes)
            return
        rows = candidates.tolist()
        scores = streak_probs.double().sum(-1).tolist()
        copy = [len(rows) - 1] if lookup else []
        for kk in self.ks:
            if kk > k or kk > len(rows) - len(copy):
                continue
            subset = list(range(kk)) + copy
            best = max(subset, key=lambda r: (scores[r], -r))  # selection's rule: ties to the earlier row
            keep = streak_probs[best].tolist()
            nodes = len({tuple(rows[r][: j + 1]) for r in subset for j in range(gamma)})
            self._learn(kk, gamma, [1.0] + keep[:-1], keep, nodes)

    def _learn(self, k: int, gamma: int, reach: Sequence[float], keep: Sequence[float], nodes: int) -> None:
        """Discount K's counts, then add one round's chance of reaching / accepting each position."""
        acc, rch = self._accepted[k], self._reached[k]
        for j in range(len(acc)):
            acc[j] *= self.discount
            rch[j] *= self.discount
        for j in range(min(gamma, len(acc))):
            rch[j] += reach[j] if j < len(reach) else 0.0
            acc[j] += keep[j] if j < len(keep) else 0.0
        n = self._rounds[k]
        self._share[k] = (self._share[k] * (n + 1) + nodes / (gamma * k)) / (n + 2)  # weak prior of 1.0
        self._rounds[k] += 1
