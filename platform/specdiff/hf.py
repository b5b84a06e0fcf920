"""Thin adapter over a Hugging Face causal-LM-shaped model: the one place that knows transformers' call conventions.

Conventions are read once from the model's ``forward`` signature (``cache`` in transformers >= 5.2x,
``past_key_values`` before; ``logits_to_keep`` where supported), never checked in the hot path.
"""

from __future__ import annotations

import inspect

import torch


class HFModel:
    """``runner``: the module forward passes go through when it differs from ``model`` (a DDP or peft wrapper used
    in training); conventions and shapes are still read from the plain Hugging Face ``model``."""

    def __init__(self, model: torch.nn.Module, *, runner: torch.nn.Module | None = None):
        self.model = model.eval()
        self.runner = runner if runner is not None else model
        params = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self._keeps_logits = "logits_to_keep" in params
        config = model.config
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.max_context = int(getattr(config, "max_position_embeddings", 0) or 0) or None
        self.dtype = next(model.parameters()).dtype
        self.device = next(model.parameters()).device

    def additive_mask(self, allowed: torch.Tensor) -> torch.Tensor:
        """bool [B, Q, K] (True = may attend) -> additive float mask [B, 1, Q, K] in the model's dtype.

        A custom 4D mask is passed to the attention implementation as-is (eager and sdpa both take additive masks).
        """
        mask = torch.zeros(allowed.shape, dtype=self.dtype, device=self.device)
        mask.masked_fill_(~allowed.to(self.device), torch.finfo(self.dtype).min)
        return mask[:, None]

    @torch.no_grad()
    def logits(self, input_ids: torch.Tensor, **kwargs) -> torch.Tensor:
        """``forward`` without gradients (inference)."""
        return self.forward(input_ids, **kwargs)

    def forward(
        self,
        input_ids: torch.Tensor,
        *,
        attention_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | None = None,
        cache=None,
        last: int | None = None,
        taps: tuple[int, ...] | None = None,
    ):
        """Forward pass -> logits [B, S or last, V]. ``last`` computes the LM head on the last positions only.

        ``taps`` (decoder layer indices): also return the outputs of those layers from the same pass, concatenated
        -> (logits, features [B, S, len(taps) * H]); layer i's output is Hugging Face's ``hidden_states[i + 1]``."""
        kwargs = {"attention_mask": attention_mask, "position_ids": position_ids, "use_cache": cache is not None}
        if cache is not None:
            kwargs[self._cache_kwarg] = cache
        if last is not None and self._keeps_logits:
            kwargs["logits_to_keep"] = last
        if taps:
            kwargs["output_hidden_states"] = True
        out = self.runner(input_ids=input_ids.to(self.device), **kwargs)
        logits = out.logits
        logits = logits[:, -last:] if last is not None else logits
        if not taps:
            return logits
        return logits, torch.cat([out.hidden_states[i + 1] for i in taps], -1)
