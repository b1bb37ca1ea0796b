"""Crash-safe writes, one helper for a file and one for a folder: write under a temporary name beside
the target, fsync, then rename over it.

- a file: `atomic_path` (a temporary path for writers that want a file name), with
  `atomic_write_text` / `atomic_write_bytes` on top of it;
- a folder: `atomic_dir` (a temporary sibling folder that takes the target's place whole; a checkpoint,
  a best model, an unpacked download).

A reader (or a resumed run) sees either the old file or folder or the new one in full, never a torn
write, whatever kills the writer (exception, SIGKILL, power loss after the fsync).
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import json
import lzma
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

__all__ = ["atomic_path", "atomic_write_text", "atomic_write_bytes", "atomic_dir", "replace_dir", "clear_stale",
           "open_binary", "read_json_object", "COMPRESSED_SUFFIXES"]

COMPRESSED_SUFFIXES = (".gz", ".bz2", ".xz", ".lzma")


def open_binary(path: str | Path) -> IO[bytes]:
    """Open a file for reading bytes, decompressing ``.gz``, ``.bz2``, ``.xz`` / ``.lzma`` on the fly."""
    suffix = Path(path).suffix.lower()
    if suffix == ".gz":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    if suffix == ".bz2":
        return bz2.open(path, "rb")  # type: ignore[return-value]
    if suffix in (".xz", ".lzma"):
        return lzma.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


@contextlib.contextmanager
def atomic_path(target: str | Path) -> Iterator[Path]:
    """Yield a temporary path in ``target``'s folder; on success it replaces ``target`` atomically.

    Use it with writers that want a file name (e.g. ``safetensors.torch.save_file``). On an
    exception the temporary file is removed and ``target`` is left untouched.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        # mkstemp (and some writers) create the file 0600; give it the mode an ordinary open() would
        # (0666 minus umask), or a checkpoint written here would be unreadable to every other user.
        os.chmod(tmp, 0o666 & ~_umask())
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, target)
        _fsync_dir(target.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def _umask() -> int:
    mask = os.umask(0o022)  # the only portable way to read it is to set it and put it back
    os.umask(mask)
    return mask


def _fsync_dir(folder: Path) -> None:
    # Make the rename itself durable; not every platform lets a directory be opened.
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _write(target: str | Path, mode: str, data: str | bytes, **kw: str) -> None:
    with atomic_path(target) as tmp:
        f: IO
        with open(tmp, mode, **kw) as f:
            f.write(data)


def atomic_write_text(target: str | Path, text: str) -> None:
    """Replace ``target`` with ``text`` (UTF-8) atomically."""
    _write(target, "w", text, encoding="utf-8", newline="\n")


def atomic_write_bytes(target: str | Path, data: bytes) -> None:
    """Replace ``target`` with ``data`` atomically."""
    _write(target, "wb", data)


@contextlib.contextmanager
def atomic_dir(target: str | Path, *, replace: bool = True) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``target``; when the block completes, every file in it
    is fsynced and the folder takes ``target``'s place whole (`replace_dir`).

    On an exception the temporary folder is removed and ``target`` is left untouched. A writer killed
    outright leaves it behind as ``.NAME.tmp-PID`` (never mistaken for ``target``); the next write of
    ``target`` clears it (`clear_stale`). With ``replace=False`` a ``target`` that exists when the block
    completes wins and the new folder is discarded: for content that any of several processes may
    fetch at once, where the first complete copy is as good as the next.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    clear_stale(target.parent, lambda name: name == target.name)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        _fsync_tree(tmp)
        if replace:
            replace_dir(tmp, target)
        else:
            try:
                os.replace(tmp, target)  # refused when another writer's complete folder is already there
            except OSError:
                if not target.is_dir():
                    raise
                shutil.rmtree(tmp, ignore_errors=True)
        _fsync_dir(target.parent)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _fsync_tree(folder: Path) -> None:
    """fsync every file under ``folder``, then the folders themselves (deepest first)."""
    for root, _, files in os.walk(folder, topdown=False):
        for name in files:
            path = os.path.join(root, name)
            if not os.path.islink(path):
                with open(path, "rb") as f:
                    os.fsync(f.fileno())
        _fsync_dir(Path(root))


def replace_dir(tmp: Path, final: Path) -> None:
    """Put the complete folder ``tmp`` in place of ``final`` (the swap at the end of `atomic_dir`).

    An existing ``final`` is first renamed aside to ``.NAME.old-PID`` and deleted once ``tmp`` is in
    place, so one of the two is whole at every moment.
    """
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)


_LEFT_OVER = re.compile(r"^\.(?P<name>.+)\.(?P<kind>tmp|old)-(?P<pid>\d+)$")


def _running(pid: int) -> bool:
    """Whether ``pid`` is another live process on this machine (this process's own leftovers are stale:
    it writes one target at a time)."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it exists but belongs to another user
        return True
    return True


def clear_stale(folder: str | Path, owns: Callable[[str], bool] = lambda name: True) -> list[Path]:
    """Remove the ``.NAME.tmp-PID`` / ``.NAME.old-PID`` folders a killed `atomic_dir` left in ``folder``,
    for the targets NAME that ``owns(NAME)`` accepts; return what was removed.

    Only leftovers of processes no longer running on this machine are touched, so a concurrent writer's
    folder stays. A kill between `replace_dir`'s two renames leaves no ``NAME`` but a whole
    ``.NAME.old-PID``: that one is put back as ``NAME`` (the previous complete version) rather than removed.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return []
    stale: dict[str, list[tuple[str, Path]]] = {}
    for p in folder.iterdir():
        m = _LEFT_OVER.match(p.name)
        if m and owns(m["name"]) and not _running(int(m["pid"])):
            stale.setdefault(m["name"], []).append((m["kind"], p))
    removed: list[Path] = []
    for name, found in stale.items():
        target = folder / name
        olds = sorted((p for kind, p in found if kind == "old"), key=lambda p: p.stat().st_mtime)
        if olds and not target.exists():
            os.replace(olds[-1], target)
            found = [(kind, p) for kind, p in found if p != olds[-1]]
        for _, p in found:
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            removed.append(p)
    return removed


def read_json_object(path: Path) -> dict:
    """A JSON file holding one object (a config, a tokenizer's settings), or a ValueError naming the
    file: not valid JSON, or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data
