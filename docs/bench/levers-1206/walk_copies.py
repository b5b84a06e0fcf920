"""Teacher-forced T=0 walk over ../data-and-trees/tree_sim.py output (TOPK=32): argmax window + a copied candidate
chosen by each rule (latest occurrence of the longest n-gram, the drafter-scored one, both, the oracle):
    [EOS=1] python walk_copies.py OUT.pt [none,latest,scored,scored_long,two,oracle]
(EOS=1: a completion ends at its first <|im_end|>)"""
import os, sys, torch
from specdiff.core.lookup import lookup_continuation
G = 8
EOS = os.environ.get("EOS") == "1"
def streak(c, lab):
    s = 0
    for a, b in zip(c, lab):
        if b < 0 or a != b: break
        s += 1
    return s
def all_copies(ctx, maxn=4, minn=1, window=2048):
    ctx = ctx[-window:]; n_ctx = len(ctx); out = []  # (n, i, cont) latest first within n, longest n first
    for n in range(min(maxn, n_ctx - 1), minn - 1, -1):
        suffix = ctx[n_ctx - n:]
        for i in range(n_ctx - n - 1, -1, -1):
            if ctx[i:i + n] == suffix:
                out.append((n, i, ctx[i + n:i + n + G]))
    return out
def qscore(c, tp, ti):
    # drafter expected streak of candidate c under its marginals (top-32; else 0)
    s, run = 0.0, 1.0
    for j, t in enumerate(c):
        m = (ti[j] == t).nonzero()
        pj = float(tp[j, m[0, 0]]) if len(m) else 0.0
        run *= pj; s += run
    return s
def pad(cp, main):
    c = list(main); c[:len(cp)] = cp; return c
def best_scored(pool, main, tp, ti):
    """The distinct continuation of ``pool`` the drafter scores highest (ties: longer n-gram, then the latest)."""
    seen = {}
    for k, (nn, i, cont) in enumerate(pool):
        if tuple(cont) not in seen:
            seen[tuple(cont)] = (qscore(pad(cont, main), tp, ti) + 1e-9 * nn, -k)
    return pad(list(max(seen.items(), key=lambda kv: kv[1])[0]), main)
def nodes(cs):
    trie = set()
    for c in cs:
        for j in range(len(c)): trie.add(tuple(c[:j+1]))
    return len(trie)
def candidates(mode, main, ctx, tp, ti):
    """The round's tree: the argmax window ``main`` and the copied candidate(s) of rule ``mode``."""
    allc = all_copies(ctx) if mode != "none" else []
    if not allc:
        return [main]
    if mode == "latest":
        return [main, pad(allc[0][2], main)]
    if mode == "scored":
        return [main, best_scored(allc, main, tp, ti)]
    if mode == "scored_long":  # only n-grams as long as the longest
        return [main, best_scored([x for x in allc if x[0] == allc[0][0]], main, tp, ti)]
    if mode == "two":
        return [main, best_scored(allc, main, tp, ti), pad(allc[0][2], main)]
    if mode == "oracle":
        return [main] + [pad(c, main) for _, _, c in allc]
    raise ValueError(f"unknown mode {mode!r}")
def walk(data, mode):
    row = {}
    for d, rs in data.items():
        toks = steps = nd = 0
        for r in rs:
            o = 0; n = len(r["labels"])
            comp = r["ctx"][r["n_prompt"]:]
            if EOS and 2 in comp: n = min(n, comp.index(2) + 1)
            while o < n:
                tp, ti = r["top_p"][o], r["top_i"][o]
                main = ti[:, 0].tolist()
                cs = candidates(mode, main, r["ctx"][: r["n_prompt"] + o], tp, ti)
                a = max(streak(c, r["labels"][o]) for c in cs)
                nd += nodes(cs) if mode != "oracle" else 0; toks += a + 1; steps += 1; o += a + 1
        row[d] = (toks / steps, nd / steps)
    return row
if __name__ == "__main__":
    data = torch.load(sys.argv[1], weights_only=False)
    MODES = sys.argv[2].split(",") if len(sys.argv) > 2 else ["none", "latest", "scored", "scored_long", "two", "oracle"]
    for mode in MODES:
        row = walk(data, mode)
        print(f"{mode:12s} " + "  ".join(f"{d} tau {t:.3f} nodes {n:.1f}" for d, (t, n) in row.items()), flush=True)
