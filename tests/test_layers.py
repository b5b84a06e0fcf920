"""The import ladder (docs/architecture.md): each rung, imported alone in a fresh interpreter, loads nothing from the
rungs above it or from frameworks it must not need. A module that starts importing Ray, MLflow or the training
package where it should not fails here, not in a user's replica."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

PLATFORM = Path(__file__).resolve().parents[1] / "platform"
FRAMEWORKS = ["ray", "mlflow", "fastapi", "vllm", "transformers"]
ABOVE_CORE = ["specdiff.distill", "specdiff.serving", "specdiff.registry", "specdiff.lifecycle.realign"]

LADDER = {
    # core: pure torch (transformers only when a model is loaded, lazily)
    "specdiff": FRAMEWORKS + ABOVE_CORE,
    "specdiff.core.engine": FRAMEWORKS + ABOVE_CORE,
    "specdiff.core.policy": FRAMEWORKS + ABOVE_CORE,
    "specdiff.models.feature_drafter": FRAMEWORKS + ABOVE_CORE,
    "specdiff.vllm.export": FRAMEWORKS + ABOVE_CORE,
    "specdiff.vllm.plugin": FRAMEWORKS + ABOVE_CORE,  # vLLM's entry point: imports vLLM only when vLLM calls it
    "specdiff.models.llama": FRAMEWORKS + ABOVE_CORE,  # the lean verifier forward and tokenizer: never transformers
    "specdiff.models.tokenizer": FRAMEWORKS + ABOVE_CORE,
    "specdiff.core.text": FRAMEWORKS + ABOVE_CORE,
    # the adapters' install checks and Ray token look-up: standard library only, importable from every rung
    "specdiff.runtime.extras": FRAMEWORKS + ABOVE_CORE,
    "specdiff.runtime.ray_auth": FRAMEWORKS + ABOVE_CORE,
    # prompt sources: plain Python over files every machine has (the self-written ones live in specdiff.distill)
    "specdiff.prompts": FRAMEWORKS + ABOVE_CORE,
    "specdiff.prompts.corpus": FRAMEWORKS + ABOVE_CORE,
    "specdiff.prompts.word_problems": FRAMEWORKS + ABOVE_CORE,
    # adapters: each on its framework, none on another adapter or the lifecycle
    "specdiff.registry": ["ray", "vllm", "specdiff.distill", "specdiff.serving", "specdiff.lifecycle.realign"],
    "specdiff.distill.teacher": ["ray", "mlflow", "fastapi", "vllm", "specdiff.serving", "specdiff.registry",
                                 "specdiff.lifecycle.realign"],
    "specdiff.distill.evaluate": ["ray", "mlflow", "fastapi", "vllm", "specdiff.serving", "specdiff.registry",
                                  "specdiff.lifecycle.realign"],
    "specdiff.serving.servers": ["ray", "mlflow", "vllm", "specdiff.distill", "specdiff.registry",
                                 "specdiff.lifecycle.realign"],
    "specdiff.serving.app": ["mlflow", "vllm", "ray.train", "ray.data", "specdiff.distill", "specdiff.registry",
                             "specdiff.lifecycle.realign"],
    "specdiff.serving.vllm_app": ["ray", "mlflow", "vllm", "specdiff.distill", "specdiff.registry",
                                  "specdiff.lifecycle.realign"],
    # lifecycle: may use the training adapter and the registry, never the serving one
    "specdiff.lifecycle.realign": ["ray.serve", "vllm", "specdiff.serving"],
}


@pytest.fixture(scope="module")
def imports() -> dict[str, subprocess.CompletedProcess]:
    """Every rung imported in its own fresh interpreter, all at once (each start-up is mostly waiting on imports)."""
    procs = {}
    for module, forbidden in LADDER.items():
        code = f"import sys, json; import {module}; print(json.dumps([m for m in {forbidden!r} if m in sys.modules]))"
        procs[module] = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         text=True, env={"PYTHONPATH": str(PLATFORM), "PATH": "/usr/bin:/bin"})
    out = {}
    for module, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        out[module] = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    return out


@pytest.mark.parametrize("module", sorted(LADDER))
def test_rung_loads_nothing_above_it(imports, module):
    done = imports[module]
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert loaded == [], f"importing {module} loaded {loaded}"
