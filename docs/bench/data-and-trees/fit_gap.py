"""Teacher-forced streak on 40 training trajectories per domain (offsets 0-52, gamma 8, float32): how well the
drafter fits its own training data: python fit_gap.py DRAFTER_DIR BUILD_DIR (BUILD_DIR: $SPECDIFF_HOME/build/smollm2)."""
import glob, json, random, sys, torch, pyarrow.parquet as pq
from specdiff.distill.feature import teacher_forced_eval
from specdiff.models.feature_drafter import load_feature_drafter
from specdiff.models.hf import HFModel
from specdiff.models.sources import DEFAULT_VERIFIER, load_causal_lm
model, tok = load_causal_lm(DEFAULT_VERIFIER, torch.float32)
v = HFModel(model)
dr = load_feature_drafter(sys.argv[1], model, dtype=torch.float32)
files = sorted(glob.glob(sys.argv[2] + "/trajectories/*.parquet"))
rows = []
for f in files:
    t = pq.read_table(f, columns=["prompt_ids", "completion_ids"]).to_pylist()
    rows += t
random.seed(0)
offs = list(range(0, 56, 4))
P = {}
for l in open(sys.argv[2] + "/prompts.jsonl"):
    j = json.loads(l); P[tuple(j["prompt_ids"][-40:])] = j["domain"]
def dom(r):
    return P.get(tuple(r["prompt_ids"][-40:]), "?")
by = {}
for r in rows:
    if len(r["completion_ids"]) >= 64: by.setdefault(dom(r), []).append(r)
for d, rs in by.items():
    rs = random.sample(rs, min(40, len(rs)))
    e = teacher_forced_eval(dr, v, rs, offs, 8)
    print("train", d, len(rs), round(e.expected_streak, 3), [round(a, 2) for a in e.alpha[:3]])
