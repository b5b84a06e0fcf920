"""A core-only install (``pip install specdiff``: no Ray, MLflow, transformers, FastAPI, vLLM, peft or pyarrow)
imports the decoder and decodes: a fresh interpreter in which those imports fail, as they would where they are not
installed, loads a Llama folder through the lean forward, builds a feature drafter and decodes speculatively, alone
and batched, equal to plain greedy decoding."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from test_llama import save_tiny

PLATFORM = Path(__file__).resolve().parents[1] / "platform"
BLOCKED = ["ray", "mlflow", "transformers", "fastapi", "vllm", "peft", "pyarrow", "starlette"]

CODE = """
import sys, importlib.abc

class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked: a core-only install)")
        return None

sys.meta_path.insert(0, Missing())
import threading
from specdiff import HFVerifier, SpecConfig, SpeculativeDecoder, generate_plain
from specdiff.models.batched import BatchedVerifier
from specdiff.models.feature_drafter import build_feature_drafter
from specdiff.models.llama import load_llama

model = load_llama({folder!r})
drafter = build_feature_drafter(model, num_layers=1, seed=0)
verifier = HFVerifier(model, tune_kernels=False, tap_layers=drafter.tap_layers)
prompts = [[5, 9, 2, 7], [40, 41, 42, 43, 44]]
plain = [generate_plain(verifier, p, max_new_tokens=12).tokens for p in prompts]
spec = SpecConfig(gamma=4, num_candidates=2)
alone = [SpeculativeDecoder(drafter, verifier).generate(p, max_new_tokens=12, spec=spec).tokens for p in prompts]
batched, out = BatchedVerifier(verifier), [None, None]
threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, SpeculativeDecoder(drafter, batched).generate(
    prompts[i], max_new_tokens=12, spec=spec).tokens)) for i in range(2)]
[t.start() for t in threads]
[t.join() for t in threads]
assert alone == plain == out, (alone, plain, out)
print(sorted({{m.split(".")[0] for m in sys.modules}} & set({blocked!r})))
"""


def test_the_core_decodes_without_any_framework(tmp_path):
    folder = save_tiny(tmp_path)  # written with transformers here; read without it there
    code = CODE.format(blocked=BLOCKED, folder=str(folder))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(PLATFORM), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
