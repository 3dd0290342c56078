"""Argument validation: what the model sent, read as JSON and judged by the tool's own types.

Arguments arrive as JSON text (``runtime.propose(tool, '{"party_size": 2}')``) or as the dict a
Pipecat service parsed from that text. Either way they are judged as JSON, in two steps:

1. `read_arguments`: the payload cap (on the text, before it is parsed), then JSON data and
   nothing else, at any depth, free-form fields included: an object with text keys, finite
   numbers (``NaN``, ``Infinity`` and ``1e999``, which Python's parser reads as infinity, are
   refused), whole numbers of at most `MAX_INT_DIGITS` digits, text that is valid Unicode,
   at most `MAX_DEPTH` levels of nesting.
2. `validate_arguments`: the action's argument model in pydantic's strict JSON mode
   (``model_validate_json(..., strict=True)``), which accepts exactly what JSON can say for a
   type: a JSON number ``2`` for an ``int``, never ``2.0``, ``"2"`` or ``true``; a number for a
   ``float``; text for text; and, as JSON has no type of its own for them, a date, time,
   datetime, UUID, decimal or enum from its JSON text or number (``"2026-12-03"``). A tool
   whose policy sets ``coerce_arguments: true`` gets pydantic's lax conversions instead
   (``"2"`` and ``2.0`` become ``2``). Either way a boolean never becomes a number nor a
   number a boolean (pydantic reads ``true`` as the ``1`` of a ``Literal[1]`` or an
   ``IntEnum`` even when strict), an unknown key is refused at every depth (nested models
   included, whatever their own ``extra``), a key given twice in JSON text is refused, and
   so is a decimal of more than `MAX_INT_DIGITS` digits or an exponent that large.
   The validated arguments are stored in their JSON form.

Every problem is told in one line that names where it is (``preferences.seats[2]``); what the
model supplied (keys, values, a parser's complaint) is quoted bounded and escaped
(`pipecat_actions._printable.bounded`), never in full.
"""

from __future__ import annotations

__all__ = [
    "MAX_DEPTH",
    "MAX_INT_DIGITS",
    "Invalid",
    "json_problem",
    "read_arguments",
    "validate_arguments",
]

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

from pydantic import ValidationError

from pipecat_actions._printable import bounded
from pipecat_actions.actions import ActionDefinition
from pipecat_actions.ledger.records import canonical_json

MAX_DEPTH = 64
"""The deepest nesting of objects and arrays accepted in a call's arguments."""

MAX_INT_DIGITS = 4300
"""The most digits a whole number of the arguments may have (Python's own limit for reading
one from text: a longer one could not be stored, logged or shown)."""

_INT_LIMIT = 10**MAX_INT_DIGITS
_MAX_PATH_CHARS = 160
_MAX_PROBLEMS = 5


@dataclass(frozen=True)
class Invalid:
    """Why a call's arguments are refused: the refusal's code and the message the model gets.

    Attributes:
        code: ``invalid_arguments`` or ``payload_too_large``.
        message: One line, ending in "nothing was done".
        recorded: What the audit record keeps of the arguments, when they were read: the
            size of an oversized payload (never parsed), or the data that is not JSON (the
            ledger keeps what it cannot encode as a bounded repr).
    """

    code: str
    message: str
    recorded: Mapping[str, Any] | None = None


def read_arguments(raw: Mapping[str, Any] | str, cap_bytes: int) -> dict[str, Any] | Invalid:
    """Read a call's arguments as a JSON object, under a payload cap.

    Args:
        raw: The JSON text of the arguments, or the mapping parsed from it.
        cap_bytes: The tool's ``max_payload_bytes``; a larger payload is refused unread.

    Returns:
        The arguments as a dict of JSON data, or why they are refused.
    """
    if isinstance(raw, str):
        text = raw
    elif isinstance(raw, Mapping):
        try:
            text = json.dumps(raw)  # NaN is written as NaN here: measured, refused below
        except (TypeError, ValueError, RecursionError):
            # Not JSON data; the walk says where and what (it is bounded in depth).
            found = json_problem(dict(raw)) or "arguments: they are not JSON data"
            return _invalid(found, recorded=dict(raw))
    else:
        return _invalid("arguments: they must be a JSON object")
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > cap_bytes:
        return Invalid(
            "payload_too_large",
            f"The arguments are too large ({size} bytes, at most {cap_bytes}); nothing was done.",
            recorded={"oversized_arguments_bytes": size},
        )
    if isinstance(raw, str):
        parsed = _parse(raw)
        if isinstance(parsed, Invalid):
            return parsed
    else:
        parsed = dict(raw)
    problem = json_problem(parsed)
    return _invalid(problem, recorded=parsed) if problem else parsed


def validate_arguments(
    action: ActionDefinition, arguments: Mapping[str, Any], *, coerce: bool = False
) -> dict[str, Any] | Invalid:
    """Validate arguments read by `read_arguments` against ``action``'s argument model.

    Args:
        action: The action whose ``args_model`` judges them.
        arguments: The call's arguments (JSON data).
        coerce: The tool's ``coerce_arguments``: pydantic's lax conversions instead of strict
            JSON types.

    Returns:
        The validated arguments in their JSON form (defaults filled in for an ``@action``; for
        an application's own handler, only what the model sent), or why they are refused.
    """
    try:
        # A closed argument model is closed at every depth: extra="forbid" reaches nested
        # models too, whatever their own config says, so an unknown key is refused, never
        # silently dropped. An open one (a handler that takes any key) keeps its own rules.
        closed = action.args_model.model_config.get("extra") == "forbid"
        model = action.args_model.model_validate_json(
            _STRICT_JSON(arguments),
            strict=not coerce,
            extra="forbid" if closed else None,
        )
        validated = model.model_dump(mode="json", by_alias=True, exclude_unset=action.app_handler)
        oversized = _oversized_decimal(model.model_dump(by_alias=True))
    except ValidationError as exc:
        return Invalid("invalid_arguments", _describe(exc))
    except (ValueError, TypeError, RecursionError):
        return _invalid("arguments: they hold values that are not plain data")
    # A lax conversion can make NaN from text ("NaN" for a nested model's float).
    problem = (
        oversized or json_problem(validated) or _changed_kind(arguments, validated, coerce=coerce)
    )
    if problem:
        return _invalid(problem)
    try:
        canonical_json(validated)  # what cannot be stored or hashed is refused here
    except (ValueError, TypeError, RecursionError):
        return _invalid("arguments: they hold values that are not plain data")
    return validated


_STRICT_JSON = json.JSONEncoder(allow_nan=False).encode
"""``json.dumps(value, allow_nan=False)``, its encoder made once rather than per call."""


def json_problem(value: Any) -> str | None:
    """Return the first thing in ``value`` that is not JSON data, as ``where: what``, or None.

    JSON data: None, booleans, finite numbers, whole numbers of at most `MAX_INT_DIGITS`
    digits, valid Unicode text, lists (or tuples) and mappings with text keys, nested at most
    `MAX_DEPTH` levels. The walk uses no recursion, so any depth is safe to look at.
    """
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if item is None or isinstance(item, bool):
            continue
        if isinstance(item, str):
            try:
                item.encode("utf-8")
            except UnicodeEncodeError:
                return f"{_where(path)}: the text holds a lone surrogate, which is not Unicode"
        elif isinstance(item, int):
            if not -_INT_LIMIT < item < _INT_LIMIT:
                return f"{_where(path)}: a whole number of more than {MAX_INT_DIGITS} digits"
        elif isinstance(item, float):
            if not math.isfinite(item):
                shown = "NaN" if math.isnan(item) else ("-" if item < 0 else "") + "Infinity"
                return f"{_where(path)}: {shown} is not a number JSON allows; numbers are finite"
        elif type(item) is dict or isinstance(item, Mapping | list | tuple):
            if len(path) >= MAX_DEPTH:
                return f"{_where(path)}: nested more than {MAX_DEPTH} levels deep"
            # A dict is a Mapping; asked of the ABC, isinstance runs Python code (the ABC's
            # __instancecheck__) for every container walked.
            if type(item) is dict or (
                not isinstance(item, list | tuple) and isinstance(item, Mapping)
            ):
                for key, child in reversed(list(item.items())):
                    if not isinstance(key, str):
                        return f"{_where(path)}: the key {_shown(key)} is not text"
                    stack.append((child, (*path, key)))
            else:
                stack.extend((child, (*path, i)) for i, child in reversed(list(enumerate(item))))
        else:
            return f"{_where(path)}: {type(item).__name__} is not JSON data"
    return None


def _changed_kind(sent: Any, validated: Any, *, coerce: bool) -> str | None:
    """Where validation made a number of a boolean (or the reverse), as ``where: what``.

    Pydantic's strict mode still reads ``true`` and ``1.0`` as the ``1`` of a ``Literal[1]``
    or an ``IntEnum``, and its lax mode reads ``true`` as ``1`` and ``1`` as ``true``. Neither
    is what the model meant: a boolean is never a number here, nor a number a boolean, and,
    unless the policy asks for coercion, a number with a fraction part never a whole one. The
    two are walked side by side (keys of both objects; arrays of the same length).
    """
    stack: list[tuple[Any, Any, tuple[str | int, ...]]] = [(sent, validated, ())]
    while stack:
        given, made, path = stack.pop()
        if isinstance(given, dict) and isinstance(made, dict):
            stack.extend((given[k], made[k], (*path, k)) for k in given if k in made)
        elif isinstance(given, list) and isinstance(made, list) and len(given) == len(made):
            pairs = enumerate(zip(given, made, strict=True))
            stack.extend((g, m, (*path, i)) for i, (g, m) in pairs)
        elif isinstance(given, bool) and not isinstance(made, bool | str):
            if isinstance(made, int | float):
                return f"{_where(path)}: a boolean is not a number, got {_json_type(given)}"
        elif isinstance(made, bool) and not isinstance(given, bool) and _is_number(given):
            return f"{_where(path)}: a number is not a boolean, got {_json_type(given)}"
        elif not coerce and isinstance(given, float) and _is_number(made) and isinstance(made, int):
            return f"{_where(path)}: Input should be a whole number, got {_json_type(given)}"
    return None


def _oversized_decimal(value: Any) -> str | None:
    """Where a decimal has more digits, or a larger exponent, than a whole number may have digits.

    Read from JSON text, ``"1e999999999"`` is a finite decimal, and would take all memory
    made into an int.
    """
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(value, ())]
    while stack:
        item, path = stack.pop()
        if type(item) in _LEAVES:
            continue  # asked first: isinstance of an ABC (Mapping) runs Python code
        if isinstance(item, Decimal) and item.is_finite():
            if (
                len(item.as_tuple().digits) > MAX_INT_DIGITS
                or abs(item.adjusted()) > MAX_INT_DIGITS
            ):
                return f"{_where(path)}: a number of more than {MAX_INT_DIGITS} digits"
        elif type(item) is dict or isinstance(item, Mapping):
            stack.extend((child, (*path, key)) for key, child in item.items())
        elif isinstance(item, list | tuple | set | frozenset):
            stack.extend((child, (*path, i)) for i, child in enumerate(item))
    return None


_LEAVES = frozenset({str, int, float, bool, type(None)})
"""Exact types that hold nothing nested (a subclass of one is looked at as usual)."""


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """An object of JSON text; a key given twice is refused (which one did the model mean?)."""
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _DuplicateKey(key)
            seen.add(key)
    return result


def _parse(text: str) -> dict[str, Any] | Invalid:
    try:
        parsed = json.loads(text, object_pairs_hook=_object)
    except _DuplicateKey as exc:
        return _invalid(f"arguments: the key {_shown(exc.key)} is given twice")
    except json.JSONDecodeError as exc:
        return _invalid(f"arguments: they are not valid JSON ({bounded(exc.msg, 80)})")
    except RecursionError:
        return _invalid(f"arguments: nested more than {MAX_DEPTH} levels deep")
    except ValueError:
        # Python refuses to read a whole number of more digits than its limit.
        return _invalid(f"arguments: a whole number of more than {MAX_INT_DIGITS} digits")
    if not isinstance(parsed, dict):
        return _invalid("arguments: they must be a JSON object")
    return parsed


def _invalid(problem: str, *, recorded: Mapping[str, Any] | None = None) -> Invalid:
    return Invalid(
        "invalid_arguments",
        f"The arguments are not valid ({problem}); nothing was done.",
        recorded=recorded,
    )


def _where(path: tuple[str | int, ...]) -> str:
    """The path of a value (``preferences.seats[2]``), each key bounded and escaped."""
    if not path:
        return "arguments"
    text = ""
    for part in path:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += ("." if text else "") + bounded(part, 40)
        if len(text) > _MAX_PATH_CHARS:
            return f"{text[:_MAX_PATH_CHARS]}…"
    return text


def _shown(key: object) -> str:
    try:
        text = repr(key)
    except ValueError:  # a whole number too long to show
        text = type(key).__name__
    return bounded(text, 40)


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return "a whole number"
    if isinstance(value, float):
        return "a number with a fraction" if not value.is_integer() else f"the number {value}"
    if isinstance(value, str):
        return "text"
    if isinstance(value, list):
        return "an array"
    return "an object" if isinstance(value, dict) else type(value).__name__


def _describe(exc: ValidationError) -> str:
    problems = []
    for error in exc.errors(include_url=False)[:_MAX_PROBLEMS]:
        where = _where(tuple(error["loc"]))
        # What was given is named by its JSON type only, never quoted.
        given = f", got {_json_type(error['input'])}" if error["type"].endswith("_type") else ""
        problems.append(f"{where}: {bounded(error['msg'], 160)}{given}")
    more = exc.error_count() - len(problems)
    if more > 0:
        problems.append(f"and {more} more")
    return "The arguments are not valid (" + "; ".join(problems) + "); nothing was done."
