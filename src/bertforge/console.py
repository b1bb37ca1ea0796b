"""What a person at a terminal sees of bertforge's log: its messages as plain lines.

The library never prints; it logs to the ``bertforge`` logger (progress lines, a run's summary, the
demo's report at INFO; problems at WARNING). `show_logs` is how the command line makes that log its
output: INFO (and DEBUG with ``verbose``) as plain lines on stdout, warnings and errors on stderr in
the standard ``LEVEL:logger:message`` form.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator
from typing import TextIO

__all__ = ["errors_only", "show_logs"]

LOGGER = "bertforge"


class _ConsoleHandler(logging.StreamHandler):
    """A stream handler that writes to whatever ``sys.stdout`` / ``sys.stderr`` is at the time of each
    message (a redirected or captured stream too), not to the one present when it was installed."""

    def __init__(self, name: str, fmt: str, below_warning: bool) -> None:
        super().__init__()
        self._name = name
        self.setFormatter(logging.Formatter(fmt))
        if below_warning:
            self.addFilter(lambda record: record.levelno < logging.WARNING)
        else:
            self.setLevel(logging.WARNING)

    @property  # type: ignore[override]
    def stream(self) -> TextIO:
        return getattr(sys, self._name)

    @stream.setter
    def stream(self, value: TextIO) -> None:  # StreamHandler.__init__ sets one; the property decides
        pass


def show_logs(verbose: bool = False, stream: str = "stdout") -> None:
    """Print the ``bertforge`` logger's messages: INFO (DEBUG if ``verbose``) as plain lines on
    ``stream`` ("stdout", or "stderr" for a command whose stdout is data to pipe on), WARNING and above
    on stderr; a second call replaces the first. The messages stop at this logger: the root logger's
    handlers would show each line a second time."""
    if stream not in ("stdout", "stderr"):
        raise ValueError(f"stream must be stdout or stderr, got {stream!r}")
    logger = logging.getLogger(LOGGER)
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    logger.handlers[:] = [h for h in logger.handlers if not isinstance(h, _ConsoleHandler)]
    logger.addHandler(_ConsoleHandler(stream, "%(message)s", below_warning=True))
    logger.addHandler(_ConsoleHandler("stderr", logging.BASIC_FORMAT, below_warning=False))
    logger.propagate = False


@contextlib.contextmanager
def errors_only() -> Iterator[None]:
    """Only the library's errors while one run of many goes (a curve's, a study's): each would log its
    settings, its fresh head and its result; the caller logs a line a run instead, and each run's
    metrics are in its folder."""
    def keep(record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR

    logger = logging.getLogger(LOGGER)
    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)
