"""Teacher-forced held-out streak per domain, windows every 4 tokens from 0 to 84 (gamma 8; dtype DT, default float32;
the first LIMIT trajectories per domain, default all):
    [DT=bfloat16] [LIMIT=12] HELDOUT=DIR python tf_eval.py NAME=DRAFTER_DIR ...   (DIR: make_heldout.py's output)"""
import json, os, sys, torch
from specdiff.distill.feature import teacher_forced_eval
from specdiff.models.feature_drafter import load_feature_drafter
from specdiff.models.hf import HFModel
from specdiff.models.sources import DEFAULT_VERIFIER, load_causal_lm
model, tok = load_causal_lm(DEFAULT_VERIFIER, getattr(torch, os.environ.get("DT", "float32")))
v = HFModel(model)
recs = {d: [json.loads(l) for l in open(os.path.join(os.environ["HELDOUT"], f"heldout-{d}.jsonl"))][: int(os.environ.get("LIMIT", 99))] for d in ("code", "math", "chat")}
for arg in sys.argv[1:]:
    name, path = arg.split("=", 1)
    dr = load_feature_drafter(path, model, dtype=getattr(torch, os.environ.get("DT", "float32")))
    row = []
    for d, rs in recs.items():
        r = teacher_forced_eval(dr, v, rs, list(range(0, 85, 4)), 8)
        a = [round(float(x), 2) for x in r.alpha[:3]] if hasattr(r, "alpha") else r
        row.append(f"{d} {r.expected_streak:.3f} a{a}")
    print(name, " | ".join(row), flush=True)
