"""The summary hand-over from jobs/distill.py to jobs/build_drafter.py goes through a JSON file, not a printed line:
on a slow machine a worker's output landed on the summary line and parsing it raised ``JSONDecodeError: Extra
data``. A fake distill.py (no Ray) stands in for the real job."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "jobs"))

import build_drafter  # noqa: E402
import distill  # noqa: E402

RECORD = {"step": 3, "finished": True, "output_dir": "/x/drafter", "expected_streak": 0.5,
          "initial_expected_streak": 0.1}

# Prints what the real job prints, with the summary line run together with other output (as seen on a slow
# machine), writes the summary file where --summary says, and exits: as `--set write=1` and `--set code=N` say.
FAKE = '''import json, sys
args = sys.argv[1:]
sets = dict(a.split("=", 1) for prev, a in zip(args, args[1:]) if prev == "--set")
record = {record!r}
print("[distill] step 3/3 loss 0.5000 lr 1.00e-03 0.100s/step (waiting for data 0.000s)", flush=True)
if sets.get("write") == "1":
    print("[distill] " + json.dumps(record) + "(raylet) worker pid=7 exited", flush=True)
    if "--summary" in args:
        with open(args[args.index("--summary") + 1], "w") as f:
            json.dump(record, f)
sys.exit(int(sets["code"]))
'''


@pytest.fixture
def fake_jobs(tmp_path, monkeypatch):
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "distill.py").write_text(FAKE.format(record=RECORD))
    monkeypatch.setattr(build_drafter, "JOBS", jobs)
    return tmp_path


def test_summary_is_read_from_the_file_not_the_interleaved_line(fake_jobs):
    log = fake_jobs / "stage.log"
    summary = build_drafter.run_stage("stage", fake_jobs / "cfg.yaml", ["write=1", "code=0"], log)
    assert {k: summary[k] for k in RECORD} == RECORD and summary["wall_s"] >= 0
    assert "(raylet) worker pid=7 exited" in log.read_text()  # the human-readable line is still in the log


def test_a_summary_left_by_an_earlier_attempt_does_not_count(fake_jobs):
    log = fake_jobs / "stage.log"
    build_drafter.run_stage("stage", fake_jobs / "cfg.yaml", ["write=1", "code=0"], log)
    with pytest.raises(RuntimeError, match="stage failed"):  # this attempt writes no summary
        build_drafter.run_stage("stage", fake_jobs / "cfg.yaml", ["code=0"], log)
    with pytest.raises(RuntimeError, match="exit code 3"):
        build_drafter.run_stage("stage", fake_jobs / "cfg.yaml", ["write=1", "code=3"], log)


def test_distill_job_writes_the_summary_file(tmp_path, monkeypatch, capsys):
    counts = {"prompts": {"rows": 4, "kept": 3, "dropped_empty": 1, "truncated": 2}}  # the prompt datasets' counts
    done = SimpleNamespace(step=3, finished=True, output_dir="/x/drafter", data=counts,
                           metrics={"eval/expected_streak": 0.5, "eval/initial_expected_streak": 0.1})
    monkeypatch.setattr(distill, "load_config", lambda path, overrides: object())
    monkeypatch.setattr(distill, "run", lambda cfg: done)
    path = tmp_path / "out" / "summary.json"
    assert distill.main(["--config", "unused.yaml", "--summary", str(path)]) == 0
    assert json.loads(path.read_text()) == {**RECORD, "data": counts}
    assert [p.name for p in path.parent.iterdir()] == ["summary.json"]  # no partial copy left beside it
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert json.loads(last.removeprefix("[distill] ")) == {**RECORD, "data": counts}  # the line stays for people


def test_the_stage_log_keeps_the_jobs_lines_and_drops_progress_bars_and_repeats():
    keep = build_drafter.LogFilter()
    lines = [
        "\x1b[36m(RayTrainWorker pid=19669)\x1b[0m [distill] step 10/600 loss 8.2953 lr 1.10e-03 3.233s/step\n",
        "\x1b[36m(RayTrainWorker pid=19669)\x1b[0m [distill] step 10/600 loss 8.2953 lr 1.10e-03 3.233s/step\n",  # echo
        "2026-12-03 07:29:45,467\tINFO logging_progress.py:225 -- Total Progress: 0/?\n",
        "\x1b[2m\x1b[36m(pid=20019) \x1b[0m- ListFiles: Tasks: 0; Actors: 0; Queued blocks: 0 (0.0B); Resources: 0.0 "
        "CPU, 669.0B object store: 100%|██████████| 1.00/1.00 [00:00<00:00]\n",
        "\x1b[A\x1b[A\n",
        "\n",
        "(PlacementGroupCleaner pid=19642) Failed to query Ray Train Controller actor state. Continuing to monitor.\n",
        "(PlacementGroupCleaner pid=19642) Failed to query Ray Train Controller actor state. Continuing to monitor.\n",
        "(RayTrainWorker pid=19669) [distill] step 20/600 loss 6.4747 lr 2.00e-03 1.196s/step\n",
        "Traceback (most recent call last):\n",
    ]
    kept = [k for line in lines if (k := keep(line)) is not None]
    assert kept == [
        "(RayTrainWorker pid=19669) [distill] step 10/600 loss 8.2953 lr 1.10e-03 3.233s/step\n",
        "(PlacementGroupCleaner pid=19642) Failed to query Ray Train Controller actor state. Continuing to monitor.\n",
        "(RayTrainWorker pid=19669) [distill] step 20/600 loss 6.4747 lr 2.00e-03 1.196s/step\n",
        "Traceback (most recent call last):\n",
    ]


def test_teacher_progress_shows_rate_and_time_left():
    assert build_drafter.teacher_progress(64, 560, 60.0) == (
        "teacher: 64/560 trajectories sampled, 64/min, about 7 min 45 s left")
    assert build_drafter.teacher_progress(560, 560, 300.0) == "teacher: 560/560 trajectories sampled, 112/min"
    assert build_drafter.teacher_progress(32, 0, 10.0) == "teacher: 32/? trajectories sampled, 192/min"
