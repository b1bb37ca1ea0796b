"""`bertforge.io`'s folder writes: a folder is replaced whole or not at all, whatever happens to the writer."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bertforge.io import atomic_dir, clear_stale


def _dead_pid() -> int:
    """The id of a process that has ended."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


def _old(target: Path) -> dict[str, str]:
    (target / "sub").mkdir(parents=True)
    (target / "a.txt").write_text("old a")
    (target / "sub" / "b.txt").write_text("old b")
    return _tree(target)


def test_a_writer_that_raises_midway_leaves_the_old_folder_intact_and_no_temporary(tmp_path):
    target = tmp_path / "model"
    old = _old(target)
    with pytest.raises(OSError, match="disk full"):
        with atomic_dir(target) as tmp:
            (tmp / "a.txt").write_text("new a")  # half of the new folder written ...
            raise OSError("disk full")  # ... then the writer fails
    assert _tree(target) == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # nothing else left beside it


def test_a_completed_folder_replaces_the_old_one_whole(tmp_path):
    target = tmp_path / "model"
    _old(target)
    with atomic_dir(target) as tmp:
        assert tmp.parent == target.parent and tmp.is_dir() and not any(tmp.iterdir())
        assert _tree(target)["a.txt"] == "old a"  # readers see the old folder until the end
        (tmp / "a.txt").write_text("new a")
    assert _tree(target) == {"a.txt": "new a"}  # no file of the old folder survives
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]
    with atomic_dir(tmp_path / "fresh" / "deeper") as tmp:  # a new target, parents made
        (tmp / "x").write_text("x")
    assert _tree(tmp_path / "fresh" / "deeper") == {"x": "x"}


def test_a_leftover_of_a_killed_writer_is_cleared_and_never_read_as_the_folder(tmp_path):
    target = tmp_path / "model"
    old = _old(target)
    leftover = tmp_path / f".model.tmp-{os.getpid()}"  # what a SIGKILL mid-write leaves
    leftover.mkdir()
    (leftover / "torn.bin").write_bytes(b"\0" * 10)
    assert _tree(target) == old
    with atomic_dir(target) as tmp:
        assert not any(tmp.iterdir())  # a fresh folder, not the torn one
        (tmp / "a.txt").write_text("new a")
    assert _tree(target) == {"a.txt": "new a"} and not leftover.exists()


def test_without_replace_a_folder_already_there_wins(tmp_path):
    target = tmp_path / "package"
    with atomic_dir(target, replace=False) as tmp:
        (tmp / ".complete").write_text("first")
    with atomic_dir(target, replace=False) as tmp:  # another process finished the same download first
        (tmp / ".complete").write_text("second")
    assert _tree(target) == {".complete": "first"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["package"]


def test_leftovers_of_killed_writers_are_cleared_and_a_live_writers_folder_stays(tmp_path):
    """A kill leaves ``.NAME.tmp-PID`` (mid-write) or ``.NAME.old-PID`` (between the two renames of the
    swap, with no NAME at all): the old folder is put back, the torn one removed; another running
    process's temporary folder and other names are not touched."""
    dead, live = _dead_pid(), os.getppid()
    _old(tmp_path / f".model.old-{dead}")  # the swap was killed after moving model/ aside
    (tmp_path / f".model.tmp-{dead}").mkdir()
    (tmp_path / f".best.tmp-{dead}").mkdir()
    (tmp_path / f".best.tmp-{live}").mkdir()  # a writer still at work
    (tmp_path / f".other.tmp-{dead}").mkdir()  # not ours
    removed = clear_stale(tmp_path, lambda name: name in ("model", "best"))
    assert sorted(p.name for p in removed) == sorted([f".model.tmp-{dead}", f".best.tmp-{dead}"])
    assert _tree(tmp_path / "model") == {"a.txt": "old a", "sub/b.txt": "old b"}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["model", f".best.tmp-{live}", f".other.tmp-{dead}"])


def test_the_next_write_clears_a_dead_writers_leftovers(tmp_path):
    dead = _dead_pid()
    target = tmp_path / "model"
    _old(target)
    (tmp_path / f".model.tmp-{dead}").mkdir()
    (tmp_path / f".model.old-{dead}").mkdir()
    with atomic_dir(target) as tmp:
        (tmp / "a.txt").write_text("new a")
    assert _tree(target) == {"a.txt": "new a"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_a_folder_that_may_not_be_written_to_is_named_with_the_target_not_the_temporary(tmp_path, monkeypatch):
    import errno
    import tempfile

    from bertforge.io import atomic_write_text

    def refused(*args, dir=None, **kwargs):  # as a read-only folder refuses (root is not refused, so stand in)
        raise PermissionError(errno.EACCES, "Permission denied", f"{dir}/.out.jsonl.abc.tmp")

    monkeypatch.setattr(tempfile, "mkstemp", refused)
    with pytest.raises(PermissionError) as e:
        atomic_write_text(tmp_path / "out.jsonl", "x")
    assert str(e.value) == f"{tmp_path / 'out.jsonl'}: cannot write it (Permission denied in {tmp_path})"
    assert ".tmp" not in str(e.value)
