"""Crash-safe writes: write under a temporary name beside the target, fsync, then rename over it, so
that a reader sees the old file or folder or the new one in full, whatever kills the writer. A write that
fails for want of space is a `NoSpaceError` naming the file or folder being written (`no_space`).
"""

from __future__ import annotations

import bz2
import contextlib
import errno
import functools
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

__all__ = ["atomic_path", "atomic_write_text", "atomic_write_texts", "atomic_dir", "replace_dir",
           "clear_stale", "append_text", "NoSpaceError", "no_space", "open_binary", "read_json_object",
           "COMPRESSED_SUFFIXES", "read_settings_file", "process_alive"]

_OPENERS: dict[str, Callable[..., IO[bytes]]] = {".gz": gzip.open, ".bz2": bz2.open, ".xz": lzma.open,
                                                   ".lzma": lzma.open}
COMPRESSED_SUFFIXES = tuple(_OPENERS)


def open_binary(path: str | Path) -> IO[bytes]:
    """Open a file for reading bytes, decompressing ``.gz``, ``.bz2``, ``.xz`` / ``.lzma`` on the fly."""
    return _OPENERS.get(Path(path).suffix.lower(), open)(path, "rb")


class NoSpaceError(OSError):
    """A write that failed on a full disk (ENOSPC) or quota (EDQUOT): "no space left on PATH"."""

    def __str__(self) -> str:
        return self.strerror or "no space left"


_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)
_NEARLY_FULL_BYTES = 1 << 20
"""Free space below which a writer's failure that gives no reason is taken for a full disk."""


def no_space(error: BaseException, target: str | Path, temporary: Path | None = None) -> OSError | None:
    """The `NoSpaceError` naming ``target`` that ``error``, raised while writing it, stands for, else None.
    A writer that drops the OS error (torch.save) leaves only the symptom, a nearly full folder: call this
    before removing the partial write."""
    if not isinstance(error, Exception):  # KeyboardInterrupt, SystemExit
        return None
    if isinstance(error, NoSpaceError) and not (temporary and error.filename
                                                and Path(error.filename).is_relative_to(temporary)):
        return error
    code = _full_errno(error)
    if code is None and not isinstance(error, (OSError, ValueError)) and _nearly_full(Path(target).parent):
        code = errno.ENOSPC
    if code is None:
        return None
    quota = " (disk quota exceeded)" if code == errno.EDQUOT else ""
    return NoSpaceError(code, f"no space left on {target}{quota}", str(target))


def _full_errno(error: BaseException) -> int | None:
    """ENOSPC or EDQUOT if ``error``, or an error it was raised from or while handling, is or reports one."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _FULL_ERRNOS:
            return current.errno
        for code in _FULL_ERRNOS:
            if os.strerror(code) in str(current):
                return code
        current = current.__cause__ or current.__context__
    return None


def _nearly_full(folder: Path) -> bool:
    try:
        return shutil.disk_usage(folder).free < _NEARLY_FULL_BYTES
    except OSError:
        return False


@contextlib.contextmanager
def _undone_on_failure(target: Path, undo: Callable[[], None], temporary: Path | None = None) -> Iterator[None]:
    """On an exception, ``undo()`` the partial write of ``target`` and re-raise, a full disk as the
    `NoSpaceError` and a refused write as a PermissionError, both naming ``target``."""
    try:
        yield
    except BaseException as e:
        full = no_space(e, target, temporary)
        undo()
        if full is None and isinstance(e, OSError) and e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise PermissionError(f"{target}: cannot write it ({e.strerror} in {target.parent})") from e
        if full is None or full is e:
            raise
        raise full from e


@contextlib.contextmanager
def atomic_path(target: str | Path) -> Iterator[Path]:
    """Yield a temporary path beside ``target`` that replaces it on success (on an exception: removed)."""
    target = Path(target)
    if target.is_dir():  # before anything is written: os.replace would name the temporary file
        raise IsADirectoryError(f"{target}: a folder is there; give a file's path")
    tmp: Path | None = None

    def remove() -> None:
        if tmp is not None:
            tmp.unlink(missing_ok=True)

    with _undone_on_failure(target, remove):
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        os.close(fd)
        tmp = Path(tmp_name)
        yield tmp
        # mkstemp (and some writers) create the file 0600; give it the mode an ordinary open() would
        # (0666 minus umask), or a checkpoint written here would be unreadable to every other user.
        os.chmod(tmp, 0o666 & ~_umask())
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, target)
        _fsync_dir(target.parent)


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


def atomic_write_text(target: str | Path, text: str) -> None:
    """Replace ``target`` with ``text`` (UTF-8) atomically."""
    target = Path(target)
    atomic_write_texts(target.parent, {target.name: text})


def atomic_write_texts(folder: str | Path, files: dict[str, str]) -> None:
    """Replace the files ``files`` names in ``folder`` with their texts (UTF-8), all or none."""
    with contextlib.ExitStack() as stack:
        for name, text in files.items():
            with open(stack.enter_context(atomic_path(Path(folder) / name)), "w", encoding="utf-8",
                      newline="\n") as f:
                f.write(text)


@contextlib.contextmanager
def atomic_dir(target: str | Path, *, replace: bool = True) -> Iterator[Path]:
    """Yield an empty temporary folder beside ``target`` that, fsynced, takes ``target``'s place whole when
    the block completes (on an exception it is removed). ``replace=False``: a ``target`` already there wins
    (content several processes may fetch at once)."""
    target = Path(target)
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    with _undone_on_failure(target, lambda: shutil.rmtree(tmp, ignore_errors=True), tmp):
        target.parent.mkdir(parents=True, exist_ok=True)
        clear_stale(target.parent, lambda name: name == target.name)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
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


def append_text(path: str | Path, text: str) -> None:
    """Append ``text`` (UTF-8) to ``path``, all of it or nothing, so a file never ends in a torn line."""
    path = Path(path)
    data = memoryview(text.encode("utf-8"))
    start: int | None = None

    def cut() -> None:
        if start is not None:
            os.truncate(path, start)

    with _undone_on_failure(path, cut), open(path, "ab", buffering=0) as f:
        start = f.seek(0, os.SEEK_END)
        while data:
            data = data[f.write(data):]


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
    """Put the folder ``tmp`` in place of ``final``, the old one kept aside (``.NAME.old-PID``) until then."""
    if final.exists():
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        shutil.rmtree(old, ignore_errors=True)
        os.replace(final, old)
        os.replace(tmp, final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, final)


_LEFT_OVER = re.compile(r"^\.(?P<name>.+)\.(?P<kind>tmp|old)-(?P<pid>\d+)$")


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs on this machine."""
    if pid <= 0:
        return False
    if os.name == "nt":
        import ctypes

        kernel32 = ctypes.windll.kernel32  # type: ignore[attr-defined]
        handle = kernel32.OpenProcess(0x1000, False, pid)  # PROCESS_QUERY_LIMITED_INFORMATION
        if not handle:
            return ctypes.GetLastError() == 5  # ERROR_ACCESS_DENIED: it exists, as another user's
        try:
            code = ctypes.c_ulong()
            return not kernel32.GetExitCodeProcess(handle, ctypes.byref(code)) or code.value == 259  # STILL_ACTIVE
        finally:
            kernel32.CloseHandle(handle)
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # it exists but belongs to another user
        return True
    return True


def clear_stale(folder: str | Path, owns: Callable[[str], bool] = lambda name: True) -> list[Path]:
    """Remove and return the ``.NAME.tmp-PID`` / ``.NAME.old-PID`` leftovers of dead processes in ``folder``
    for the NAMEs ``owns`` accepts; a ``.NAME.old-PID`` without a ``NAME`` is put back as ``NAME``."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    stale: dict[str, list[tuple[str, Path]]] = {}
    for p in folder.iterdir():
        m = _LEFT_OVER.match(p.name)
        # This process's own leftovers are stale too: it writes one target at a time.
        if m and owns(m["name"]) and (int(m["pid"]) == os.getpid() or not process_alive(int(m["pid"]))):
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
    """A JSON file holding one object, or a ValueError naming the file."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return data


def read_settings_file(path: str | Path, what: str = "config file") -> object:
    """The content of a JSON or YAML file, or a ValueError naming the file (``what``: its role). A key twice in
    one mapping, and a YAML integer with a leading zero (YAML 1.1 reads ``010`` as octal 8), are refused:
    either would silently be another setting than the one written."""
    try:
        text = Path(path).read_text(encoding="utf-8")
        if str(path).endswith((".yaml", ".yml")):
            import yaml

            return yaml.load(text, Loader=_strict_yaml_loader())  # noqa: S506 - a SafeLoader subclass
        return json.loads(text, object_pairs_hook=_unique_keys)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: cannot read the {what} ({e})") from e
    except _DuplicateKey as e:
        raise ValueError(f"{path}: {e}") from None
    except Exception as e:  # noqa: BLE001 - yaml's errors (YAMLError) without importing yaml up front
        mark, problem = getattr(e, "problem_mark", None), getattr(e, "problem", None)
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ValueError(f"{path}{where}: not valid YAML ({problem or ' '.join(str(e).split())})") from e


class _DuplicateKey(ValueError):
    """A JSON object holding a key twice."""


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """A JSON object's pairs as a dict, a key given twice refused."""
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(f"the key {key!r} is given twice in one object")
        out[key] = value
    return out


@functools.lru_cache(maxsize=None)
def _strict_yaml_loader() -> type:
    """yaml's SafeLoader, refusing a key twice in one mapping and an integer written with a leading zero."""
    import yaml
    from yaml.constructor import ConstructorError

    class StrictLoader(yaml.SafeLoader):
        def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:  # type: ignore[override]
            self.flatten_mapping(node)
            seen: dict[object, int] = {}
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=True)
                if key in seen:
                    raise ConstructorError(None, None, f"the key {key!r} is given twice in one mapping (first at "
                                                       f"line {seen[key] + 1})", key_node.start_mark)
                seen[key] = key_node.start_mark.line
            return super().construct_mapping(node, deep)

        def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
            text = str(self.construct_scalar(node)).replace("_", "")
            if re.fullmatch(r"[-+]?0[0-9]+", text):
                raise ConstructorError(None, None, f"{text} has a leading zero, which YAML reads as an octal "
                                                   "number; write it without the zero (or quote it)",
                                       node.start_mark)
            return super().construct_yaml_int(node)

    StrictLoader.add_constructor("tag:yaml.org,2002:int", StrictLoader.construct_yaml_int)
    return StrictLoader
