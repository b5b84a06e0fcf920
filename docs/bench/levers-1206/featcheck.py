"""Decode 3 code prompts (bf16, lean backend, K=1, gamma 8) and at every round compare the features the engine hands
the drafter with a full transformers forward's taps over the same tokens, and the argmax windows under both:
    python featcheck.py DRAFTER_DIR ..."""
import sys, torch, json
from specdiff import HFVerifier, SpecConfig, SpeculativeDecoder, load_drafter
from specdiff.models.sources import DEFAULT_VERIFIER, load_causal_lm
from specdiff.prompts import load_prompts, chat_prompt_ids
from specdiff.models.hf import HFModel
dt = torch.bfloat16
model, tok = load_causal_lm(DEFAULT_VERIFIER, dt, backend="auto")
ref_model, _ = load_causal_lm(DEFAULT_VERIFIER, dt, backend="transformers")
v = HFModel(ref_model)
class Wrap:
    needs_features = True
    def __init__(self, d):
        self.d = d; self.tap_layers = d.tap_layers; self.rows = []
    def __getattr__(self, k): return getattr(self.d, k)
    def propose(self, prefix, gamma, features=None):
        q = self.d.propose(prefix, gamma, features)
        ids = torch.tensor([list(prefix)])
        with torch.no_grad():
            _, f = v.logits(ids, taps=self.tap_layers)
        ref = f[0, :-1]
        rel = float((features.float() - ref.float()).norm() / ref.float().norm())
        fresh = self.d._marginals(list(prefix), gamma, ref.to(features.dtype))
        self.rows.append((rel, int((q.argmax(-1) == fresh.argmax(-1)).sum())))
        return q
for path in sys.argv[1:]:
    d = load_drafter(path, dtype=dt, verifier=model)
    w = Wrap(d)
    dec = SpeculativeDecoder(w, HFVerifier(model, tap_layers=d.tap_layers))
    for text in load_prompts("code", "eval", 3):
        w.d.reset()
        r = dec.generate(chat_prompt_ids(tok, text), max_new_tokens=96, spec=SpecConfig(gamma=8, num_candidates=1, draft_temperature=1.0), seed=0)
    rel = [a for a, _ in w.rows]; agree = [b for _, b in w.rows]
    print(path, "rounds", len(rel), "feature rel err mean %.4f max %.4f" % (sum(rel)/len(rel), max(rel)), "argmax agree %.2f/8" % (sum(agree)/len(agree)))
