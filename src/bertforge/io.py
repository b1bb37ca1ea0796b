"""Crash-safe file writes: write a temporary file beside the target, fsync, then rename over it.

A reader (or a resumed run) sees either the old file or the new one in full, never a torn write,
whatever kills the writer (exception, SIGKILL, power loss after the fsync).
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import lzma
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO

__all__ = ["atomic_path", "atomic_write_text", "atomic_write_bytes", "replace_dir", "open_binary", "COMPRESSED_SUFFIXES"]

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


def replace_dir(tmp: Path, final: Path) -> None:
    """Put the complete folder ``tmp`` in place of ``final``: never a moment without one of them whole."""
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)
