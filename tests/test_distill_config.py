"""The job's config: YAML + overrides, unknown keys and bad values are errors that name them, before any work."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from specdiff.distill import load_config, run

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / "jobs" / "configs" / "tiny.yaml"


def test_example_config_parses_with_overrides():
    cfg = load_config(TINY, ["train.steps=7", "train.lora.enabled=false", "eval.offsets=[0, 4]"], check_paths=False)
    assert cfg.train.steps == 7 and cfg.eval.offsets == [0, 4] and cfg.objective.kind == "streak"
    assert cfg.teacher.sampling().temperature == 0.5 and cfg.teacher.sampling().top_p == 0.95


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["train.stepz=3"], "unknown config key 'train.stepz'"),
        (["bogus.key=1"], "unknown config key 'bogus'"),
        (["train.lora.rank=8"], "unknown config key 'train.lora.rank'"),
        (["train.steps=0"], "train.steps: Input should be greater than or equal to 1 (got 0)"),
        (["objective.kind=streaks"], "objective.kind"),
        (["objective.gamma=64"], "objective.gamma must be <= teacher.max_new_tokens (32), got 64"),
        (["objective.kind=ar_distill", "teacher.logprobs_k=0"], "teacher.logprobs_k must be >= 1"),
        (["drafter.init=small", "train.lora.enabled=true"], "train.lora.enabled needs drafter.init"),
        (["tracking.backend=mlflow"], "tracking.tracking_uri must be set"),
        (["train.steps"], "override must look like section.key=value, got 'train.steps'"),
        (["drafter.init=feature", "train.lora.enabled=false", "objective.prompt_anchors_per_sample=8"],
         "objective.prompt_anchors_per_sample needs a greedy teacher (teacher.temperature 0"),
        (["objective.prompt_anchors_per_sample=8"], "objective.prompt_anchors_per_sample needs drafter.init='feature'"),
        (["run.output_dir=/tmp/x", "run.storage_path=/tmp/x/ray"], "run.storage_path (/tmp/x/ray) must not lie inside"),
        (["run.output_dir=/tmp/x", "run.storage_path=/tmp/x"], "must not lie inside run.output_dir"),
    ],
)
def test_bad_config_names_the_key_and_value(overrides, message):
    with pytest.raises(ValueError) as err:
        load_config(TINY, overrides, check_paths=False)
    assert message in str(err.value)


def test_missing_paths_fail_before_ray_starts(tmp_path):
    import ray

    cfg = load_config(TINY, [f"verifier.path={tmp_path / 'nope'}"], check_paths=False)
    with pytest.raises(ValueError, match="verifier.path must be an existing path"):
        run(cfg)
    assert not ray.is_initialized()


def test_cli_reports_a_bad_config_quickly_and_starts_nothing(tmp_path):
    bad = tmp_path / "bad.yaml"
    tree = yaml.safe_load(TINY.read_text())
    tree["train"]["learning_rate"] = 0.1
    bad.write_text(yaml.safe_dump(tree))
    began = time.perf_counter()
    out = subprocess.run([sys.executable, str(REPO / "jobs" / "distill.py"), "--config", str(bad)],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert "unknown config key 'train.learning_rate'" in out.stderr
    assert "Started a local Ray instance" not in out.stderr + out.stdout
    assert time.perf_counter() - began < 60
