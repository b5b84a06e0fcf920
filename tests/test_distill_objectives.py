"""Training objectives: the streak objective against brute-force enumeration of greedy acceptance, its gradient,
stability at long windows, and the baselines (AR-distill, naive window, masked diffusion)."""

from __future__ import annotations

import itertools

import pytest
import torch

from specdiff.core.objectives import (
    ar_distill_loss,
    expected_streak_from_logprobs,
    label_logprobs,
    mask_window,
    masked_diffusion_loss,
    naive_window_loss,
    streak_loss,
)
from specdiff.core.selection import expected_streak


def random_verifier(vocab: int, gamma: int, gen: torch.Generator):
    """p(z_j | z_<j) for every context of length < gamma: an arbitrary autoregressive distribution."""
    return {
        ctx: torch.randn(vocab, generator=gen, dtype=torch.float64).mul(2).softmax(-1)
        for j in range(gamma)
        for ctx in itertools.product(range(vocab), repeat=j)
    }


def brute_force_greedy_streak(q: torch.Tensor, p: dict) -> float:
    """E[accepted tokens] when a draft x ~ Π_j q_j is verified by greedy acceptance (accept x_j with prob
    p(x_j | x_<j), stop at the first rejection): enumerate every draft and every accept/reject outcome."""
    gamma, vocab = q.shape
    total = 0.0
    for x in itertools.product(range(vocab), repeat=gamma):
        draft_prob = float(torch.prod(q[torch.arange(gamma), torch.tensor(x)]))
        accept = [float(p[x[:j]][x[j]]) for j in range(gamma)]
        for n in range(gamma + 1):  # n tokens accepted, then a rejection (or the window ends)
            prob = 1.0
            for j in range(n):
                prob *= accept[j]
            if n < gamma:
                prob *= 1 - accept[n]
            total += draft_prob * prob * n
    return total


@pytest.mark.parametrize("temperature", [1.0, 1.7])
def test_streak_objective_equals_brute_force_expected_greedy_streak(temperature):
    gen = torch.Generator().manual_seed(0)
    vocab, gamma = 3, 3
    p = random_verifier(vocab, gamma, gen)
    logits = torch.randn(1, gamma, vocab, generator=gen, dtype=torch.float64) * 2
    q = (logits[0] / temperature).softmax(-1)
    # Objective side: average E(y) over every teacher completion y, weighted by the verifier's probability of y.
    completions = list(itertools.product(range(vocab), repeat=gamma))
    labels = torch.tensor(completions)  # [V^γ, γ]
    weights = torch.tensor(
        [float(torch.prod(torch.stack([p[y[:j]][y[j]] for j in range(gamma)]))) for y in completions],
        dtype=torch.float64,
    )
    per_completion = expected_streak_from_logprobs(
        label_logprobs(logits.expand(len(completions), -1, -1), labels, temperature)
    )
    objective = float((weights * per_completion).sum())
    assert weights.sum().item() == pytest.approx(1.0)
    assert objective == pytest.approx(brute_force_greedy_streak(q, p), rel=1e-10)
    # And the loss is minus the mean objective over windows.
    loss = streak_loss(logits.expand(len(completions), -1, -1), labels, temperature)
    assert float(loss) == pytest.approx(-float(per_completion.mean()), rel=1e-12)


def test_streak_loss_gradient_is_exact():
    gen = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 5, 7, generator=gen, dtype=torch.float64, requires_grad=True)
    labels = torch.randint(7, (3, 5), generator=gen)
    assert torch.autograd.gradcheck(lambda x: streak_loss(x, labels, 1.3), (logits,))
    # Analytic gradient w.r.t. the per-position log-probs: dE/dlog p_j = Σ_{m≥j} Π_{i≤m} p_i.
    logp = torch.log(torch.rand(4, 6, generator=gen, dtype=torch.float64)).requires_grad_()
    expected_streak_from_logprobs(logp).sum().backward()
    prefix_products = logp.detach().exp().cumprod(-1)
    analytic = prefix_products.flip(-1).cumsum(-1).flip(-1)
    torch.testing.assert_close(logp.grad, analytic)


@pytest.mark.parametrize("gamma", [64, 128])
def test_streak_objective_is_stable_for_long_windows(gamma):
    gen = torch.Generator().manual_seed(2)
    vocab = 50
    logits = torch.randn(4, gamma, vocab, generator=gen) * 30  # very peaked rows
    labels = torch.randint(vocab, (4, gamma), generator=gen)
    logits[0].scatter_add_(-1, labels[0, :, None], torch.full((gamma, 1), 200.0))  # a window the drafter nails
    logits.requires_grad_()
    loss = streak_loss(logits, labels)
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logits.grad).all() and logits.grad.abs().sum() > 0
    reference = expected_streak(label_logprobs(logits.detach().double(), labels).exp())  # float64 cumprod
    torch.testing.assert_close(
        expected_streak_from_logprobs(label_logprobs(logits.detach(), labels)).double(), reference, rtol=1e-4, atol=1e-6
    )
    assert float(reference[0]) > gamma - 1e-3 and float(reference[1:].max()) < 1


def test_naive_window_loss_is_mean_cross_entropy():
    gen = torch.Generator().manual_seed(3)
    logits, labels = torch.randn(2, 4, 9, generator=gen), torch.randint(9, (2, 4), generator=gen)
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, 9), labels.reshape(-1))
    torch.testing.assert_close(naive_window_loss(logits, labels), expected)


def test_ar_distill_matches_full_divergences_and_handles_filtered_teacher_tokens():
    gen = torch.Generator().manual_seed(4)
    vocab = 6
    q_logits = torch.randn(3, vocab, generator=gen, dtype=torch.float64, requires_grad=True)
    p = torch.randn(3, vocab, generator=gen, dtype=torch.float64).softmax(-1)
    ids = torch.arange(vocab).expand(3, -1)
    q = q_logits.softmax(-1)
    fkl = ar_distill_loss(q_logits, ids, p.log(), "fkl")
    torch.testing.assert_close(fkl, (p * (p.log() - q.log())).sum(-1).mean())
    tvd = ar_distill_loss(q_logits, ids, p.log(), "tvd")
    torch.testing.assert_close(tvd, 0.5 * (p - q).abs().sum(-1).mean())
    assert float(ar_distill_loss(p.log(), ids, p.log(), "fkl")) == pytest.approx(0.0, abs=1e-12)
    # A top-p-filtered teacher (-inf log-probs) and a top-k subset: finite loss and gradient.
    filtered = p.log().clone()
    filtered[:, -2:] = float("-inf")
    loss = ar_distill_loss(q_logits, ids[:, :5], filtered[:, :5], "fkl")
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(q_logits.grad).all()
    with pytest.raises(ValueError, match="divergence"):
        ar_distill_loss(q_logits, ids, p.log(), "jsd")


def test_masked_diffusion_mask_and_unbiased_weighting():
    gen = torch.Generator().manual_seed(5)
    rows, gamma, vocab, mask_id = 40000, 6, 5, 99
    labels = torch.randint(vocab, (rows, gamma), generator=gen)
    noisy, masked, t = mask_window(labels, mask_id, gen)
    assert ((noisy == mask_id) == masked).all() and (noisy[~masked] == labels[~masked]).all()
    assert float(t.min()) >= 1e-3 and float(t.max()) <= 1
    assert abs(float(masked.float().mean()) - 0.5) < 0.01  # E[t] = ~1/2
    # With logits that ignore the input, E[1/(tγ) Σ_masked nll] equals the mean cross-entropy (an unbiased ELBO).
    logits = torch.randn(1, gamma, vocab, generator=gen).expand(rows, -1, -1)
    loss = masked_diffusion_loss(logits, labels, masked, t)
    assert float(loss) == pytest.approx(float(naive_window_loss(logits, labels)), rel=0.05)
    with pytest.raises(ValueError, match="temperature"):
        label_logprobs(logits, labels, 0.0)


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_head_label_logprobs_equals_the_plain_head_and_log_softmax(monkeypatch, temperature):
    # Training's chunked head against logits -> label_logprobs, values and gradients in float64; chunks of 3 rows
    # over 10 rows (a short last chunk); a label of -1 is unreachable (constant, no gradient).
    import specdiff.core.objectives as objectives
    from specdiff.core.objectives import UNREACHABLE_LOGP, head_label_logprobs

    monkeypatch.setattr(objectives, "HEAD_CHUNK_BYTES", 3 * 4 * 11)  # 3 rows of an 11-token head
    gen = torch.Generator().manual_seed(0)
    hidden = torch.randn(2, 5, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(11, 6, generator=gen, dtype=torch.float64) * 2
    labels = torch.randint(0, 11, (2, 5), generator=gen)
    labels[0, 2] = labels[1, 4] = -1
    upstream = torch.randn(2, 5, generator=gen, dtype=torch.float64)

    chunked = head_label_logprobs(hidden, weight, labels, temperature)
    (g_chunked,) = torch.autograd.grad((chunked * upstream).sum(), hidden)
    plain = label_logprobs(hidden @ weight.T, labels, temperature)
    (g_plain,) = torch.autograd.grad((plain * upstream).sum(), hidden)
    torch.testing.assert_close(chunked, plain)
    assert float(chunked[0, 2]) == UNREACHABLE_LOGP
    torch.testing.assert_close(g_chunked, g_plain)
