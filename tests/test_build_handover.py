"""The hand-over from the distillation job to the build is a Python call: a typed config in, a ``DistillSummary`` and
progress events out (``specdiff.distill.events``). No stage reads another's printed text: before, the build ran
jobs/distill.py as a subprocess, passed its budget as ``--set`` strings and scraped its stdout with four regexes (and a
worker's line landing on the summary line once broke the parse). A fake ``specdiff.distill.run`` stands in for the
real job (no Ray) here; tests/test_distill_e2e.py and the main job's test run the real one."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

import specdiff.distill
from specdiff.cli import main as cli_main
from specdiff.cli.build import BarRenderer
from specdiff.distill import DistillConfig, DistillSummary
from specdiff.distill.events import Evaluated, Note, TeacherBudgetSpent, TeacherSampled, TrainStep
from specdiff.lifecycle import build

REPO = Path(__file__).resolve().parents[1]
COUNTS = {"data.prompts": {"rows": 4, "kept": 3, "dropped_empty": 1, "truncated": 2}}
RECORD = {"step": 3, "finished": True, "output_dir": "/x/drafter", "expected_streak": 0.5,
          "initial_expected_streak": 0.1, "data": COUNTS}
EVENTS = [Note("[distill] verifier tiny 1 sha256:0123..."), TeacherSampled(2, 2, "hf"), TeacherBudgetSpent(2),
          TrainStep(3, 3, 0.5, 1e-3, 0.1, 0.0), Evaluated(3, 0.5, (0.4, 0.2), 0.1, "scored by the verifier")]


class FakeRun:
    """``specdiff.distill.run``: records the config it was given, sends EVENTS, returns a summary (or raises)."""

    def __init__(self, finished: bool = True, error: Exception | None = None):
        self.finished, self.error, self.configs = finished, error, []

    def __call__(self, cfg: DistillConfig, on_event=None) -> DistillSummary:
        assert isinstance(cfg, DistillConfig)  # typed, validated: no `--set` strings
        self.configs.append(cfg)
        for event in EVENTS:
            on_event(event)
        if self.error is not None:
            raise self.error
        return DistillSummary(step=3, finished=self.finished, output_dir="/x/drafter" if self.finished else None,
                              metrics={"eval/expected_streak": 0.5, "eval/initial_expected_streak": 0.1}, data=COUNTS)


@pytest.fixture
def tiny_cfg(tmp_path) -> DistillConfig:
    return build.configure("tiny", {"run": {"storage_path": str(tmp_path / "rr"), "output_dir": str(tmp_path / "o")}})


def test_a_stage_hands_over_its_summary_and_events(tmp_path, tiny_cfg, monkeypatch):
    fake = FakeRun()
    monkeypatch.setattr(specdiff.distill, "run", fake)
    seen = []
    log = tmp_path / "stage.log"
    summary = build.run_stage("stage", tiny_cfg, log, teacher_total=4, progress=seen.append)
    assert fake.configs == [tiny_cfg]
    assert {k: summary[k] for k in RECORD} == RECORD and summary["wall_s"] >= 0
    assert json.loads((tmp_path / "stage.summary.json").read_text()) == RECORD  # the summary file, as before
    assert seen[0] == build.StageStarted("stage", 4) and isinstance(seen[-1], build.StageFinished)
    assert [p.event for p in seen[1:-1]] == EVENTS and {p.label for p in seen[1:-1]} == {"stage"}
    lines = log.read_text().splitlines()
    assert lines[1:] == [e.line() for e in EVENTS]  # the log: the events' own lines, for people


def test_a_failed_or_unfinished_stage_raises_and_an_earlier_summary_does_not_count(tmp_path, tiny_cfg, monkeypatch):
    log = tmp_path / "stage.log"
    monkeypatch.setattr(specdiff.distill, "run", FakeRun())
    build.run_stage("stage", tiny_cfg, log, progress=lambda e: None)
    monkeypatch.setattr(specdiff.distill, "run", FakeRun(error=ValueError("bad prompts")))
    with pytest.raises(RuntimeError, match=r"stage failed \(ValueError: bad prompts\); see the log"):
        build.run_stage("stage", tiny_cfg, log, progress=lambda e: None)
    assert not (tmp_path / "stage.summary.json").exists()  # the earlier attempt's summary is gone
    assert "# failed: ValueError: bad prompts" in log.read_text()
    monkeypatch.setattr(specdiff.distill, "run", FakeRun(finished=False))
    with pytest.raises(RuntimeError, match="stopped at step 3 before its last"):
        build.run_stage("stage", tiny_cfg, log, progress=lambda e: None)


def test_the_stage_config_carries_paths_and_budget_typed(tmp_path, monkeypatch):
    monkeypatch.delenv("SPECDIFF_BUILD_QUICK", raising=False)
    fake = FakeRun()
    monkeypatch.setattr(specdiff.distill, "run", fake)
    (tmp_path / "prompts.jsonl").write_text('{"prompt_ids": [1]}\n{"prompt_ids": [2]}\n')
    recipe = build.default_recipe()
    budget, scale = build.first_run_budget(30 * 60, 100.0, recipe)
    assert scale == 2.0 and budget.train_s == 30 * 60 - 100 - build.DECODE_RESERVE_S
    assert budget.teacher_s == pytest.approx(build.TEACHER_SHARE * budget.train_s)
    assert budget.steps == 2 * recipe["train"]["steps"]
    seen = []
    build.distill("feature", build.DEFAULT_RECIPE, tmp_path, "feature", seen.append, budget.sections())
    (cfg,) = fake.configs
    assert cfg.train.time_budget_s == round(budget.train_s) and cfg.teacher.time_budget_s == round(budget.teacher_s)
    assert cfg.train.steps == budget.steps and cfg.objective.warmup_ce_steps == budget.warmup_ce_steps
    assert cfg.run.output_dir == str(tmp_path / "feature") and cfg.data.prompts == str(tmp_path / "prompts.jsonl")
    assert cfg.teacher.save_to == str(tmp_path / "trajectories") and cfg.data.trajectories is None
    assert seen[0] == build.StageStarted("feature", 2)  # the teacher's total: the training prompts
    assert build.first_run_budget(None, 100.0, recipe)[0] == build.Budget()  # no budget: the whole recipe
    with pytest.raises(ValueError, match="time_budget"):  # a wrong key is an error that names it
        build.configure("tiny", {"train": {"time_budget": 1}})


def test_the_build_reads_no_printed_text():
    """No subprocess and no regular expressions left between the build and its stages."""
    tree = ast.parse((REPO / "platform" / "specdiff" / "lifecycle" / "build.py").read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not imported & {"subprocess", "re"}, imported


def test_the_event_lines_are_the_jobs_printed_lines():
    # what `ray job submit` users and the stage logs have always read
    assert TrainStep(3, 3, 0.5, 1e-3, 0.1, 0.0).line() == (
        "[distill] step 3/3 loss 0.5000 lr 1.00e-03 0.100s/step (waiting for data 0.000s)")
    assert TeacherSampled(16, 48, "hf").line() == "[teacher] 16 trajectories sampled (48 by this actor, hf)"
    assert Evaluated(50, 1.23456, (0.5, 0.25), 2.0, "scored by the verifier").line() == (
        "[distill] eval step 50: expected streak 1.235 alpha [0.5, 0.25] (2.0s, scored by the verifier)")


def test_the_bar_is_drawn_from_the_events(capsys):
    bar = BarRenderer()
    bar(build.StageStarted("stage", 4))
    bar(build.StageProgress("stage", TeacherSampled(2, 2, "hf")))
    assert "teacher: 2/4 trajectories sampled" in bar.bar.postfix
    bar(build.StageProgress("stage", TrainStep(2, 10, 0.75, 1e-3, 0.1, 0.0)))
    assert (bar.bar.n, bar.bar.total) == (2, 10) and "loss 0.750" in bar.bar.postfix
    bar(build.StageProgress("stage", Evaluated(2, 0.5, (0.4,), 0.1, "x")))
    bar(build.BuildNote("default drafter ready"))
    bar(build.StageFinished("stage", {}))
    assert bar.bar is None
    out = capsys.readouterr()
    assert "stage: held-out expected streak 0.500 at step 2" in out.out and "default drafter ready" in out.out
    assert "2/10" in out.err  # the bar, on stderr


def test_teacher_progress_shows_rate_and_time_left():
    assert build.teacher_progress(64, 560, 60.0) == (
        "teacher: 64/560 trajectories sampled, 64/min, about 7 min 45 s left")
    assert build.teacher_progress(560, 560, 300.0) == "teacher: 560/560 trajectories sampled, 112/min"
    assert build.teacher_progress(32, 0, 10.0) == "teacher: 32/? trajectories sampled, 192/min"


def test_distill_command_writes_the_summary_file(tmp_path, monkeypatch, capsys):
    done = DistillSummary(step=3, finished=True, output_dir="/x/drafter", data=COUNTS,
                          metrics={"eval/expected_streak": 0.5, "eval/initial_expected_streak": 0.1})
    monkeypatch.setattr(specdiff.distill, "load_config", lambda path, overrides: object())
    monkeypatch.setattr(specdiff.distill, "run", lambda cfg: done)
    path = tmp_path / "out" / "summary.json"
    assert cli_main(["distill", "--config", "unused.yaml", "--summary", str(path)]) == 0
    assert json.loads(path.read_text()) == RECORD
    assert [p.name for p in path.parent.iterdir()] == ["summary.json"]  # no partial copy left beside it
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last.removeprefix("[distill] ")) == RECORD  # the line stays for people
