"""`python jobs/distill.py ...` is `specdiff distill ...` (specdiff.cli.distill), kept for the commands the platform is known by."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "platform"))  # run from a checkout without install

from specdiff.cli import main as cli_main  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    return cli_main(["distill", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
