"""Reading a policy file's YAML strictly: one document, plain text keys, nothing hidden.

PyYAML's ``safe_load`` is safe from code execution but forgiving in ways that hide mistakes in
a policy: a repeated key silently keeps the last value, and aliases (``*name``) can expand a
small file into billions of nodes. This module drives `yaml.SafeLoader` (the constructor behind
``safe_load``) step by step and refuses:

* files over `MAX_POLICY_BYTES` (checked before parsing),
* more than one document, and nesting deeper than `MAX_DEPTH`,
* aliases and merge keys (``<<``) altogether: a policy shares settings through ``defaults:``,
  so refusing them costs nothing and removes alias bombs by construction,
* repeated keys and keys that are not text (unquoted ``on``/``yes`` become booleans).

Problems are raised as `YamlRefused` with a location (key path parts) and a plain reason.
"""

from __future__ import annotations

__all__ = ["MAX_DEPTH", "MAX_POLICY_BYTES", "YamlRefused", "parse_policy_yaml", "too_large"]

from typing import TYPE_CHECKING

import yaml
from yaml.events import AliasEvent, Event, StreamEndEvent
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.reader import ReaderError

from pipecat_actions._printable import bounded, quoted

if TYPE_CHECKING:
    from yaml._yaml import Mark as CMark
    from yaml.error import Mark

MAX_POLICY_BYTES = 1024 * 1024
"""The largest policy file read, in bytes (1 MiB); a larger one is refused unparsed."""

MAX_DEPTH = 32
"""The deepest nesting of mappings and lists a policy file may have."""

_STR_TAG = "tag:yaml.org,2002:str"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_TAG_WORDS = {
    "tag:yaml.org,2002:bool": "a boolean (true/false)",
    "tag:yaml.org,2002:int": "a number",
    "tag:yaml.org,2002:float": "a number",
    "tag:yaml.org,2002:null": "null (nothing)",
    "tag:yaml.org,2002:timestamp": "a date",
}


class YamlRefused(Exception):
    """The YAML text cannot be read as a policy document.

    Attributes:
        problems: Each problem's location (key path parts from the root) and reason.
    """

    def __init__(self, problems: list[tuple[tuple[str | int, ...], str]]) -> None:
        super().__init__("; ".join(reason for _loc, reason in problems))
        self.problems = problems


def _at(mark: Mark | CMark | None) -> str:
    return "" if mark is None else f" at line {mark.line + 1}, column {mark.column + 1}"


class _RefusedNode(Exception):
    """The composer met something a policy file may not contain (an alias, deep nesting)."""

    def __init__(self, reason: str, event: Event) -> None:
        super().__init__(reason)
        self.reason = f"{_at(event.start_mark).strip()}: {reason}"


class _StrictLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` that refuses aliases and deep nesting while it builds the node tree."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0

    def next_event(self, *, consume: bool) -> Event:
        """Return the next parser event, taking it from the stream when ``consume`` is True."""
        # PyYAML's stubs leave the parser's event methods untyped.
        if consume:
            taken: Event = self.get_event()  # type: ignore[no-untyped-call]
            return taken
        peeked: Event = self.peek_event()  # type: ignore[no-untyped-call]
        return peeked

    def compose_node(self, parent: Node | None, index: int) -> Node | None:
        event = self.next_event(consume=False)
        if isinstance(event, AliasEvent):
            raise _RefusedNode(
                f"YAML aliases (*{event.anchor}) are not allowed in policy files; write the "
                "settings out, or share them through defaults:",
                event,
            )
        if self._depth >= MAX_DEPTH:
            raise _RefusedNode(f"the document is nested more than {MAX_DEPTH} levels deep", event)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def parse_policy_yaml(text: str) -> object:
    """Parse the text of a policy file into plain Python data.

    Args:
        text: The whole file, already decoded.

    Returns:
        The document's data (a mapping when the file is well formed; callers check).

    Raises:
        YamlRefused: The text is not one clean YAML document, with every problem found.
    """
    # A string longer than the cap in characters is too long in bytes; skip encoding it.
    too_long = len(text) > MAX_POLICY_BYTES
    size = len(text) if too_long else len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_POLICY_BYTES:
        raise YamlRefused([((), too_large(size))])
    if not text.strip():
        raise YamlRefused([((), "file is empty")])
    loader: _StrictLoader | None = None
    try:
        loader = _StrictLoader(text)
        node = _single_node(loader)
        if node is None:
            raise YamlRefused([((), "file is empty: it holds only comments or blank lines")])
        problems: list[tuple[tuple[str | int, ...], str]] = []
        _check_keys(loader, node, (), problems)
        if problems:
            raise YamlRefused(problems)
        try:
            return loader.construct_document(node)
        except _CONSTRUCTION_ERRORS as exc:
            # Every scalar was read above; what is left is a tag on a list or mapping.
            raise YamlRefused([((), f"cannot be read: {_complaint(exc)}")]) from None
    except _RefusedNode as exc:
        raise YamlRefused([((), exc.reason)]) from None
    except ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        raise YamlRefused(
            [((), f"character U+{exc.character:04X} at line {line} is not allowed in YAML text")]
        ) from None
    except yaml.MarkedYAMLError as exc:
        reason = f"invalid YAML{_at(exc.problem_mark)}: {exc.problem or exc.context}"
        if exc.context and exc.problem:
            reason += f" ({exc.context}{_at(exc.context_mark)})"
        raise YamlRefused([((), reason)]) from None
    except yaml.YAMLError as exc:
        raise YamlRefused([((), f"invalid YAML: {exc}")]) from None
    finally:
        if loader is not None:
            loader.dispose()


def too_large(size: int) -> str:
    """Say that a policy of ``size`` bytes is over `MAX_POLICY_BYTES`."""
    return (
        f"file is {size / 1024 / 1024:.1f} MiB ({size} bytes); a policy file may be at most "
        f"1 MiB ({MAX_POLICY_BYTES} bytes)"
    )


def _single_node(loader: _StrictLoader) -> Node | None:
    loader.next_event(consume=True)  # stream start
    node = None if loader.check_event(StreamEndEvent) else loader.compose_document()
    if not loader.check_event(StreamEndEvent):
        second = loader.next_event(consume=True)
        raise YamlRefused(
            [
                (
                    (),
                    "file holds more than one YAML document (another one starts"
                    f"{_at(second.start_mark)}); a policy file is a single document",
                )
            ]
        )
    return node


_CONSTRUCTION_ERRORS = (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError)
"""What PyYAML's constructors raise for a scalar they cannot read, besides its own errors:
``!!int abc``, ``2026-13-45`` (read as a date), a number of more digits than Python reads
(``ValueError: Exceeds the limit (4300 digits)``), ``!!bool maybe`` (a KeyError), ``!!int ''``
(an IndexError), ``!!timestamp nope`` (an AttributeError)."""

_SCALAR_WORDS = {
    **_TAG_WORDS,
    "tag:yaml.org,2002:binary": "base64 data",
    "tag:yaml.org,2002:str": "text",
}


def _check_scalar(
    loader: _StrictLoader,
    node: ScalarNode,
    loc: tuple[str | int, ...],
    problems: list[tuple[tuple[str | int, ...], str]],
) -> None:
    """Read one scalar now, so that a value YAML cannot read is a problem at its key."""
    try:
        loader.construct_object(node)
    except (yaml.YAMLError, *_CONSTRUCTION_ERRORS) as exc:
        what = _SCALAR_WORDS.get(node.tag, f"a value tagged {quoted(node.tag)}")
        problems.append(
            (
                loc,
                f"{quoted(node.value)}{_at(node.start_mark)} cannot be read as {what}: "
                f"{_complaint(exc)}",
            )
        )


def _complaint(exc: BaseException) -> str:
    """What a constructor said, in a reader's words where Python's are about Python."""
    text = str(getattr(exc, "problem", None) or exc)
    if "Exceeds the limit" in text and "digits" in text:
        return "it has more digits than the 4300 a number may have"
    if isinstance(exc, KeyError):
        return "it is not one of the values of that type"
    if isinstance(exc, IndexError | AttributeError):
        return "it is not written as that type is"
    return bounded(text, 120)


def _check_keys(
    loader: _StrictLoader,
    node: Node,
    loc: tuple[str | int, ...],
    problems: list[tuple[tuple[str | int, ...], str]],
) -> None:
    # Recursion is bounded by MAX_DEPTH, enforced while composing.
    if isinstance(node, SequenceNode):
        for index, item in enumerate(node.value):
            _check_keys(loader, item, (*loc, index), problems)
        return
    if isinstance(node, ScalarNode):
        _check_scalar(loader, node, loc, problems)
        return
    if not isinstance(node, MappingNode):
        return
    first_line: dict[str, int] = {}
    for key_node, value_node in node.value:
        line = key_node.start_mark.line + 1
        if key_node.tag == _MERGE_TAG:
            problems.append(
                (
                    loc,
                    f"YAML merge keys (<<, line {line}) are not allowed; share settings "
                    "through defaults:",
                )
            )
            continue
        if not isinstance(key_node, ScalarNode):
            problems.append(
                (loc, f"the key at line {line} is a list or mapping; keys must be text")
            )
            continue
        if key_node.tag != _STR_TAG:
            what = _TAG_WORDS.get(key_node.tag, f"a value tagged {key_node.tag}")
            problems.append(
                (
                    loc,
                    f"key {quoted(key_node.value)} at line {line} is read by YAML as "
                    f"{what}, not as text; put it in quotes ({quoted(key_node.value)}:)",
                )
            )
            continue
        key: str = key_node.value
        if key in first_line:
            problems.append(
                (
                    (*loc, key),
                    f"duplicate key {quoted(key)} (line {first_line[key]} and again at "
                    f"line {line}); "
                    "YAML would silently keep only the last one",
                )
            )
        else:
            first_line[key] = line
        _check_keys(loader, value_node, (*loc, key), problems)
