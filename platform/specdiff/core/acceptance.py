"""Verification of the selected draft. Both rules emit exactly the verifier's distribution.

Vocabulary (as in vLLM's rejection sampler): **accepted** tokens are drafted tokens kept; the **recovered** token is
sampled at the first rejection; the **bonus** token is sampled from p(. | s, x_1..x_gamma) after a fully accepted
window. Every round emits the accepted tokens plus exactly one recovered-or-bonus token.

Greedy acceptance, and why it is lossless with self-selection
------------------------------------------------------------
At position j, with p = p(. | s, x_<j) and the selected candidate's token x: accept with probability p(x);
otherwise emit y ~ p(y) 1[y != x] / (1 - p(x)). Let q'(x) be the probability that the selected candidate has x at
this position, for ANY selection rule that uses drafter samples and verifier probabilities but not the accept
coins. Then

    P(emit y) = q'(y) p(y) + sum_{x != y} q'(x) (1 - p(x)) p(y) / (1 - p(x)) = p(y) (q'(y) + 1 - q'(y)) = p(y).

Conditioning on an accepted prefix leaves later positions in the same situation, so the whole output follows the
verifier exactly. What breaks it: verifying several candidates with coins and keeping the longest (the coins then
feed the selection).

Speculative sampling (K = 1, drafter probabilities q known): accept with probability min(1, p(x)/q(x)); on
rejection emit from norm(max(p - q, 0)). Exact for a single candidate drawn from q, and accepts more than greedy
acceptance. At temperature 0 (p one-hot) both rules reduce to "accept iff x == argmax p".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specdiff.core.sampling import sample


@dataclass(frozen=True)
class Verdict:
    num_accepted: int  # leading drafted tokens kept
    next_token: int  # recovered token (num_accepted < gamma) or bonus token (num_accepted == gamma)

    def emitted(self, draft: list[int]) -> list[int]:
        return draft[: self.num_accepted] + [self.next_token]


def _first_rejection(reject: torch.Tensor) -> int | None:
    hits = reject.nonzero()
    return int(hits[0]) if hits.numel() else None


def greedy_accept(draft: torch.Tensor, probs: torch.Tensor, generator: torch.Generator | None) -> Verdict:
    """draft: [gamma] long; probs: [gamma+1, V] verifier distribution at each draft position and after the last."""
    gamma = int(draft.shape[0])
    idx = torch.arange(gamma)
    p_draft = probs[idx, draft].double()  # [gamma]
    residual_mass = probs[:gamma].double().sum(-1) - p_draft  # [gamma]
    coins = torch.rand(gamma, generator=generator, dtype=torch.float64)
    # Accept iff coin < p(x); at temperature 0, p(x) is 0 or 1, so this is exact argmax matching. Where no other
    # token has mass (p(x) == 1 up to rounding) there is nothing to recover, so the token is kept.
    j = _first_rejection((coins >= p_draft) & (residual_mass > 0))
    if j is None:
        return Verdict(gamma, int(sample(probs[gamma], generator)))
    residual = probs[j].clone()
    residual[int(draft[j])] = 0  # p with x removed, renormalised
    return Verdict(j, int(sample(residual / residual.sum(), generator)))


def speculative_accept(
    draft: torch.Tensor, probs: torch.Tensor, draft_probs: torch.Tensor, generator: torch.Generator | None
) -> Verdict:
    """Standard speculative sampling for one candidate drawn from draft_probs.

    draft: [gamma]; probs: [gamma+1, V] verifier; draft_probs: [gamma, V] the distribution draft was drawn from.
    """
    gamma = int(draft.shape[0])
    idx = torch.arange(gamma)
    p = probs[idx, draft].double()
    q = draft_probs[idx, draft].double()
    residual = (probs[:gamma].double() - draft_probs.double()).clamp_min(0)  # [gamma, V]
    coins = torch.rand(gamma, generator=generator, dtype=torch.float64)
    # q <= p: always accept (coin * q < q <= p); q > p: accept with probability p / q. Where p == q everywhere the
    # residual is empty and the token is kept.
    j = _first_rejection((coins * q >= p) & (residual.sum(-1) > 0))
    if j is None:
        return Verdict(gamma, int(sample(probs[gamma], generator)))
    return Verdict(j, int(sample(residual[j] / residual[j].sum(), generator)))
