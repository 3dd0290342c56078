"""Turning pydantic's validation errors into `PolicyProblem` lines a reviewer can act on.

Each problem names the key path from the document root (``tools.book_table.retry.max_attempts``,
list items as ``redact[2]``) and says what is wrong in plain words, with what was found. No
pydantic jargon or documentation URLs reach the reader.

`ProblemList` keeps the first `MAX_LISTED_PROBLEMS` problems of a file and only counts the
others, without wording them: a file of a hundred thousand mistakes costs no more to report than
one of a hundred, and its report stays a screenful.
"""

from __future__ import annotations

__all__ = ["Loc", "ProblemList", "key_path", "shown"]

import difflib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from pydantic import BaseModel
from pydantic_core import ErrorDetails

from pipecat_actions._printable import bounded, quoted
from pipecat_actions.errors import PolicyProblem
from pipecat_actions.policy._violations import RULE_ERROR_TYPE, Violation
from pipecat_actions.policy._yaml import MAX_LISTED_PROBLEMS, not_listed
from pipecat_actions.policy.document import PolicyFile, nested_model_type
from pipecat_actions.policy.model import ToolPolicy

Loc = tuple[str | int, ...]

_MAX_SHOWN_CHARS = 60
_MAX_KEY_CHARS = 100
_SHOWN_INT_LIMIT = 10**_MAX_SHOWN_CHARS

_BOOLEAN_HINT = (
    "; YAML reads unquoted yes/no/on/off/true/false as a boolean, so put the value in quotes"
)

_TYPE_WORDS = {
    "int_type": "a whole number",
    "int_parsing": "a whole number",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": "text",
    "dict_type": "a mapping of settings",
    "model_type": "a mapping of settings",
    "model_attributes_type": "a mapping of settings",
    "tuple_type": "a list",
    "list_type": "a list",
}

_BOUNDS = {
    "greater_than": ("gt", "greater than"),
    "greater_than_equal": ("ge", "at least"),
    "less_than": ("lt", "less than"),
    "less_than_equal": ("le", "at most"),
}

_REQUIRED_HINTS = {
    "kind": "say read (the tool only looks things up) or mutation (it changes something)",
    "version": "start the file with version: 1",
    "tools": "list each tool the bot may call under tools:",
}


def key_path(loc: Iterable[str | int]) -> str:
    """Format a location as a dotted key path, list indexes in brackets (``redact[2]``).

    Args:
        loc: Keys and list indexes from the document root.

    Returns:
        The key path; empty for the document itself. Each key is `bounded`: escaped, and
        cut to its first 100 characters with a note of its length.
    """
    path = ""
    for part in loc:
        if isinstance(part, int):
            path += f"[{part}]"
        else:
            # A key is the file's text: shown escaped, and a long one only in part.
            name = bounded(part, _MAX_KEY_CHARS)
            path = f"{path}.{name}" if path else name
    return path


def shown(value: object) -> str:
    """Describe a found value briefly, the way a reviewer wrote it in YAML.

    Args:
        value: The offending value.

    Returns:
        ``'stop'`` for text, ``false`` for booleans, ``null``, numbers as written, and the kind
        of thing for mappings and lists.
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int) and not -_SHOWN_INT_LIMIT < value < _SHOWN_INT_LIMIT:
        # Python will not even write a number of more than 4300 digits; none is worth reading.
        return f"a number of more than {_MAX_SHOWN_CHARS} digits"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, list | tuple):
        return "a list"
    text = repr(value) if isinstance(value, str) else f"{type(value).__name__} {value}"
    return text if len(text) <= _MAX_SHOWN_CHARS else text[: _MAX_SHOWN_CHARS - 3] + "..."


class ProblemList:
    """The problems of one file in the order found: the first few worded, the others counted.

    The first `MAX_LISTED_PROBLEMS` distinct problems are kept; each one after that is only
    counted (check `full` before working out a reason that costs something, such as a "did you
    mean" suggestion). `report` lists them, with a last problem saying how many were left out.
    """

    def __init__(self, file: str) -> None:
        """Start an empty list of the problems of ``file`` (`PolicyProblem.file`)."""
        self.file = file
        self._listed: dict[PolicyProblem, None] = {}
        self._unlisted = 0

    def __len__(self) -> int:
        """Return the number of problems found: listed and counted."""
        return len(self._listed) + self._unlisted

    @property
    def full(self) -> bool:
        """True when a further problem would only be counted."""
        return len(self._listed) >= MAX_LISTED_PROBLEMS

    def add(self, loc: Loc, reason: str) -> None:
        """Add a problem at a key path (``loc``, from the document root)."""
        if self.full:
            self._unlisted += 1
        else:
            self._listed[PolicyProblem(self.file, key_path(loc), reason)] = None

    def add_errors(self, errors: Sequence[ErrorDetails], prefix: Loc = ()) -> None:
        """Add the errors of a pydantic validation, ``prefix`` locating what was validated."""
        for error in errors:
            loc: Loc = prefix + tuple(error["loc"])
            if error["type"] == RULE_ERROR_TYPE:
                violations: tuple[Violation, ...] = error["ctx"]["violations"]
                for violation in violations:
                    self.add(loc + violation.path, violation.reason)
                continue
            if self.full:
                self._unlisted += 1
                continue
            if loc and loc[-1] == "[key]":
                loc = loc[:-1]
            self.add(loc, _reason(loc, error))

    def report(self) -> list[PolicyProblem]:
        """Return the listed problems, then one counting the others (if any were left out)."""
        listed = list(self._listed)
        if self._unlisted:
            listed.append(PolicyProblem(self.file, "", not_listed(self._unlisted)))
        return listed


def _reason(loc: Loc, error: Mapping[str, Any]) -> str:
    kind: str = error["type"]
    value = error.get("input")
    ctx: Mapping[str, Any] = error.get("ctx") or {}
    if kind in ("value_error", "assertion_error"):
        return str(ctx.get("error", error["msg"]))
    if kind == "missing":
        hint = _REQUIRED_HINTS.get(str(loc[-1])) if loc else None
        return f"is required: {hint}" if hint else "is required"
    if kind == "extra_forbidden":
        return _unknown_key(loc)
    if kind in ("enum", "literal_error"):
        allowed = _allowed_values(str(ctx.get("expected", "")))
        found = f"must be one of {allowed} (got {shown(value)}"
        return found + (_BOOLEAN_HINT if isinstance(value, bool) else "") + ")"
    if kind in _TYPE_WORDS:
        if value is None:
            return f"must be {_TYPE_WORDS[kind]}, but it is empty (null)"
        reason = f"must be {_TYPE_WORDS[kind]} (got {shown(value)})"
        if kind == "string_type" and not isinstance(value, Mapping | list | tuple):
            reason += "; put the value in quotes if it is meant as text"
        return reason
    if kind in _BOUNDS:
        key, words = _BOUNDS[kind]
        bound = ctx.get(key)
        bound_text = f"{bound:g}" if isinstance(bound, int | float) else str(bound)
        return f"must be {words} {bound_text} (got {shown(value)})"
    if kind == "finite_number":
        return f"must be a finite number (got {shown(value)})"
    if kind == "too_short":
        if loc == ("tools",):
            return "lists no tools: add at least one"
        return f"must not be empty (got {shown(value)})"
    return f"{error['msg']} (got {shown(value)})"


def _allowed_values(expected: str) -> str:
    # pydantic phrases the choices as "'a', 'b' or 'c'"; reviewers write them unquoted.
    values = expected.replace(" or ", ", ").split(", ")
    return ", ".join(value.strip().strip("'") for value in values if value.strip())


def _unknown_key(loc: Loc) -> str:
    key = str(loc[-1]) if loc else ""
    allowed = _keys_at(loc[:-1])
    reason = f"unknown key {quoted(key)}"
    if not allowed:
        return reason
    close = difflib.get_close_matches(key, allowed, n=1)
    if close:
        return f"{reason}; did you mean {close[0]!r}? Allowed here: {', '.join(allowed)}"
    return f"{reason}; allowed here: {', '.join(allowed)}"


def _keys_at(loc: Loc) -> tuple[str, ...]:
    """Return the keys a mapping at ``loc`` may hold, or () when it is not a settings mapping."""
    if not loc:
        return tuple(PolicyFile.model_fields)
    if loc[0] == "defaults":
        rest = loc[1:]
    elif loc[0] == "tools" and len(loc) >= 2:
        rest = loc[2:]
    else:
        return ()
    model: type[BaseModel] = ToolPolicy
    for part in rest:
        field = model.model_fields.get(str(part))
        nested = None if field is None else nested_model_type(field.annotation)
        if nested is None:
            return ()
        model = nested
    return tuple(model.model_fields)
