"""Self-selection (SpecDiff-2, Alg. 1 / Eq. 7): sample K candidates from the drafter's marginals, keep the one with
the highest expected accepted streak under the verifier.

The score of candidate x is ``sum_m prod_{j<=m} p(x_j | s, x_<j)``: the expected number of tokens greedy
acceptance keeps. Selection looks at drafter samples and verifier probabilities only, never at the acceptance
coins, which is what keeps greedy acceptance exact (see ``acceptance``).
"""

from __future__ import annotations

import torch

from specdiff.core.sampling import sample, tempered
from specdiff.core.tree import TokenTree


def sample_candidates(
    marginals: torch.Tensor,
    num_candidates: int,
    temperature: float,
    generator: torch.Generator | None,
    top_k: int = 0,
    include_argmax: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Draw K candidates, each position independently.

    marginals: [gamma, V] drafter probabilities. Returns (candidates [K, gamma] long, draft_probs [gamma, V]), where
    draft_probs is the exact distribution each position was drawn from (needed by speculative sampling; None when
    nothing is drawn: K=1 with the argmax, where computing it over the vocabulary cost ~4 ms a round).
    ``include_argmax``: candidate 0 is the marginals' argmax window, the other K-1 are drawn (a fixed candidate
    is just another selection input that ignores the acceptance coins, so greedy acceptance stays exact; it is
    not a draw from draft_probs, so speculative sampling must not use it).
    """
    drawn = num_candidates - 1 if include_argmax else num_candidates
    if include_argmax and not drawn:
        return marginals.argmax(-1)[None].long().contiguous(), None
    draft_probs = tempered(marginals, temperature, top_k)
    candidates = sample(draft_probs, generator, drawn).T if drawn else marginals.new_zeros(0, marginals.shape[0])
    if include_argmax:
        candidates = torch.cat([marginals.argmax(-1)[None], candidates.long()])
    return candidates.long().contiguous(), draft_probs


def path_probs(tree: TokenTree, node_probs: torch.Tensor) -> torch.Tensor:
    """p(x_j | s, x_<j) for every distinct candidate and position: [C, gamma]. node_probs: [N+1, V]."""
    return node_probs[tree.parent_rows(), tree.candidates]


def expected_streak(probs: torch.Tensor) -> torch.Tensor:
    """sum_m prod_{j<=m} probs[..., j] over the last dim: [..., gamma] -> [...]."""
    return probs.cumprod(dim=-1).sum(dim=-1)


def select(tree: TokenTree, node_probs: torch.Tensor) -> tuple[int, torch.Tensor]:
    """Index (row of ``tree.candidates``) of the best candidate, and all scores [C].

    Ties go to the candidate sampled first (``torch.argmax`` returns the first maximum), so selection is
    deterministic given the samples.
    """
    scores = expected_streak(path_probs(tree, node_probs).double())
    return int(scores.argmax()), scores
