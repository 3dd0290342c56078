"""Paths into JSON values (``card.number``, ``guests[*].phone``): parsed, found, replaced.

The syntax of a policy's ``redact`` and ``sensitive`` paths: names joined by dots, each name
followed by any number of ``[N]`` (one list item) or ``[*]`` (every item). A path that does not
match the value (a missing key, a list where a mapping was expected) finds nothing and
replaces nothing: a call's arguments may be anything the model sent.
"""

from __future__ import annotations

__all__ = ["EVERY", "Step", "parse_path", "replace_at", "shown_path", "values_at"]

import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Final

_STEP = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\[(?:\*|[0-9]+)\]")
_PATH = re.compile(
    r"[A-Za-z_][A-Za-z0-9_]*(?:\[(?:\*|[0-9]+)\])*(?:\.[A-Za-z_][A-Za-z0-9_]*(?:\[(?:\*|[0-9]+)\])*)*"
)

EVERY: Final = -1
"""The step ``[*]``: every item of a list."""

Step = str | int
"""A key of a mapping, an index of a list, or `EVERY`."""


def parse_path(path: str) -> tuple[Step, ...]:
    """Return the steps of ``path`` (``guests[*].phone`` → ``("guests", EVERY, "phone")``).

    Raises:
        ValueError: ``path`` is not written in the path syntax.
    """
    if not _PATH.fullmatch(path):
        raise ValueError(f"{path!r} is not a path like card.number or guests[*].phone")
    steps: list[Step] = []
    for token in _STEP.findall(path):
        if token == "[*]":
            steps.append(EVERY)
        elif token.startswith("["):
            steps.append(int(token[1:-1]))
        else:
            steps.append(token)
    return tuple(steps)


def shown_path(prefix: str, steps: tuple[Step, ...]) -> str:
    """A concrete path as people write it (``args.guests[0].phone``)."""
    text = prefix
    for step in steps:
        if isinstance(step, str):
            text = f"{text}.{step}" if text else step
        else:
            text += "[*]" if step == EVERY else f"[{step}]"
    return text


def values_at(value: Any, steps: tuple[Step, ...]) -> Iterator[Any]:
    """Yield every value ``steps`` reach in ``value``."""
    if not steps:
        yield value
        return
    step, rest = steps[0], steps[1:]
    if isinstance(step, str):
        if isinstance(value, Mapping) and step in value:
            yield from values_at(value[step], rest)
    elif isinstance(value, list | tuple):
        items = value if step == EVERY else value[step : step + 1]
        for item in items:
            yield from values_at(item, rest)


def replace_at(
    value: Any,
    steps: tuple[Step, ...],
    leaf: Callable[[Any, tuple[Step, ...]], Any],
    _at: tuple[Step, ...] = (),
) -> Any:
    """Return ``value`` with every value ``steps`` reach replaced by ``leaf(found, where)``.

    ``where`` is the concrete path of the value found (list indexes in place of ``[*]``).
    Containers on the way are copied; ``value`` itself is never changed.
    """
    if not steps:
        return leaf(value, _at)
    step, rest = steps[0], steps[1:]
    if isinstance(step, str):
        if not isinstance(value, Mapping) or step not in value:
            return value
        copy = dict(value)
        copy[step] = replace_at(value[step], rest, leaf, (*_at, step))
        return copy
    if not isinstance(value, list | tuple):
        return value
    items = list(value)
    indexes = range(len(items)) if step == EVERY else [step] if step < len(items) else []
    for index in indexes:
        items[index] = replace_at(items[index], rest, leaf, (*_at, index))
    return items
