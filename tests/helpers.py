"""Tiny models and test drafters shared by the tests (random init, built from configs; no hub access)."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_llama(vocab_size: int = 64, *, seed: int = 0, init_std: float = 0.02, max_positions: int = 256, layers: int = 2):
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        initializer_range=init_std,
        attn_implementation="sdpa",
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return LlamaForCausalLM(config).eval()


@torch.no_grad()
def full_logprobs(model, tokens: list[int]) -> torch.Tensor:
    """From-scratch causal forward: log-probs [len(tokens), V] of the next token after each position."""
    return model(torch.tensor([tokens])).logits[0].float().log_softmax(-1)


class FixedDrafter:
    """A drafter whose marginals are fixed per position (the same for every prefix)."""

    def __init__(self, marginals: torch.Tensor):
        self.table = marginals  # [max_gamma, V]
        self.vocab_size = int(marginals.shape[-1])

    def propose(self, prefix, gamma):
        return self.table[:gamma].clone()

    def propose_batch(self, prefixes, gamma):
        return torch.stack([self.propose(p, gamma) for p in prefixes])


class OracleDrafter:
    """Proposes the verifier's own greedy continuation with probability ``confidence`` per position (rest spread
    uniformly): a drafter that is usually right, so long windows are accepted and trees branch."""

    def __init__(self, model, confidence: float = 0.7):
        self.model = model
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.confidence = confidence

    @torch.no_grad()
    def propose(self, prefix, gamma):
        tokens = list(prefix)
        for _ in range(gamma):
            tokens.append(int(self.model(torch.tensor([tokens])).logits[0, -1].argmax()))
        greedy = torch.tensor(tokens[len(prefix) :])
        out = torch.full((gamma, self.vocab_size), (1 - self.confidence) / (self.vocab_size - 1))
        out[torch.arange(gamma), greedy] = self.confidence
        return out

    def propose_batch(self, prefixes, gamma):
        return torch.stack([self.propose(p, gamma) for p in prefixes])
