"""End-to-end distillation on Ray (tiny verifier and drafter, 2 CPU workers of 0.5 CPU each): the CLI job
improves the held-out expected streak and logs to a local sqlite MLflow; a stopped run resumes from its step; a
killed worker is survived by restarting from the latest checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "jobs" / "configs" / "tiny.yaml"
ENV = {"RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}  # one auth mode for every process

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    sys.path.insert(0, str(REPO / "jobs"))
    from make_tiny import make_tiny

    out = make_tiny(tmp_path_factory.mktemp("tiny"))
    lines = (out / "prompts.jsonl").read_text().splitlines()
    (out / "prompts_small.jsonl").write_text("\n".join(lines[:200]) + "\n")
    return out


def overrides(assets: Path, work: Path, prompts: str = "prompts.jsonl") -> list[str]:
    return [f"verifier.path={assets / 'verifier'}", f"data.prompts={assets / prompts}",
            f"data.heldout={assets / 'heldout.jsonl'}", f"run.storage_path={work / 'ray_results'}",
            f"run.output_dir={work / 'drafter'}"]


def test_cli_job_improves_heldout_streak_and_logs_to_mlflow(assets, tmp_path):
    from mlflow.tracking import MlflowClient

    from specdiff import load_drafter
    from specdiff.lineage.verifier import verifier_record

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    args = overrides(assets, tmp_path) + ["tracking.backend=mlflow", f"tracking.tracking_uri={uri}",
                                          f"tracking.artifact_location={tmp_path / 'mlartifacts'}"]
    cmd = [sys.executable, str(REPO / "jobs" / "distill.py"), "--config", str(TINY),
           "--summary", str(tmp_path / "summary.json")]
    for a in args:
        cmd += ["--set", a]
    env = {**os.environ, **ENV, "PYTHONPATH": str(REPO / "platform")}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=420, env=env, cwd=tmp_path)
    log = out.stdout + out.stderr
    assert out.returncode == 0, log[-4000:]
    summary = json.loads((tmp_path / "summary.json").read_text())  # the hand-over; the printed line is for people
    assert any(line.startswith("[distill] {") for line in out.stdout.splitlines())
    print("held-out expected streak:", summary["initial_expected_streak"], "->", summary["expected_streak"])
    assert summary["finished"] and summary["step"] == 150
    assert summary["expected_streak"] > summary["initial_expected_streak"] + 0.1
    for progress in ("held-out trajectories", "step 10/150 loss", "eval step 150: expected streak"):
        assert progress in log
    # A local Ray has no dashboard, so Ray Train's placement-group cleaner would warn once a second (init_ray's hook).
    assert "Failed to query Ray Train Controller actor state" not in log

    drafter = load_drafter(summary["output_dir"])
    assert drafter.propose([1, 2, 3], 8).shape == (8, 32)
    meta = json.loads((Path(summary["output_dir"]) / "specdiff_drafter.json").read_text())
    expected = verifier_record(assets / "verifier", "tiny-cycle-llama", "1").to_dict()
    assert meta["verifier"] == expected and meta["training"]["steps"] == 150

    client = MlflowClient(tracking_uri=uri)
    (run,) = client.search_runs([client.get_experiment_by_name("specdiff-distill").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["objective.kind"] == "streak"
    history = client.get_metric_history(run.info.run_id, "eval/expected_streak")
    assert [m.step for m in history] == [0, 50, 100, 150]
    assert history[-1].value == pytest.approx(summary["expected_streak"])
    assert "train/loss" in run.data.metrics and "eval/alpha_1" in run.data.metrics
    assert [a.path for a in client.list_artifacts(run.info.run_id, "plots")] == ["plots/alpha_per_position.png"]


@pytest.fixture(scope="module")
def ray_session():
    import ray

    import specdiff

    os.environ.update(ENV)
    ray.init(address="local", num_cpus=2, include_dashboard=False,
             runtime_env={"py_modules": [str(Path(specdiff.__file__).parent)], "excludes": ["__pycache__"]})
    yield
    ray.shutdown()


@pytest.fixture(scope="module")
def trajectories(assets, ray_session, tmp_path_factory):
    """Teacher trajectories written once to parquet (teacher.save_to) and reused by the short runs below."""
    from specdiff.distill import load_config
    from specdiff.distill.job import absolutize, training_trajectories
    from specdiff.lineage.verifier import verifier_record

    work = tmp_path_factory.mktemp("traj")
    cfg = absolutize(load_config(TINY, overrides(assets, work, "prompts_small.jsonl")
                                 + [f"teacher.save_to={work / 'trajectories'}"]))
    ds = training_trajectories(cfg, verifier_record(cfg.verifier.path))
    rows = ds.take(2)
    assert len(rows[0]["completion_ids"]) == 32 and len(rows[0]["topk_ids"][0]) == 8
    assert rows[0]["verifier_digest"].startswith("sha256:") and json.loads(rows[0]["sampling"])["top_p"] == 0.95
    return work / "trajectories"


def test_teacher_time_budget_samples_the_first_batch_and_skips_the_rest(assets, ray_session, tmp_path):
    # teacher.time_budget_s counts from the job's start: a job that started long ago has spent it, so the actor
    # samples its first batch only and the parquet holds that batch (the skipped ones are empty blocks).
    from specdiff.distill import load_config
    from specdiff.distill.job import absolutize, training_trajectories
    from specdiff.lineage.verifier import verifier_record

    cfg = absolutize(load_config(TINY, overrides(assets, tmp_path, "prompts_small.jsonl") + [
        f"teacher.save_to={tmp_path / 'trajectories'}", "teacher.time_budget_s=1"]))
    ds = training_trajectories(cfg, verifier_record(cfg.verifier.path), began=time.time() - 3600)
    total = sum(1 for line in (assets / "prompts_small.jsonl").open() if line.strip())
    assert ds.count() == cfg.teacher.batch_size < total
    assert len(ds.take(1)[0]["completion_ids"]) == cfg.teacher.max_new_tokens


def short_run(assets, work, trajectories, *extra):
    from specdiff.distill import load_config, run

    cfg = load_config(TINY, overrides(assets, work) + [
        f"data.trajectories={trajectories}", "train.steps=20", "train.checkpoint_every=5", "train.log_every=5",
        "eval.every=10", "eval.offsets=[0]", *extra])
    return run(cfg)


def final_state(summary) -> dict:
    return json.loads((Path(summary.checkpoint) / "state.json").read_text())


def test_stopped_run_resumes_from_its_step_and_survives_a_killed_worker(assets, trajectories, tmp_path):
    # One Ray Train run costs about a minute here, so one test covers both: stop at 10, resume, get killed at 17.
    first = short_run(assets, tmp_path, trajectories, "train.stop_after=10")
    assert first.step == 10 and not first.finished and first.output_dir is None
    assert final_state(first)["starts"] == [0]

    second = short_run(assets, tmp_path, trajectories, "fault.kill_at_step=17", "fault.kill_rank=1",
                       "train.max_failures=1")
    assert second.step == 20 and second.finished and Path(second.output_dir).is_dir()
    assert (tmp_path / "ray_results" / "tiny-distill" / "fault_injected").read_text() == "killed rank 1 at step 17\n"
    starts = [json.loads(line)["start"] for line in (tmp_path / "ray_results" / "tiny-distill" /
                                                     "attempts.jsonl").read_text().splitlines()]
    # The resumed run continued from step 10, not from 0; after the kill, the restarted worker group continued from
    # the latest checkpoint the controller had registered (15, or 10 if the step-15 report was still in flight).
    assert starts[:2] == [0, 10] and len(starts) == 3 and starts[2] in (10, 15)
    assert [e[0] for e in final_state(second)["evals"]][:2] == [0, 10]  # no second step-0 evaluation


def test_time_budget_ends_the_run_early_and_finished(assets, trajectories, tmp_path):
    from specdiff.models.drafter import drafter_meta

    # 100000 steps would take hours; a 60 s budget (from the job's start, Ray and data set-up included) trains what
    # fits (at least 6 steps: the plan is first made at step 5), then ends like a full run: final evaluation,
    # checkpoint, drafter, finished.
    began = time.monotonic()
    summary = short_run(assets, tmp_path, trajectories, "train.steps=100000", "train.time_budget_s=60",
                        "eval.every=100000", "train.checkpoint_every=100000", "train.log_every=50")
    wall = time.monotonic() - began
    state = final_state(summary)
    print(f"time budget 60 s: {summary.step} steps, {wall:.0f} s")
    assert summary.finished and 6 <= summary.step < 100000 and Path(summary.output_dir).is_dir()
    assert state["planned_steps"] == summary.step and [e[0] for e in state["evals"]] == [0, summary.step]
    assert wall < 60 + 60  # the budget, plus the driver's start before the clock runs and the final write
    meta = drafter_meta(summary.output_dir)
    assert meta["training"]["steps"] == summary.step and meta["training"]["recipe_steps"] == 100000


def test_feature_drafter_job_learns_from_the_verifiers_states(assets, ray_session, tmp_path):
    # drafter.init=feature: the teacher records the verifier's tapped states, two DDP workers train blocks cut at
    # many anchors per trajectory (decayed-CE warm-up, then Eq. 6), and the output loads as a feature drafter.
    from specdiff import HFVerifier, SpeculativeDecoder, generate_plain, load_drafter
    from specdiff.distill import load_config, run
    from specdiff.distill.trajectories import load_verifier_model

    cfg = load_config(TINY, overrides(assets, tmp_path, "prompts_small.jsonl") + [
        "drafter.init=feature", "drafter.num_layers=1", "drafter.draft_vocab_size=24", "teacher.temperature=0",
        "objective.warmup_ce_steps=20", "train.steps=40", "train.checkpoint_every=20", "eval.every=20",
        f"teacher.save_to={tmp_path / 'trajectories'}", "run.name=tiny-feature"])
    events = []
    summary = run(cfg, on_event=events.append)  # progress as events: the driver's, and the workers' via the relay
    assert summary.finished and summary.step == 40
    from specdiff.distill.events import Evaluated, Note, TeacherSampled, TrainStep

    kinds = {type(e) for e in events}
    assert {Note, TeacherSampled, TrainStep, Evaluated} <= kinds, kinds
    prompts = [p for p in ("prompts_small.jsonl", "heldout.jsonl") for line in (assets / p).open() if line.strip()]
    assert sum(e.count for e in events if isinstance(e, TeacherSampled)) == len(prompts)  # every batch, held-out too
    assert [e.step for e in events if isinstance(e, Evaluated)] == [0, 20, 40]
    assert max(e.step for e in events if isinstance(e, TrainStep)) == 40
    initial, final = summary.metrics["eval/initial_expected_streak"], summary.metrics["eval/expected_streak"]
    print("feature drafter held-out expected streak:", initial, "->", final)
    assert final > initial + 0.2
    meta = json.loads((Path(summary.output_dir) / "specdiff_feature_drafter.json").read_text())
    assert meta["kind"] == "feature" and meta["config"]["target_layer_ids"] == [1]
    assert meta["config"]["draft_vocab_size"] == 24 and meta["training"]["steps"] == 40
    verifier = load_verifier_model(assets / "verifier")
    drafter = load_drafter(summary.output_dir, verifier=verifier)
    decoder = SpeculativeDecoder(drafter, HFVerifier(verifier, tap_layers=drafter.tap_layers))
    prompt = [1, 5, 9, 13]
    result = decoder.generate(prompt, max_new_tokens=24)
    assert result.tokens == generate_plain(HFVerifier(verifier), prompt, max_new_tokens=24).tokens

    # Reusing those trajectories for a drafter that taps other layers is refused, naming both.
    from specdiff.distill.job import absolutize, training_trajectories
    from specdiff.lineage.verifier import verifier_record

    other = absolutize(load_config(TINY, overrides(assets, tmp_path) + [
        "drafter.init=feature", "drafter.target_layer_ids=[0]", f"data.trajectories={tmp_path / 'trajectories'}"]))
    with pytest.raises(ValueError, match=r"layers \[1\], but drafter.target_layer_ids is \[0\]"):
        training_trajectories(other, verifier_record(other.verifier.path))
