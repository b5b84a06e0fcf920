"""``specdiff ui``: MLflow's UI over the project's store (the registry's and the distillation runs' tracking).

    specdiff ui                     # http://127.0.0.1:5000 over MLFLOW_TRACKING_URI, else $SPECDIFF_HOME/mlflow.db
    specdiff ui --port 5001 --dry-run

The store is the one every subcommand uses (``specdiff.registry.tracking_uri``). It runs ``mlflow ui`` with one
worker and without MLflow's job runner (``MLFLOW_SERVER_ENABLE_JOB_EXECUTION=false``): what a 2-core machine can
carry beside the platform.
"""

from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys

ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def add_parser(sub, name: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help="MLflow's UI over the project's store", description=__doc__,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tracking-uri", default=None, help="the store (default: MLFLOW_TRACKING_URI, else the embedded "
                   "sqlite store $SPECDIFF_HOME/mlflow.db)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    p.add_argument("--port", type=int, default=5000, help="port (default: %(default)s)")
    p.add_argument("--workers", type=int, default=1, help="server workers (default: %(default)s)")
    p.add_argument("--dry-run", action="store_true", help="print the command and its environment, run nothing")
    return p


def command(args: argparse.Namespace) -> list[str]:
    from specdiff.models.sources import state_dir

    if args.tracking_uri:
        uri = args.tracking_uri
    elif os.environ.get("MLFLOW_TRACKING_URI"):
        uri = os.environ["MLFLOW_TRACKING_URI"]
    else:  # specdiff.registry.tracking_uri's default, without importing MLflow for it
        uri = f"sqlite:///{state_dir() / 'mlflow.db'}"
    return [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri, "--host", args.host,
            "--port", str(args.port), "--workers", str(args.workers)]


def run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int:
    cmd = command(args)
    if args.dry_run:
        print(" ".join(f"{k}={v}" for k, v in ENV.items()) + " " + shlex.join(cmd))
        return 0
    from specdiff.runtime.extras import require

    try:
        require("registry", "specdiff ui", "mlflow")
    except ImportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    state_dir_of_store = cmd[cmd.index("--backend-store-uri") + 1].removeprefix("sqlite:///")
    if state_dir_of_store != cmd[cmd.index("--backend-store-uri") + 1]:  # a local sqlite file: its folder must exist
        os.makedirs(os.path.dirname(state_dir_of_store), exist_ok=True)
    try:
        return subprocess.run(cmd, env={**os.environ, **ENV}).returncode
    except KeyboardInterrupt:
        return 0
