"""``python -m specdiff``: the ``specdiff`` command (specdiff.cli)."""

import sys

from specdiff.cli import main

if __name__ == "__main__":
    sys.exit(main())
