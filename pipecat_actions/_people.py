"""How people read names and reasons: one approver's name against a requester's, a blank reason.

An approver's name is compared with the request's principal as a reader sees them, so a
requester cannot approve their own request under a name that merely looks different; a reason
must hold something a reader can see.
"""

from __future__ import annotations

__all__ = ["same_person", "shows_something"]

import unicodedata

_LOOK_ALIKES = str.maketrans(
    # Cyrillic, Greek and Latin letters drawn as a Latin letter is (after NFKC, before casefold):
    # "\u0440\u043e\u0455\u0430" reads "rosa" on any screen. Approver names are ASCII
    # (`check_approver_name`), so only a principal can hold them.
    "\u0430\u0435\u043e\u0440\u0441\u0443\u0445\u0455\u0456\u0458\u04bb\u0501\u051b\u051d\u04cf"
    "\u0410\u0412\u0415\u041a\u041c\u041d\u041e\u0420\u0421\u0422\u0425\u0423\u0405\u0406\u0408"
    "\u051a\u051c\u04c0"
    "\u03b1\u03bf\u03c1\u03bd\u03b9\u03ba\u03c5\u03c7\u03f2"
    "\u0391\u0392\u0395\u0396\u0397\u0399\u039a\u039c\u039d\u039f\u03a1\u03a4\u03a5\u03a7"
    "\u0131\u0269\u0261",
    "aeopcyxsijhdqwlABEKMHOPCTXYSIJQWIaopvikuxcABEZHIKMNOPTYXiig",
)
_INVISIBLE = frozenset({"Cf", "Mn", "Me"})
"""Format characters (zero-width, bidi marks) and combining marks left over after NFKC (one
that composes with the letter before it is part of that letter by then)."""


_BLANK = frozenset({"Cc", "Cf", "Cs", "Cn", "Zs", "Zl", "Zp", "Mn", "Me"})
_BLANK_LETTERS = frozenset("\u115f\u1160\u3164\uffa0\u2800")
"""Hangul fillers and the blank braille pattern: letters and symbols that print as nothing."""


def shows_something(text: str) -> bool:
    """Whether ``text`` holds a character a reader sees (a reason of zero-width spaces does not)."""
    return any(
        unicodedata.category(c) not in _BLANK and c not in _BLANK_LETTERS and not c.isspace()
        for c in text
    )


def same_person(name: str, principal: str) -> bool:
    """Whether an approver's ``name`` is the request's ``principal``.

    Compared as people would read them: without regard to case, Unicode compatibility forms
    (NFKC), invisible format characters (zero-width, bidi marks), combining marks left over,
    letters of another script drawn as a Latin one (Cyrillic o, Greek alpha) or surrounding
    whitespace, so ``"rosa "``, ``"ro\u200bsa"`` or ``"r\u043esa"`` as a principal is still
    rosa. It errs towards "the same": a refusal sends the request to another approver.
    """

    def plain(text: str) -> str:
        folded = unicodedata.normalize("NFKC", text)
        visible = "".join(c for c in folded if unicodedata.category(c) not in _INVISIBLE)
        return visible.translate(_LOOK_ALIKES).strip().casefold()

    return plain(name) == plain(principal)
