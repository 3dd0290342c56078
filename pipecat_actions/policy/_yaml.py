"""Reading a policy file's YAML strictly and in bounded time: one document, plain text keys.

PyYAML's ``safe_load`` is safe from code execution but forgiving in ways that hide mistakes in
a policy: a repeated key silently keeps the last value, and aliases (``*name``) can expand a
small file into billions of nodes. It is also slow (its pure-Python parser takes seconds for a
megabyte). This module reads the parser's events one at a time (libyaml's parser when PyYAML
has it, PyYAML's own otherwise) and builds the data itself, in a loop without recursion, doing
a bounded amount of work per event. It refuses:

* files over `MAX_POLICY_BYTES` (checked before parsing), and characters YAML does not allow;
* more than one document, nesting deeper than `MAX_DEPTH` and more than `MAX_VALUES` values,
  each where it is met, without reading further;
* aliases and merge keys (``<<``) altogether: a policy shares settings through ``defaults:``,
  so refusing them costs nothing and removes alias bombs by construction;
* repeated keys, keys that are not text (unquoted ``on``/``yes`` become booleans), tags on
  lists and mappings, scalars YAML cannot read as their type, and numbers of more than
  `MAX_NUMBER_CHARS` characters (PyYAML reads a ``1:2:3`` number of n parts in time n²).

Problems are raised as `YamlRefused` with a location (key path parts) and a plain reason; past
`MAX_LISTED_PROBLEMS` they are only counted, and a last problem says how many were left out.
"""

from __future__ import annotations

__all__ = [
    "MAX_DEPTH",
    "MAX_LISTED_PROBLEMS",
    "MAX_NUMBER_CHARS",
    "MAX_POLICY_BYTES",
    "MAX_VALUES",
    "YamlRefused",
    "not_listed",
    "parse_policy_yaml",
    "too_large",
]

import re
from collections.abc import Callable
from typing import TYPE_CHECKING, cast

import yaml
from yaml.events import (
    AliasEvent,
    CollectionStartEvent,
    Event,
    MappingStartEvent,
    ScalarEvent,
    StreamEndEvent,
)
from yaml.nodes import ScalarNode
from yaml.reader import ReaderError

from pipecat_actions._printable import bounded, quoted

if TYPE_CHECKING:
    from yaml._yaml import Mark as CMark
    from yaml.error import Mark

MAX_POLICY_BYTES = 1024 * 1024
"""The largest policy file read, in bytes (1 MiB); a larger one is refused unparsed."""

MAX_DEPTH = 32
"""The deepest nesting of mappings and lists a policy file may have."""

MAX_VALUES = 100_000
"""The most values (keys, settings and list items) a policy file may hold; a legitimate policy
of a thousand tools holds a few tens of thousands."""

MAX_NUMBER_CHARS = 4300
"""The longest number a policy may write, in characters (Python's own limit for decimals)."""

MAX_LISTED_PROBLEMS = 100
"""The most problems listed for one file; the others are counted in a last problem."""

_LOADER = yaml.CSafeLoader if yaml.__with_libyaml__ else yaml.SafeLoader

# The characters YAML allows (PyYAML's own reader refuses the others, libyaml's differently).
_NOT_YAML = re.compile("[^\x09\x0a\x0d\x20-\x7e\x85\xa0-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")

_NO_TOKEN = "found character that cannot start any token"
_STR_TAG = "tag:yaml.org,2002:str"
_MERGE_TAG = "tag:yaml.org,2002:merge"
_INT_TAG = "tag:yaml.org,2002:int"
_NUMBER_TAGS = frozenset({_INT_TAG, "tag:yaml.org,2002:float"})
_UNTAGGED = frozenset({None, "!"})
_COLLECTION_TAGS = frozenset({"tag:yaml.org,2002:map", "tag:yaml.org,2002:seq"})
_TAG_WORDS = {
    "tag:yaml.org,2002:bool": "a boolean (true/false)",
    "tag:yaml.org,2002:int": "a number",
    "tag:yaml.org,2002:float": "a number",
    "tag:yaml.org,2002:null": "null (nothing)",
    "tag:yaml.org,2002:timestamp": "a date",
}
_SCALAR_WORDS = {
    **_TAG_WORDS,
    "tag:yaml.org,2002:binary": "base64 data",
    "tag:yaml.org,2002:str": "text",
}
_TOO_MANY_DIGITS = f"it has more digits than the {MAX_NUMBER_CHARS} a number may have"

Loc = tuple[str | int, ...]


class YamlRefused(Exception):
    """The YAML text cannot be read as a policy document.

    Attributes:
        problems: Each problem's location (key path parts from the root) and reason; at most
            `MAX_LISTED_PROBLEMS`, and then one more saying how many were left out.
    """

    def __init__(self, problems: list[tuple[Loc, str]]) -> None:
        super().__init__("; ".join(reason for _loc, reason in problems))
        self.problems = problems


def not_listed(count: int) -> str:
    """Say that ``count`` problems past the first `MAX_LISTED_PROBLEMS` are not listed."""
    return (
        f"and {count} more problem{'' if count == 1 else 's'}, not listed: a check lists the "
        f"first {MAX_LISTED_PROBLEMS} problems of a file; fix these and check again"
    )


def too_large(size: int) -> str:
    """Say that a policy of ``size`` bytes is over `MAX_POLICY_BYTES`."""
    return (
        f"file is {size / 1024 / 1024:.1f} MiB ({size} bytes); a policy file may be at most "
        f"1 MiB ({MAX_POLICY_BYTES} bytes)"
    )


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
    bad = _NOT_YAML.search(text)
    if bad is not None:
        line = text.count("\n", 0, bad.start()) + 1
        raise YamlRefused(
            [((), f"character U+{ord(bad.group()):04X} at line {line} is not allowed in YAML text")]
        )
    loader = _LOADER(text)
    try:
        return _Reader(loader).document()
    except _Refused as exc:
        raise YamlRefused([((), exc.reason)]) from None
    except ReaderError as exc:
        line = text.count("\n", 0, exc.position) + 1
        raise YamlRefused(
            [((), f"character U+{exc.character:04X} at line {line} is not allowed in YAML text")]
        ) from None
    except yaml.MarkedYAMLError as exc:
        problem = exc.problem or exc.context
        mark = exc.problem_mark
        if problem == _NO_TOKEN and mark is not None and 0 <= mark.index < len(text):
            # libyaml does not say which character (a tab, mostly); PyYAML's parser did.
            problem = f"found character {text[mark.index]!r} that cannot start any token"
        reason = f"invalid YAML{_at(mark)}: {problem}"
        if exc.context and exc.problem:
            reason += f" ({exc.context}{_at(exc.context_mark)})"
        raise YamlRefused([((), reason)]) from None
    except yaml.YAMLError as exc:
        raise YamlRefused([((), f"invalid YAML: {exc}")]) from None
    finally:
        loader.dispose()


def _at(mark: Mark | CMark | None) -> str:
    return "" if mark is None else f" at line {mark.line + 1}, column {mark.column + 1}"


def _line(event: Event) -> int:
    return 0 if event.start_mark is None else event.start_mark.line + 1


class _Refused(Exception):
    """Something no policy file may contain (an alias, deep nesting): reading stops there."""

    def __init__(self, reason: str, event: Event) -> None:
        super().__init__(reason)
        self.reason = f"{_at(event.start_mark).strip()}: {reason}"


class _Collection:
    """A list or mapping being read: where it is, what it holds so far, whether it is checked.

    The contents of an unchecked one (a key that is a list, the value of a refused key, a tagged
    list) are read for the limits only: nesting, aliases and the count of values.
    """

    __slots__ = (
        "awaiting_value",
        "checked",
        "data",
        "first_line",
        "is_mapping",
        "items",
        "key",
        "loc",
    )

    def __init__(self, loc: Loc, *, checked: bool, mapping: bool) -> None:
        self.loc = loc
        self.checked = checked
        self.is_mapping = mapping
        self.data: dict[str, object] | list[object] | None = (
            ({} if mapping else []) if checked else None
        )
        self.items = 0
        self.key: str | None = None
        """In a mapping, the key whose value comes next; None when that key was refused."""
        self.awaiting_value = False
        self.first_line: dict[str, int] = {}

    def child(self) -> tuple[Loc, bool]:
        """Where the next value of this collection is, and whether it is checked."""
        if not self.checked:
            return self.loc, False
        if self.is_mapping:
            return ((*self.loc, self.key), True) if self.key is not None else (self.loc, False)
        return (*self.loc, self.items), True

    def add(self, value: object) -> None:
        """Take the value just read: a list's item, a mapping's value or a refused key."""
        if not self.is_mapping:
            if isinstance(self.data, list):
                self.data.append(value)
            self.items += 1
        elif not self.awaiting_value:  # the key was a list or mapping: its value goes unread
            self.key = None
            self.awaiting_value = True
        else:
            if isinstance(self.data, dict) and self.key is not None:
                self.data[self.key] = value
            self.key = None
            self.awaiting_value = False


class _Reader:
    """Builds a document's data from its parser events, checking each as it comes."""

    def __init__(self, loader: yaml.SafeLoader | yaml.CSafeLoader) -> None:
        self.loader = loader
        self.problems: list[tuple[Loc, str]] = []
        self.unlisted = 0
        self.values = 0
        # A plain scalar whose first character starts no implicit type (int, bool, null...)
        # is text: it needs no regular expression.
        resolvers = loader.yaml_implicit_resolvers
        self.resolvable = frozenset(resolvers) if None not in resolvers else None
        # PyYAML's stubs leave its parser's get_event untyped, and libyaml's may give None
        # (only past the end of the stream, which is never asked for).
        self.next_event = cast(Callable[[], Event], loader.get_event)

    def event(self) -> Event:
        return self.next_event()

    def problem(self, loc: Loc, reason: Callable[[], str]) -> None:
        """Note a problem; past `MAX_LISTED_PROBLEMS` it is counted, its reason never built."""
        if len(self.problems) < MAX_LISTED_PROBLEMS:
            self.problems.append((loc, reason()))
        else:
            self.unlisted += 1

    def document(self) -> object:
        self.event()  # stream start
        if self.loader.check_event(StreamEndEvent):
            raise YamlRefused([((), "file is empty: it holds only comments or blank lines")])
        self.event()  # document start
        data = self.tree()
        self.event()  # document end
        if not self.loader.check_event(StreamEndEvent):
            second = self.event()
            raise YamlRefused(
                [
                    (
                        (),
                        "file holds more than one YAML document (another one starts"
                        f"{_at(second.start_mark)}); a policy file is a single document",
                    )
                ]
            )
        if self.problems:
            if self.unlisted:
                self.problems.append(((), not_listed(self.unlisted)))
            raise YamlRefused(self.problems)
        return data

    def tree(self) -> object:
        """Read one node and everything under it, looking at each event once."""
        stack: list[_Collection] = []
        next_event = self.next_event  # the loop runs once per event: no lookups in it
        resolvable = self.resolvable
        value: object
        while True:
            event = next_event()
            if isinstance(event, ScalarEvent | CollectionStartEvent):
                self.values += 1
                if self.values > MAX_VALUES or len(stack) >= MAX_DEPTH:
                    raise self.too_much(event, len(stack))
                parent = stack[-1] if stack else None
                if parent is not None and parent.is_mapping and not parent.awaiting_value:
                    self.key_of(parent, event)
                    if isinstance(event, CollectionStartEvent):
                        stack.append(self.collection(event, parent.loc, checked=False))
                    continue
                loc, checked = parent.child() if parent is not None else ((), True)
                if isinstance(event, CollectionStartEvent):
                    stack.append(self.collection(event, loc, checked=checked))
                    continue
                if not checked:
                    value = None
                elif event.tag is None and (
                    not event.implicit[0]
                    or (resolvable is not None and event.value[:1] not in resolvable)
                ):
                    value = event.value  # plain text, as most scalars are: nothing to resolve
                else:
                    value = self.scalar(event, loc)
            elif isinstance(event, AliasEvent):
                raise _Refused(
                    f"YAML aliases (*{event.anchor}) are not allowed in policy files; write the "
                    "settings out, or share them through defaults:",
                    event,
                )
            else:  # the end of the innermost list or mapping
                value = stack.pop().data
            if not stack:
                return value
            stack[-1].add(value)

    def too_much(self, event: Event, depth: int) -> _Refused:
        """The refusal of a value past `MAX_DEPTH` levels of nesting or `MAX_VALUES` values."""
        if depth >= MAX_DEPTH:
            return _Refused(f"the document is nested more than {MAX_DEPTH} levels deep", event)
        return _Refused(
            f"the file holds more than {MAX_VALUES} values (keys, settings and list items); a "
            f"policy file may hold at most {MAX_VALUES}",
            event,
        )

    def key_of(self, mapping: _Collection, event: Event) -> None:
        """Take a mapping's key; a list or mapping as a key is a problem."""
        if isinstance(event, ScalarEvent):
            mapping.key = self.key(event, mapping) if mapping.checked else None
            mapping.awaiting_value = True
        elif mapping.checked:
            line = _line(event)
            self.problem(
                mapping.loc,
                lambda: f"the key at line {line} is a list or mapping; keys must be text",
            )

    def collection(self, event: CollectionStartEvent, loc: Loc, *, checked: bool) -> _Collection:
        if checked and event.tag not in _UNTAGGED and event.tag not in _COLLECTION_TAGS:
            self.problem(loc, lambda: _tagged_collection(event))
            checked = False
        return _Collection(loc, checked=checked, mapping=isinstance(event, MappingStartEvent))

    def key(self, event: ScalarEvent, mapping: _Collection) -> str | None:
        """Check a mapping's key: text, not a merge key, not repeated. None if it is refused."""
        loc = mapping.loc
        line = _line(event)
        tag = self.tag(event)
        if tag == _MERGE_TAG:
            self.problem(
                loc,
                lambda: (
                    f"YAML merge keys (<<, line {line}) are not allowed; share settings "
                    "through defaults:"
                ),
            )
            return None
        if tag != _STR_TAG:
            what = _TAG_WORDS.get(tag, f"a value tagged {tag}")
            self.problem(
                loc,
                lambda: (
                    f"key {quoted(event.value)} at line {line} is read by YAML as {what}, "
                    f"not as text; put it in quotes ({quoted(event.value)}:)"
                ),
            )
            return None
        key = event.value
        first = mapping.first_line.get(key)
        if first is None:
            mapping.first_line[key] = line
        else:
            self.problem(
                (*loc, key),
                lambda: (
                    f"duplicate key {quoted(key)} (line {first} and again at line {line}); "
                    "YAML would silently keep only the last one"
                ),
            )
        return key

    def tag(self, event: ScalarEvent) -> str:
        """The scalar's tag: as written, or resolved from a plain scalar's text as PyYAML does."""
        if event.tag is not None and event.tag not in _UNTAGGED:
            return event.tag
        if not event.implicit[0] or (
            self.resolvable is not None and event.value[:1] not in self.resolvable
        ):
            return _STR_TAG
        resolved: str = self.loader.resolve(  # type: ignore[no-untyped-call]
            ScalarNode, event.value, event.implicit
        )
        return resolved

    def scalar(self, event: ScalarEvent, loc: Loc) -> object:
        """Read one scalar now, so that a value YAML cannot read is a problem at its key."""
        tag = self.tag(event)
        if tag == _STR_TAG:
            return event.value
        value = event.value
        if tag in _NUMBER_TAGS and len(value) > MAX_NUMBER_CHARS:
            self.problem(loc, lambda: _unreadable(event, tag, _TOO_MANY_DIGITS))
            return None
        if tag == _INT_TAG and value.isdigit() and value.isascii() and value[:1] != "0":
            return int(value)  # what PyYAML makes of a plain decimal, without its detour
        node = ScalarNode(tag, value, style=event.style)
        try:
            return self.loader.construct_object(node)
        except (yaml.YAMLError, *_CONSTRUCTION_ERRORS) as exc:
            # Worded now or never: a closure holding the exception would hold its traceback,
            # this frame and the closure in a cycle, for the garbage collector to find.
            complaint = _complaint(exc) if len(self.problems) < MAX_LISTED_PROBLEMS else ""
            self.problem(loc, lambda: _unreadable(event, tag, complaint))
            return None


_CONSTRUCTION_ERRORS = (ValueError, TypeError, KeyError, IndexError, AttributeError, OverflowError)
"""What PyYAML's constructors raise for a scalar they cannot read, besides its own errors:
``!!int abc``, ``2026-13-45`` (read as a date), ``!!bool maybe`` (a KeyError), ``!!int ''``
(an IndexError), ``!!timestamp nope`` (an AttributeError)."""


def _unreadable(event: ScalarEvent, tag: str, complaint: str) -> str:
    what = _SCALAR_WORDS.get(tag) or f"a value tagged {quoted(tag)}"
    return f"{quoted(event.value)}{_at(event.start_mark)} cannot be read as {what}: {complaint}"


def _tagged_collection(event: CollectionStartEvent) -> str:
    kind = "a mapping" if isinstance(event, MappingStartEvent) else "a list"
    return (
        f"{kind} tagged {quoted(event.tag or '')}{_at(event.start_mark)} cannot be read: lists "
        "and mappings take no tags in a policy file"
    )


def _complaint(exc: BaseException) -> str:
    """What a constructor said, in a reader's words where Python's are about Python."""
    text = str(getattr(exc, "problem", None) or exc)
    if "Exceeds the limit" in text and "digits" in text:
        return _TOO_MANY_DIGITS
    if isinstance(exc, KeyError):
        return "it is not one of the values of that type"
    if isinstance(exc, IndexError | AttributeError):
        return "it is not written as that type is"
    return bounded(text, 120)
