"""Showing the library's log messages on the console (the CLI's job; library code only logs)."""

from __future__ import annotations

import logging
import sys

__all__ = ["show_logs"]


def show_logs(verbose: bool = False) -> None:
    """Print the "bertforge" logger's messages as plain lines on stdout: INFO and above (DEBUG with
    ``verbose``). Calling it again changes only the level."""
    logger = logging.getLogger("bertforge")
    logger.setLevel(logging.DEBUG if verbose else logging.INFO)
    if not any(getattr(h, "_bertforge_console", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stdout)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler._bertforge_console = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
