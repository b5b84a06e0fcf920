"""Greedy 96-token held-out trajectories of the whole eval splits, one jsonl per domain (float32):
    python make_heldout.py OUT_DIR"""
import json, sys, torch
from specdiff import SamplingParams
from specdiff.distill.teacher import sample_completions
from specdiff.models.hf import HFModel
from specdiff.models.sources import DEFAULT_VERIFIER, load_causal_lm
from specdiff.prompts import DOMAINS, chat_prompt_ids, load_prompts
out = sys.argv[1]
model, tok = load_causal_lm(DEFAULT_VERIFIER, torch.float32)
for d in DOMAINS:
    prompts = [chat_prompt_ids(tok, t)[-160:] for t in load_prompts(d, "eval")]
    comps, _, _ = sample_completions(HFModel(model), prompts, 96, SamplingParams(0.0), 0, None)
    with open(f"{out}/heldout-{d}.jsonl", "w") as f:
        for p, c in zip(prompts, comps.tolist()):
            f.write(json.dumps({"domain": d, "prompt_ids": p, "completion_ids": c}) + "\n")
    print(d, len(prompts), flush=True)
