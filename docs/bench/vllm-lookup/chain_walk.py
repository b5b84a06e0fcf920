"""Which single chain should a chain verifier (vLLM) check: the drafter's window, a copy from the context, or the copy
where there is one? Teacher-forced T=0 decode walks over held-out greedy trajectories (a one-off study; its result
is specdiff.core.lookup.lookup_or_draft and specdiff.vllm.plugin).

    python docs/bench/vllm-lookup/chain_walk.py DRAFTER_DIR

At T=0 a step started at position t accepts the longest prefix of its chain that matches the greedy continuation,
so a decode's tokens per step follow from the drafter's argmax window at every position (one batched drafter pass
per trajectory, specdiff.distill.feature.anchor_logits) and the copied candidate (specdiff.core.lookup). float32,
96-token greedy trajectories of every eval prompt (prompts cut to their last 160 tokens, as in training).
"""
import sys

import torch

from specdiff import SamplingParams
from specdiff.distill.feature import anchor_logits, causal_inputs
from specdiff.distill.teacher import sample_completions
from specdiff.models.feature_drafter import AnchorBatch, greedy_labels, load_feature_drafter
from specdiff.models.hf import HFModel
from specdiff.core.lookup import lookup_continuation
from specdiff.models.sources import DEFAULT_VERIFIER, load_causal_lm
from specdiff.prompts import DOMAINS, chat_prompt_ids, load_prompts

MAX_GAMMA = 8


def streak(chain, labels):
    n = 0
    for a, b in zip(chain, labels):
        if a != b or b < 0:
            break
        n += 1
    return n


@torch.no_grad()
def windows(drafter, verifier, prompts, completions, gamma=MAX_GAMMA):
    """Per trajectory: context tokens, prompt length, the drafter's argmax window, its top-1 probabilities and the
    greedy labels at every completion position that has ``gamma`` labels after it."""
    out = []
    for start in range(0, len(prompts), 4):
        seqs = [p + c for p, c in zip(prompts[start:start + 4], completions[start:start + 4])]
        n_prompt = [len(p) for p in prompts[start:start + 4]]
        ids, valid, positions = causal_inputs(seqs)
        logits, feats = verifier.logits(ids, attention_mask=valid.long(), position_ids=positions,
                                        taps=drafter.tap_layers)
        pad, width = ids.shape[1], max(len(s) for s in seqs)
        offsets = list(range(min(len(s) - n for s, n in zip(seqs, n_prompt)) - gamma + 1))
        tokens = torch.zeros(len(seqs), width, dtype=torch.long)
        greedy = torch.zeros_like(tokens)
        features = torch.zeros(len(seqs), width, feats.shape[-1])
        anchors = torch.zeros(len(seqs), len(offsets), dtype=torch.long)
        for i, (seq, n) in enumerate(zip(seqs, n_prompt)):
            greedy[i, : len(seq) - 1] = logits[i, pad - len(seq) : pad - 1].argmax(-1)
            tokens[i, : len(seq)] = torch.as_tensor(seq)
            features[i, : len(seq) - 1] = feats[i, pad - len(seq) : pad - 1].float()
            anchors[i] = torch.as_tensor([n - 1 + o for o in offsets])
        labels = greedy_labels(tokens, greedy, anchors, gamma)
        batch = AnchorBatch(anchors=anchors, labels=labels, valid=torch.ones_like(anchors, dtype=torch.bool))
        conf, drafts = anchor_logits(drafter, drafter.model, tokens, features, batch, gamma).softmax(-1).max(-1)
        if drafter.config.draft_vocab_size is not None:
            drafts = drafter.model.draft_ids[drafts]
        out += [dict(ctx=s, n_prompt=n, drafts=drafts[i].tolist(), conf=conf[i].tolist(), labels=labels[i].tolist())
                for i, (s, n) in enumerate(zip(seqs, n_prompt))]
    return out


def walk(trajectories, rule, gamma, min_ngram):
    tokens = steps = 0
    for r in trajectories:
        o = 0
        while o < len(r["drafts"]):
            copy = lookup_continuation(r["ctx"][: r["n_prompt"] + o], gamma, min_ngram=min_ngram, max_ngram=4)
            a = rule(r["drafts"][o][:gamma], copy, r["labels"][o][:gamma])
            tokens, steps, o = tokens + a + 1, steps + 1, o + a + 1
    return tokens / steps


RULES = {
    "drafter": lambda d, c, lab: streak(d, lab),
    "copy": lambda d, c, lab: streak(c, lab),
    "copy_else_drafter": lambda d, c, lab: streak(c + d[len(c):], lab) if c else streak(d, lab),
    "oracle": lambda d, c, lab: max(streak(d, lab), streak(c, lab)),
}

def trajectories(drafter_dir, gamma=MAX_GAMMA):
    """Domain -> ``windows`` of every eval prompt's 96-token greedy trajectory (float32)."""
    model, tok = load_causal_lm(DEFAULT_VERIFIER, torch.float32)
    drafter = load_feature_drafter(drafter_dir, model, dtype=torch.float32)
    data = {}
    for d in DOMAINS:
        prompts = [chat_prompt_ids(tok, t)[-160:] for t in load_prompts(d, "eval")]
        comps, _, _ = sample_completions(HFModel(model), prompts, 96, SamplingParams(0.0), 0, None)
        data[d] = windows(drafter, HFModel(model), prompts, comps.tolist(), gamma)
        print(f"{d}: {len(prompts)} trajectories", flush=True)
    return data


if __name__ == "__main__":
    data = trajectories(sys.argv[1])
    print("tokens per step (T=0, teacher-forced):")
    for gamma in (4, 8):
        for min_ngram in (1, 2, 3):
            for name, rule in RULES.items():
                if name == "drafter" and min_ngram > 1:
                    continue
                row = " ".join(f"{d} {walk(t, rule, gamma, min_ngram):.2f}" for d, t in data.items())
                print(f"gamma {gamma} n-grams {min_ngram}-4 {name:18s} {row}", flush=True)
