"""What an approver is asked to approve, in words: ``confirmation.summary``.

A summary is a template over the call's arguments and the before-state the action's
``snapshot`` hook recorded when the request was made::

    summary: "Transfer {rx_id} for {before.patient_name} from {before.pharmacy} to {to_pharmacy}"

``{name}`` is an argument, ``{before.name}`` a field of the before-state; either may go on into
a nested mapping (``{card.last4}``, ``{before.patient.name}``). ``{{`` and ``}}`` are literal
braces. The template is checked when the policy loads (`check_summary`; the tool's
``arguments`` and ``before_state_fields``, when declared, name what it may use) and filled in
where it is shown (`render_summary`) from what the ledger holds, as parts: the template's own
text, a value, or a field the request does not hold, which every view marks as missing rather
than leaving a gap. The parts are plain text: whoever shows them escapes them (the console's
templates, the CLI's `printable`), so an argument cannot write markup into a page.
"""

from __future__ import annotations

__all__ = [
    "BEFORE",
    "SummaryPart",
    "check_summary",
    "render_summary",
    "summary_placeholders",
    "summary_text",
]

import json
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from pipecat_actions._printable import bounded, quoted

BEFORE = "before"
"""The first name of a placeholder that reads the before-state (``{before.patient_name}``)."""

_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
_VALUE_CHARS = 200
"""The most characters one value shows (an argument can be long; a summary is one line)."""


@dataclass(frozen=True, slots=True)
class SummaryPart:
    """One piece of a filled-in summary.

    Attributes:
        text: The template's own text, a value, or (``missing``) the placeholder's path.
        kind: ``text``, ``value`` or ``missing``.
    """

    text: str
    kind: Literal["text", "value", "missing"]


def summary_placeholders(template: str) -> tuple[tuple[str, ...], ...]:
    """Return the paths a summary template reads, as tuples of names, in order.

    Raises:
        ValueError: The braces do not balance, a placeholder is not a dotted name
            (``{}``, ``{x[0]}``, ``{x!r}``, ``{x:>4}``), or ``{before}`` names no field.
    """
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValueError(f"{quoted(template)} is not a valid template: {exc}") from None
    paths: list[tuple[str, ...]] = []
    for _literal, field, spec, conversion in parsed:
        if field is None:
            continue
        written = field + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "")
        shown = bounded("{" + written + "}", 40)
        if not _PATH.fullmatch(field) or conversion or spec:
            raise ValueError(
                f"placeholder {shown} in {quoted(template)} must be an argument name or a "
                "field of the before-state, like {rx_id} or {before.patient_name}"
            )
        path = tuple(field.split("."))
        if path == (BEFORE,):
            raise ValueError(
                f"placeholder {{before}} in {quoted(template)} must name a field of the "
                "before-state, like {before.patient_name}"
            )
        paths.append(path)
    return tuple(paths)


def check_summary(value: str) -> str:
    """Return ``value`` if it is a summary template (see `summary_placeholders`)."""
    if not value.strip():
        raise ValueError("must not be empty; leave it out to show the arguments only")
    summary_placeholders(value)
    return value


def _look_up(data: Any, path: tuple[str, ...]) -> tuple[bool, Any]:
    for name in path:
        if not isinstance(data, Mapping) or name not in data:
            return False, None
        data = data[name]
    return True, data


def _shown(value: Any) -> str:
    if isinstance(value, str):
        text = value
    elif isinstance(value, bool) or value is None:
        text = json.dumps(value)
    elif isinstance(value, int | float):
        text = str(value)
    else:
        text = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
    return text if len(text) <= _VALUE_CHARS else f"{text[: _VALUE_CHARS - 1]}…"


def render_summary(template: str, args: Any, before_state: Any) -> tuple[SummaryPart, ...]:
    """Fill ``template`` in from a request's arguments and before-state.

    Args:
        template: A template `check_summary` accepts (recorded with the request).
        args: The arguments the ledger holds.
        before_state: The before-state the ledger holds (None: no snapshot was taken).

    Returns:
        The parts in order; a placeholder the request does not hold is a ``missing`` part
        whose text is its path (``before.patient_name``). A template that no longer parses
        (written by hand into the ledger) is one ``missing`` part holding it.
    """
    try:
        parsed = list(string.Formatter().parse(template))
        summary_placeholders(template)
    except ValueError:
        return (SummaryPart(template, "missing"),)
    parts: list[SummaryPart] = []
    for literal, field, _conversion, _spec in parsed:
        if literal:
            parts.append(SummaryPart(literal, "text"))
        if field is None:
            continue
        path = tuple(field.split("."))
        source, within = (before_state, path[1:]) if path[0] == BEFORE else (args, path)
        found, value = _look_up(source, within)
        parts.append(
            SummaryPart(_shown(value), "value") if found else SummaryPart(field, "missing")
        )
    return tuple(parts)


def summary_text(parts: tuple[SummaryPart, ...]) -> str:
    """The parts as one line of text, a missing field as ``[missing: before.patient_name]``."""
    return "".join(
        f"[missing: {part.text}]" if part.kind == "missing" else part.text for part in parts
    )
