"""One run at a time in a folder: a lock file that the running process holds.

Two runs writing into one ``--out`` would each do all the work, append each metrics line twice, and
trip over each other's temporary checkpoint folders. A run therefore holds ``FOLDER/run.lock``, which
records who holds it (process id, host, start time, command line) as JSON, and a second run into
that folder is refused with one line naming the holder::

    runs/base is in use by process 4242 (started 2024-05-01 12:00:03): wait for it, or stop it

Where ``fcntl`` exists (Linux, macOS), the lock is ``flock(LOCK_EX | LOCK_NB)`` on the open file for
as long as the run lasts: the kernel lets go of it when the process ends, however it ends, so a run
killed with ``kill -9`` never leaves a folder blocked. Elsewhere (Windows) the file is created with
``O_CREAT | O_EXCL`` and a lock whose recorded process no longer runs on this machine is taken over.
The file is removed when the lock is let go of; one left behind by a killed process is no result of a
run (`bertforge.train.rundir.run_files` does not list it) and is reused by the next run.

`FolderLock` is the lock as a context manager; `run_lock` is the one a run takes around all it does
with its folder, in its main process only under torchrun, every process raising the main one's
refusal. Forked children (data-loader workers) close their copies of the lock files, so a lock never
outlives the process that took it.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import logging
import os
import socket
import sys
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bertforge.io import process_alive

if TYPE_CHECKING:
    from bertforge.train.distributed import Distributed

try:
    import fcntl
except ImportError:  # Windows: exclusive creation and a liveness check of the recorded process
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCK_FILE", "FolderInUse", "FolderLock", "run_lock", "folder_user"]

logger = logging.getLogger("bertforge")

LOCK_FILE = "run.lock"
"""The lock's file name inside the folder it guards."""
UNWRITTEN_GRACE_SECONDS = 60.0
"""Without ``fcntl``: how old an empty or unreadable lock file must be to count as left by a crash (its
owner writes it right after creating it)."""

_NO_FLOCK = {errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS}
"""What ``flock`` raises on a file system without locks (some network and FUSE file systems)."""


class FolderInUse(ValueError):
    """Another live process holds the folder's lock. ``owner``: what its lock file records (None: unreadable)."""

    def __init__(self, message: str, owner: dict[str, Any] | None = None):
        super().__init__(message)
        self.owner = owner

    def __reduce__(self) -> tuple[Any, ...]:  # pickled whole: `run_lock` sends it to every process
        return type(self), (str(self), self.owner)


def _host() -> str:
    return socket.gethostname()


def _parse(text: str) -> dict[str, Any] | None:
    try:
        owner = json.loads(text)
    except ValueError:
        return None
    return owner if isinstance(owner, dict) and isinstance(owner.get("pid"), int) else None


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return _parse(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError):
        return None


def _read_fd(fd: int) -> dict[str, Any] | None:
    try:
        return _parse(os.pread(fd, 1 << 16, 0).decode("utf-8"))
    except (OSError, UnicodeDecodeError):
        return None


def _when(started: Any) -> str:
    """An ISO time as local ``YYYY-MM-DD HH:MM:SS`` ("" if it is not one)."""
    try:
        return datetime.datetime.fromisoformat(str(started)).astimezone().strftime("%Y-%m-%d %H:%M:%S")
    except ValueError:
        return ""


def _who(owner: dict[str, Any] | None) -> str:
    """"process 4242 (started 2024-05-01 12:00:03)", with the host if it is another machine."""
    if owner is None:
        return "another process"
    host = owner.get("host")
    when = _when(owner.get("started"))
    return (f"process {owner['pid']}" + (f" on {host}" if host and host != _host() else "")
            + (f" (started {when})" if when else ""))


def _in_use(folder: Path, owner: dict[str, Any] | None) -> FolderInUse:
    return FolderInUse(f"{folder} is in use by {_who(owner)}: wait for it, or stop it", owner)


def _unlocked_stale(path: Path, owner: dict[str, Any] | None) -> bool:
    """Without ``fcntl``: whether a lock file was left by a process that is gone."""
    if owner is None:
        try:
            return time.time() - path.stat().st_mtime > UNWRITTEN_GRACE_SECONDS
        except FileNotFoundError:
            return True
    return owner.get("host") == _host() and not process_alive(int(owner["pid"]))


_LIVE: weakref.WeakSet[FolderLock] = weakref.WeakSet()
"""Every lock this process holds (forked children close their copies of these files)."""


class FolderLock:
    """The lock of run folder ``folder`` (created if missing): ``with FolderLock(out): ...``, or `acquire` /
    `release`. Acquiring raises `FolderInUse` when another live process holds it, without changing the
    folder. Released, the lock file is removed, and so is the folder if acquiring created it and it stayed
    empty."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.path = self.folder / LOCK_FILE
        self._fd: int | None = None
        self._created: list[Path] = []  # folders acquiring made, deepest first

    @property
    def held(self) -> bool:
        return self._fd is not None

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
        if missing:
            self._created = missing

    def _record(self) -> bytes:
        owner = {"pid": os.getpid(), "host": _host(),
                 "started": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
                 "command": " ".join(sys.argv)}
        return (json.dumps(owner) + "\n").encode("utf-8")

    def acquire(self) -> FolderLock:
        """Take the lock, or raise `FolderInUse`; return self."""
        if self._fd is not None:
            return self
        for _ in range(100):  # another process may remove the file (or its empty folder) as it lets go
            try:
                self._make_folder()
                fd = self._flock() if fcntl is not None else self._create()
            except FileNotFoundError:
                continue
            if fd is None:
                continue
            self._fd = fd
            _LIVE.add(self)
            return self
        raise OSError(errno.EAGAIN, f"{self.path}: could not be locked (it keeps changing)")

    def _flock(self) -> int | None:
        """The locked descriptor of the lock file; None: the file was replaced meanwhile (try again)."""
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise _in_use(self.folder, _read_fd(fd)) from None
            except OSError as e:
                if e.errno not in _NO_FLOCK:
                    raise
                logger.warning("%s cannot be locked on this file system (%s): runs into %s are not kept apart",
                               self.path, e.strerror, self.folder)
            held, now = os.fstat(fd), os.stat(self.path)  # FileNotFoundError: removed as its holder let go
            if (held.st_dev, held.st_ino) != (now.st_dev, now.st_ino):
                os.close(fd)
                return None
            os.ftruncate(fd, 0)
            os.pwrite(fd, self._record(), 0)
            return fd
        except BaseException:
            with contextlib.suppress(OSError):
                os.close(fd)
            raise

    def _create(self) -> int | None:
        """The descriptor of the lock file created exclusively; None: a stale one was removed (try again)."""
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            owner = _read(self.path)
            if not _unlocked_stale(self.path, owner):
                raise _in_use(self.folder, owner) from None
            logger.info("removing %s, left by %s, which no longer runs", self.path,
                        f"process {owner['pid']}" if owner else "a process")
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            return None
        os.write(fd, self._record())
        return fd

    def release(self) -> None:
        """Let go of the lock (nothing if not held): remove the lock file, then the folders acquiring made
        if they are empty."""
        fd, self._fd = self._fd, None
        if fd is None:
            return
        _LIVE.discard(self)
        try:
            if fcntl is not None:  # removed while still held: a process that opened this file sees it was replaced
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()
        finally:
            os.close(fd)
        if fcntl is None:  # an open file cannot be removed on Windows
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
        for p in self._created:
            try:
                p.rmdir()
            except OSError:  # not empty (or gone): it stays, and so do its parents
                break
        self._created = []

    def __del__(self) -> None:
        with contextlib.suppress(Exception):
            self.release()

    def _forget_in_child(self) -> None:
        """In a forked child: close this copy of the descriptor without unlocking (the parent still holds it)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)


def _after_fork_in_child() -> None:
    for lock in list(_LIVE):
        lock._forget_in_child()
    _LIVE.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


@contextlib.contextmanager
def run_lock(folder: str | Path, dist: Distributed | None = None) -> Iterator[None]:
    """Hold ``folder``'s lock (created if missing) for the ``with`` block, or raise `FolderInUse`; let go
    of it when the block ends, however it ends (and remove the folder if taking the lock created it and
    it stayed empty: a run refused or failing before it wrote anything leaves nothing behind).

    Under torchrun (``dist``: the run's `bertforge.train.distributed.Distributed`) only the main process
    takes the lock, and every process raises its refusal: the others would otherwise wait for it at
    their next barrier. Every process must enter the block."""
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
    """Who holds ``folder``'s lock, e.g. "process 4242 (started 2024-05-01 12:00:03)", if another live
    process does (None: nobody does, or this process). Reads only: the folder is not changed."""
    path = Path(folder) / LOCK_FILE
    if any(lock.held and lock.path == path for lock in list(_LIVE)):
        return None
    if fcntl is None:
        if not path.is_file():
            return None
        owner = _read(path)
        return None if _unlocked_stale(path, owner) else _who(owner)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return _who(_read_fd(fd))
        return None
    finally:
        os.close(fd)  # a shared lock taken here goes with it
