"""``specdiff distill``: align a diffusion drafter to its verifier (teacher trajectories on Ray Data -> Ray Train ->
a drafter folder).

    specdiff distill --config tiny [--set train.steps=20 ...]       # a shipped recipe, or a YAML file; local Ray
    ray job submit --working-dir . -- python -m specdiff distill --config tiny

The last line printed is ``[distill] {summary JSON}`` for people; ``--summary PATH`` also writes that JSON to a file,
which is what programs should read: printed lines can interleave with other output. (Python callers pass
``specdiff.distill.run`` a typed config and take its progress as events; see specdiff.distill.events.)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_parser(sub, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help="one distillation run: a drafter aligned to its verifier (Ray)", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", required=True, help="a YAML config file, or the name of a recipe the package ships "
                   "(tiny, smollm2-feature, smollm2-mdm, smollm2-streak; see docs/distill.md)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override one config value (YAML syntax); repeatable")
    p.add_argument("--check", action="store_true", help="validate the config, print it and exit")
    p.add_argument("--summary", type=Path, default=None, metavar="PATH",
                   help="also write the run's summary (step, finished, output_dir, expected streaks, prompt "
                        "counts: data.*.dropped_empty / truncated) as JSON here")
    return p


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    from specdiff.distill import load_config
    from specdiff.distill import run as distill_run
    from specdiff.distill.datasets import DatasetError

    try:
        cfg = load_config(args.config, args.overrides)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.check:
        print(json.dumps(cfg.model_dump(mode="json"), indent=2))
        return 0
    try:
        summary = distill_run(cfg)
    except DatasetError as e:  # a bad prompt file: found on the driver before Ray starts
        print(f"error: {e}", file=sys.stderr)
        return 2
    record = summary.record()
    if args.summary is not None:
        write_summary(args.summary, record)
    print("[distill] " + json.dumps(record), flush=True)
    return 0


def write_summary(path: Path, record: dict) -> None:
    """Atomically: a reader never sees half a file."""
    from specdiff.runtime import publish

    publish.write_text(path, json.dumps(record, indent=2, sort_keys=True) + "\n")
