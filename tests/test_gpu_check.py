"""Where there is no CUDA (this machine): jobs/gpu_check.py refuses in one line with exit 2, and tests/test_gpu.py's
tests are collected under the ``gpu`` marker and skipped, not silently absent."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k != "SPECDIFF_GPU_TESTS_ON"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "platform"), env.get("PYTHONPATH")]))
    return env


def test_gpu_check_fails_clearly_without_cuda(tmp_path):
    out = subprocess.run([sys.executable, str(REPO / "jobs" / "gpu_check.py"), "--out", str(tmp_path / "r")],
                         capture_output=True, text=True, timeout=120, env=_env(), cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "no CUDA device" in lines[0] and "torch.cuda.is_available() is False" in lines[0]
    assert not (tmp_path / "r").exists()  # nothing half-written


def test_gpu_tests_are_collected_and_skipped_here():
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-m", "gpu", "tests/test_gpu.py", "-p",
                          "no:cacheprovider", "-o", "addopts=-rs"], capture_output=True, text=True, timeout=300,
                         env=_env(), cwd=REPO)
    assert out.returncode == 0, out.stdout[-2000:]
    summary = out.stdout.strip().splitlines()[-1]
    assert "skipped" in summary and "passed" not in summary and "failed" not in summary, summary
    assert int(summary.split()[0]) >= 11, summary  # every test and parameter, none dropped at collection
    assert "needs a CUDA GPU" in out.stdout
