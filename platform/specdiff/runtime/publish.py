"""Atomic publication of files and folders: written aside, then renamed into place, so a reader (another replica,
a later run, a crashed run's successor) never sees half of one.

Every writer of a shared state path uses these two: the converted default verifier, registry downloads, the vLLM
export, teacher trajectories, the built drafter, stage summaries and the machine cache.
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator


STALE_AFTER_S = 3600.0  # a leftover older than this whose writer is gone is swept


def _aside(target: Path, tag: str) -> Path:
    """A unique sibling name (same filesystem, so the rename is atomic), hidden from folder listings."""
    return target.with_name(f".{target.name}.{tag}-{os.getpid()}-{secrets.token_hex(4)}")


@contextmanager
def publishing(target: str | Path, *, replace: bool = False) -> Iterator[Path]:
    """Yield a fresh path beside ``target`` (not created: make it a folder or a file); when the block ends without
    an exception, rename it to ``target``. An exception leaves ``target`` as it was and removes the partial copy.

    ``replace=False``: where ``target`` already exists as a folder when the block ends (another process published
    the same thing first), the new copy is dropped and the existing one kept. ``replace=True``: the new copy
    replaces it (a file by the rename itself; an old folder is renamed aside first and then deleted, so ``target``
    is missing only between two renames).
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    sweep(target)
    partial = _aside(target, "partial")
    try:
        yield partial
        if not partial.exists():
            raise FileNotFoundError(f"nothing was written to {partial} for {target}")
        old = None
        if replace and target.is_dir() and not target.is_symlink():  # a file is replaced by the rename itself
            old = _aside(target, "old")
            target.rename(old)
        try:
            partial.rename(target)
        except OSError:
            if not target.exists():
                if old is not None:
                    old.rename(target)  # put the old copy back: a failed publish changes nothing
                raise
            # another process won the race; its copy is the same thing
        if old is not None:
            _remove(old)
    finally:
        _remove(partial)


def write_text(path: str | Path, text: str) -> Path:
    """Write a text file atomically (any existing file is replaced)."""
    with publishing(path, replace=True) as partial:
        partial.write_text(text)
    return Path(path)


def sweep(target: str | Path, *, older_than_s: float = STALE_AFTER_S) -> list[Path]:
    """Remove the leftovers of killed writers of ``target`` (``.name.partial-PID-…`` / ``.name.old-PID-…``): those
    whose process is not running on this machine and that were last changed more than ``older_than_s`` ago (the age
    guard keeps a live writer on another machine of a shared filesystem safe). Returns what it removed."""
    target = Path(target)
    removed = []
    now = time.time()
    for tag in ("partial", "old"):
        for path in target.parent.glob(f".{target.name}.{tag}-*"):
            pid = path.name[len(f".{target.name}.{tag}-"):].split("-")[0]
            try:
                if not pid.isdigit() or _running(int(pid)) or now - path.lstat().st_mtime < older_than_s:
                    continue
            except OSError:  # gone meanwhile
                continue
            _remove(path)
            removed.append(path)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
