"""SIGINT and SIGTERM as a request to stop a run cleanly: finish the step, save a checkpoint, stop."""

from __future__ import annotations

import contextlib
import logging
import signal
from typing import Any

__all__ = ["StopSignals"]

logger = logging.getLogger("bertforge")


class StopSignals:
    """SIGINT / SIGTERM set a flag the loop checks between steps (a second SIGINT interrupts at once)."""

    def __init__(self) -> None:
        self.requested = False
        self.signum = 0
        self._old: dict[int, Any] = {}

    def __enter__(self) -> StopSignals:
        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(ValueError):  # not the main thread: no handlers, the run stops only at its end
                self._old[sig] = signal.signal(sig, self._handle)
        return self

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = True
        self.signum = self.signum or signum
        logger.warning("signal %d: saving a checkpoint after this step, then stopping", signum)

    def __exit__(self, *exc: object) -> None:
        for sig, old in self._old.items():
            signal.signal(sig, old)
