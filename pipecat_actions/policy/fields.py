"""Checked value types shared by the policy models: names, paths, templates, spoken text.

Every check lives in an ``Annotated`` type rather than in a model validator, so the same check
runs on a tool's own entry, on ``defaults:``, and on the merged result, and a mistake is
reported at the key where it was written.
"""

from __future__ import annotations

__all__ = [
    "CANCEL_TOOL_PREFIX",
    "OUTCOME_WORDS",
    "AgentName",
    "AgentNames",
    "Announcement",
    "ApproverName",
    "ApproverNames",
    "ArgumentName",
    "ArgumentNames",
    "PlainData",
    "RedactPath",
    "RedactPaths",
    "SensitivePath",
    "SummaryTemplate",
    "Template",
    "ToolName",
    "cancel_tool_name",
    "check_approver_name",
    "number_text",
    "redact_root",
    "render_template",
    "template_placeholders",
]

import math
import re
import string
from collections.abc import Mapping
from typing import Annotated, Any

from pydantic import AfterValidator, Strict

from pipecat_actions._printable import bounded, quoted
from pipecat_actions.policy.summary import check_summary

_TOOL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NAME = r"[A-Za-z_][A-Za-z0-9_]*"
_INDEX = r"\[(?:\*|[0-9]+)\]"
_REDACT_PATH = re.compile(rf"{_NAME}(?:{_INDEX})*(?:\.{_NAME}(?:{_INDEX})*)*")

OUTCOME_WORDS: tuple[str, ...] = (
    "booked",
    "canceled",
    "cancelled",
    "charged",
    "completed",
    "confirmed",
    "done",
    "finished",
    "refunded",
    "reserved",
    "succeeded",
    "successful",
    "successfully",
)
"""Words an ``announce`` or filler text may not contain: it is spoken before the outcome."""

CANCEL_TOOL_PREFIX = "cancel_"
"""The model stops a call of ``book_table`` with ``cancel_book_table`` (Pipecat's naming)."""

_OUTCOME = re.compile(r"\b(" + "|".join(OUTCOME_WORDS) + r")\b", re.IGNORECASE)


def cancel_tool_name(tool: str) -> str:
    """The name of the tool the model calls to stop a call of ``tool`` (``cancel_<tool>``)."""
    return f"{CANCEL_TOOL_PREFIX}{tool}"


_SHOWN_NUMBER_LIMIT = 10**40


def number_text(value: int) -> str:
    """A whole number from a policy as a problem shows it: written out, unless it is huge.

    Python will not even write a number of more than 4300 digits, and none of 40 is worth
    reading in a problem line.
    """
    if -_SHOWN_NUMBER_LIMIT < value < _SHOWN_NUMBER_LIMIT:
        return str(value)
    return "a number of more than 40 digits"


def _check_tool_name(value: str) -> str:
    if not _TOOL_NAME.fullmatch(value):
        raise ValueError(
            f"{quoted(value, 100)} is not a valid tool name: use letters, digits and "
            "underscores, start with a letter or underscore, at most 64 characters"
        )
    return value


def _check_argument_name(value: str) -> str:
    if not _TOOL_NAME.fullmatch(value):
        raise ValueError(
            f"{quoted(value, 100)} is not a valid argument name: use letters, digits and "
            "underscores, start with a letter or underscore, at most 64 characters"
        )
    return value


def _check_agent_name(value: str) -> str:
    if not value.strip() or value != value.strip():
        raise ValueError(
            f"{quoted(value)} is not an agent name: use non-blank text without leading or "
            "trailing spaces"
        )
    return value


_APPROVER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@:+-]{0,127}")


def check_approver_name(value: str) -> str:
    """Return ``value`` if it is an approver's name or role, else raise `ValueError`.

    A name or role is at most 128 letters, digits and ``. _ @ : + -``, starting with a letter or
    digit: an operator's login (``rosa``, ``rosa@example.com``, ``manager:rosa``) or a group
    (``billing-leads``). Nothing in it can hide another name when printed.
    """
    if not isinstance(value, str) or not _APPROVER_NAME.fullmatch(value):
        shown = value if isinstance(value, str) and len(value) <= 40 else f"{str(value)[:40]}…"
        raise ValueError(
            f"{shown!r} is not an approver name: use at most 128 letters, digits and "
            ". _ @ : + -, starting with a letter or digit"
        )
    return value


def _check_redact_path(value: str) -> str:
    if not value:
        raise ValueError("a redact path must not be empty")
    if not _REDACT_PATH.fullmatch(value):
        raise ValueError(
            f"{quoted(value)} is not a redact path: write argument names joined by dots, "
            "with [*] or [0] for list items, e.g. card.number or guests[*].phone"
        )
    return value


def _no_duplicates(values: tuple[str, ...]) -> tuple[str, ...]:
    seen: set[str] = set()
    for value in values:
        if value in seen:
            raise ValueError(f"lists {quoted(value)} more than once")
        seen.add(value)
    return values


def template_placeholders(template: str) -> tuple[str, ...]:
    """Return the argument names a ``{name}`` template refers to, in order of appearance.

    Args:
        template: Text with ``{argument_name}`` placeholders; ``{{`` and ``}}`` are literal
            braces.

    Returns:
        Every placeholder name, repeated names included.

    Raises:
        ValueError: The braces do not balance, or a placeholder is not a plain argument name
            (positional ``{}``, attribute or index access, a conversion or a format spec).
    """
    names: list[str] = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise ValueError(f"{quoted(template)} is not a valid template: {exc}") from None
    for _literal, field, conversion, spec in parsed:
        if field is None:
            continue
        if not _IDENTIFIER.fullmatch(field):
            shown = bounded("{" + field + "}", 40)
            raise ValueError(
                f"placeholder {shown} in {quoted(template)} must be a plain argument name, "
                "like {restaurant_id}"
            )
        if conversion or spec:
            name = bounded(field, 40)
            raise ValueError(
                f"placeholder {{{name}}} in {quoted(template)} must not carry a conversion (!r) "
                "or format spec (:...); write just {" + name + "}"
            )
        names.append(field)
    return tuple(names)


def render_template(template: str, args: Mapping[str, object]) -> str:
    """Fill a checked template's placeholders with ``str(args[name])``.

    Args:
        template: A template accepted by `template_placeholders`.
        args: The tool call's arguments.

    Returns:
        The filled-in text.

    Raises:
        KeyError: An argument the template names is missing from ``args``.
    """
    parts: list[str] = []
    for literal, field, _conversion, _spec in string.Formatter().parse(template):
        parts.append(literal)
        if field is not None:
            if field not in args:
                raise KeyError(f"template {template!r} needs argument {field!r}")
            parts.append(str(args[field]))
    return "".join(parts)


def _check_template(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty")
    template_placeholders(value)
    return value


def _check_announcement(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be empty; leave it out to say nothing")
    claim = _OUTCOME.search(value)
    if claim is not None:
        raise ValueError(
            f"is spoken while the action is still running, so it must not claim an outcome "
            f"(found {claim.group(0)!r}); say what is being done, e.g. "
            "'Let me book that for you, one moment.'"
        )
    return value


def _describe(value: object) -> str:
    if isinstance(value, float):
        return f"the number {value}"
    return f"{type(value).__name__} {value}"


def _where(path: tuple[str | int, ...]) -> str:
    where = ""
    for part in path:
        if isinstance(part, int):
            where += f"[{part}]"
        else:
            where = f"{where}.{bounded(part, 60)}" if where else bounded(part, 60)
    return where


def _check_plain(value: object, path: tuple[str | int, ...]) -> None:
    # The path is worded only for the value refused: wording it at every value would cost the
    # length of the path (up to the nesting times the longest key) for each.
    if value is None or isinstance(value, str | bool | int):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(
                f"{_where(path) or 'the value'} is {_describe(value)}; numbers must be finite"
            )
        return
    if isinstance(value, list):
        for index, item in enumerate(value):
            _check_plain(item, (*path, index))
        return
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise ValueError(
                    f"key {quoted(str(key))} at {_where(path) or 'the top'} must be text"
                )
            _check_plain(item, (*path, key))
        return
    raise ValueError(
        f"{_where(path) or 'the value'} is {_describe(value)}; only text, numbers, true/false, "
        "null, lists and mappings are allowed"
    )


def _check_plain_data(value: dict[str, Any]) -> dict[str, Any]:
    _check_plain(value, ())
    return value


def redact_root(path: str) -> str:
    """Return the argument name a redact path starts from (``card`` for ``card.number``).

    Args:
        path: A redact path accepted by `RedactPath`.

    Returns:
        The leading argument name.
    """
    match = _IDENTIFIER.match(path)
    return match.group(0) if match else path


# YAML gives lists, never tuples; strict mode would refuse a list for a tuple field, so each
# tuple type is marked lax. Its items stay strict.
ToolName = Annotated[str, AfterValidator(_check_tool_name)]
"""A tool's name as the LLM calls it: a Python-style identifier of at most 64 characters."""

ArgumentName = Annotated[str, AfterValidator(_check_argument_name)]
"""One of a tool's argument names (an identifier of at most 64 characters)."""

ArgumentNames = Annotated[tuple[ArgumentName, ...], Strict(False), AfterValidator(_no_duplicates)]
"""A list of argument names, each listed once."""

AgentName = Annotated[str, AfterValidator(_check_agent_name)]
"""The name of an agent in a multi-agent bot."""

AgentNames = Annotated[tuple[AgentName, ...], Strict(False), AfterValidator(_no_duplicates)]
"""A list of agent names, each listed once."""

ApproverName = Annotated[str, AfterValidator(check_approver_name)]
"""An operator's name or a role that may approve (see `check_approver_name`)."""

ApproverNames = Annotated[tuple[ApproverName, ...], Strict(False), AfterValidator(_no_duplicates)]
"""A list of approver names or roles, each listed once."""

RedactPath = Annotated[str, AfterValidator(_check_redact_path)]
"""A dotted argument path (``card.number``, ``guests[*].phone``) whose value is hidden."""

RedactPaths = Annotated[tuple[RedactPath, ...], Strict(False), AfterValidator(_no_duplicates)]
"""A list of redact paths, each listed once."""

SensitivePath = Annotated[str, AfterValidator(_check_redact_path)]
"""A path whose value the ledger stores sealed: an argument path, or one under ``result`` or
``before_state`` (``result.payment.card``; ``result`` alone is the whole result)."""

Template = Annotated[str, AfterValidator(_check_template)]
"""Text with ``{argument_name}`` placeholders, filled in from a call's arguments."""

SummaryTemplate = Annotated[str, AfterValidator(check_summary)]
"""What an approver approves, in words: ``{argument}`` and ``{before.field}`` placeholders
(see `pipecat_actions.policy.summary`)."""

Announcement = Annotated[str, AfterValidator(_check_announcement)]
"""What the bot says while an action runs (``announce``, a filler line); it claims no outcome."""

PlainData = Annotated[dict[str, Any], AfterValidator(_check_plain_data)]
"""A mapping of plain data (text, finite numbers, booleans, null, lists, mappings)."""
