"""Held-out evaluation of a drafter against the verifier it serves: α_j per position and the expected streak.

For every held-out prefix s the drafter proposes marginals (one pass), K candidates are drawn at the draft
temperature (argmax at 0) and the verifier scores each: p_j = p(x_j | s, x_<j) at the verifier's sampling settings.
The candidate with the highest expected streak Σ_m Π_{j≤m} p_j is kept (self-selection, as in serving). That
score is exactly the expected number of tokens greedy acceptance keeps from it; α_j = E[Π_{i≤j} p_i] /
E[Π_{i<j} p_i] is the probability that position j is accepted given that it is reached (``DecodeStats.alpha``
in expectation). Pure torch.

The records (``EvalResult``, ``HeldoutSpec``) are plain data in ``specdiff.lineage.evaluation``; a registered pair's
evaluation on a ``HeldoutSpec`` (the verifier completes the prompts, then the drafter is scored) is
``specdiff.lifecycle.evaluate``.
"""

from __future__ import annotations

from typing import Sequence

import torch

from specdiff.core.config import DrafterConfig, SamplingParams
from specdiff.models.drafter import bound_prefixes, window_inputs, window_logits
from specdiff.models.hf import HFModel
from specdiff.core.sampling import target_probs
from specdiff.core.selection import expected_streak, sample_candidates
from specdiff.distill.trajectories import causal_inputs
from specdiff.lineage.evaluation import EvalResult
from specdiff.lineage.evaluation import HeldoutSpec, read_prompt_ids  # noqa: F401 (moved there; kept importable)


@torch.no_grad()
def verifier_chain_probs(
    verifier: HFModel, prefixes: Sequence[Sequence[int]], drafts: torch.Tensor, sampling: SamplingParams
) -> torch.Tensor:
    """p(x_j | s, x_<j) for every row: prefixes (B of them), drafts [B, γ] -> [B, γ] (one causal pass)."""
    gamma = drafts.shape[1]
    ids, valid, positions = causal_inputs([list(s) + d for s, d in zip(prefixes, drafts.tolist())])
    logits = verifier.logits(ids, attention_mask=valid.long(), position_ids=positions, last=gamma + 1)
    probs = target_probs(logits[:, :gamma], sampling)  # output at s_last predicts x_1, ...
    return probs.gather(-1, drafts[..., None].to(probs.device)).squeeze(-1).cpu()


@torch.no_grad()
def evaluate_drafter(
    drafter: HFModel,
    drafter_config: DrafterConfig,
    verifier: HFModel,
    prefixes: Sequence[Sequence[int]],
    gamma: int,
    sampling: SamplingParams,
    *,
    num_candidates: int = 1,
    draft_temperature: float = 0.0,
    generator: torch.Generator | None = None,
    batch_size: int = 32,
) -> EvalResult:
    marginals = []
    for start in range(0, len(prefixes), batch_size):
        chunk = bound_prefixes(prefixes[start : start + batch_size], gamma, drafter_config.max_context)
        batch = window_inputs(chunk, gamma, drafter_config.mask_token_id)
        marginals.append(window_logits(drafter, batch, drafter_config, grad=False).softmax(-1).cpu())  # [B, γ, V]
    return score_drafts(torch.cat(marginals), prefixes, verifier, gamma, sampling, num_candidates=num_candidates,
                        draft_temperature=draft_temperature, generator=generator, batch_size=batch_size)


@torch.no_grad()
def score_drafts(
    all_marginals: torch.Tensor,
    prefixes: Sequence[Sequence[int]],
    verifier: HFModel,
    gamma: int,
    sampling: SamplingParams,
    *,
    num_candidates: int = 1,
    draft_temperature: float = 0.0,
    generator: torch.Generator | None = None,
    batch_size: int = 32,
    chain_probs=None,
) -> EvalResult:
    """Drafter marginals [P, γ, V] of every held-out prefix -> K candidates each, self-selection by the verifier,
    and α_j / expected streak of the selected ones (any drafter kind).

    ``chain_probs(start, prefixes, drafts [B*K, γ]) -> p [B*K, γ]``: how the verifier scores a chunk's drafts
    (default: one causal pass over prefix + draft, ``verifier_chain_probs``)."""
    if chain_probs is None:
        def chain_probs(start, chunk, drafts):
            k = drafts.shape[0] // len(chunk)
            return verifier_chain_probs(verifier, [list(s) for s in chunk for _ in range(k)], drafts, sampling)

    streaks, reached, accepted = [], torch.zeros(gamma, dtype=torch.float64), torch.zeros(gamma, dtype=torch.float64)
    for start in range(0, len(prefixes), batch_size):
        marginals = all_marginals[start : start + batch_size]
        chunk = prefixes[start : start + batch_size]
        drafts = torch.stack(
            [sample_candidates(m, num_candidates, draft_temperature, generator)[0] for m in marginals]
        )  # [B, K, γ]
        p = chain_probs(start, chunk, drafts.reshape(-1, gamma)).double()
        p = p.reshape(len(chunk), num_candidates, gamma)
        best = expected_streak(p).argmax(-1)  # [B]
        chosen = p[torch.arange(len(chunk)), best]  # [B, γ]
        survive = chosen.cumprod(-1)  # [B, γ] P(positions 1..j all accepted)
        streaks.append(survive.sum(-1))
        accepted += survive.sum(0)
        reached += torch.cat([torch.ones(len(chunk), 1, dtype=torch.float64), survive[:, :-1]], 1).sum(0)
    alpha = (accepted / reached.clamp_min(1e-300)).tolist()
    return EvalResult(expected_streak=float(torch.cat(streaks).mean()), alpha=alpha, windows=len(prefixes))


def alpha_plot(history: Sequence[tuple[int, EvalResult]], path: str, label: str = "step {}") -> str:
    """PNG of α_j per position, one line per evaluation step (``label`` formats each line's legend entry)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    for step, result in history:
        ax.plot(range(1, len(result.alpha) + 1), result.alpha, marker="o", label=label.format(step))
    ax.set_xlabel("draft position j")
    ax.set_ylabel("α_j (accepted | reached)")
    ax.set_ylim(0, 1)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
