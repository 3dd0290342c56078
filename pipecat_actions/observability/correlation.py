"""Correlation ids on log lines: which session, turn, tool call and operation a line is about.

Every log line the runtime writes about an operation carries, in loguru's ``extra``:
``session_id``, ``turn_id`` (the user turn), ``generation`` (the LLM response that proposed
the call), ``tool_call_id`` (the provider's id), ``operation_id`` and ``tool``, whichever are
known at that point. Lines written while a call is being admitted or run, including the
application's own effect and hook code, get them from `logger.contextualize` (the effect runs
in a task that inherits the context); lines written elsewhere about an operation (the watchdog,
recovery, the operator CLI) bind them with `operation_logger`.

A sink can print them one by one (``{extra[operation_id]}``, only on lines that have it) or,
on every line, the ready-made ``{extra[correlation]}`` that the redaction patcher adds
(``session=call-1 turn=2 gen=3 call=call_7 op=op_0190…``, empty on lines about nothing).
`LOG_FORMAT` prints it on every line, also on lines logged before the patcher is installed::

    logger.add(sys.stderr, format=LOG_FORMAT)
"""

from __future__ import annotations

__all__ = [
    "CORRELATION_KEYS",
    "LOG_FORMAT",
    "correlation_text",
    "log_format",
    "operation_ids",
    "operation_logger",
]

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from loguru import logger

if TYPE_CHECKING:
    from loguru import Logger, Record

    from pipecat_actions.ledger import Operation

CORRELATION_KEYS: tuple[tuple[str, str], ...] = (
    ("session_id", "session"),
    ("turn_id", "turn"),
    ("generation", "gen"),
    ("tool_call_id", "call"),
    ("operation_id", "op"),
    ("tool", "tool"),
)
"""The ``extra`` keys that correlate a line, with the short label `correlation_text` uses."""

_FORMAT = (
    "<green>{time:YYYY-MM-DD HH:mm:ss.SSS}</green> | <level>{level: <8}</level> | "
    "<cyan>{name}</cyan>:<cyan>{line}</cyan> - <level>{message}</level> "
    "<dim>{extra[correlation]}</dim>\n{exception}"
)


def log_format(record: Record) -> str:
    """A loguru format (a format function) showing the correlation ids of every line.

    Works on any line, whenever it is logged: the redaction patcher that
    `ActionRuntime.create` installs adds ``extra["correlation"]`` (from the redacted ids);
    before it is installed, or where it is not, the ids are rendered here.
    """
    extra = record["extra"]
    if "correlation" not in extra:
        extra["correlation"] = correlation_text(extra)
    return _FORMAT


LOG_FORMAT = log_format
"""The suggested format: ``logger.add(sys.stderr, format=LOG_FORMAT)`` (see `log_format`)."""


def correlation_text(extra: Mapping[str, Any]) -> str:
    """Render the correlation ids present in ``extra`` as ``label=value`` pairs."""
    return " ".join(
        f"{label}={extra[key]}" for key, label in CORRELATION_KEYS if extra.get(key) is not None
    )


def operation_ids(op: Operation) -> dict[str, Any]:
    """Return the correlation ids of a ledger operation (the generation is not stored on it)."""
    return {
        "session_id": op.session_id,
        "turn_id": op.turn_id,
        "tool_call_id": op.provider_call_id,
        "operation_id": op.operation_id,
        "tool": op.tool,
    }


def operation_logger(op: Operation) -> Logger:
    """Return the logger bound to ``op``'s correlation ids."""
    return logger.bind(**operation_ids(op))
