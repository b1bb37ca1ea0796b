"""The C library's allocator tuned for training steps that allocate the same large buffers every time."""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

__all__ = ["keep_freed_memory"]


def keep_freed_memory() -> bool:
    """Ask glibc to keep freed memory for reuse instead of returning large blocks to the OS, which it
    would map afresh, page faults included, at every step (about 10% of a BERT-base CPU step).
    Process-wide; a no-op (False) where the C library is not glibc."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return False
    m_trim_threshold, m_mmap_max = -1, -4
    return bool(libc.mallopt(m_mmap_max, 0)) and bool(libc.mallopt(m_trim_threshold, 1 << 30))
