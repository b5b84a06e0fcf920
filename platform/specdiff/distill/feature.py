"""Training and evaluation pieces of the feature drafter (pure torch; no Ray).

A teacher record carries, besides the prompt and completion ids, the verifier's tapped hidden states of every
token but the last (``features``: float16 bytes, [P + N - 1, taps * H]), taken from the same forward passes that
sampled the completion. One training step cuts ``anchors_per_sample`` blocks from every trajectory's completion (and
``prompt_anchors_per_sample`` from its prompt, labelled with the verifier's greedy argmax recorded by the teacher's
prefill: free data, since no extra verifier pass is needed) and scores them all in ONE forward (``feature_drafter.anchor_logits``): each block sees the context strictly before its
anchor and itself, so a trajectory yields dozens of windows per step at the cost of one context projection.
"""

from __future__ import annotations

from typing import Sequence

import torch

from specdiff.core.config import SamplingParams
from specdiff.models.feature_drafter import FeatureDrafter, anchor_hidden, anchor_logits, sample_anchors
from specdiff.models.hf import HFModel
from specdiff.core.sampling import target_probs
from specdiff.core.objectives import WINDOW_OBJECTIVES, head_label_logprobs, window_loss_from_logprobs
from specdiff.distill.evaluate import score_drafts
from specdiff.distill.trajectories import FEATURE_DTYPE, encode_features  # noqa: F401 (moved there; kept importable)
from specdiff.distill.trajectories import causal_inputs, decode_features
from specdiff.lineage.evaluation import EvalResult


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


def greedy_targets(records: dict[str, list], tokens: torch.Tensor) -> torch.Tensor:
    """[B, L] long, row t: the verifier's argmax after token t — the teacher's ``prompt_targets`` over the prompt,
    the (greedy) teacher's own next token over the completion; 0 past the end."""
    if "prompt_targets" not in records:
        raise ValueError("objective.prompt_anchors_per_sample needs trajectories with a 'prompt_targets' column (the "
                         "verifier's argmax over each prompt); these were written by an older teacher: sample them "
                         "again (delete the saved trajectories)")
    greedy = torch.zeros_like(tokens)
    greedy[:, :-1] = tokens[:, 1:]
    for i, targets in enumerate(records["prompt_targets"]):
        greedy[i, : len(targets)] = torch.as_tensor(list(targets), dtype=torch.long)
    return greedy


def feature_loss(drafter: FeatureDrafter, runner: torch.nn.Module, objective, records: dict[str, list],
                 generator: torch.Generator) -> torch.Tensor:
    """The configured objective over ``objective.anchors_per_sample`` blocks of every trajectory in ``records``.

    ``runner``: the module the forward goes through (the drafter's model or its DDP wrapper)."""
    if objective.kind not in WINDOW_OBJECTIVES:  # before any work (window_loss_from_logprobs would say it last)
        raise ValueError(f"objective.kind {objective.kind!r} is not available for a feature drafter "
                         f"({', '.join(WINDOW_OBJECTIVES)})")
    tokens, feats, lengths, starts = collate(records, drafter.config.feature_size)
    gamma = objective.gamma
    extra = objective.prompt_anchors_per_sample
    greedy = greedy_targets(records, tokens) if extra else None
    batch = sample_anchors(lengths, starts, tokens, gamma, objective.anchors_per_sample, generator, greedy=greedy,
                           prompt_anchors=extra)
    if not bool(batch.valid.any()):
        raise ValueError(f"no trajectory is long enough for a window of gamma={gamma}")
    hidden = anchor_hidden(drafter, runner, tokens, feats, batch, gamma)[batch.valid]  # [W, γ, H]
    labels = drafter.draft_labels(batch.labels[batch.valid]).to(hidden.device)  # [W, γ]; -1 outside the draft vocabulary
    # log q_j(label_j) through the verifier's (sliced, frozen) head, a chunk of rows at a time.
    weight = drafter.head_weight.detach()[: drafter.vocab_size]  # as ``FeatureDrafter.logits`` scores
    logp = head_label_logprobs(hidden, weight, labels, objective.temperature)
    return window_loss_from_logprobs(objective.kind, logp, labels, objective.decay)


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


@torch.no_grad()
def teacher_forced_eval(drafter: FeatureDrafter, verifier: HFModel, records: Sequence[dict], offsets: Sequence[int],
                        gamma: int, batch_size: int = 16) -> EvalResult | None:
    """Held-out α_j and expected streak of greedy drafts (K=1, draft temperature 0) at verifier temperature 0, read
    off held-out trajectories: the windows are those of ``heldout_prefixes(records, offsets)``, and a draft token is
    accepted iff it equals the verifier's greedy continuation there. One verifier pass per trajectory gives its
    states and its argmax at every position; every window is then scored in one drafter forward. Equal to
    ``evaluate_feature_drafter`` at those settings (tested) at a fraction of the cost.

    The labels are the verifier's argmax along the trajectory (``greedy_labels``). Where the trajectory is not
    greedy under this pass (in bf16, batched decoding and a full pass can break a near-tie differently), a window's
    greedy continuation is known only up to the first token where they part: a streak that gets there is cut there,
    so the figure is a lower bound, exact at position 1 (``EvalResult.cut`` counts such windows).

    None when a window runs past a trajectory's end: the caller evaluates the usual way."""
    from specdiff.models.feature_drafter import AnchorBatch, greedy_labels

    if any(o + gamma > len(r["completion_ids"]) for r in records for o in offsets):
        return None
    reached, accepted, streaks = torch.zeros(gamma, dtype=torch.float64), torch.zeros(gamma, dtype=torch.float64), []
    cut = 0
    for start in range(0, len(records), batch_size):
        chunk = records[start : start + batch_size]
        seqs = [list(r["prompt_ids"]) + list(r["completion_ids"]) for r in chunk]
        ids, valid, positions = causal_inputs(seqs)
        logits, feats = verifier.logits(ids, attention_mask=valid.long(), position_ids=positions,
                                        taps=drafter.tap_layers)
        pad = ids.shape[1]
        length = max(len(s) for s in seqs)
        tokens = torch.zeros(len(seqs), length, dtype=torch.long)
        greedy = torch.zeros(len(seqs), length, dtype=torch.long)
        features = torch.zeros(len(seqs), length, feats.shape[-1])
        anchors = torch.zeros(len(seqs), len(offsets), dtype=torch.long)
        for i, (r, seq) in enumerate(zip(chunk, seqs)):
            n_prompt = len(r["prompt_ids"])
            greedy[i, : len(seq) - 1] = logits[i, pad - len(seq) : pad - 1].argmax(-1).cpu()  # row t: after t
            tokens[i, : len(seq)] = torch.as_tensor(seq)
            features[i, : len(seq) - 1] = feats[i, pad - len(seq) : pad - 1].float().cpu()
            anchors[i] = torch.as_tensor([n_prompt - 1 + o for o in offsets])
        labels = greedy_labels(tokens, greedy, anchors, gamma)  # -1 past the point where a trajectory parts
        batch = AnchorBatch(anchors=anchors, labels=labels, valid=torch.ones_like(anchors, dtype=torch.bool))
        out = anchor_logits(drafter, drafter.model, tokens, features, batch, gamma)  # [B, A, γ, V_draft]
        drafts = out.argmax(-1)
        if drafter.config.draft_vocab_size is not None:
            drafts = drafter.model.draft_ids[drafts]
        drafts = drafts.cpu()  # beside the labels (host)
        survive = (drafts == labels).view(-1, gamma).double().cumprod(-1)
        reach = torch.cat([torch.ones(len(survive), 1, dtype=torch.float64), survive[:, :-1]], 1)  # [W, γ]
        cut += int(((labels < 0).view(-1, gamma) & reach.bool()).any(-1).sum())  # a streak reached an unknown label
        streaks.append(survive.sum(-1))
        accepted += survive.sum(0)
        reached += reach.sum(0)
    alpha = (accepted / reached.clamp_min(1e-300)).tolist()
    return EvalResult(expected_streak=float(torch.cat(streaks).mean()), alpha=alpha,
                      windows=len(records) * len(offsets), cut=cut)


def draft_vocabulary(token_lists, vocab_size: int, size: int) -> torch.Tensor:
    """The ``size`` most frequent ids over ``token_lists`` (ties and unseen ids: lowest id first) -> [size] long."""
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    for tokens in token_lists:
        t = torch.as_tensor(list(tokens), dtype=torch.long)
        counts.index_add_(0, t, torch.ones(len(t), dtype=torch.float64))
    # A stable sort by descending count keeps the order deterministic.
    order = torch.sort(-counts, stable=True).indices
    return order[:size]

