"""One stats object for a decode: feeds logs, MLflow and Prometheus alike."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class DecodeStats:
    rounds: int = 0  # speculative rounds (one drafter call + one verifier call each)
    verifier_calls: int = 0  # all verifier forwards after prefill, plain steps included
    emitted: int = 0  # tokens emitted (accepted + recovered/bonus), before truncation by stop / max_new_tokens
    drafted: int = 0  # tokens in the selected candidates
    accepted: int = 0
    candidates: int = 0  # distinct candidates scored
    tree_nodes: int = 0  # trie nodes scored, root excluded
    accepted_per_position: list[int] = field(default_factory=list)  # [gamma]: rounds where position j was accepted
    reached_per_position: list[int] = field(default_factory=list)  # [gamma]: rounds where position j was verified
    lookup_rounds: int = 0  # rounds whose tree held a candidate copied from the context (SpecConfig.prompt_lookup)
    lookup_selected: int = 0  # ... in which self-selection kept it (it scored strictly higher than every draft)
    fallbacks: int = 0  # rounds decoded verifier-only because the drafter was unavailable or too slow
    policy_plain_steps: int = 0  # verifier-only steps the adaptive policy chose (no speculation paid)
    gated_plain_steps: int = 0  # verifier-only steps taken while the decoder's gate held speculation off (load)
    rounds_by_gamma: list[int] = field(default_factory=list)  # [gamma+1]: speculative rounds run with window g
    rounds_by_k: list[int] = field(default_factory=list)  # [K+1]: speculative rounds run with K candidates
    calls_by_emitted: list[int] = field(default_factory=list)  # [n]: verifier calls that emitted n tokens
    drafter_s: float = 0.0
    verifier_s: float = 0.0
    prefill_s: float = 0.0
    calibration_s: float = 0.0  # the adaptive policy's one-off cost measurement (first adaptive decode only)

    @property
    def tau(self) -> float:
        """Acceptance length: tokens emitted per verifier call, recovered/bonus included (vLLM's convention)."""
        return self.emitted / self.verifier_calls if self.verifier_calls else 0.0

    @property
    def alpha(self) -> list[float]:
        """alpha_j: of the rounds that reached position j, the fraction that accepted it."""
        return [a / r if r else 0.0 for a, r in zip(self.accepted_per_position, self.reached_per_position)]

    def record_round(
        self, gamma: int, num_accepted: int, candidates: int, tree_nodes: int, num_candidates: int | None = None
    ) -> None:
        grow = gamma - len(self.accepted_per_position)
        if grow > 0:
            self.accepted_per_position.extend([0] * grow)
            self.reached_per_position.extend([0] * grow)
        _bump(self.rounds_by_gamma, gamma)
        if num_candidates is not None:
            _bump(self.rounds_by_k, num_candidates)
        for j in range(min(num_accepted + 1, gamma)):  # verified up to and including the first rejection
            self.reached_per_position[j] += 1
        for j in range(num_accepted):
            self.accepted_per_position[j] += 1
        self.rounds += 1
        self.verifier_calls += 1
        self.drafted += gamma
        self.accepted += num_accepted
        self.emitted += num_accepted + 1
        _bump(self.calls_by_emitted, num_accepted + 1)
        self.candidates += candidates
        self.tree_nodes += tree_nodes

    @property
    def choices(self) -> dict[str, int]:
        """What the decode ran: plain steps the policy chose, rounds by window and by K (for logs)."""
        out = {"plain": self.policy_plain_steps}
        if self.gated_plain_steps:
            out["busy_plain"] = self.gated_plain_steps
        out.update({f"gamma={g}": n for g, n in enumerate(self.rounds_by_gamma) if n})
        out.update({f"K={k}": n for k, n in enumerate(self.rounds_by_k) if n})
        return out

    def record_plain_step(self) -> None:
        self.verifier_calls += 1
        self.emitted += 1
        _bump(self.calls_by_emitted, 1)

    def merge(self, other: DecodeStats) -> DecodeStats:
        """Sum of two stats (for aggregating over prompts)."""
        out = DecodeStats()
        for name, value in asdict(self).items():
            theirs = getattr(other, name)
            if isinstance(value, list):
                n = max(len(value), len(theirs))
                value = [a + b for a, b in zip(value + [0] * (n - len(value)), theirs + [0] * (n - len(theirs)))]
                setattr(out, name, value)
            else:
                setattr(out, name, value + theirs)
        return out

    def to_dict(self) -> dict:
        return {**asdict(self), "tau": self.tau, "alpha": self.alpha}


def _bump(counts: list[int], index: int) -> None:
    if index >= len(counts):
        counts.extend([0] * (index + 1 - len(counts)))
    counts[index] += 1
