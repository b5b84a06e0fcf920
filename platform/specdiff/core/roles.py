"""The roles the decode loop plays against, as interfaces: a drafter (prefix -> marginals) and a verifier (prompt
-> session that scores tries and commits). The models (``specdiff.models``) implement them; the core depends only on
these, never on a model."""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import torch

from specdiff.core.tree import TokenTree


class DrafterUnavailable(RuntimeError):
    """Raised by a drafter that cannot answer (remote replica gone, timed out): the decoder then takes a
    verifier-only step for that round and counts it in ``DecodeStats.fallbacks``."""


@runtime_checkable
class Drafter(Protocol):
    """Role interface: stateless prefix -> marginals."""

    vocab_size: int

    def propose(self, prefix: Sequence[int], gamma: int) -> torch.Tensor:
        """Marginals [gamma, V] (float32 probabilities) for the gamma positions after ``prefix``."""
        ...

    def propose_batch(self, prefixes: Sequence[Sequence[int]], gamma: int) -> torch.Tensor:
        """Marginals [B, gamma, V] for a batch of prefixes of any lengths."""
        ...


class VerifierSession(Protocol):
    tokens: list[int]
    # Tapped hidden states [len(tokens) - 1, taps * H] of every token but the pending one (None: no taps).
    features: torch.Tensor | None

    def score(self, tree: TokenTree) -> torch.Tensor:
        """Log-probs [N+1, V] (float32) of the next token at every node of ``tree``."""
        ...

    def commit(self, path: Sequence[int], next_token: int) -> None:
        """Keep the scored tree's nodes ``path`` (node indices >= 1, root to leaf), then append ``next_token``."""
        ...


class Verifier(Protocol):
    vocab_size: int
    max_context: int | None
    tap_layers: tuple[int, ...] | None  # layers whose outputs sessions keep as ``features`` (a feature drafter's)

    def start(self, prompt: Sequence[int]) -> VerifierSession: ...
