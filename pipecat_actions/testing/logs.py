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

__all__ = ["CAPTURE_FORMAT", "capture_logs", "find_secrets"]

import json
import re
from collections.abc import Callable, Iterable, Iterator
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


def find_secrets(text: str, secrets: Iterable[str]) -> dict[str, int]:
    """Count the planted ``secrets`` that appear in ``text``; return only those found.

    For a test harness that captured log output: a secret counts when it appears as written,
    JSON-escaped, or (for a card number) as its digits with other separators (spaces,
    dashes, dots, slashes, any one character that is not a letter or digit).

    Args:
        text: The captured log text.
        secrets: The values planted in tool arguments.

    Returns:
        ``{secret: occurrences}`` for every secret found at least once.
    """
    found: dict[str, int] = {}
    for secret in secrets:
        forms = {secret, json.dumps(secret)[1:-1]}
        digits = re.sub(r"[\W_]", "", secret)
        count = sum(text.count(form) for form in forms if form)
        if digits.isdigit() and len(digits) >= 12:
            spaced = r"[\W_]?".join(digits)
            count = max(count, len(re.findall(rf"(?<!\d){spaced}(?!\d)", text)))
        if count:
            found[secret] = count
    return found
