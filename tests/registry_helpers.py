"""Shared pieces of the registry tests: tiny verifier builds, registered drafters, a private Ray head."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1"}
TINY = REPO / "jobs" / "configs" / "tiny.yaml"
FAST = ["train.steps=5", "train.checkpoint_every=5", "train.log_every=5", "eval.every=5", "eval.offsets=[0]",
        "teacher.batch_size=8", "train.num_workers=1"]  # a CI-sized distillation job: the pipeline, not the learning


def make_assets(out: Path, *, sharpness: float = 0.6, train_prompts: int = 200) -> Path:
    """A tiny verifier build (make_tiny); another ``sharpness`` is another build of the same language/vocab."""
    sys.path.insert(0, str(REPO / "jobs"))
    from make_tiny import make_tiny

    return make_tiny(out, train_prompts=train_prompts, heldout_prompts=16, sharpness=sharpness)


def save_for(verifier_dir: Path, out: Path, *, good: bool, seed: int = 0) -> Path:
    """A drafter folder recording ``verifier_dir`` as its verifier. ``good``: built from the verifier (its first
    window position copies the verifier's next-token head: τ ≈ 1.5 on the tiny language); else random (τ ≈ 1)."""
    from specdiff import build_small_drafter, drafter_from_verifier, save_drafter
    from specdiff.distill.trajectories import load_verifier_model
    from specdiff.lineage.verifier import verifier_record

    if good:
        drafter = drafter_from_verifier(load_verifier_model(verifier_dir), num_layers=1, seed=seed)
    else:
        drafter = build_small_drafter(32, hidden_size=32, num_layers=1, num_heads=4, seed=seed)
    return save_drafter(drafter, out, verifier=verifier_record(verifier_dir).to_dict())


def spec_for(assets: Path):
    from specdiff.lineage.evaluation import HeldoutSpec

    return HeldoutSpec(str(assets / "heldout.jsonl"), gamma=8, offsets=(0,))


class RayHead:
    """`ray start --head --block` on dedicated ports and temp dir, in its own process group; `stop()` ends exactly
    that head (never `ray stop`, which would end every Ray instance of the user on this machine). ``slot`` shifts
    every port (two heads side by side); ``env`` replaces the default environment (``ENV``: no token auth);
    ``token`` is sent by this helper's own clients (a head with token auth on)."""

    def __init__(self, dashboard_port: int = 8297, gcs_port: int = 6397, num_cpus: int = 4, *, slot: int = 0,
                 env: dict | None = None, token: str | None = None):
        dashboard_port, gcs_port = dashboard_port + slot, gcs_port + slot
        self.address = f"http://127.0.0.1:{dashboard_port}"
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.temp_dir = tempfile.mkdtemp(prefix="rh", dir="/tmp")  # short: Ray's socket paths have a length limit
        ray = str(Path(sys.executable).with_name("ray"))
        workers = 20300 + 100 * slot
        cmd = [ray, "start", "--head", "--block", f"--port={gcs_port}", f"--dashboard-port={dashboard_port}",
               "--dashboard-host=127.0.0.1", "--include-dashboard=true", f"--num-cpus={num_cpus}",
               f"--temp-dir={self.temp_dir}", f"--ray-client-server-port={10097 + slot}",
               f"--dashboard-agent-listen-port={52397 + slot}", f"--min-worker-port={workers}",
               f"--max-worker-port={workers + 99}", "--disable-usage-stats"]
        env = env if env is not None else {**os.environ, **ENV}
        env = {**env, "PATH": f"{Path(sys.executable).parent}:{env.get('PATH', os.environ['PATH'])}"}
        self.log = open(Path(self.temp_dir) / "head.log", "w")
        self.proc = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout_s: float = 180) -> None:
        from ray.job_submission import JobSubmissionClient

        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ray head exited: {Path(self.log.name).read_text()[-3000:]}")
            try:
                JobSubmissionClient(self.address, headers=self.headers).list_jobs()
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"ray head at {self.address} not ready after {timeout_s}s")
                time.sleep(2)

    def jobs(self) -> list:
        from ray.job_submission import JobSubmissionClient

        return JobSubmissionClient(self.address, headers=self.headers).list_jobs()

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)  # the blocking `ray start` shuts down the processes it started
        try:
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the group this fixture created, nothing else
            self.proc.wait(10)
        self.log.close()
        shutil.rmtree(self.temp_dir, ignore_errors=True)
