"""Drafter argmax streak by completion offset (16-token buckets): python by_offset.py OUT.pt (output of ../data-and-trees/tree_sim.py with TOPK=32)"""
import sys
import torch
data = torch.load(sys.argv[1], weights_only=False)
def streak(c, lab):
    s = 0
    for a, b in zip(c, lab):
        if b < 0 or a != b: break
        s += 1
    return s
for d, rs in data.items():
    b = {}
    for r in rs:
        for o, lab in enumerate(r["labels"]):
            s = streak(r["top_i"][o][:, 0].tolist(), lab)
            k = min(o // 16, 5)
            b.setdefault(k, []).append(s)
    print(d, "  ".join(f"{16*k}-: {sum(v)/len(v):.2f} (n={len(v)})" for k, v in sorted(b.items())))
