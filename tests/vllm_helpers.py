"""A feature drafter that has learnt a few teacher continuations by heart (test-only, pure torch, seconds on CPU).

The vLLM tests need a drafter whose drafts are often accepted, so that vLLM's counters show accepted tokens and
its acceptance can be compared with our engine's on the same prompts: a mistake in the export (tap offset, RoPE,
mask vector, draft-vocabulary mapping) makes that acceptance collapse. Training it on the very continuations the
test then decodes makes acceptance high in seconds, without the distillation pipeline.
"""

from __future__ import annotations

from collections import Counter

import torch
import torch.nn.functional as F

from specdiff.models.feature_drafter import AnchorBatch, FeatureDrafter, anchor_logits, build_feature_drafter


@torch.no_grad()
def tapped_features(model, tokens: list[int], taps) -> torch.Tensor:
    """[len(tokens), taps*H]: the verifier's outputs of layers ``taps`` (Hugging Face hidden_states[i + 1])."""
    out = model(torch.tensor([tokens]), output_hidden_states=True)
    return torch.cat([out.hidden_states[i + 1][0] for i in taps], -1)


def overfit_feature_drafter(model, sequences: list[list[int]], prompt_lengths: list[int], *, gamma: int = 4,
                            steps: int = 120, draft_vocab_size: int = 1024, lr: float = 2e-3,
                            seed: int = 0) -> FeatureDrafter:
    """A one-layer feature drafter for ``model`` trained (cross-entropy on every window of the completions) on
    ``sequences`` (prompt + teacher completion). Its draft vocabulary is the completions' tokens, then the rest of
    the most frequent tokens of the sequences, then the lowest ids: a real slice, so the export writes ``d2t``."""
    drafter = build_feature_drafter(model, draft_vocab_size=draft_vocab_size, max_gamma=gamma, seed=seed)
    counts = Counter(t for s, p in zip(sequences, prompt_lengths) for t in s[p:])
    counts.update({t: 0 for s in sequences for t in s})
    ids = [t for t, _ in counts.most_common()][:draft_vocab_size]
    ids += [t for t in range(drafter.vocab_size) if t not in set(ids)][: draft_vocab_size - len(ids)]
    drafter.set_draft_vocabulary(torch.tensor(ids))

    taps = drafter.tap_layers
    width = max(len(s) for s in sequences)
    tokens = torch.zeros(len(sequences), width, dtype=torch.long)
    features = torch.zeros(len(sequences), width, drafter.config.feature_size)
    for i, s in enumerate(sequences):
        tokens[i, : len(s)] = torch.tensor(s)
        features[i, : len(s)] = tapped_features(model, s, taps)
    # Every anchor whose gamma labels lie inside the completion: [B, A].
    spans = [list(range(p - 1, len(s) - gamma)) for s, p in zip(sequences, prompt_lengths)]
    a = max(len(x) for x in spans)
    anchors = torch.zeros(len(sequences), a, dtype=torch.long)
    valid = torch.zeros(len(sequences), a, dtype=torch.bool)
    for i, x in enumerate(spans):
        anchors[i, : len(x)], valid[i, : len(x)] = torch.tensor(x), True
    idx = (anchors[..., None] + torch.arange(1, gamma + 1)).clamp_max(width - 1)  # [B, A, gamma]
    labels = tokens.gather(1, idx.view(len(sequences), -1)).view(len(sequences), a, gamma)
    batch = AnchorBatch(anchors=anchors, labels=labels, valid=valid)
    targets = drafter.draft_labels(labels).masked_fill(~valid[..., None], -1)  # [B, A, gamma]

    model.requires_grad_(False)  # the verifier's embedding feeds the blocks: no gradient into it
    model_ = drafter.model.train()
    opt = torch.optim.Adam(model_.parameters(), lr=lr)
    for _ in range(steps):  # every anchor every step: nothing is sampled
        logits = anchor_logits(drafter, model_, tokens, features, batch, gamma)  # [B, A, gamma, V_draft]
        loss = F.cross_entropy(logits.flatten(0, 2), targets.flatten(), ignore_index=-1)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model_.eval()
    drafter.final_loss = float(loss.detach())
    return drafter
