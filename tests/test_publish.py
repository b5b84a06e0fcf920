"""specdiff.runtime.publish: a reader sees a whole file or folder or none, never half of one."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from specdiff.runtime.publish import publishing, write_text


def _leftovers(folder):
    return sorted(p.name for p in folder.iterdir() if p.name.startswith("."))


def test_folder_appears_whole(tmp_path):
    target = tmp_path / "a" / "model"
    with publishing(target) as partial:
        partial.mkdir()
        (partial / "w.bin").write_bytes(b"x" * 10)
        assert not target.exists()  # nothing visible until the block ends
    assert (target / "w.bin").read_bytes() == b"x" * 10
    assert _leftovers(target.parent) == []


def test_failure_leaves_nothing(tmp_path):
    target = tmp_path / "model"
    with pytest.raises(RuntimeError, match="crash"):
        with publishing(target) as partial:
            partial.mkdir()
            (partial / "half").write_text("...")
            raise RuntimeError("crash")
    assert list(tmp_path.iterdir()) == []


def test_nothing_written_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothing was written"):
        with publishing(tmp_path / "model"):
            pass


def test_first_copy_wins_unless_replacing(tmp_path):
    target = tmp_path / "export"
    target.mkdir()
    (target / "v").write_text("first")
    with publishing(target) as partial:
        partial.mkdir()
        (partial / "v").write_text("second")
    assert (target / "v").read_text() == "first" and _leftovers(tmp_path) == []
    with publishing(target, replace=True) as partial:
        partial.mkdir()
        (partial / "v").write_text("third")
    assert (target / "v").read_text() == "third" and _leftovers(tmp_path) == []


def test_failed_replace_puts_the_old_copy_back(tmp_path, monkeypatch):
    target = tmp_path / "drafter"
    target.mkdir()
    (target / "v").write_text("old")
    real_rename = Path.rename

    def failing(self, to):
        if ".partial-" in self.name:  # the publishing rename fails (full disk, ...)
            raise OSError("simulated")
        return real_rename(self, to)

    monkeypatch.setattr(Path, "rename", failing)
    with pytest.raises(OSError, match="simulated"):
        with publishing(target, replace=True) as partial:
            partial.mkdir()
            (partial / "v").write_text("new")
    assert (target / "v").read_text() == "old" and _leftovers(tmp_path) == []


def test_write_text_replaces(tmp_path):
    path = tmp_path / "s" / "summary.json"
    write_text(path, "{}")
    write_text(path, '{"a": 1}')
    assert path.read_text() == '{"a": 1}' and _leftovers(path.parent) == []


def test_racing_writers_leave_one_whole_copy(tmp_path):
    target = tmp_path / "download"
    errors = []

    def writer(i):
        try:
            with publishing(target) as partial:
                partial.mkdir()
                for j in range(20):
                    (partial / f"{j}").write_text(str(i))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=writer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    values = {(target / f"{j}").read_text() for j in range(20)}
    assert len(values) == 1  # one writer's whole copy, not a mix
    assert _leftovers(tmp_path) == []


def test_leftovers_of_killed_writers_are_swept(tmp_path):
    """A writer killed mid-copy leaves ``.name.partial-PID-…``; the next publish of that name removes it once its
    process is gone and it is old, and never touches a live or recent writer's copy or another name's."""
    import os
    import subprocess
    import sys
    import time

    from specdiff.runtime.publish import STALE_AFTER_S, sweep

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                          text=True).stdout.strip()
    old = time.time() - 2 * STALE_AFTER_S
    paths = {
        "dead_old": tmp_path / f".model.partial-{dead}-abcd", "dead_old_aside": tmp_path / f".model.old-{dead}-ef01",
        "dead_recent": tmp_path / f".model.partial-{dead}-2345",
        "live_old": tmp_path / f".model.partial-{os.getpid()}-6789",
        "other_name": tmp_path / f".other.partial-{dead}-abcd",
    }
    for name, path in paths.items():
        path.mkdir()
        (path / "x").write_text(name)
        if name != "dead_recent":
            os.utime(path, (old, old))
    with publishing(tmp_path / "model") as partial:
        partial.mkdir()
        (partial / "weights").write_text("new")
    left = {p.name for p in tmp_path.iterdir()}
    assert left == {"model", paths["dead_recent"].name, paths["live_old"].name, paths["other_name"].name}
    assert sweep(tmp_path / "model", older_than_s=0) == [paths["dead_recent"]]
