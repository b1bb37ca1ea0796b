"""What a person at a terminal sees of bertforge's log: its messages as plain lines, and progress bars
that redraw in place on a terminal but write one line at intervals to a file or a pipe.

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
from typing import Any, TextIO

__all__ = ["errors_only", "progress_bar", "show_logs", "LINE_INTERVAL"]

LOGGER = "bertforge"
LINE_INTERVAL = 30.0
"""Seconds between a progress bar's lines where stderr is not a terminal (a log file, a pipe, CI)."""


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


class _Lines:
    """A progress bar's stream off a terminal: each redraw becomes one line of its own (tqdm returns the
    carriage and pads a redraw to the last one's width, which a file keeps as one ever-growing line)."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def write(self, text: str) -> None:
        line = text.replace("\r", "").rstrip()
        if line:
            self.stream.write(line + "\n")

    def flush(self) -> None:
        self.stream.flush()


def _on_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a stream without a terminal, or closed
        return False


def progress_bar(**settings: Any) -> Any:
    """A tqdm progress bar on stderr (``settings`` are tqdm's): redrawn in place on a terminal or in a
    notebook; elsewhere a line every `LINE_INTERVAL` seconds and one at the end, so a log file stays
    readable."""
    if _on_terminal(sys.stderr) or "ipykernel" in sys.modules:
        from tqdm.auto import tqdm

        return tqdm(dynamic_ncols=True, **settings)
    from tqdm import tqdm

    settings.pop("dynamic_ncols", None)
    return tqdm(file=_Lines(sys.stderr), mininterval=LINE_INTERVAL, ncols=100, **settings)
