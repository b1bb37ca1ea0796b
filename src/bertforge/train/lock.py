"""One run at a time in a folder: ``FOLDER/run.lock``, recording its holder as JSON, so that a second run
writing into the same ``--out`` is refused naming the holder. The lock is the operating system's (through
``filelock``), released by the kernel however the process ends: a killed run never blocks a folder.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import filelock

if TYPE_CHECKING:
    from bertforge.train.distributed import Distributed

__all__ = ["LOCK_FILE", "FolderInUse", "FolderLock", "run_lock", "folder_user"]

LOCK_FILE = "run.lock"


class FolderInUse(ValueError):
    """Another live process holds the folder's lock. ``owner``: what its lock file records (None: unreadable)."""

    def __init__(self, message: str, owner: dict[str, Any] | None = None):
        super().__init__(message)
        self.owner = owner

    def __reduce__(self) -> tuple[Any, ...]:  # pickled whole: `run_lock` sends it to every process
        return type(self), (str(self), self.owner)


def _read(path: Path) -> dict[str, Any] | None:
    """What a lock file records (None: unreadable)."""
    try:
        owner = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # UnicodeDecodeError included
        return None
    return owner if isinstance(owner, dict) and isinstance(owner.get("pid"), int) else None


def _who(owner: dict[str, Any] | None) -> str:
    """"process 4242 (started 2024-05-01 12:00:03)", with the host if it is another machine."""
    if owner is None:
        return "another process"
    host = owner.get("host")
    try:
        started = datetime.datetime.fromisoformat(str(owner.get("started"))).astimezone()
        when = f" (started {started:%Y-%m-%d %H:%M:%S})"
    except ValueError:  # not an ISO time
        when = ""
    return f"process {owner['pid']}" + (f" on {host}" if host and host != socket.gethostname() else "") + when


class FolderLock:
    """The lock of run folder ``folder`` (created if missing): ``with FolderLock(out): ...``, or `acquire` /
    `release`. Released, the lock file is removed, and so is a folder acquiring created that stayed empty."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.path = self.folder / LOCK_FILE
        self._lock: filelock.BaseFileLock | None = None
        self._created: list[Path] = []  # folders acquiring made, deepest first

    def __enter__(self) -> FolderLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()

    def _make_folder(self) -> None:
        missing = []
        for p in (self.folder, *self.folder.parents):
            if p.exists() or p.is_symlink():
                break
            missing.append(p)
        if self.folder.exists() and not self.folder.is_dir():
            raise ValueError(f"{self.folder} is a file, not a folder")
        self.folder.mkdir(parents=True, exist_ok=True)
        self._created = missing or self._created

    @staticmethod
    def _record(fd: int) -> None:
        """Write who holds the lock into the locked file (``filelock``'s ``on_acquired``)."""
        owner = {"pid": os.getpid(), "host": socket.gethostname(),
                 "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                 "command": " ".join(sys.argv)}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(owner) + "\n").encode("utf-8"), 0)

    def acquire(self) -> FolderLock:
        """Take the lock, or raise `FolderInUse`; return self."""
        if self._lock is not None:
            return self
        lock = filelock.FileLock(self.path, timeout=0, on_acquired=self._record, is_singleton=False,
                                 thread_local=False)
        for _ in range(100):  # another process may remove the file (or its empty folder) as it lets go
            self._make_folder()
            try:
                lock.acquire()
            except filelock.Timeout:
                if self.path.exists():
                    owner = _read(self.path)
                    raise FolderInUse(f"{self.folder} is in use by {_who(owner)}: wait for it, or stop it",
                                      owner) from None
                continue
            except FileNotFoundError:
                continue
            except OSError as e:
                if e.errno == errno.ELOOP:
                    raise ValueError(f"{self.path} is a symbolic link; a run's lock file must be a plain file: "
                                     "remove the link") from None
                raise
            self._lock = lock
            return self
        raise OSError(errno.EAGAIN, f"{self.path}: could not be locked (it keeps changing)")

    def release(self) -> None:
        """Let go of the lock (if held): remove the lock file, then the folders acquiring made if empty."""
        lock, self._lock = self._lock, None
        if lock is None:
            return
        try:  # removed while still held: a process waiting on this file finds it gone and takes a new one
            with contextlib.suppress(OSError):
                self.path.unlink()
        finally:
            lock.release()
        for p in self._created:
            try:
                p.rmdir()
            except OSError:  # not empty (or gone): it stays, and so do its parents
                break
        self._created = []

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.release()


@contextlib.contextmanager
def run_lock(folder: str | Path, dist: Distributed | None = None) -> Iterator[None]:
    """Hold ``folder``'s lock for the block, or raise `FolderInUse` (under torchrun: in every process)."""
    lock = FolderLock(folder)
    refusal: Exception | None = None
    if dist is None or dist.is_main:
        try:
            lock.acquire()
        except (OSError, ValueError) as e:  # FolderInUse, a file in the folder's place, an unwritable parent
            refusal = e
    if dist is not None and dist.enabled:
        shared = dist.gather_objects(refusal)[0]  # the main process's, pickled
        refusal = refusal or shared  # type: ignore[assignment]
    if refusal is not None:
        raise refusal
    try:
        yield
    finally:
        lock.release()


def folder_user(folder: str | Path) -> str | None:
    """Who holds ``folder``'s lock if another process does ("process 4242 (started ...)"), else None."""
    path = Path(folder) / LOCK_FILE
    if not path.is_file() or path.is_symlink():
        return None
    probe = filelock.FileLock(path, timeout=0, is_singleton=False, thread_local=False, preserve_lock_file=True)
    try:
        probe.acquire()
    except filelock.Timeout:
        owner = _read(path)
        mine = owner is not None and owner.get("pid") == os.getpid() and owner.get("host") == socket.gethostname()
        return None if mine else _who(owner)
    except OSError:
        return None
    probe.release()
    return None
