"""The verifier's sampling distribution p, and sampling from a distribution with a passed-in generator.

``target_probs`` reproduces Hugging Face ``generate``'s warpers (temperature, top-k, top-p, in that order) so that
speculative decoding targets exactly the distribution the verifier's own sampling would use.
"""

from __future__ import annotations

import torch

from specdiff.core.config import SamplingParams


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Verifier distribution p from raw logits or log-probs.

    logits: [..., V] (any float dtype). Returns float32 probabilities [..., V]; one-hot on the argmax when
    ``params.temperature == 0`` (ties go to the lowest token id, as ``torch.argmax``).
    """
    logits = logits.float()
    if params.greedy:
        return torch.zeros_like(logits).scatter_(-1, logits.argmax(-1, keepdim=True), 1.0)  # one-hot, no int64 copy
    scores = logits / params.temperature
    if params.top_k > 0 and params.top_k < scores.shape[-1]:
        # TopKLogitsWarper: keep every token whose score reaches the k-th largest.
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        # TopPLogitsWarper: drop the low tail whose cumulative mass is <= 1 - top_p, always keep the top token.
        sorted_scores, sorted_idx = torch.sort(scores, descending=False, dim=-1)
        cumulative = sorted_scores.softmax(-1).cumsum(-1)
        remove_sorted = cumulative <= (1 - params.top_p)
        remove_sorted[..., -1] = False
        remove = remove_sorted.scatter(-1, sorted_idx, remove_sorted)
        scores = scores.masked_fill(remove, float("-inf"))
    return scores.softmax(-1)


def tempered(probs: torch.Tensor, temperature: float, top_k: int = 0) -> torch.Tensor:
    """Re-temper a probability table: softmax(log(probs) / temperature), then keep the top-k. probs: [..., V].

    Used to turn the drafter's marginals into the distribution candidates are drawn from. Temperature 0 gives the
    argmax one-hot.
    """
    logp = probs.float().clamp_min(0).log()
    if temperature == 0:
        return torch.nn.functional.one_hot(logp.argmax(-1), probs.shape[-1]).float()
    scores = logp / temperature
    if 0 < top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    return scores.softmax(-1)


def sample(probs: torch.Tensor, generator: torch.Generator | None, num_samples: int = 1) -> torch.Tensor:
    """Draw token ids from probs [..., V] -> [..., num_samples] (with replacement).

    One draw from a distribution with a single nonzero entry (every T=0 step) is that entry: returned without
    ``torch.multinomial``, which draws an exponential per vocabulary entry (1.1 ms of a 33 ms plain step over
    SmolLM2's 49k tokens, 2-core Xeon). Same token; the generator is left as it was."""
    flat = probs.reshape(-1, probs.shape[-1])
    if num_samples == 1 and flat.shape[0] == 1 and int(torch.count_nonzero(flat)) == 1:
        return flat.argmax(-1, keepdim=True).reshape(*probs.shape[:-1], 1)
    out = torch.multinomial(flat, num_samples, replacement=True, generator=generator)
    return out.reshape(*probs.shape[:-1], num_samples)
