"""Card and phone numbers in free text: where they are, in the notations people write them.

`number_spans` finds what the redaction masks even when no redact path armed it (a caller
reads out a number before any tool is called; a model writes a card number into a note):

* **cards**: 13 to 19 digits that pass the Luhn check, run together or separated by spaces
  (also no-break and thin spaces) or dashes anywhere, or written in groups of four (Amex
  4-6-5) joined by one repeated ``.``, ``/`` or ``_`` (``5105.1051.0510.5100``);
* **phones in international form** (``+44 20 7946 0958``, or ``0044 20 7946 0958`` with the
  ``00`` dialled for the ``+``), up to the number's own end: a
  group after a space is part of it only while the digits so far are fewer than 11 (every
  country's numbers but a few short ones have at least 11 with the country code), so the
  ``2`` of ``+44 20 7946 0958 2 guests`` stays;
* **phones in national form**: ``(415) 555-0199``, ``415-555-0199``, ``415.555.0199``,
  ``415 555 0199``, ``1-800-555-0199``, and a trunk ``0`` with groups (``07700 900123``,
  ``020 7946 0958``, ``07700.900.123``) of 10 or 11 digits in all.

Digits of other scripts (fullwidth digits, Arabic-Indic ones) count as the digits they are.
Every pattern is bounded and linear; a number never starts inside a word or a longer number.

National numbers are written differently in every country (``01 42 68 53 00`` in France,
``03-1234-5678`` in Japan, ``(02) 9374 4000`` in Australia, ``030 901820`` in Germany): for
the ``regions`` a deployment names, Google's libphonenumber (the `phonenumbers` package, its
``lite`` build without geocoding data) finds every number its metadata says is a *valid*
number of that region, in any of its notations. Only valid numbers: its looser levels take
dates, amounts, ports and the digits of an id for phone numbers. It costs about a millisecond
per kilobyte of text per region (the patterns above, about 0.03), which is why it runs only
for the regions named (`pipecat_actions.observability.redaction.install_log_redaction`).
"""

from __future__ import annotations

__all__ = ["check_regions", "number_spans"]

import re
import unicodedata
from collections.abc import Sequence

_CARD = re.compile(r"[2-6](?<![\w+][2-6])(?:[ \-\u00a0\u2007\u2009\u202f]?\d){12,18}(?!\w)")
"""13 to 19 digits, spaces or dashes allowed, not inside a longer number nor glued to a word
(an operation id's hex holds runs of digits that pass Luhn) nor after a ``+`` (a phone number
and the number after it); Luhn is checked by `_card_span`.
It starts with a character class, not the look-behind, so that the regex engine can skip ahead
fast to the digits that could start a card."""

_GROUPED_CARD = re.compile(
    r"[2-6](?<![\w.,/][2-6])"
    r"(?:\d{3}(?P<sep>[./_])\d{4}(?P=sep)\d{4}(?P=sep)\d{1,7}|\d{3}(?P<amex>[./_])\d{6}(?P=amex)\d{5})"
    r"(?![\w]|[.,/]\d)"
)
"""A card in groups joined by one repeated dot, slash or underscore; never a decimal or a
version number, whose groups are not four digits each."""

_PHONE = re.compile(r"\+(?<![\w+]\+)[1-9](?:[ \-.()\u00a0]{0,2}\d){7,14}(?!\d)")
_IDD_PHONE = re.compile(r"0(?<![\w+.,:|\-/]0)0[1-9](?:[ \-.()\u00a0]{0,2}\d){7,14}(?!\d)")
"""An international number dialled with ``00`` for the ``+`` (``0044 20 7946 0958``), never
``00`` inside a longer number, a decimal, a time or after a ``|`` (an idempotency key joins
its parts with one: ``book|0010…``)."""
_NATIONAL_PHONE = re.compile(
    r"[(\d](?<![\w+\-./][(\d])"
    r"(?:(?<=\()\d{3}\)[ \-.\u00a0]?\d{3}[ \-.\u00a0]\d{4}"
    r"|(?<=\d)\d{2}(?P<us>[ \-.\u00a0])\d{3}(?P=us)\d{4}"
    r"|(?<=1)(?P<nanp>[ \-.\u00a0])\d{3}(?P=nanp)\d{3}(?P=nanp)\d{4}"
    r"|(?<=0)\d{2,4}[ \-.\u00a0]\d{3,6}(?:[ \-.\u00a0]\d{3,4})?)"
    r"(?!\w|[\-./]\d)"
)
"""Each pattern starts with what a number starts with, the look-behind after it, so that the
regex engine can skip ahead fast to where a number could start."""
_COMPLETE_DIGITS = 11
"""Digits (country code included) after which a space ends an international number."""

_OTHER_DIGIT = re.compile(r"\d(?<![0-9])")


_MAX_TRIES = 1000
"""The most candidate numbers libphonenumber examines in one text, per region (its bound)."""


def check_regions(regions: Sequence[str]) -> tuple[str, ...]:
    """Return ``regions`` as region codes libphonenumber knows (``FR``), or raise `ValueError`."""
    if not regions:
        return ()
    import phonenumbers  # 40 ms to import: only for a deployment that names regions

    known = phonenumbers.SUPPORTED_REGIONS
    codes = tuple(dict.fromkeys(region.strip().upper() for region in regions))
    unknown = [code for code in codes if code not in known]
    if unknown:
        raise ValueError(
            f"unknown phone region {', '.join(map(repr, unknown))}: use two-letter country "
            "codes (ISO 3166-1), such as US, GB, FR"
        )
    return codes


def number_spans(text: str, regions: Sequence[str] = ()) -> list[tuple[int, int]]:
    """Return the spans of ``text`` that hold a card or phone number, sorted, not overlapping.

    Args:
        text: The text.
        regions: Region codes (`check_regions`) whose national phone numbers are found too,
            in every notation libphonenumber knows for them.
    """
    if not text.isascii() and _OTHER_DIGIT.search(text):
        # One character for one: the spans found in the copy are the spans of the text.
        text = _OTHER_DIGIT.sub(lambda m: str(unicodedata.decimal(m.group(), 0)), text)
    digits = _digit_count(text, enough=13)
    spans: list[tuple[int, int]] = []
    if digits >= 13:
        spans += [span for m in _CARD.finditer(text) if (span := _card_span(m)) is not None]
        if "." in text or "/" in text or "_" in text:
            spans += [m.span() for m in _GROUPED_CARD.finditer(text) if _luhn(_digits(m.group()))]
    if "+" in text:
        spans += [_phone_span(m) for m in _PHONE.finditer(text)]
    if "00" in text:
        spans += [_phone_span(m) for m in _IDD_PHONE.finditer(text)]
    if digits >= 10:
        spans += [m.span() for m in _NATIONAL_PHONE.finditer(text) if _national(m.group())]
    if regions and digits >= 6:
        import phonenumbers

        valid = phonenumbers.Leniency.VALID
        for region in regions:
            matcher = phonenumbers.PhoneNumberMatcher(
                text, region, leniency=valid, max_tries=_MAX_TRIES
            )
            spans += [(match.start, match.end) for match in matcher]
    return _merged(spans)


def _digit_count(text: str, *, enough: int) -> int:
    # str.count runs in C; far cheaper than running the patterns on text without digits.
    count = 0
    for digit in "0123456789":
        count += text.count(digit)
        if count >= enough:
            break
    return count


def _digits(text: str) -> str:
    return "".join(char for char in text if char.isdigit())


def _luhn(digits: str) -> bool:
    total = 0
    for index, char in enumerate(reversed(digits)):
        value = ord(char) - 48
        if index % 2:
            value *= 2
            if value > 9:
                value -= 9
        total += value
    return total % 10 == 0


def _card_span(match: re.Match[str]) -> tuple[int, int] | None:
    """The card in a run of 13 to 19 digits: the whole run, else a window of it, else None."""
    candidate = match.group()
    positions = [i for i, char in enumerate(candidate) if char.isdigit()]
    digits = "".join(candidate[i] for i in positions)
    if _luhn(digits):
        return match.span()
    for first in range(len(digits) - 12):
        if digits[first] not in "23456":
            continue
        for length in range(min(19, len(digits) - first), 12, -1):
            if _luhn(digits[first : first + length]):
                start = match.start() + positions[first]
                return start, match.start() + positions[first + length - 1] + 1
    return None


def _phone_span(match: re.Match[str]) -> tuple[int, int]:
    """The international number of ``match``, ending where a complete number meets a space."""
    text = match.group()
    count = -2 if text.startswith("00") else 0  # the 00 stands for the +: not the number's
    for index, char in enumerate(text):
        if char.isdigit():
            count += 1
        elif char.isspace() and count >= _COMPLETE_DIGITS:
            end = index
            while end and not text[end - 1].isdigit():
                end -= 1
            return match.start(), match.start() + end
    return match.span()


def _national(text: str) -> bool:
    return text.startswith("(") or not text.startswith("0") or 10 <= len(_digits(text)) <= 11


def _merged(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged
