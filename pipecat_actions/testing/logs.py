"""`capture_logs`: collect what loguru writes, to check it (for planted secrets, for ids).

::

    with capture_logs() as lines:
        await run_conversation(...)
    assert find_secrets("".join(lines), planted) == {}

Each captured line holds the level, the logger's module, the message and the record's
``extra`` (where correlation ids and bound values live), as a sink would see them: after the
redaction patcher, if one is installed.
"""

from __future__ import annotations

__all__ = ["CAPTURE_FORMAT", "capture_logs"]

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from loguru import logger

if TYPE_CHECKING:
    from loguru import Record

CAPTURE_FORMAT = "{level} | {name}:{function}:{line} | {message} | {extra}"
"""The format of a captured line."""


@contextmanager
def capture_logs(
    level: str | int = "DEBUG", *, format: str | Callable[[Record], str] = CAPTURE_FORMAT
) -> Iterator[list[str]]:
    """Add a loguru sink at ``level`` for the duration of the block; yield its lines.

    Args:
        level: The lowest level captured (DEBUG by default, where Pipecat logs tool-call
            arguments and whole contexts).
        format: The loguru format of a line (a format string, or a format function).
    """
    lines: list[str] = []
    sink = logger.add(
        lambda message: lines.append(str(message)),
        level=level,
        format=format,
        colorize=False,
        backtrace=False,
        diagnose=False,
    )
    try:
        yield lines
    finally:
        logger.remove(sink)
