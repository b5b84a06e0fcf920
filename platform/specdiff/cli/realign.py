"""``specdiff realign``: re-align drafters when the verifier changes. Find the latest verifier version without an
aligned drafter, claim it (exactly once, even with several watchers), submit ``python -m specdiff distill`` through
Ray's Job Submission SDK (the package travels with the job), warm-started from the production drafter, register the
result and promote it only if its held-out tau is at least the production pair's.

    specdiff realign --family tiny --config tiny --address http://127.0.0.1:8265
    specdiff realign --family tiny --config tiny --address http://127.0.0.1:8265 \\
        --watch --interval 60 --set train.steps=50

The registry is MLFLOW_TRACKING_URI, else the embedded sqlite store under $SPECDIFF_HOME (see docs/registry.md).
Exit status: 0 done (promoted, not promoted, nothing to do, claimed elsewhere), 1 re-alignment failed, 2 bad input.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path



def add_parser(sub, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help='re-align drafters when the verifier changes (registry + Ray Job Submission)', description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--family", required=True, help="verifier family: registered models specdiff-verifier-FAMILY "
                   "and specdiff-drafter-FAMILY")
    p.add_argument("--config", required=True, help="base distillation config (a YAML file or a shipped recipe's name, see "
                   "docs/distill.md); the "
                   "verifier, warm start, run and tracking sections are filled in")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="override a base config value (repeatable), e.g. train.steps=50")
    p.add_argument("--address", default="http://127.0.0.1:8265", help="Ray dashboard address (job submission)")
    p.add_argument("--tracking-uri", default=None, help="MLflow store (default: MLFLOW_TRACKING_URI or the "
                   "embedded sqlite store)")
    p.add_argument("--heldout", default=None, help="held-out prompts (.jsonl prompt_ids) for the promotion test; "
                   "default: the config's data.heldout")
    p.add_argument("--max-attempts", type=int, default=2, help="job submissions per verifier version (default 2)")
    p.add_argument("--job-timeout", type=float, default=None, help="stop a job running longer (seconds)")
    p.add_argument("--poll", type=float, default=5.0, help="job status period in seconds (default 5)")
    p.add_argument("--watch", action="store_true", help="keep polling the registry for new verifier versions")
    p.add_argument("--interval", type=float, default=60.0, help="registry poll period of --watch (seconds)")
    p.add_argument("--max-polls", type=int, default=None, help="stop --watch after this many polls")
    p.add_argument("--work-dir", default=None, help="configs, drafters, checkpoints (default $SPECDIFF_HOME/realign; "
                   "must be visible to the cluster)")
    p.add_argument("--python", default="python", help="interpreter of the job entrypoint on the cluster")
    p.add_argument("--working-dir", default=None, help="also upload this folder as the job's working_dir (its "
                   "relative paths then resolve on the cluster); the specdiff package travels with every job")
    return p


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    if args.max_attempts < 1:
        parser.error(f"--max-attempts must be >= 1, got {args.max_attempts}")
    from specdiff.lifecycle.realign import RayJobs, RealignSettings, Realigner
    from specdiff.lifecycle.evaluate import Registry

    settings = RealignSettings(
        family=args.family, config=args.config, overrides=tuple(args.overrides), heldout=args.heldout,
        work_dir=args.work_dir, max_attempts=args.max_attempts, poll_s=args.poll, job_timeout_s=args.job_timeout,
        python=args.python, working_dir=args.working_dir)
    try:
        registry = Registry(args.tracking_uri)
        realigner = Realigner(registry, RayJobs(args.address), settings)
        if args.watch:
            realigner.watch(args.interval, args.max_polls)
            return 0
        outcome = realigner.run_once()
    except (ValueError, OSError, ConnectionError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"[realign] result: {outcome.status} verifier_version={outcome.verifier_version} "
          f"drafter_version={outcome.drafter_version} jobs={outcome.jobs} {outcome.reason}", flush=True)
    return 1 if outcome.status == "failed" else 0

