"""Ray's token auth and README's registry flow, with no RAY_AUTH_MODE anywhere (every other Ray test sets
RAY_AUTH_MODE=disabled, so none of them can see this). Each process gets a throwaway HOME: Ray keeps its token in
~/.ray/auth_token.

Seen before the fix (issue 36): the main job's local Ray wrote ~/.ray/auth_token, the next `ray start --head`
turned token auth on because of it, and `jobs/realign.py --address ...` failed with "Missing authentication token"."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from registry_helpers import FAST, REPO, TINY, RayHead, make_assets, save_for, spec_for

from specdiff.runtime import ray_auth
AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH")
CLUSTER_VARS = ("RAY_ADDRESS", "RAY_API_SERVER_ADDRESS")  # a user who has not pointed this shell at a cluster


def user_env(home: Path) -> dict:
    """A user's shell: this environment without any Ray auth variable, HOME a throwaway folder."""
    env = {k: v for k, v in os.environ.items() if k not in AUTH_VARS + CLUSTER_VARS}
    return {**env, "HOME": str(home), "RAY_USAGE_STATS_ENABLED": "0", "HF_HUB_OFFLINE": "1",
            "PYTHONPATH": str(REPO / "platform"), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}


@pytest.fixture
def clean(monkeypatch, tmp_path):
    for var in AUTH_VARS:
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    return tmp_path


def test_token_is_found_where_ray_reads_it_in_rays_order(clean, monkeypatch):
    assert ray_auth.find_token() is None and ray_auth.auth_headers() == {}
    (clean / ".ray").mkdir()
    (clean / ".ray" / "auth_token").write_text("from-home\n")
    assert ray_auth.find_token() == ("from-home", str(clean / ".ray" / "auth_token"))
    (clean / "tok").write_text("from-path")
    monkeypatch.setenv("RAY_AUTH_TOKEN_PATH", str(clean / "tok"))
    assert ray_auth.find_token()[0] == "from-path"
    monkeypatch.setenv("RAY_AUTH_TOKEN", "from-env")
    assert ray_auth.auth_headers() == {"Authorization": "Bearer from-env"}
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # the user turned auth off: send nothing
    assert ray_auth.auth_headers() == {}


def test_private_token_only_where_ray_has_nothing_to_go_by(clean, monkeypatch):
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    assert not ray_auth.use_private_token() and "RAY_AUTH_TOKEN" not in os.environ
    monkeypatch.delenv("RAY_AUTH_MODE")
    assert ray_auth.use_private_token() and len(os.environ["RAY_AUTH_TOKEN"]) == 64
    assert not ray_auth.use_private_token()  # a token exists now: left as it is
    assert not (clean / ".ray").exists()


LOCAL_JOB_RAY = """
import json, ray
from ray._raylet import AuthenticationMode, get_authentication_mode
from specdiff.distill import load_config
from specdiff.distill.job import init_ray

init_ray(load_config({config!r}, ["ray.num_cpus=1"], check_paths=False))
square = ray.remote(lambda x: x * x)
print(json.dumps({{"token_auth": get_authentication_mode() == AuthenticationMode.TOKEN,
                  "task": ray.get(square.remote(7))}}))
ray.shutdown()
"""


@pytest.mark.slow
def test_the_local_ray_of_a_distillation_run_leaves_no_token_for_a_later_ray_start(tmp_path):
    """A fresh machine: the distillation job's own local Ray (the first-run build's) runs with token auth on, yet
    writes no ~/.ray/auth_token; so README's next `ray start --head` starts without token auth, as it would have
    without the platform, and Ray's own clients (`ray job submit`) reach it."""
    home = tmp_path / "home"
    home.mkdir()
    env = user_env(home)
    done = subprocess.run([sys.executable, "-c", LOCAL_JOB_RAY.format(config=str(TINY))], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"token_auth": True, "task": 49}
    assert not (home / ".ray" / "auth_token").exists()

    head = RayHead(slot=2, env=env, num_cpus=1)
    try:
        head.wait_ready()
        log = Path(head.log.name).read_text()
        assert "Token authentication is disabled" in log and "Token authentication is enabled" not in log, log
        ray = str(Path(sys.executable).with_name("ray"))
        listed = subprocess.run([ray, "job", "list", "--address", head.address], env=env, capture_output=True,
                                text=True, timeout=120)
        assert listed.returncode == 0, listed.stderr[-2000:]
    finally:
        head.stop()


@pytest.fixture(scope="module")
def token_home(tmp_path_factory):
    """A HOME where an earlier Ray left ~/.ray/auth_token (`ray get-auth-token --generate` writes it, as a plain
    `ray.init()` does)."""
    home = tmp_path_factory.mktemp("home")
    ray = str(Path(sys.executable).with_name("ray"))
    made = subprocess.run([ray, "get-auth-token", "--generate"], env=user_env(home), capture_output=True, text=True,
                          timeout=120)
    assert made.returncode == 0, made.stderr[-2000:]
    token = (home / ".ray" / "auth_token").read_text().strip()
    assert token and token in made.stdout
    return home, token


@pytest.fixture(scope="module")
def auth_head(token_home):
    home, token = token_home
    head = RayHead(slot=1, env=user_env(home), token=token)  # `ray start --head`, no RAY_AUTH_MODE: auth turns on
    try:
        head.wait_ready()
        assert "Token authentication is enabled" in Path(head.log.name).read_text()
        yield head
    finally:
        head.stop()


RAY_JOBS = """
import sys
from specdiff.lifecycle.realign import RayJobs
try:
    print("jobs:", RayJobs({address!r}).client.list_jobs())
except ConnectionError as err:
    print("error:", err)
    sys.exit(2)
"""


@pytest.mark.slow
def test_a_cluster_with_token_auth_on_takes_the_platforms_client_and_says_why_it_refuses(token_home, auth_head,
                                                                                          tmp_path):
    home, _ = token_home
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    with pytest.raises(AuthenticationError):  # what re-alignment met: Ray's client sends no token by itself
        JobSubmissionClient(auth_head.address).list_jobs()
    ok = subprocess.run([sys.executable, "-c", RAY_JOBS.format(address=auth_head.address)], env=user_env(home),
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "jobs:" in ok.stdout, ok.stdout[-2000:] + ok.stderr[-2000:]
    stranger = tmp_path / "stranger"  # a machine without the cluster's token: one line saying what to do
    stranger.mkdir()
    refused = subprocess.run([sys.executable, "-c", RAY_JOBS.format(address=auth_head.address)],
                             env=user_env(stranger), capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-2000:]
    line = refused.stdout.strip().splitlines()[-1]
    assert "token authentication on" in line and "ray get-auth-token" in line and "RAY_AUTH_TOKEN" in line


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_readme_realign_runs_against_a_cluster_with_token_auth_on(token_home, auth_head, tmp_path, specdiff_home):
    """README's "Registry and re-alignment" flow where `ray start --head` turned token auth on: jobs/realign.py,
    run with no RAY_AUTH_MODE, claims the new verifier version, its Ray job (a driver on the auth-enabled cluster)
    trains, and the drafter is registered and judged for promotion."""
    from specdiff.lifecycle.evaluate import Registry

    home, _ = token_home
    v1_assets = make_assets(tmp_path / "v1", train_prompts=64)
    v2_assets = make_assets(tmp_path / "v2", sharpness=0.8, train_prompts=64)
    reg = Registry(f"sqlite:///{tmp_path / 'mlflow.db'}")
    v1 = reg.register_verifier("tiny", v1_assets / "verifier")
    d1 = reg.register_drafter("tiny", save_for(reg.local_dir(v1), tmp_path / "d1", good=False), v1,
                              spec_for(v1_assets))
    assert reg.promote("tiny", d1, spec_for(v1_assets))[0]
    reg.register_verifier("tiny", v2_assets / "verifier")

    cmd = [sys.executable, str(REPO / "jobs" / "realign.py"), "--family", "tiny", "--config", str(TINY),
           "--address", auth_head.address, "--tracking-uri", reg.uri, "--work-dir", str(tmp_path / "work"),
           "--poll", "1", "--python", sys.executable,
           "--set", f"data.prompts={v2_assets / 'prompts.jsonl'}", "--set", f"data.heldout={v2_assets / 'heldout.jsonl'}"]
    for s in FAST:
        cmd += ["--set", s]
    began = time.monotonic()
    done = subprocess.run(cmd, env={**user_env(home), "SPECDIFF_HOME": str(specdiff_home)}, capture_output=True,
                          text=True, timeout=840)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-4000:]
    assert "[realign] claimed specdiff-verifier-tiny/2" in log and "realign-tiny-v2-a1: SUCCEEDED" in log, log[-4000:]
    assert "result: promoted" in log or "result: not-promoted" in log, log[-3000:]
    (drafter,) = reg.aligned("tiny", "2")
    assert drafter.tags["specdiff.lifecycle.realign.job"] == "realign-tiny-v2-a1"
    assert [j.submission_id for j in auth_head.jobs()] == ["realign-tiny-v2-a1"]
    print(f"realign against the token-auth head: {time.monotonic() - began:.0f} s")
