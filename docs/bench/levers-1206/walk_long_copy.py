"""T=0 walk: argmax window (8) + the latest copy extended to LC tokens (past 8 only where the n-gram match has
>= min_ngram_long tokens; labels past 8 from the greedy trajectory): python walk_long_copy.py OUT.pt"""
import sys, torch
from specdiff.core.lookup import lookup_continuation
G = 8
from walk_copies import nodes, streak  # its labels (trajectory tokens) are never -1
data = torch.load(sys.argv[1], weights_only=False)
for LC, minn in [(8, 1), (12, 1), (16, 1), (16, 3), (24, 3)]:
    row = {}
    for d, rs in data.items():
        toks = steps = nd = 0; hist = [0]*30
        for r in rs:
            o = 0; seq = r["ctx"]; n0 = r["n_prompt"]; n = len(r["labels"])
            while o < n:
                lab = seq[n0 + o: n0 + o + 32]
                tp, ti = r["top_p"][o], r["top_i"][o]
                main = ti[:, 0].tolist(); ctx = seq[: n0 + o]
                cs = [main]
                cp = lookup_continuation(ctx, LC, max_ngram=4, min_ngram=1)
                if cp:
                    # past its first G tokens, the copy continues only where its n-gram match is >= minn tokens
                    long_ok = len(lookup_continuation(ctx, LC, max_ngram=4, min_ngram=minn)) > 0
                    c = list(main); c[:min(len(cp), G)] = cp[:G]
                    if long_ok and len(cp) > G: c = c + cp[G:]
                    cs.append(c)
                a = max(streak(c, lab) for c in cs)
                nd += nodes(cs); toks += a + 1; steps += 1; o += a + 1
        row[d] = (toks / steps, nd / steps)
    print(f"LC={LC} min_ngram_long={minn} " + "  ".join(f"{d} tau {t:.3f} nodes {n:.1f}" for d, (t, n) in row.items()), flush=True)
