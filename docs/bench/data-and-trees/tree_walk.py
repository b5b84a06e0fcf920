"""Teacher-forced decode walk (T=0, gamma 8) over tree_sim.py's output: tokens per round and tree nodes for the
argmax window, + the copied candidate, + B one-swap branches: python tree_walk.py OUT.pt"""
import sys, torch
from specdiff.core.lookup import lookup_continuation
G = 8
data = torch.load(sys.argv[1], weights_only=False)
def streak(c, lab):
    s = 0
    for a, b in zip(c, lab):
        if b < 0 or a != b: break
        s += 1
    return s
def cands(tp, ti, B, copy, ctx, alt3=False):
    p1 = tp[:, 0].tolist(); main = ti[:, 0].tolist()
    cs = [main]
    # branch score: prob of reaching j on argmax * prob of alt at j
    reach = [1.0]
    for j in range(G - 1): reach.append(reach[-1] * p1[j])
    opts = []
    for j in range(G):
        for k in ((1, 2) if alt3 else (1,)):
            opts.append((reach[j] * float(tp[j, k]), j, k))
    opts.sort(reverse=True)
    for s, j, k in opts[:B]:
        c = list(main); c[j] = int(ti[j, k]); cs.append(c)
    if copy:
        cp = lookup_continuation(ctx, G, max_ngram=4)
        if cp:
            c = list(main); c[:len(cp)] = cp; cs.append(c)
    return cs
def nodes(cs):
    trie = set()
    for c in cs:
        for j in range(len(c)): trie.add(tuple(c[:j+1]))
    return len(trie)
def run(B, copy, alt3=False):
    row = {}
    for d, rs in data.items():
        toks = steps = nd = 0
        for r in rs:
            o = 0; n = len(r["labels"])
            while o < n:
                lab = r["labels"][o]
                cs = cands(r["top_p"][o], r["top_i"][o], B, copy, r["ctx"][: r["n_prompt"] + o], alt3)
                a = max(streak(c, lab) for c in cs)
                nd += nodes(cs); toks += a + 1; steps += 1; o += a + 1
        row[d] = (toks / steps, nd / steps)
    return row
for B in (0, 1, 2, 3, 4, 6):
    for copy in (False, True):
        r = run(B, copy)
        print(f"B={B} copy={int(copy)} " + "  ".join(f"{d} tau {t:.2f} nodes {n:.1f}" for d, (t, n) in r.items()), flush=True)
for B in (2, 4):
    r = run(B, True, True)
    print(f"B={B} copy=1 alt3 " + "  ".join(f"{d} tau {t:.2f} nodes {n:.1f}" for d, (t, n) in r.items()), flush=True)
