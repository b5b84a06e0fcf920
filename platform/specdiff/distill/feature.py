"""Training and evaluation pieces of the feature drafter (pure torch; no Ray).

A teacher record carries, besides the prompt and completion ids, the verifier's tapped hidden states of every
token but the last (``features``: float16 bytes, [P + N - 1, taps * H]), taken from the same forward passes that
sampled the completion. One training step cuts ``anchors_per_sample`` blocks from every trajectory and scores
them all in ONE forward (``feature_drafter.anchor_logits``): each block sees the context strictly before its
anchor and itself, so a trajectory yields dozens of windows per step at the cost of one context projection.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..config import SamplingParams
from ..feature_drafter import FeatureDrafter, anchor_logits, sample_anchors
from ..hf import HFModel
from ..sampling import target_probs
from ..objectives import ar_distill_first_position_loss, decayed_ce_loss, naive_window_loss, streak_loss
from .evaluate import EvalResult, score_drafts
from .teacher import causal_inputs

FEATURE_DTYPE = np.float16  # features travel and rest as float16 bytes: half the size, ample precision


def encode_features(features: torch.Tensor) -> bytes:
    return features.to(torch.float32).numpy().astype(FEATURE_DTYPE).tobytes()


def decode_features(blob: bytes, width: int) -> torch.Tensor:
    return torch.from_numpy(np.frombuffer(blob, dtype=FEATURE_DTYPE).reshape(-1, width).astype(np.float32))


def collate(records: dict[str, list], width: int):
    """Columns of a batch of trajectories -> tokens [B, L] (right-padded), features [B, L, width] (row t: states
    of token t; zero past each row's features), lengths and completion starts."""
    seqs = [list(p) + list(c) for p, c in zip(records["prompt_ids"], records["completion_ids"])]
    length = max(len(s) for s in seqs)
    tokens = torch.zeros(len(seqs), length, dtype=torch.long)
    feats = torch.zeros(len(seqs), length, width)
    for i, (s, blob) in enumerate(zip(seqs, records["features"])):
        tokens[i, : len(s)] = torch.tensor(s)
        f = decode_features(blob, width)
        if len(f) != len(s) - 1:
            raise ValueError(f"a trajectory's features cover {len(f)} tokens, expected {len(s) - 1} (prompt + "
                             "completion - 1); were the trajectories written by a feature-drafter teacher?")
        feats[i, : len(f)] = f
    return tokens, feats, [len(s) for s in seqs], [len(p) for p in records["prompt_ids"]]


def feature_loss(drafter: FeatureDrafter, runner: torch.nn.Module, objective, records: dict[str, list],
                 generator: torch.Generator) -> torch.Tensor:
    """The configured objective over ``objective.anchors_per_sample`` blocks of every trajectory in ``records``.

    ``runner``: the module the forward goes through (the drafter's model or its DDP wrapper)."""
    tokens, feats, lengths, starts = collate(records, drafter.config.feature_size)
    gamma = objective.gamma
    batch = sample_anchors(lengths, starts, tokens, gamma, objective.anchors_per_sample, generator)
    if not bool(batch.valid.any()):
        raise ValueError(f"no trajectory is long enough for a window of gamma={gamma}")
    logits = anchor_logits(drafter, runner, tokens, feats, batch, gamma)[batch.valid]  # [W, γ, V_draft]
    labels = drafter.draft_labels(batch.labels[batch.valid])  # [W, γ]; -1 outside the draft vocabulary
    kind, temperature = objective.kind, objective.temperature
    if kind == "streak":
        return streak_loss(logits, labels, temperature)
    if kind == "decayed_ce":
        return decayed_ce_loss(logits, labels, objective.decay, temperature)
    if kind == "naive":
        return naive_window_loss(logits, labels, temperature)
    if kind == "ar_distill":
        return ar_distill_first_position_loss(logits, labels, temperature)
    raise ValueError(f"objective.kind {kind!r} is not available for a feature drafter (streak, decayed_ce, naive, "
                     "ar_distill)")


@torch.no_grad()
def prefix_features(verifier: HFModel, prefixes: Sequence[Sequence[int]], taps: tuple[int, ...]) -> list:
    """The verifier's tapped states of every token but the last of each prefix (one causal pass per batch)."""
    ids, valid, positions = causal_inputs([list(p) for p in prefixes])
    _, feats = verifier.logits(ids, attention_mask=valid.long(), position_ids=positions, last=1, taps=taps)
    pad = ids.shape[1]
    return [feats[i, pad - len(p) : pad - 1].cpu() for i, p in enumerate(prefixes)]


@torch.no_grad()
def evaluate_feature_drafter(
    drafter: FeatureDrafter,
    verifier: HFModel,
    prefixes: Sequence[Sequence[int]],
    gamma: int,
    sampling: SamplingParams,
    *,
    num_candidates: int = 1,
    draft_temperature: float = 0.0,
    generator: torch.Generator | None = None,
    batch_size: int = 32,
) -> EvalResult:
    """Held-out α_j and expected streak, exactly as ``evaluate_drafter`` scores a standalone drafter.

    One verifier pass per chunk of prefixes gives the tapped states (the drafter's context) and fills a KV cache;
    the drafts are then scored by a second pass over the draft tokens only."""
    from transformers import DynamicCache

    marginals, passes = [], {}
    for start in range(0, len(prefixes), batch_size):
        chunk = [list(p) for p in prefixes[start : start + batch_size]]
        ids, valid, positions = causal_inputs(chunk)
        cache = DynamicCache()
        logits, feats = verifier.logits(ids, attention_mask=valid.long(), position_ids=positions, cache=cache,
                                        last=1, taps=drafter.tap_layers)
        pad = ids.shape[1]
        rows = [feats[i, pad - len(p) : pad - 1].cpu() for i, p in enumerate(chunk)]
        marginals.append(drafter.propose_batch(chunk, gamma, rows))
        passes[start] = (cache, logits[:, -1], valid, positions[:, -1])

    def chain_probs(start: int, chunk, drafts: torch.Tensor) -> torch.Tensor:
        cache, last, valid, pos = passes.pop(start)
        k = drafts.shape[0] // len(chunk)
        if k > 1:  # one cache row per candidate
            for layer in cache.layers:
                layer.keys = layer.keys.repeat_interleave(k, 0)
                layer.values = layer.values.repeat_interleave(k, 0)
            last, valid, pos = (t.repeat_interleave(k, 0) for t in (last, valid, pos))
        g = drafts.shape[1]
        mask = torch.cat([valid, torch.ones(len(drafts), g, dtype=torch.bool)], 1).long()
        out = verifier.logits(drafts, attention_mask=mask, position_ids=pos[:, None] + 1 + torch.arange(g),
                              cache=cache)  # [B*K, γ, V]: position i predicts draft token i + 1
        probs = target_probs(torch.cat([last[:, None], out[:, :-1]], 1), sampling)
        return probs.gather(-1, drafts[..., None].to(probs.device)).squeeze(-1).cpu()

    return score_drafts(torch.cat(marginals), prefixes, verifier, gamma, sampling, num_candidates=num_candidates,
                        draft_temperature=draft_temperature, generator=generator, batch_size=batch_size,
                        chain_probs=chain_probs)


def draft_vocabulary(token_lists, vocab_size: int, size: int) -> torch.Tensor:
    """The ``size`` most frequent ids over ``token_lists`` (ties and unseen ids: lowest id first) -> [size] long."""
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    for tokens in token_lists:
        t = torch.as_tensor(list(tokens), dtype=torch.long)
        counts.index_add_(0, t, torch.ones(len(t), dtype=torch.float64))
    # A stable sort by descending count keeps the order deterministic.
    order = torch.sort(-counts, stable=True).indices
    return order[:size]

