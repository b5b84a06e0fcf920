"""README is a user's guide: small, with its three commands on the first screen, the same set-up and test commands CI
runs (.ci/run installs exactly as README says), and links that lead somewhere."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MAIN_COMMAND = "specdiff generate"  # builds the default drafter on a first run, then decodes
FIRST_SCREEN = 60  # lines


def ci_command(marker: str) -> str:
    """The command line that follows ``# --- README: <marker> ---`` in .ci/run."""
    lines = (REPO / ".ci" / "run").read_text().splitlines()
    start = lines.index(f"# --- README: {marker} ---")
    return next(line for line in lines[start + 1 :] if line.strip() and not line.startswith("#"))


def test_readme_is_at_most_10_kb():
    size = len(README.read_bytes())
    assert size <= 10 * 1024, f"README.md is {size} bytes; measurements belong in docs/results.md"


def test_the_three_commands_are_on_the_first_screen_and_match_ci():
    first = README.read_text().splitlines()[:FIRST_SCREEN]
    setup, tests = ci_command("set-up"), ci_command("tests")
    assert setup in first, f"README's first {FIRST_SCREEN} lines must hold .ci/run's set-up line: {setup}"
    assert MAIN_COMMAND in first
    assert tests in first, f"README's first {FIRST_SCREEN} lines must hold .ci/run's test command: {tests}"
    assert first.index(setup) < first.index(MAIN_COMMAND) < first.index(tests)


def test_links_in_readme_and_docs_point_at_files_that_exist():
    broken = []
    for doc in [README, *sorted((REPO / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            path = (doc.parent / target.split("#")[0]).resolve()
            if not path.exists():
                broken.append(f"{doc.relative_to(REPO)}: {target}")
    assert broken == []
