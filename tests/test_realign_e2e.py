"""Re-alignment end to end on a real local Ray head (job submission) and a real sqlite MLflow: a new verifier version
gets exactly one distillation job even with two watchers racing, the new drafter is registered with its lineage,
promotion follows τ; a failing job is retried a bounded number of times and then reported, never resubmitted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
import yaml

from registry_helpers import ENV, FAST, REPO, TINY, RayHead, make_assets, save_for, spec_for

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def head():
    head = RayHead()
    try:
        head.wait_ready()
        yield head
    finally:
        head.stop()


@pytest.fixture(scope="module")
def world(tmp_path_factory, specdiff_home):
    """Verifier v1 with a promoted drafter, then verifier v2 (another build): v2 has no aligned drafter."""
    from specdiff.lifecycle.evaluate import Registry

    root = tmp_path_factory.mktemp("realign")
    v1_assets, v2_assets = make_assets(root / "v1", train_prompts=64), make_assets(root / "v2", sharpness=0.8,
                                                                                   train_prompts=64)
    reg = Registry(f"sqlite:///{root / 'mlflow.db'}")
    v1 = reg.register_verifier("tiny", v1_assets / "verifier")
    d1 = reg.register_drafter("tiny", save_for(reg.local_dir(v1), root / "d1", good=False), v1, spec_for(v1_assets))
    assert reg.promote("tiny", d1, spec_for(v1_assets))[0]
    v2 = reg.register_verifier("tiny", v2_assets / "verifier")
    return {"root": root, "reg": reg, "v2": v2, "assets": v2_assets, "d1": d1, "home": specdiff_home}


def realign(world, head, *extra, sets=()):
    cmd = [sys.executable, str(REPO / "jobs" / "realign.py"), "--family", "tiny", "--config", str(TINY),
           "--address", head.address, "--tracking-uri", world["reg"].uri, "--work-dir", str(world["root"] / "work"),
           "--heldout", str(world["assets"] / "heldout.jsonl"), "--poll", "1", "--python", sys.executable,
           "--set", f"data.prompts={world['assets'] / 'prompts.jsonl'}",
           "--set", f"data.heldout={world['assets'] / 'heldout.jsonl'}", *extra]
    for s in [*FAST, *sets]:
        cmd += ["--set", s]
    env = {**os.environ, **ENV, "SPECDIFF_HOME": str(world["home"]),
           "PYTHONPATH": str(REPO / "platform")}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env)


def realigner(world):
    from specdiff.lifecycle.realign import RealignSettings, Realigner

    settings = RealignSettings("tiny", str(TINY), heldout=str(world["assets"] / "heldout.jsonl"),
                               overrides=(f"data.heldout={world['assets'] / 'heldout.jsonl'}",))
    return Realigner(world["reg"], jobs=None, settings=settings)


def test_two_racing_watchers_submit_one_job_and_the_new_drafter_carries_its_lineage(world, head):
    from specdiff.registry import PRODUCTION, claim_name, config_digests

    with ThreadPoolExecutor(2) as pool:  # two processes started together: both see v2 unaligned and unclaimed
        runs = list(pool.map(lambda _: realign(world, head), range(2)))
    logs = [r.stdout + r.stderr for r in runs]
    assert all(r.returncode == 0 for r in runs), "\n=====\n".join(log[-3000:] for log in logs)
    winners = [log for log in logs if "[realign] claimed specdiff-verifier-tiny/2" in log]
    assert len(winners) == 1, logs
    loser = next(log for log in logs if log is not winners[0])
    # It lost the claim, or (started late on a loaded machine) found v2 claimed, or even already aligned.
    assert any(s in loser for s in ("claimed-elsewhere", "is claimed by", "already has an aligned drafter"))
    jobs = [j.submission_id for j in head.jobs() if j.submission_id.startswith("realign-tiny-v2")]
    assert jobs == ["realign-tiny-v2-a1"]

    reg, v2 = world["reg"], world["v2"]
    (drafter,) = reg.aligned("tiny", "2")
    t = drafter.tags
    assert t["specdiff.models.verifier.model"] == "specdiff-verifier-tiny" and t["specdiff.models.verifier.version"] == "2"
    assert t["specdiff.models.verifier.digest"] == v2.tags["specdiff.digest"] != world["d1"].tags["specdiff.models.verifier.digest"]
    job_config = yaml.safe_load((world["root"] / "work" / "tiny" / jobs[0] / "distill.yaml").read_text())
    assert (t["specdiff.training.config_digest"], t["specdiff.teacher.data_digest"]) == config_digests(job_config)
    assert job_config["drafter"]["init"] == "pretrained" and job_config["train"]["steps"] == 5
    assert t["specdiff.warm_start"] == "models:/specdiff-drafter-tiny/1" and t["specdiff.lifecycle.realign.job"] == jobs[0]
    assert len(json.loads(t["specdiff.eval.alpha"])) == 8

    new_tau, old_tau = float(t["specdiff.eval.tau"]), float(world["d1"].tags["specdiff.eval.tau"])
    production = reg.production("tiny")
    if new_tau >= old_tau:
        assert str(production.version) == str(drafter.version) and t["specdiff.promotion"].startswith("promoted")
        assert str(reg.client.get_model_version_by_alias("specdiff-verifier-tiny", PRODUCTION).version) == "2"
    else:
        assert str(production.version) == "1" and t["specdiff.promotion"].startswith("not promoted")
    assert reg.claim_state("tiny", "2")["specdiff.lifecycle.realign.status"] in ("promoted", "not-promoted")

    claim = reg.client.get_experiment_by_name(claim_name("tiny", "2"))  # the job's run and the evaluation run
    runs = reg.client.search_runs([claim.experiment_id])
    assert {r.info.run_name for r in runs} == {jobs[0], "drafter-tiny-for-v2"}
    distill_run = next(r for r in runs if r.info.run_name == jobs[0])
    assert [m.step for m in reg.client.get_metric_history(distill_run.info.run_id, "eval/expected_streak")] == [0, 5]

    assert realigner(world).pending() is None  # aligned now: nothing to submit


def test_failing_job_is_retried_twice_then_reported_and_never_resubmitted(world, head, tmp_path):
    reg = world["reg"]
    v3 = reg.register_verifier("tiny", make_assets(tmp_path / "v3", sharpness=0.9) / "verifier")
    failing = ("--python", "/bin/false")  # the entrypoint fails on the cluster, after the claim and submission
    first = realign(world, head, *failing, "--max-attempts", "2")
    assert first.returncode == 1, first.stdout[-3000:] + first.stderr[-3000:]
    v3_jobs = sorted(j.submission_id for j in head.jobs() if j.submission_id.startswith("realign-tiny-v3"))
    assert v3_jobs == ["realign-tiny-v3-a1", "realign-tiny-v3-a2"]
    tags = reg.client.get_model_version("specdiff-verifier-tiny", str(v3.version)).tags
    assert tags["specdiff.lifecycle.realign.status"] == "failed" and "2 attempts failed" in tags["specdiff.lifecycle.realign.error"]
    assert "result: failed" in first.stdout

    from specdiff.lifecycle.realign import Realigner

    logs = []  # a later watcher sees the failed claim and submits nothing
    assert Realigner(world["reg"], None, realigner(world).s, log=logs.append).run_once().status == "nothing-to-do"
    assert "(status failed)" in logs[0]
    assert len([j for j in head.jobs() if j.submission_id.startswith("realign-tiny-v3")]) == 2
    assert not reg.aligned("tiny", str(v3.version))


def test_readme_ray_job_submit_runs_the_distillation_job(head, tmp_path):
    """README's `ray job submit --working-dir . -- python jobs/distill.py ...` against a private head: the job
    uploads the checkout, trains on the cluster and writes its drafter where the command said."""
    assets = make_assets(tmp_path / "assets", train_prompts=64)
    out = tmp_path / "drafter"
    ray = os.path.join(os.path.dirname(sys.executable), "ray")
    cmd = [ray, "job", "submit", "--address", head.address, "--working-dir", ".", "--",
           "python", "jobs/distill.py", "--config", "jobs/configs/tiny.yaml",
           "--set", f"verifier.path={assets / 'verifier'}", "--set", f"data.prompts={assets / 'prompts.jsonl'}",
           "--set", f"data.heldout={assets / 'heldout.jsonl'}", "--set", f"run.storage_path={tmp_path / 'results'}",
           "--set", f"run.output_dir={out}"]
    for s in FAST:
        cmd += ["--set", s]
    env = {**os.environ, **ENV, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"}
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "succeeded" in done.stdout + done.stderr
    summary = json.loads(next(line for line in reversed(done.stdout.splitlines()) if "[distill] {" in line)
                         .split("[distill] ", 1)[1])
    assert summary["finished"] and summary["output_dir"] == str(out)
    assert (out / "specdiff_drafter.json").exists()  # a drafter folder load_drafter reads
