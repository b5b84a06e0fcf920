"""Teacher trajectories in pure torch: the frozen verifier samples completions of prompts, batched, with an exact KV
cache (``sample_completions``: transformers' padded batch, or ragged on the lean Llama forward), and a record's
tapped verifier states travel as float16 bytes (``encode_features``).

The bottom of the distillation package: the samplers (``teacher``, ``teacher_vllm``), the evaluation
(``evaluate``, ``feature``) and the baselines (``ar``) all use these, and this module imports none of them.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from specdiff.core.config import SamplingParams
from specdiff.core.sampling import sample, target_probs
from specdiff.models.dtypes import resolve_dtype
from specdiff.models.hf import HFModel
from specdiff.models.llama import LlamaCausalLM

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


def load_teacher_model(path: str | Path, dtype: str | torch.dtype = "float32"):
    """The frozen verifier for ``sample_completions``: the lean ``LlamaCausalLM`` where it computes the folder's
    model exactly (``specdiff.models.llama.load_llama``), else transformers' model in an ``HFModel``."""
    from specdiff.models.llama import load_llama

    lean = load_llama(path, resolve_dtype(dtype))
    if lean is not None:
        lean.requires_grad_(False)
        return lean
    return HFModel(load_verifier_model(path, dtype))


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


def _draw(logits: torch.Tensor, sampling: SamplingParams, k: int, generator: torch.Generator | None,
          tokens: list, top_ids: list, top_lp: list) -> torch.Tensor:
    """One decode step's tokens [B, 1] from logits [B, V] under ``sampling``, appended to ``tokens`` ([B] each), with
    the top-k (ids, log p) of p appended to ``top_ids`` / ``top_lp`` when ``k``."""
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
    return token


@torch.no_grad()
def sample_completions(
    hf: HFModel | LlamaCausalLM,
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

    ``hf``: an ``HFModel`` (transformers' padded batch) or a lean ``LlamaCausalLM`` (``load_teacher_model``), which
    samples the same tokens without padding (``_sample_ragged``: faster where prompts differ in length).
    """
    from transformers import DynamicCache

    if isinstance(hf, LlamaCausalLM):
        return _sample_ragged(hf, prompts, max_new_tokens, sampling, logprobs_k, generator, taps, features_out,
                              prompt_targets_out)

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
        token = _draw(logits, sampling, k, generator, tokens, top_ids, top_lp)
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


# A ragged prefill's rows per forward: the LM head's logits for every prompt row (prompt targets) are [rows, V]
# float32, ~200 MB at 1024 rows of a 49k vocabulary.
PREFILL_ROWS = 1024


@torch.no_grad()
def _sample_ragged(
    model: LlamaCausalLM,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    sampling: SamplingParams,
    logprobs_k: int,
    generator: torch.Generator | None,
    taps: tuple[int, ...] | None = None,
    features_out: list | None = None,
    prompt_targets_out: list | None = None,
    prefill_rows: int = PREFILL_ROWS,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``sample_completions`` on the lean Llama forward (``specdiff.models.llama.LlamaCausalLM``): the same
    outputs, computed without padding. Prompts are prefilled end to end in ragged forwards of up to
    ``prefill_rows`` rows; then every decode step is one ``forward_ragged`` over all prompts, their KV caches in one
    ``KVPool`` so that a step attends in one call per layer (``kvpool.StepPlan``).

    transformers' padded batch pays for the longest prompt in every row of the prefill and for a padded mask over
    every cached position at each step; here each prompt costs its own rows."""
    from specdiff.models.kvpool import KVPool
    from specdiff.models.llama import Piece

    pool = KVPool(model.config.num_hidden_layers, min_room=max(len(p) for p in prompts) + max_new_tokens)
    caches = [pool.cache() for _ in prompts]
    want_targets = prompt_targets_out is not None
    last_logits: list[torch.Tensor] = [None] * len(prompts)  # type: ignore[list-item]
    feats: list[list[torch.Tensor]] = [[] for _ in prompts]
    targets: list[torch.Tensor] = [None] * len(prompts)  # type: ignore[list-item]
    try:
        order, chunk, rows = [], [], 0
        for i, p in enumerate(prompts):
            if chunk and rows + len(p) > prefill_rows:
                order.append(chunk)
                chunk, rows = [], 0
            chunk.append(i)
            rows += len(p)
        order.append(chunk)
        for chunk in order:
            pieces = [Piece(torch.as_tensor(list(prompts[i]), dtype=torch.long), caches[i],
                            last=None if want_targets else 1) for i in chunk]
            for i, (logits, f) in zip(chunk, model.forward_ragged(pieces, taps)):
                if want_targets:
                    targets[i] = logits.argmax(-1).cpu()
                last_logits[i] = logits[-1]
                if taps:
                    feats[i].append(f.cpu())
        logits = torch.stack(last_logits)  # [B, V]
        tokens, top_ids, top_lp = [], [], []
        k = min(logprobs_k, int(model.lm_head.weight.shape[0]))
        for step in range(max_new_tokens):
            token = _draw(logits, sampling, k, generator, tokens, top_ids, top_lp)
            if step == max_new_tokens - 1:
                break
            pieces = [Piece(token[i], caches[i], last=1) for i in range(len(prompts))]
            out = model.forward_ragged(pieces, taps)
            logits = torch.cat([lg for lg, _ in out])
            if taps:
                every = torch.cat([f for _, f in out]).cpu()  # [B, F]: one row per prompt
                for i in range(len(prompts)):
                    feats[i].append(every[i : i + 1])
    finally:
        for c in caches:
            c.release()
    if want_targets:
        prompt_targets_out.extend(targets)
    if taps and features_out is not None:
        features_out.extend(torch.cat(f) for f in feats)
    b = len(prompts)
    completions = torch.stack(tokens, 1).cpu()
    if not k:
        return completions, torch.zeros(b, max_new_tokens, 0, dtype=torch.long), torch.zeros(b, max_new_tokens, 0)
    return completions, torch.stack(top_ids, 1).cpu(), torch.stack(top_lp, 1).float().cpu()
