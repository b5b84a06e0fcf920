"""How much of the drafter's window is worth verifying? Teacher-forced T=0 walks of the plugin's rule (copy where the
context has one, else the drafter's window) with the drafter's window cut before the first position where the
running product of its top-1 probabilities falls below a threshold (specdiff.vllm.plugin.cut_rows). A one-off study,
as chain_walk.py (same trajectories: 96-token greedy continuations of every eval prompt, float32, gamma 4):

    python docs/bench/vllm-lookup/cut_walk.py DRAFTER_DIR

Prints tokens per step and the share of steps verifying 0..4 draft tokens, per threshold and domain.
"""
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import chain_walk as cw  # noqa: E402
from specdiff.core.lookup import lookup_or_draft  # noqa: E402
from specdiff.vllm.plugin import cut_rows  # noqa: E402

G = 4


def walk(trajectories, threshold):
    """Tokens per step of the plugin's rule, and the share of steps by number of draft tokens verified."""
    tokens = steps = 0
    lengths = collections.Counter()
    for r in trajectories:
        o = 0
        while o < len(r["drafts"]):
            draft = r["drafts"][o]
            chain = lookup_or_draft(draft, r["ctx"][: r["n_prompt"] + o], min_ngram=2, max_ngram=4)
            if chain is None:
                chain = cut_rows([draft], [r["conf"][o]], set(), threshold)[0] if threshold else draft
            a = cw.streak(chain, r["labels"][o])
            lengths[len(chain)] += 1
            tokens, steps, o = tokens + a + 1, steps + 1, o + a + 1
    return tokens / steps, {k: round(v / steps, 3) for k, v in sorted(lengths.items())}


if __name__ == "__main__":
    data = cw.trajectories(sys.argv[1], gamma=G)
    for threshold in (0.0, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8):
        for d, t in data.items():
            per_step, lengths = walk(t, threshold)
            print(f"thr {threshold:.2f} {d:5s} tok/step {per_step:.2f} lens {lengths}", flush=True)
