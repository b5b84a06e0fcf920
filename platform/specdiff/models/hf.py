"""Thin adapter over a Hugging Face causal-LM-shaped model: the one place that knows transformers' call conventions.

Conventions are read once from the model's ``forward`` signature (``cache`` in transformers >= 5.2x,
``past_key_values`` before; ``logits_to_keep`` where supported), never checked in the hot path.
"""

from __future__ import annotations

import inspect

import torch

from specdiff.models.llama import folded_attention

GQA_SDPA = "specdiff_gqa_sdpa"  # the attention implementation ``fold_gqa_attention`` switches a model to


def _gqa_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """transformers' sdpa attention, except for a few masked query rows of a grouped-query model without gradients
    (a verifier's tree pass): there the query heads of each key/value head are folded into the rows, and the mask
    repeated, instead of copying every key and value ``num_key_value_groups`` times (``repeat_kv``, what the stock
    function does whenever a mask is given and more than one row is queried).

    Same attention, another order of the same sums. Measured (2-core AVX2 EPYC, float32, SmolLM2: 9 query heads on 3
    key/value heads, whole tree passes): 2/5/9 nodes 72/86/119 -> 69/79/102 ms on a 200-token context and 92/103/136
    -> 69/82/113 ms on 800 tokens (the copies grow with the context); log-probs equal to 1e-4."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    groups = getattr(module, "num_key_value_groups", 1)
    rows = query.shape[2]
    if (groups == 1 or rows == 1 or rows > 64 or attention_mask is None or attention_mask.dim() != 4
            or attention_mask.shape[1] != 1 or dropout or torch.is_grad_enabled()
            or any(kwargs.get(k) is not None for k in ("softcap", "position_bias", "sliding_window", "s_aux"))):
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout, scaling, is_causal,
                                      **kwargs)
    return folded_attention(query, key, value, attention_mask, scaling).transpose(1, 2).contiguous(), None


def fold_gqa_attention(model: torch.nn.Module) -> bool:
    """Switch a Hugging Face model that runs transformers' ``sdpa`` attention to ``_gqa_sdpa`` (equal results,
    fewer copies in tree passes); anything else is left alone. Returns whether it switched."""
    config = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa" or not hasattr(model, "set_attn_implementation"):
        return False
    try:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        AttentionInterface.register(GQA_SDPA, _gqa_sdpa)
        AttentionMaskInterface.register(GQA_SDPA, sdpa_mask)  # the masks sdpa gets (else transformers builds none)
        model.set_attn_implementation(GQA_SDPA)
    except (ImportError, AttributeError, ValueError, TypeError):  # a transformers without these hooks: stock sdpa
        return False
    return True


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

    def new_cache(self):
        """An empty KV cache of the kind the model takes: its own (``specdiff.models.llama``) or transformers'
        ``DynamicCache``."""
        make = getattr(self.model, "new_cache", None)
        if make is not None:
            return make()
        from transformers import DynamicCache

        return DynamicCache()

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
        # Inputs are built on the host (token ids, masks, positions are small); they meet the weights here, once.
        attention_mask = None if attention_mask is None else attention_mask.to(self.device)
        position_ids = None if position_ids is None else position_ids.to(self.device)
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
