"""Held-out evaluation of a drafter against the verifier it serves: α_j per position and the expected streak.

For every held-out prefix s the drafter proposes marginals (one pass), K candidates are drawn at the draft
temperature (argmax at 0) and the verifier scores each: p_j = p(x_j | s, x_<j) at the verifier's sampling settings.
The candidate with the highest expected streak Σ_m Π_{j≤m} p_j is kept (self-selection, as in serving). That
score is exactly the expected number of tokens greedy acceptance keeps from it; α_j = E[Π_{i≤j} p_i] /
E[Π_{i<j} p_i] is the probability that position j is accepted given that it is reached (``DecodeStats.alpha``
in expectation). Pure torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from specdiff.core.config import DrafterConfig, SamplingParams
from specdiff.models.drafter import bound_prefixes, window_inputs, window_logits
from specdiff.models.hf import HFModel
from specdiff.core.sampling import target_probs
from specdiff.core.selection import expected_streak, sample_candidates
from specdiff.distill.teacher import causal_inputs


@dataclass(frozen=True)
class EvalResult:
    expected_streak: float  # mean over held-out windows of the selected candidate's expected accepted tokens
    alpha: list[float]  # [γ] P(position j accepted | reached)
    windows: int
    cut: int = 0  # windows whose greedy continuation left the trajectory before the streak ended (teacher_forced_eval)

    def metrics(self, prefix: str = "eval/") -> dict[str, float]:
        out = {f"{prefix}expected_streak": self.expected_streak, f"{prefix}tau": 1 + self.expected_streak}
        out.update({f"{prefix}alpha_{j + 1}": a for j, a in enumerate(self.alpha)})
        return out


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


@dataclass(frozen=True)
class HeldoutSpec:
    """The held-out test a drafter–verifier pair is measured on; both sides of a promotion use the same one.

    Each prompt (``prompt_ids`` rows of a .jsonl file) is completed by the pair's own verifier (``max_new_tokens``
    tokens at ``temperature`` / ``top_p``, seeded), windows are cut at ``offsets``, and the drafter's argmax window
    is scored as in ``evaluate_drafter``. τ = 1 + expected streak (tokens per verifier call under greedy
    acceptance, bonus/recovered token included)."""

    prompts: str
    gamma: int = 8
    offsets: tuple[int, ...] = (0, 8)
    max_new_tokens: int = 32
    temperature: float = 0.5
    top_p: float = 0.95
    seed: int = 0

    @classmethod
    def from_config(cls, cfg, prompts: str | None = None) -> HeldoutSpec:
        """The test a distillation config implies: its held-out prompts, γ, eval offsets, teacher and seed."""
        t = cfg.teacher
        return cls(prompts=prompts or cfg.data.heldout, gamma=cfg.objective.gamma, offsets=tuple(cfg.eval.offsets),
                   max_new_tokens=t.max_new_tokens, temperature=t.temperature, top_p=t.top_p, seed=cfg.run.seed)

    def digest(self) -> str:
        """sha256 over the prompt file's bytes and every other field: equal digests = the same test."""
        import hashlib
        import json
        from dataclasses import asdict
        from pathlib import Path

        h = hashlib.sha256(Path(self.prompts).read_bytes())
        h.update(json.dumps({k: v for k, v in asdict(self).items() if k != "prompts"}, sort_keys=True).encode())
        return "sha256:" + h.hexdigest()


def read_prompt_ids(path: str) -> list[list[int]]:
    """``prompt_ids`` rows of a .jsonl file (the format of jobs/make_tiny.py and data.heldout)."""
    import json
    from pathlib import Path

    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    if not rows or any("prompt_ids" not in r or not r["prompt_ids"] for r in rows):
        raise ValueError(f"held-out prompts must be non-empty 'prompt_ids' rows of a .jsonl file, got {path!r}")
    return [list(map(int, r["prompt_ids"])) for r in rows]


@torch.no_grad()
def evaluate_pair(drafter, verifier_model: torch.nn.Module, spec: HeldoutSpec) -> EvalResult:
    """``drafter`` (an ``HFDiffusionDrafter`` or a ``FeatureDrafter``) against ``verifier_model`` (a causal LM) on
    ``spec``."""
    from specdiff.models.feature_drafter import FeatureDrafter
    from specdiff.distill.teacher import sample_completions
    from specdiff.distill.windows import heldout_prefixes

    sampling = SamplingParams(temperature=spec.temperature, top_p=spec.top_p)
    verifier = HFModel(verifier_model)
    prompts = read_prompt_ids(spec.prompts)
    completions, _, _ = sample_completions(verifier, prompts, spec.max_new_tokens, sampling, 0,
                                           torch.Generator().manual_seed(spec.seed))
    records = [{"prompt_ids": p, "completion_ids": c} for p, c in zip(prompts, completions.tolist())]
    prefixes = heldout_prefixes(records, spec.offsets)
    generator = torch.Generator().manual_seed(spec.seed)
    if isinstance(drafter, FeatureDrafter):
        from specdiff.distill.feature import evaluate_feature_drafter

        return evaluate_feature_drafter(drafter, verifier, prefixes, spec.gamma, sampling, generator=generator)
    return evaluate_drafter(HFModel(drafter.model), drafter.config, verifier, prefixes, spec.gamma, sampling,
                            generator=generator)
