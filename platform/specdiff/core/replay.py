"""Replay the adaptive policy offline over recorded rounds: how a decode would have gone under a policy, in seconds.

At T=0 a round's outcome depends only on where it starts: the prefix is the verifier's greedy output so far, the
drafter's argmax window and the copied candidate follow from it, and acceptance keeps the longest prefix that
matches greedy decoding. So ``record`` runs, at every position of a prompt's greedy output, one real round (the
engine's own ``_round``: drafter, copied candidate, trie pass, selection) of the largest window with one drafted
candidate, and keeps its candidates and their per-position chances of being kept (0/1 at T=0). ``replay`` then
walks a decode under any policy over those records in microseconds: a round of window γ started at position t keeps
what the first γ columns of record t keep, costs ``draft(1) + verify(nodes)`` of a fixed cost model, and teaches the
policy exactly what the engine would (``SpeculationPolicy.observe`` with the same rows); a plain step costs
``plain_s``. Used to tune the policy (``jobs/policy_replay.py``), then checked with ``jobs/bench.py``.

Approximations, all on the side of simplicity: T=0 and K=1 only (at T=0 the drawn candidates beside the argmax
window rarely win; the bench's adaptive rows chose K=1 in every round); a window of γ below the recorded one is
taken as the recorded window's first γ tokens (a block drafter's masks see the block, so a smaller one can differ);
times come from the cost model, not a clock. Measured against the bench on a 2-core Xeon (bf16, 12 held-out prompts
per domain): the replay put the adaptive decode at 0.87x of fixed γ=8 on math where the bench measured 0.84x.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from specdiff.core.config import DecodeOptions, SamplingParams, SpecConfig
from specdiff.core.engine import SpeculativeDecoder, generate_plain
from specdiff.core.policy import SpeculationCosts, SpeculationPolicy
from specdiff.core.stats import DecodeStats


@dataclass(frozen=True)
class RoundRecord:
    """One round started at a position of the greedy output: ``candidates`` [rows, γ] (the argmax window, then
    the copied candidate when ``lookup``), ``streak_probs`` [rows, γ]: row r's chance of keeping its first j+1
    tokens (``rounds.Outcome.streak_probs``)."""

    candidates: torch.Tensor
    streak_probs: torch.Tensor
    lookup: bool

    def to_dict(self) -> dict:
        return {"candidates": self.candidates.tolist(), "streak_probs": self.streak_probs.tolist(),
                "lookup": self.lookup}

    @classmethod
    def from_dict(cls, value: dict) -> RoundRecord:
        return cls(torch.tensor(value["candidates"], dtype=torch.long),
                   torch.tensor(value["streak_probs"], dtype=torch.float32), bool(value["lookup"]))


@dataclass(frozen=True)
class Replayed:
    tokens: int
    seconds: float
    rounds: int
    plain_steps: int


def record(decoder: SpeculativeDecoder, prompt: Sequence[int], *, max_new_tokens: int, gamma: int,
           stop_token_ids: Sequence[int] = (), prompt_lookup: bool = True) -> list[RoundRecord]:
    """One real round (window ``gamma``, one drafted candidate plus the copied one unless ``prompt_lookup`` is
    off, T=0) at every position of ``prompt``'s greedy continuation (``max_new_tokens``, ending at a stop token) ->
    a record per position."""
    sampling = SamplingParams(temperature=0.0)
    options = DecodeOptions(max_new_tokens=max_new_tokens, sampling=sampling, stop_token_ids=list(stop_token_ids))
    greedy = generate_plain(decoder.verifier, prompt, options).tokens
    spec = SpecConfig(gamma=gamma, num_candidates=1, prompt_lookup=prompt_lookup)
    out = []
    for t in range(len(greedy)):
        session = decoder.verifier.start(list(prompt) + greedy[:t])
        _, seen = decoder._round(session, sampling, spec, 0, DecodeStats())
        if seen is None:
            raise RuntimeError("the drafter was unavailable while recording")
        draft, looked_up, outcome = seen
        out.append(RoundRecord(draft.candidates.clone(), outcome.streak_probs.clone(), looked_up))
    return out


def replay(records: Sequence[RoundRecord], costs: SpeculationCosts,
           policy: Callable[[SpeculationCosts], SpeculationPolicy] | None = None,
           gamma: int | None = None) -> Replayed:
    """Walk one decode over ``records``: under ``policy(costs)`` (a fresh policy, as each decode gets), or at the
    fixed window ``gamma``."""
    if (policy is None) == (gamma is None):
        raise ValueError("give either a policy or a fixed gamma")
    pol = policy(costs) if policy is not None else None
    n, t, seconds, rounds, plain = len(records), 0, 0.0, 0, 0
    while t < n:
        if pol is not None:
            window = pol.choose()[0]
            if window == 0:  # a plain run, as many steps as the policy fixes at once
                steps = min(pol.plain_run(n - t), n - t)
                t, seconds, plain = t + steps, seconds + steps * costs.plain_s, plain + steps
                continue
        else:
            window = gamma
        window = min(window, n - t - 1)  # as the engine: leave a slot for the recovered/bonus token
        if window <= 0:
            t, seconds, plain = t + 1, seconds + costs.plain_s, plain + 1
            continue
        rec = records[t]
        rows, keep = rec.candidates[:, :window], rec.streak_probs[:, :window]
        nodes = len({tuple(r[: j + 1]) for r in rows.tolist() for j in range(window)})
        accepted = int(keep.sum(-1).max().round())
        seconds += costs.draft(1) + costs.verify(1 + nodes)
        if pol is not None:
            pol.observe(window, 1, accepted, nodes, candidates=rows, streak_probs=keep, lookup=rec.lookup)
        t, rounds = t + accepted + 1, rounds + 1
    return Replayed(n, seconds, rounds, plain)


def speedup(decodes: Sequence[Sequence[RoundRecord]], costs: SpeculationCosts, **kwargs) -> tuple[float, float]:
    """(tokens per second against plain decoding's, share of tokens from plain steps) over several decodes."""
    results = [replay(records, costs, **kwargs) for records in decodes]
    tokens = sum(r.tokens for r in results)
    seconds = sum(r.seconds for r in results)
    if not tokens:
        return 1.0, 0.0
    return tokens * costs.plain_s / seconds, sum(r.plain_steps for r in results) / tokens


__all__ = ["RoundRecord", "Replayed", "record", "replay", "speedup"]
