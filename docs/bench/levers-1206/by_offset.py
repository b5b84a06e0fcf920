"""Drafter argmax streak by completion offset (16-token buckets):
    python by_offset.py OUT.pt   (OUT.pt: ../data-and-trees/tree_sim.py's output with TOPK=32)"""
import sys
import torch
from walk_copies import streak
data = torch.load(sys.argv[1], weights_only=False)
for d, rs in data.items():
    b = {}
    for r in rs:
        for o, lab in enumerate(r["labels"]):
            s = streak(r["top_i"][o][:, 0].tolist(), lab)
            k = min(o // 16, 5)
            b.setdefault(k, []).append(s)
    print(d, "  ".join(f"{16*k}-: {sum(v)/len(v):.2f} (n={len(v)})" for k, v in sorted(b.items())))
