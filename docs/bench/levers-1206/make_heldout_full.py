"""Greedy 96-token held-out trajectories of the first 12 eval prompts per domain (the bench's), prompts NOT truncated,
in dtype DT (default float32): DT=bfloat16 python make_heldout_full.py OUT_DIR"""
import json, os, sys, torch
from specdiff import SamplingParams
from specdiff.distill.teacher import sample_completions
from specdiff.models.hf import HFModel
from specdiff.models.sources import DEFAULT_VERIFIER, load_causal_lm
from specdiff.prompts import DOMAINS, chat_prompt_ids, load_prompts
out = sys.argv[1]
model, tok = load_causal_lm(DEFAULT_VERIFIER, getattr(torch, os.environ.get("DT", "float32")))
for d in ("code", "math", "chat"):
    prompts = [chat_prompt_ids(tok, t) for t in load_prompts(d, "eval", 12)]
    comps, _, _ = sample_completions(HFModel(model), prompts, 96, SamplingParams(0.0), 0, None)
    with open(f"{out}/heldout-{d}.jsonl", "w") as f:
        for p, c in zip(prompts, comps.tolist()):
            f.write(json.dumps({"domain": d, "prompt_ids": p, "completion_ids": c}) + "\n")
    print(d, len(prompts), flush=True)
