"""Drafter training objectives: pure torch, tensors in, a scalar loss out (no Ray, no MLflow).

A training *window* is cut at offset o of a teacher completion x (sampled from the frozen verifier): the drafter
reads ``prompt ∥ x_<o ∥ [MASK]×γ`` in one pass and its window logits [B, γ, V] are scored against the labels
x_o..x_{o+γ-1}.

- ``streak_loss`` (SpecDiff-2 Eq. 6): maximise E = Σ_m Π_{j≤m} q_j(label_j), q at the drafter's sampling
  temperature. Because the labels are samples of the verifier p, E's expectation over teacher samples equals the
  expected accepted streak of a draft sampled from q under greedy acceptance:
  E_{y~p}[Σ_m Π_{j≤m} q_j(y_j)] = Σ_m Σ_{z_1..m} Π_{j≤m} q_j(z_j) p(z_j | z_<j) = E_{x~q}[Σ_m Π_{j≤m} p(x_j | x_<j)].
  Computed in log space (a cumulative sum of log-probs and one logsumexp), so it stays finite with finite
  gradients for windows of 64 positions and more.
- baselines for ablations: ``ar_distill_loss`` (a divergence at the first window position only, DistillSpec),
  ``naive_window_loss`` (uniform per-position cross-entropy over the window) and ``masked_diffusion_loss`` (random
  mask ratio t, 1/t weighting; trains a drafter from scratch).
"""

from __future__ import annotations

from typing import Literal

import torch

Divergence = Literal["fkl", "tvd"]


def _upcast(x: torch.Tensor) -> torch.Tensor:
    """bf16/fp16 -> float32 for the softmax; float64 stays (gradient checks)."""
    return x if x.dtype == torch.float64 else x.float()


# log q of a label the drafter cannot emit (outside its draft vocabulary, label id -1): a constant, no gradient.
UNREACHABLE_LOGP = -30.0


def label_logprobs(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """log q_j(label_j) at ``temperature``. logits: [B, γ, V]; labels: [B, γ] long -> [B, γ] float32.

    A label of -1 (a token outside a draft vocabulary) gets ``UNREACHABLE_LOGP``: the window's streak stops there,
    and no gradient pretends the drafter could have produced it."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for a differentiable objective, got {temperature!r}")
    scaled = _upcast(logits) if temperature == 1.0 else _upcast(logits) / temperature  # no copy at temperature 1
    logq = scaled.log_softmax(-1)
    reachable = labels >= 0
    picked = logq.gather(-1, labels.clamp_min(0)[..., None]).squeeze(-1)
    return torch.where(reachable, picked, torch.full_like(picked, UNREACHABLE_LOGP))


# Rows of logits ``head_label_logprobs`` makes at once: ~32 MB of float32 whatever the vocabulary. Blocks under
# glibc's 64 MB heap size are reused by a thread's own malloc arena (a Ray train worker's training thread); larger
# ones are mmap'd and faulted in afresh every step (see ``specdiff.runtime.memory``).
HEAD_CHUNK_BYTES = 32 * 2**20


def head_label_logprobs(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor,
                        temperature: float = 1.0) -> torch.Tensor:
    """``label_logprobs(hidden @ weight.T, labels, temperature)`` a chunk of rows at a time (``HEAD_CHUNK_BYTES``
    of logits each): hidden [..., H], weight [V, H] (a head; cast to its dtype), labels [...] -> [...] float32.
    Same values and gradients as the unchunked product (tested); every tensor of the head's forward and backward
    stays chunk-sized."""
    x = hidden.reshape(-1, hidden.shape[-1]).to(weight.dtype)
    flat = labels.reshape(-1)
    rows = max(1, HEAD_CHUNK_BYTES // (4 * weight.shape[0]))
    parts = [label_logprobs(torch.nn.functional.linear(x[start : start + rows], weight), flat[start : start + rows],
                            temperature) for start in range(0, len(flat), rows)]
    return torch.cat(parts).view(labels.shape)


def log_expected_streak(logp: torch.Tensor) -> torch.Tensor:
    """log Σ_m Π_{j≤m} p_j from per-position log-probs [..., γ] -> [...]; exact and finite for any γ."""
    return torch.logsumexp(logp.cumsum(-1), dim=-1)


def expected_streak_from_logprobs(logp: torch.Tensor) -> torch.Tensor:
    """Σ_m Π_{j≤m} p_j from log-probs [..., γ] -> [...] (``selection.expected_streak`` in log space)."""
    return log_expected_streak(logp).exp()


def streak_loss(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """−mean over windows of E = Σ_m Π_{j≤m} q_j(label_j). logits: [B, γ, V]; labels: [B, γ]."""
    return window_loss_from_logprobs("streak", label_logprobs(logits, labels, temperature), labels)


def naive_window_loss(logits: torch.Tensor, labels: torch.Tensor, temperature: float = 1.0) -> torch.Tensor:
    """Uniform cross-entropy over every window position: −mean_{b,j} log q_j(label_j) (labels of -1 left out)."""
    return window_loss_from_logprobs("naive", label_logprobs(logits, labels, temperature), labels)


def decayed_ce_loss(logits: torch.Tensor, labels: torch.Tensor, decay: float = 4.0,
                    temperature: float = 1.0) -> torch.Tensor:
    """DFlash's objective: cross-entropy with weight exp(−(j−1)/decay) at window position j (early positions
    matter most, since a rejection ends the streak), normalised by the weights' sum."""
    return window_loss_from_logprobs("decayed_ce", label_logprobs(logits, labels, temperature), labels, decay)


def ar_distill_first_position_loss(logits: torch.Tensor, labels: torch.Tensor,
                                   temperature: float = 1.0) -> torch.Tensor:
    """AR-distill from sampled teacher labels: −mean log q_1(label_1), the first window position only. The label
    is a sample of the verifier's p, so this is an unbiased estimate of KL(p ‖ q_1)'s gradient (exact at T=0,
    where p is one-hot)."""
    return naive_window_loss(logits[:, :1], labels[:, :1], temperature)


WINDOW_OBJECTIVES = ("streak", "decayed_ce", "naive", "ar_distill")  # what window_loss_from_logprobs computes


def window_loss_from_logprobs(kind: str, logp: torch.Tensor, labels: torch.Tensor, decay: float = 4.0) -> torch.Tensor:
    """The window objectives above from log q_j(label_j) [B, γ] (``label_logprobs`` or ``head_label_logprobs``):
    ``streak``, ``naive``, ``decayed_ce`` (weight exp(−(j−1)/decay)) or ``ar_distill`` (first position only)."""
    reachable = labels >= 0
    if kind == "streak":
        return -expected_streak_from_logprobs(logp).mean()
    if kind == "ar_distill":
        logp, reachable = logp[:, :1], reachable[:, :1]
        kind = "naive"
    if kind == "naive":
        return -(logp * reachable).sum() / reachable.sum().clamp_min(1)
    if kind == "decayed_ce":
        if decay <= 0:
            raise ValueError(f"decay must be > 0, got {decay!r}")
        weights = torch.exp(-torch.arange(logp.shape[-1], dtype=logp.dtype, device=logp.device) / decay)
        weights = weights * reachable  # a label outside a draft vocabulary teaches nothing: left out
        return -(logp * weights).sum() / weights.sum().clamp_min(1e-9)
    raise ValueError(f"no window objective {kind!r} ({', '.join(WINDOW_OBJECTIVES)})")


def ar_distill_loss(
    first_logits: torch.Tensor,
    teacher_ids: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    divergence: Divergence = "fkl",
    temperature: float = 1.0,
) -> torch.Tensor:
    """DistillSpec-style divergence between the teacher and the drafter at the first window position only.

    first_logits: [B, V] drafter logits at window position 1. teacher_ids / teacher_logprobs: [B, k], the
    verifier's top-k tokens and log-probs there (-inf allowed for tokens its sampling filter removed). The teacher
    is renormalised over its top-k (mass outside it is taken as 0).
      - ``"fkl"``: KL(p ‖ q) = Σ_k p_k (log p_k − log q_k);
      - ``"tvd"``: ½ Σ_v |p_v − q_v| = ½ (Σ_k |p_k − q_k| + 1 − Σ_k q_k).
    """
    logq_all = (_upcast(first_logits) / temperature).log_softmax(-1)  # [B, V]
    logq = logq_all.gather(-1, teacher_ids)  # [B, k]
    logp = _upcast(teacher_logprobs).log_softmax(-1)  # renormalised over the top-k
    p = logp.exp()
    if divergence == "fkl":
        terms = torch.where(p > 0, p * (logp - logq), torch.zeros_like(p))
        return terms.sum(-1).mean()
    if divergence == "tvd":
        q = logq.exp()
        return (0.5 * ((p - q).abs().sum(-1) + 1 - q.sum(-1))).mean()
    raise ValueError(f"divergence must be 'fkl' or 'tvd', got {divergence!r}")


def mask_window(
    labels: torch.Tensor, mask_token_id: int, generator: torch.Generator | None, eps: float = 1e-3
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Masked-diffusion forward process on windows: per row a ratio t ~ U(eps, 1), each token masked with
    probability t (independently, so the 1/t-weighted loss is an unbiased estimate of the mean cross-entropy).

    labels: [B, γ]. Returns (noisy window ids [B, γ], masked [B, γ] bool, t [B]).
    """
    b, gamma = labels.shape
    t = eps + (1 - eps) * torch.rand(b, generator=generator)
    masked = torch.rand(b, gamma, generator=generator) < t[:, None]  # [B, γ]
    noisy = labels.masked_fill(masked, mask_token_id)
    return noisy, masked, t


def masked_diffusion_loss(
    logits: torch.Tensor, labels: torch.Tensor, masked: torch.Tensor, t: torch.Tensor
) -> torch.Tensor:
    """LLaDA-style masked-diffusion loss: mean_b 1/(t_b γ) Σ_{j masked} −log q_j(label_j) (an ELBO bound).

    logits: [B, γ, V] at the noisy window; labels, masked: [B, γ]; t: [B] mask ratios.
    """
    nll = torch.where(masked, -label_logprobs(logits, labels), 0.0)  # [B, γ]
    return (nll.sum(-1) / (t.to(nll) * labels.shape[1])).mean()
