"""Teacher trajectories in pure torch: the frozen verifier samples completions of prompts, batched, with an exact KV
cache (``sample_completions``), and a record's tapped verifier states travel as float16 bytes (``encode_features``).

The bottom of the distillation package: the samplers (``teacher``, ``teacher_vllm``), the evaluation
(``evaluate``, ``feature``) and the baselines (``ar``) all use these, and this module imports none of them.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from specdiff.core.config import SamplingParams
from specdiff.core.sampling import sample, target_probs
from specdiff.models.dtypes import resolve_dtype
from specdiff.models.hf import HFModel

FEATURE_DTYPE = np.float16  # features travel and rest as float16 bytes: half the size, ample precision


def encode_features(features: torch.Tensor) -> bytes:
    return features.to(torch.float32).numpy().astype(FEATURE_DTYPE).tobytes()


def decode_features(blob: bytes, width: int) -> torch.Tensor:
    return torch.from_numpy(np.frombuffer(blob, dtype=FEATURE_DTYPE).reshape(-1, width).astype(np.float32))


def load_verifier_model(path: str | Path, dtype: str | torch.dtype = "float32") -> torch.nn.Module:
    """The frozen verifier, on the CPU, in eval mode. ``dtype`` "auto" follows ``specdiff.models.dtypes`` (resolved where
    this runs: a teacher actor decides for its own machine); the default stays float32 so that registry
    evaluations give the same figures on every machine."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=resolve_dtype(dtype))
    model.requires_grad_(False)
    return model.eval()


def causal_inputs(sequences: Sequence[Sequence[int]], pad_id: int = 0):
    """Left-padded ids [B, L], validity [B, L] bool and position ids [B, L] for a causal forward pass."""
    length = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), length), pad_id, dtype=torch.long)
    valid = torch.zeros(len(sequences), length, dtype=torch.bool)
    for b, s in enumerate(sequences):
        ids[b, length - len(s) :] = torch.as_tensor(list(s), dtype=torch.long)
        valid[b, length - len(s) :] = True
    positions = (valid.long().cumsum(-1) - 1).clamp_min(0)
    return ids, valid, positions


def _greedy_step(logits: torch.Tensor, k: int):
    """Greedy decoding's token [B, 1] and top-k (values, indices) of log p, p the argmax one-hot, without
    materialising p: the argmax first with log p = 0, then k - 1 other ids with -inf (the same as
    ``target_probs(..., greedy).log().topk(k)``, up to the order of the -inf ids, which carry no mass)."""
    token = logits.argmax(-1, keepdim=True)  # ties: the lowest id, as target_probs
    if not k:
        return token, None
    ids = logits.scatter(-1, token, float("inf")).topk(k, dim=-1).indices  # argmax first, then distinct
    lp = torch.full(ids.shape, float("-inf"), device=ids.device)
    lp[:, 0] = 0.0
    return token, (lp, ids)


@torch.no_grad()
def sample_completions(
    hf: HFModel,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    sampling: SamplingParams,
    logprobs_k: int,
    generator: torch.Generator | None,
    taps: tuple[int, ...] | None = None,
    features_out: list | None = None,
    prompt_targets_out: list | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sample ``max_new_tokens`` tokens after every prompt from p (``target_probs`` at ``sampling``).

    Returns completions [B, N] long, top-k ids [B, N, k] long and top-k log p [B, N, k] float32 (-inf where the
    sampling filter removed the token).

    ``taps``: also collect the outputs of those verifier layers for every prompt token and every completion token
    but the last (the ones the passes read) from the same forward passes, appended to ``features_out`` as one
    tensor [P_b + N - 1, taps * H] per prompt (a feature drafter's training context).

    ``prompt_targets_out``: also append, per prompt, the verifier's argmax after each of its tokens ([P_b] long,
    from the same prefill pass): greedy labels for windows anchored inside the prompt (see
    ``feature.greedy_targets``).
    """
    from transformers import DynamicCache

    ids, valid, positions = causal_inputs(prompts)
    cache = DynamicCache()
    want_targets = prompt_targets_out is not None
    out = hf.logits(ids, attention_mask=valid.long(), position_ids=positions, cache=cache,
                    last=None if want_targets else 1, taps=taps)
    feats = []
    if taps:
        out, prefill = out
        feats.append(prefill.cpu())
    if want_targets:
        argmax = out.argmax(-1).cpu()  # [B, L_pad]; prompts are left-padded
        for i, p in enumerate(prompts):
            prompt_targets_out.append(argmax[i, ids.shape[1] - len(p) :])
    logits = out[:, -1]
    mask, pos = valid.long(), positions[:, -1:]
    tokens, top_ids, top_lp = [], [], []
    k = min(logprobs_k, hf.vocab_size)
    for step in range(max_new_tokens):
        if sampling.greedy:  # p is the argmax one-hot: skip the [B, V] softmax, log and multinomial draw
            token, top = _greedy_step(logits, k)
        else:
            p = target_probs(logits, sampling)  # [B, V]
            token = sample(p, generator)  # [B, 1]
            top = p.log().topk(k, dim=-1) if k else None
        tokens.append(token[:, 0])
        if top is not None:
            values, indices = top
            top_ids.append(indices)
            top_lp.append(values)
        if step == max_new_tokens - 1:
            break
        mask = torch.cat([mask, torch.ones_like(token)], dim=1)
        pos = pos + 1
        out = hf.logits(token, attention_mask=mask, position_ids=pos, cache=cache, last=1, taps=taps)
        if taps:
            out, step_feats = out
            feats.append(step_feats.cpu())
        logits = out[:, -1]
    b = len(prompts)
    if taps and features_out is not None:
        every = torch.cat(feats, 1)  # [B, L_pad + N - 1, F]; prompts are left-padded
        pad = ids.shape[1]
        for i, p in enumerate(prompts):
            features_out.append(every[i, pad - len(p) :])
    completions = torch.stack(tokens, 1)
    if not k:
        return completions, torch.zeros(b, max_new_tokens, 0, dtype=torch.long), torch.zeros(b, max_new_tokens, 0)
    return completions, torch.stack(top_ids, 1), torch.stack(top_lp, 1).float()


