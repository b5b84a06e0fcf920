"""The drafter's top-TOPK tokens and probabilities (default 3) at every completion position of the held-out
trajectories, for tree_walk.py and ../levers-1206's walks (gamma 8; dtype DT, default float32):
    [DT=bfloat16] [TOPK=32] HELDOUT=DIR python tree_sim.py DRAFTER_DIR OUT.pt"""
import json, os, sys, torch
from specdiff.distill.teacher import causal_inputs
from specdiff.models.feature_drafter import AnchorBatch, greedy_labels, anchor_logits, load_feature_drafter
from specdiff.models.hf import HFModel
from specdiff.models.sources import DEFAULT_VERIFIER, load_causal_lm
G = 8
path = sys.argv[1]
model, tok = load_causal_lm(DEFAULT_VERIFIER, getattr(torch, os.environ.get("DT", "float32")))
v = HFModel(model)
dr = load_feature_drafter(path, model, dtype=getattr(torch, os.environ.get("DT", "float32")))
out = {}
for d in ("code", "math", "chat"):
    recs = [json.loads(l) for l in open(os.path.join(os.environ["HELDOUT"], f"heldout-{d}.jsonl"))]
    res = []
    for r in recs:
        seq = list(r["prompt_ids"]) + list(r["completion_ids"])
        n_prompt = len(r["prompt_ids"])
        ids, valid, positions = causal_inputs([seq])
        with torch.no_grad():
            logits, feats = v.logits(ids, attention_mask=valid.long(), position_ids=positions, taps=dr.tap_layers)
        L = len(seq)
        tokens = torch.tensor(seq)[None]
        greedy = torch.zeros(1, L, dtype=torch.long); greedy[0, :L-1] = logits[0, :L-1].argmax(-1)
        features = torch.zeros(1, L, feats.shape[-1]); features[0, :L-1] = feats[0, :L-1].float()
        offs = list(range(0, len(r["completion_ids"]) - G))
        anchors = torch.tensor([[n_prompt - 1 + o for o in offs]])
        labels = greedy_labels(tokens, greedy, anchors, G)
        batch = AnchorBatch(anchors=anchors, labels=labels, valid=torch.ones_like(anchors, dtype=torch.bool))
        with torch.no_grad():
            lo = anchor_logits(dr, dr.model, tokens, features, batch, G)[0].float()  # [A, G, Vd]
        p = lo.softmax(-1)
        top_p, top_i = p.topk(int(os.environ.get("TOPK", 3)), -1)  # 32: enough to score a copied candidate
        top_i = dr.model.draft_ids[top_i]
        res.append(dict(ctx=seq, n_prompt=n_prompt, labels=labels[0].tolist(), top_p=top_p, top_i=top_i))
    out[d] = res
torch.save(out, sys.argv[2])
print("saved")
