"""Align a diffusion drafter to its verifier: teacher trajectories (Ray Data) -> Ray Train -> a drafter folder.

    python jobs/distill.py --config jobs/configs/tiny.yaml [--set train.steps=20 ...]   # starts a local Ray
    ray job submit --working-dir . -- python jobs/distill.py --config jobs/configs/tiny.yaml

The last line printed is ``[distill] {summary JSON}`` for people; ``--summary PATH`` also writes that JSON to a file,
which is what programs should read (jobs/build_drafter.py does): printed lines can interleave with other output.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

# Run from a checkout without installing: the library lives in <repo>/platform.
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "platform"))

from specdiff.runtime import publish  # noqa: E402
from specdiff.distill import load_config, run  # noqa: E402
from specdiff.distill.datasets import DatasetError  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="YAML config file (see docs/distill.md)")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one config value (YAML syntax); repeatable")
    parser.add_argument("--check", action="store_true", help="validate the config and exit")
    parser.add_argument("--summary", type=Path, default=None, metavar="PATH",
                        help="also write the run's summary (step, finished, output_dir, expected streaks, prompt "
                             "counts: data.*.dropped_empty / truncated) as JSON here")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.config, args.overrides)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.check:
        print(json.dumps(cfg.model_dump(mode="json"), indent=2))
        return 0
    try:
        summary = run(cfg)
    except DatasetError as e:  # a bad prompt file: found on the driver before Ray starts
        print(f"error: {e}", file=sys.stderr)
        return 2
    record = {
        "step": summary.step, "finished": summary.finished, "output_dir": summary.output_dir,
        "expected_streak": summary.metrics.get("eval/expected_streak"),
        "initial_expected_streak": summary.metrics.get("eval/initial_expected_streak"),
        "data": summary.data,  # per prompt dataset: rows, kept, dropped_empty, truncated
    }
    if args.summary is not None:
        write_summary(args.summary, record)
    print("[distill] " + json.dumps(record), flush=True)
    return 0


def write_summary(path: Path, record: dict) -> None:
    """Atomically: a reader never sees half a file."""
    publish.write_text(path, json.dumps(record, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    sys.exit(main())
