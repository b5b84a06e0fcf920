"""The verifier: a frozen causal LM with an exact KV cache, scoring a whole candidate trie in one forward pass.

A session holds the tokens so far. Its cache covers every token but the last ("pending") one, whose logits are
not computed yet: ``score(tree)`` feeds the pending token as the tree's root plus all trie nodes, with a tree
attention mask (a node sees the cached prefix, the root and its ancestors) and position ids by depth, and returns
log-probs at every node. ``commit(path, next_token)`` keeps the root and the accepted nodes in the cache, drops the
rest, and makes ``next_token`` the new pending token, so the next round never recomputes the prefix.
"""

from __future__ import annotations

import copy

from typing import Sequence

import torch

from specdiff.models.hf import HFModel, fold_gqa_attention
from specdiff.core.roles import Verifier, VerifierSession  # noqa: F401 (the roles, importable from here too)
from specdiff.core.tree import TokenTree


def check_prompt(prompt: Sequence[int], max_context: int | None, vocab_size: int) -> list[int]:
    prompt = [int(t) for t in prompt]
    if not prompt:
        raise ValueError("prompt must contain at least one token, got 0 tokens")
    bad = next((t for t in prompt if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise ValueError(f"prompt token ids must lie in [0, {vocab_size}), got {bad}")
    if max_context is not None and len(prompt) > max_context:
        raise ValueError(f"prompt has {len(prompt)} tokens, more than the verifier's context of {max_context}")
    return prompt


class HFVerifier:
    """Verifier backend over any Hugging Face causal LM whose attention accepts a custom 4D mask.

    ``tap_layers``: decoder layers whose outputs each session keeps for every committed token (``features``), read
    from the same forward passes that score the trees: a feature drafter's context, at no extra verifier pass.
    ``tune_kernels``: on a CPU, time the two forms of a few-row linear product on the model's weights (once per
    machine, kept in ``$SPECDIFF_HOME/kernels``) and use the faster one (``specdiff.models.kernels``)."""

    def __init__(self, model: torch.nn.Module, *, max_context: int | None = None,
                 tap_layers: Sequence[int] | None = None, tune_kernels: bool = True):
        self.small_rows: tuple[int, ...] = ()  # row counts that take the transposed product (specdiff.models.kernels)
        self.packed_rows: tuple[int, ...] = ()  # and those that take oneDNN's product on packed weights
        if tune_kernels:
            from specdiff.models.kernels import packed_rows, tune_small_rows
            from specdiff.models.sources import state_dir

            self.small_rows = tune_small_rows(model, state_dir() / "kernels")
            self.packed_rows = packed_rows(model)
        fold_gqa_attention(model)  # tree passes without copying keys/values per query head (``hf._gqa_sdpa``)
        self.hf = HFModel(model)
        self.vocab_size = self.hf.vocab_size
        self.max_context = max_context or self.hf.max_context
        layers = int(getattr(model.config, "num_hidden_layers", 0) or 0)
        self.tap_layers = tuple(int(i) for i in tap_layers) if tap_layers else None
        bad = [i for i in self.tap_layers or () if not 0 <= i < layers]
        if bad:
            raise ValueError(f"tap_layers must index the verifier's {layers} layers, got {list(tap_layers)}")
        self.hidden_size = int(getattr(model.config, "hidden_size", 0) or 0)

    @property
    def model(self) -> torch.nn.Module:
        return self.hf.model

    def without_taps(self) -> HFVerifier:
        """The same verifier keeping no features (plain decoding has no drafter to feed)."""
        if self.tap_layers is None:
            return self
        view = copy.copy(self)
        view.tap_layers = None
        return view

    def start(self, prompt: Sequence[int]) -> HFVerifierSession:
        return HFVerifierSession(self, check_prompt(prompt, self.max_context, self.vocab_size))


class HFVerifierSession:
    """``prefill=False``: the cache starts empty and the caller prefills (a batched session: its prefill is one
    piece of a batch step, ``specdiff.models.batched``)."""

    def __init__(self, verifier: HFVerifier, prompt: list[int], *, prefill: bool = True):
        self.hf = verifier.hf
        self.taps = verifier.tap_layers
        self.tokens = list(prompt)
        self.cache = self.hf.new_cache()
        self._scored: TokenTree | None = None
        self._tree_features: torch.Tensor | None = None
        width = len(self.taps) * verifier.hidden_size if self.taps else 0
        self.features = torch.zeros(0, width, dtype=self.hf.dtype) if self.taps else None
        if len(prompt) > 1 and prefill:  # prefill everything but the pending token
            out = self.hf.logits(torch.tensor([prompt[:-1]]), cache=self.cache, last=1, taps=self.taps)
            if self.taps:
                self.features = out[1][0].cpu()

    @property
    def tree_features(self) -> torch.Tensor | None:
        """Tapped states [N+1, taps*H] of the nodes of the tree scored last, until its commit (None: no taps)."""
        return self._tree_features

    @property
    def cached(self) -> int:
        """Tokens held in the KV cache (all but the pending one, between rounds)."""
        return self.cache.get_seq_length()

    def tree_inputs(self, tree: TokenTree) -> tuple[torch.Tensor | None, torch.Tensor]:
        """The pass that scores ``tree``: (additive mask [1, 1, N+1, cached + N+1], position ids [N+1]). A lone
        root (a plain step) sees every cached position: no mask (attention without one takes a faster path)."""
        if int(tree.tokens[0]) != self.tokens[-1]:
            raise ValueError(f"tree root must be the pending token {self.tokens[-1]}, got {int(tree.tokens[0])}")
        if self._scored is not None:
            raise RuntimeError("score() called twice without commit(); the cache holds the previous tree")
        prefix = self.cached
        n = tree.num_nodes
        if n == 1:
            return None, prefix + tree.depth
        allowed = torch.ones(1, n, prefix + n, dtype=torch.bool)
        allowed[0, :, prefix:] = tree.attention_mask()
        return self.hf.additive_mask(allowed), prefix + tree.depth

    def score(self, tree: TokenTree) -> torch.Tensor:
        mask, positions = self.tree_inputs(tree)
        logits = self.hf.logits(tree.tokens[None], attention_mask=mask, position_ids=positions[None],
                                cache=self.cache, taps=self.taps)
        features = None
        if self.taps:
            logits, features = logits
            features = features[0]
        return self.scored(tree, logits[0], features)

    def scored(self, tree: TokenTree, logits: torch.Tensor, features: torch.Tensor | None) -> torch.Tensor:
        """``tree``'s pass has run (logits [N+1, V], tapped states [N+1, taps*H]): keep what commit needs ->
        log-probs [N+1, V] float32."""
        if self.taps:
            self._tree_features = features.cpu()  # [N+1, taps*H]
        self._scored = tree
        return logits.float().log_softmax(-1).cpu()

    @torch.no_grad()
    def commit(self, path: Sequence[int], next_token: int) -> None:
        if self._scored is None:
            raise RuntimeError("commit() needs a scored tree; call score() first")
        base = self.cached - self._scored.num_nodes  # cache length before the tree
        path = [int(i) for i in path]
        keep = base + 1 + len(path)  # prefix, root, accepted nodes
        if path != list(range(1, len(path) + 1)):
            # Move the accepted nodes' keys/values next to the root; the first candidate's path is already there.
            src = torch.tensor([base + i for i in path], device=self.hf.device)
            for layer in self.cache.layers:
                layer.keys[..., base + 1 : keep, :] = layer.keys.index_select(-2, src)
                layer.values[..., base + 1 : keep, :] = layer.values.index_select(-2, src)
        if keep < self.cached:  # drop the rejected nodes (a plain step, or a chain kept whole, has none)
            for layer in self.cache.layers:
                layer.keys = layer.keys[..., :keep, :]
                layer.values = layer.values[..., :keep, :]
        self.tokens.extend(int(self._scored.tokens[i]) for i in path)
        self.tokens.append(int(next_token))
        if self.taps:  # the root and the accepted nodes are now committed: their states join the context
            self._append_features(self._tree_features[[0, *path]])
            self._tree_features = None
        self._scored = None

    @property
    def features(self) -> torch.Tensor | None:
        """Tapped states [n, taps*H] of the committed tokens but the pending one (None: no taps)."""
        return None if self._features is None else self._features[: self._num_features]

    @features.setter
    def features(self, value: torch.Tensor | None) -> None:
        self._features, self._num_features = value, 0 if value is None else len(value)

    def _append_features(self, rows: torch.Tensor) -> None:
        # Into spare rows of the buffer, doubling it when full: a commit copies its own rows, not the whole context
        # (a torch.cat per step copied every earlier row: quadratic in the decode's length).
        n, buf = self._num_features, self._features
        if n + len(rows) > len(buf):
            grown = buf.new_empty(max(2 * len(buf), n + len(rows), 64), buf.shape[1])
            grown[:n] = buf[:n]
            self._features = buf = grown
        buf[n: n + len(rows)] = rows
        self._num_features = n + len(rows)
