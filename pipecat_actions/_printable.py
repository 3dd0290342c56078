r"""Text made safe to show, whatever the ledger holds.

A tool's name, a principal, arguments, an error or an audit detail are written by whoever
wrote the ledger: a model's tool call, an application, another process on a shared database.
Shown as they are, their control characters are obeyed by the terminal that shows them (ESC
starts sequences that recolour, move the cursor, set the window's title or plant an OSC 8
link), a newline forges a line of a table, and a bidi override shows text in another order
than it is stored. `printable` shows each such character as an escape a person can read (ESC
as the four characters ``\x1b``) and every other character as it is. Every text output of
the operator's tools goes through it; JSON needs nothing (``json.dumps`` escapes them).

`bounded` is `printable` for text quoted back to whoever sent it (a refusal naming the tool or
the argument key the model sent): a short prefix and a note of the length, never all of it.

It is a way of showing, not an encoding: a value that holds the characters ``\x1b`` is shown
as one that holds an ESC is. The exact value is what ``--json`` prints.
"""

from __future__ import annotations

__all__ = ["bounded", "printable", "printable_json", "printable_lines", "quoted"]

import json
import unicodedata
from typing import Any

_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})
"""Control characters (C0, DEL, C1), format characters (the bidi embeddings, overrides,
isolates and marks; zero-width characters, which can make two names look the same), lone
surrogates (which no terminal encoding can carry) and the line and paragraph separators."""
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    code = ord(char)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def printable(text: str) -> str:
    r"""Return ``text`` with every control, format and separator character escaped visibly.

    ``"\x1b]8;;http://x\x07"`` becomes ``\x1b]8;;http://x\x07`` as plain characters, a newline
    ``\n``, U+202E ``\u202e``. The result is one line whatever ``text`` holds.
    """
    if text.isprintable():  # the common case: nothing to look at character by character
        return text
    return "".join(
        _escape(char) if unicodedata.category(char) in _ESCAPED_CATEGORIES else char
        for char in text
    )


def bounded(text: str, limit: int = 60) -> str:
    r"""Return ``text`` `printable` in at most ``limit`` characters, with a note when it is cut.

    For text someone else chose (a tool name or an argument key the model sent) quoted back in
    a message: ``bounded("x" * 10_000_000)`` is 60 ``x`` and ``… (10000000 characters)``, never
    the whole of it. Only the part shown is escaped, so a huge ``text`` costs no more than a
    short one; an escape cut at the limit is shown in part.
    """
    if len(text) <= limit and text.isprintable():
        return text
    shown = printable(text[:limit])
    if len(text) <= limit and len(shown) <= limit:
        return shown
    return f"{shown[:limit]}… ({len(text)} characters)"


def quoted(text: str, limit: int = 60) -> str:
    """Return ``text`` quoted as ``repr`` quotes it, cut after ``limit`` characters.

    For a name quoted inside a sentence (``unknown key 'x'``): ``repr`` escapes what a
    terminal would obey, and a long one is shown in part, with a note of its length.
    """
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}… ({len(text)} characters)"


def printable_lines(text: str) -> str:
    """Return ``text`` with each of its lines made `printable`: its line breaks are kept."""
    return "\n".join(printable(line) for line in text.split("\n"))


def printable_json(value: Any, *, sort_keys: bool = False) -> str:
    """Return ``value`` as indented JSON, readable (non-ASCII kept), each line `printable`.

    ``ensure_ascii=False`` keeps ``José`` readable; JSON escapes the C0 controls itself and
    `printable` what is left (C1 controls, bidi overrides, zero-width characters).
    """
    text = json.dumps(value, indent=2, ensure_ascii=False, sort_keys=sort_keys, default=str)
    return printable_lines(text)
