"""jobs/loadtest.py as a user runs it: a private Ray + Serve with the demo app, streamed requests, a table with
latency and time to first token (no RAY_AUTH_MODE set: the private Ray keeps token auth)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]


def test_loadtest_smoke(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_AUTH_MODE"}
    out = tmp_path / "rows.json"
    done = subprocess.run([sys.executable, str(REPO / "jobs" / "loadtest.py"), "--concurrency", "2", "--requests",
                           "2", "--max-tokens", "8", "--json", str(out)], capture_output=True, text=True,
                          timeout=900, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "first token" in done.stdout
    rows = json.loads(out.read_text())["rows"]
    assert [r["mode"] for r in rows] == ["verifier-only", "speculative"]
    for r in rows:
        assert r["tok_s"] > 0 and 0 < r["ttft_p50_s"] <= r["p50_s"]
