"""Log redaction: what a policy marks ``redact`` and common secrets never reach a log line.

One loguru patcher (`install_log_redaction`; `ActionRuntime.create` installs it) rewrites every
record of the process before any sink sees it: the message, the string values of ``extra`` and
the text of an attached exception. It masks with three nets:

1. **Keys.** The last name of every redact path of every loaded policy (``number`` for
   ``card.number``, ``phone`` for ``guests[*].phone``, ``card`` for ``card``): the value after
   ``"number":``, ``'number':`` or ``number=`` is masked wherever it appears (JSON, a Python
   repr, JSON inside a repr, keyword form). This is what hides the arguments Pipecat logs at
   DEBUG before the runtime has seen the call: ``LLMService`` logs ``Calling function [...]
   with arguments {...}``, and every inference logs the whole context (``Generating LLM
   response [...]``), tool-call arguments included. A key may hide more than its path (every
   ``number`` value, not only the card's): hiding too much is the safe side.
2. **Values.** The runtime arms the values found at the redact paths of each call it admits
   (`Redactor.arm`, after validation: a refused call's values may be anything the model made
   up); they are masked wherever they appear afterwards, e.g. when the model reads a phone
   number back and Pipecat logs the text it sends to TTS. Only a value that could be a secret
   of the kind redacted is armed: text or a whole number of at least
   `Redactor.min_value_chars` characters holding a digit or an ``@`` (a phone, a card, an
   e-mail address, a reference). A plain word (``escalated``, a name) is not: it would blank
   that word out of every later line, and it stays masked by key. The most recent
   `Redactor.max_values` are kept.
3. **Patterns.** Card numbers that pass the Luhn check and phone numbers, in the notations
   people write them (see `pipecat_actions.observability._numbers`); bearer and basic
   credentials; JWTs; API keys (``sk-…``, ``sk_live_…``, ``ghp_…``, ``xoxb-…``, ``AIza…``); AWS
   access key ids; passwords, secrets and tokens written ``key=value`` or ``"key": "value"``;
   passwords in URLs.

Every quantifier is bounded and every scan is linear, so a huge or deeply nested argument
costs time in proportion to its length and cannot blow the stack. An exception attached to a
record is rendered here as a plain traceback without variable values (loguru's ``diagnose``
would print the locals of every frame, arguments included), redacted, and appended to the
message.

The ledger keeps the exact arguments for audit: redaction is for logs and traces only.
"""

from __future__ import annotations

__all__ = [
    "MASK",
    "PHONE_REGIONS_ENV",
    "Redactor",
    "install_log_redaction",
    "log_redactor",
    "uninstall_log_redaction",
]

import json
import os
import re
import threading
import traceback
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from loguru import logger

from pipecat_actions.errors import ConfigurationError
from pipecat_actions.observability._numbers import check_regions, number_spans
from pipecat_actions.observability.correlation import correlation_text

if TYPE_CHECKING:
    from loguru import Record

    from pipecat_actions.policy import PolicySet

MASK = "[REDACTED]"
"""What a masked value is replaced with."""

_PATH_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SCALAR = re.compile(r"[^\s,;&}\])]+")
_STRUCTURAL = re.compile(r"[\[\]{}()\"'\\]")
_MAX_STRUCTURE_CHARS = 65_536
"""A bracketed value longer than this is masked to the end of the text (never scanned further)."""

_SECRET_WORDS = (
    r"password|passwd|passphrase|pwd|secret|client[_-]?secret|secret[_-]?key|api[_-]?key|"
    r"apikey|access[_-]?key|access[_-]?token|refresh[_-]?token|auth[_-]?token|id[_-]?token|"
    r"token|private[_-]?key|aws_secret_access_key|authorization|cookie|cvc|cvv"
)
_QUOTED = r"\"(?:[^\"\\\n]|\\.)*\"|'(?:[^'\\\n]|\\.)*'"
_NAMED_SECRET = re.compile(
    # Credentials in an Authorization header or its text (before key=value, which would stop
    # at the scheme's name).
    r"(?P<auth>(?i:\bbearer\s+|\bauthorization\b\\{0,8}[\"']?\s*[:=]\s*[\"']?"
    r"(?:basic|digest|token|bearer)?\s*))(?P<authval>[A-Za-z0-9\-._~+/]{8,}=*)"
    # A named secret in key=value, key: value or "key": "value" form: the value is masked.
    rf"|(?P<kv>(?i:\b(?:{_SECRET_WORDS})\b)\\{{0,8}}[\"']?\s*[:=]\s*)"
    rf"(?P<kvval>\\{{1,8}}\"[^\"]*?\\{{1,8}}\"|{_QUOTED}|[^\s,;&}}\])\"']+)"
)
_NAMED_TRIGGERS = (
    "pass", "pwd", "secret", "api_key", "api-key", "apikey", "access_key", "access-key",
    "private_key", "private-key", "token", "authorization", "bearer", "cookie", "cvc", "cvv",
)  # fmt: skip
"""Lower-case words one of which a text must hold before `_NAMED_SECRET` is run on it."""

_API_KEY = re.compile(
    r"\b(?:[sprk]k[-_](?:live_|test_|proj-|ant-|svcacct-)?[A-Za-z0-9_\-]{16,}"
    r"|gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,}"
    r"|xox[abprs]-[A-Za-z0-9\-]{10,}|AIza[0-9A-Za-z_\-]{30,}"
    r"|(?:AKIA|ASIA|AGPA|AIDA|AROA|ANPA|ANVA|AIPA)[A-Z0-9]{16}\b"
    r"|eyJ[A-Za-z0-9_\-]{8,}\.eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,})"
)
_API_KEY_TRIGGERS = (
    "sk-", "sk_", "pk-", "pk_", "rk-", "rk_", "kk-", "kk_", "gh", "github_pat_", "xox",
    "AIza", "AKIA", "ASIA", "AGPA", "AIDA", "AROA", "ANPA", "ANVA", "AIPA", "eyJ",
)  # fmt: skip
"""Substrings one of which a text must hold before `_API_KEY` is run on it."""

_URL_PASSWORD = re.compile(r"(?P<url>://[^:/@\s]{1,256}:)(?P<urlval>[^@/\s]{1,256})(?=@)")
_KEY_VALUE_SEPARATOR = re.compile(r"\\{0,8}[\"']\s*:\s*")
_KEYWORD_SEPARATOR = re.compile(r"\s*=(?!=)\s*")
_QUOTED_VALUE = {
    quote: re.compile(rf"{quote}(?:[^{quote}\\]|\\.)*{quote}", re.S) for quote in "\"'"
}


def _replace_named(match: re.Match[str]) -> str:
    if match.lastgroup == "authval":
        return f"{match.group('auth')}{MASK}"
    value = match.group("kvval")
    quote = value[0] if value[0] in "\"'" else ""
    if value.startswith("\\"):
        quote = value[: value.index('"') + 1]
    return f"{match.group('kv')}{quote}{MASK}{quote}"


class Redactor:
    """Masks redacted argument values and common secrets in text (see the module docstring).

    Thread-safe: the runtime arms values from the event loop while other threads may log.

    Args:
        max_values: How many armed values are kept (the oldest are dropped first).
        min_value_chars: Values shorter than this are not armed.
        phone_regions: Countries (``FR``, ``JP``) whose national phone numbers are masked in
            every notation their numbering plan allows (see `phone_regions`).
    """

    def __init__(
        self,
        *,
        max_values: int = 512,
        min_value_chars: int = 4,
        phone_regions: Sequence[str] = (),
    ) -> None:
        self.max_values = max_values
        self.min_value_chars = min_value_chars
        self._regions: tuple[str, ...] = ()
        self.phone_regions = phone_regions
        self._lock = threading.Lock()
        self._keys: tuple[str, ...] = ()
        self._values: dict[str, None] = {}
        self._value_pattern: re.Pattern[str] | None = None
        self._values_dirty = False

    # --- what to hide ----------------------------------------------------------------------

    def add_paths(self, paths: Iterable[str]) -> None:
        """Mask the values of these redact paths' last names wherever they appear."""
        names = {_last_name(path) for path in paths} - set(self._keys)
        if names:
            with self._lock:
                self._keys = tuple(sorted({*self._keys, *names}))

    def add_policy(self, policy: PolicySet) -> None:
        """Mask the redact and sensitive paths of every tool of ``policy``."""
        self.add_paths(path for name in policy.names() for path in policy[name].redacted_paths)

    def arm(self, paths: Sequence[str], arguments: Mapping[str, Any]) -> None:
        """Mask, from now on, the values found at ``paths`` in one call's ``arguments``.

        Only values that could be a secret are armed (see `plausible_secret`).

        Args:
            paths: Redact paths (``card.number``, ``guests[*].phone``).
            arguments: An admitted call's validated arguments.
        """
        if not paths:
            return
        found: list[str] = []
        for path in paths:
            for value in _values_at(arguments, path):
                _scalars(value, found)
        fresh = [v for v in found if self.plausible_secret(v) and v not in self._values]
        if not fresh:
            return
        with self._lock:
            for value in fresh:
                self._values[value] = None
                escaped = json.dumps(value)[1:-1]
                if escaped != value:
                    self._values[escaped] = None
            while len(self._values) > self.max_values:
                del self._values[next(iter(self._values))]
            self._values_dirty = True

    def plausible_secret(self, value: str) -> bool:
        """Whether ``value`` (text, or a number as text) is worth masking wherever it appears.

        It must be at least `min_value_chars` long and hold a digit or an ``@``: what the model
        may read back (a phone, a card, an e-mail address, a booking reference). A plain word
        would mask that word in every later line: a call that put ``escalated`` at a redact
        path would hide every escalation from the logs.
        """
        return len(value) >= self.min_value_chars and (
            "@" in value or any(char.isdigit() for char in value)
        )

    @property
    def phone_regions(self) -> tuple[str, ...]:
        """The countries whose national phone numbers are masked in any notation.

        International numbers (``+33 1 42 68 53 00``, ``0033 ...``) and the national forms of
        North America and of trunk-0 countries written in groups are masked whatever this
        says; a country's other notations (``01 42 68 53 00``) need it here. Each costs about
        a millisecond per kilobyte of logged text.

        Raises:
            ConfigurationError: A code that is not a country's (set to an unknown one).
        """
        return self._regions

    @phone_regions.setter
    def phone_regions(self, regions: Sequence[str]) -> None:
        if isinstance(regions, str):
            regions = [regions]  # one code, never its letters
        try:
            self._regions = check_regions(regions)
        except ValueError as exc:
            raise ConfigurationError(str(exc)) from None

    @property
    def armed_values(self) -> int:
        """How many values are armed now."""
        return len(self._values)

    # --- masking ---------------------------------------------------------------------------

    def redact_text(self, text: str) -> str:
        """Return ``text`` with every redacted value and recognised secret masked."""
        # Each net first checks, with plain substring searches (fast, in C), that the text
        # could hold what it looks for; most log lines hold none and cost only those checks.
        if self._keys:
            text = self._mask_keys(text)
        if self._values:
            text = self._values_regex().sub(MASK, text)
        lower = text.lower()
        if any(word in lower for word in _NAMED_TRIGGERS):
            text = _NAMED_SECRET.sub(_replace_named, text)
        if any(prefix in text for prefix in _API_KEY_TRIGGERS):
            text = _API_KEY.sub(MASK, text)
        if "://" in text:
            text = _URL_PASSWORD.sub(lambda m: f"{m.group('url')}{MASK}", text)
        spans = number_spans(text, self._regions)
        if spans:
            text = _masked(text, spans)
        return text

    def redact_value(self, value: Any, *, _depth: int = 0) -> Any:
        """Return ``value`` with its strings redacted, through lists, tuples and mappings.

        Containers nested deeper than 16 levels, and items past the first 1,000 of one
        container, are replaced by a mask rather than walked.
        """
        if isinstance(value, str):
            return self.redact_text(value)
        if isinstance(value, int | float | bool) or value is None:
            return value
        if _depth >= 16:
            return MASK
        if isinstance(value, Mapping):
            items = list(value.items())
            out = {k: self.redact_value(v, _depth=_depth + 1) for k, v in items[:1000]}
            if len(items) > 1000:
                out["..."] = MASK
            return out
        if isinstance(value, list | tuple):
            walked = [self.redact_value(v, _depth=_depth + 1) for v in value[:1000]]
            return [*walked, MASK] if len(value) > 1000 else walked
        return self.redact_text(str(value))

    def __call__(self, record: Record) -> None:
        """Redact one loguru record in place (the patcher)."""
        message = self.redact_text(record["message"])
        exception = record["exception"]
        if exception is not None:
            rendered = "".join(
                traceback.format_exception(exception.type, exception.value, exception.traceback)
            )
            message = f"{message}\n{self.redact_text(rendered).rstrip()}"
            record["exception"] = None
        record["message"] = message
        extra = record["extra"]
        for name, value in extra.items():
            if not isinstance(value, int | float | bool) and value is not None:
                extra[name] = self.redact_value(value)
        if "correlation" not in extra:
            extra["correlation"] = correlation_text(extra)

    def _values_regex(self) -> re.Pattern[str]:
        if self._values_dirty or self._value_pattern is None:
            with self._lock:
                ordered = sorted(self._values, key=len, reverse=True)
                self._value_pattern = re.compile("|".join(re.escape(v) for v in ordered))
                self._values_dirty = False
        return self._value_pattern

    def _mask_keys(self, text: str) -> str:
        """Mask the value after each redact key (``"key":``, ``'key':``, ``key=``)."""
        spans: list[tuple[int, int]] = []
        for key in self._keys:
            at = text.find(key)
            while at >= 0:
                after = at + len(key)
                before = text[at - 1] if at else ""
                if before in ("'", '"'):
                    separator = _KEY_VALUE_SEPARATOR.match(text, after)
                elif not (before.isalnum() or before == "_"):
                    separator = _KEYWORD_SEPARATOR.match(text, after)
                else:
                    separator = None
                if separator is not None:
                    start = separator.end()
                    end = _value_end(text, start)
                    if end > start:
                        spans.append((start, end))
                    after = max(after, end)
                at = text.find(key, after)
        if not spans:
            return text
        parts: list[str] = []
        position = 0
        for start, end in sorted(spans):
            if start < position:  # inside a value already masked
                continue
            quote = _leading_quote(text, start)
            parts.append(text[position:start])
            parts.append(f"{quote}{MASK}{quote}" if quote else MASK)
            position = end
        parts.append(text[position:])
        return "".join(parts)


def _masked(text: str, spans: list[tuple[int, int]]) -> str:
    parts: list[str] = []
    position = 0
    for start, end in spans:
        parts += [text[position:start], MASK]
        position = end
    parts.append(text[position:])
    return "".join(parts)


def _last_name(path: str) -> str:
    names = _PATH_NAME.findall(path)
    return names[-1] if names else path


def _values_at(value: Any, path: str) -> Iterable[Any]:
    """Yield the values at a redact path (``guests[*].phone``) in ``value``."""
    current = [value]
    for token in re.findall(r"[A-Za-z_][A-Za-z0-9_]*|\[(?:\*|\d+)\]", path):
        following: list[Any] = []
        for item in current:
            if token == "[*]":
                if isinstance(item, list | tuple):
                    following.extend(item)
            elif token.startswith("["):
                index = int(token[1:-1])
                if isinstance(item, list | tuple) and index < len(item):
                    following.append(item[index])
            elif isinstance(item, Mapping) and token in item:
                following.append(item[token])
        current = following
    return current


def _scalars(value: Any, into: list[str], depth: int = 0) -> None:
    """Collect the text of every scalar in ``value`` (bounded: 16 levels, 1,000 items)."""
    if depth > 16 or len(into) > 1000:
        return
    if isinstance(value, str):
        into.append(value)
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int | float):
        into.append(str(value))
    elif isinstance(value, Mapping):
        for item in list(value.values())[:1000]:
            _scalars(item, into, depth + 1)
    elif isinstance(value, list | tuple):
        for item in value[:1000]:
            _scalars(item, into, depth + 1)


def _leading_quote(text: str, start: int) -> str:
    """The quote (with any escaping backslashes) a value at ``start`` opens with, or ''."""
    end = start
    while end < len(text) and end - start < 8 and text[end] == "\\":
        end += 1
    if end < len(text) and text[end] in "\"'":
        return text[start : end + 1]
    return ""


def _value_end(text: str, start: int) -> int:
    """Return where the value at ``start`` ends (a quoted string, brackets, or a bare word).

    An unterminated value, or a bracketed one longer than 64 KiB, ends at the end of the text.
    """
    if start >= len(text):
        return start
    quote = _leading_quote(text, start)
    if quote:
        if len(quote) > 1:  # an escaped quote (JSON inside JSON): ends at the same sequence
            close = text.find(quote, start + len(quote))
            return len(text) if close < 0 else close + len(quote)
        match = _QUOTED_VALUE[quote].match(text, start)
        return match.end() if match else len(text)
    if text[start] in "[{(":
        return _bracket_end(text, start)
    match = _SCALAR.match(text, start)
    return match.end() if match else start


def _bracket_end(text: str, start: int) -> int:
    depth = 0
    quote: str | None = None
    escaped = -1  # the position of a character a backslash escapes
    for match in _STRUCTURAL.finditer(text, start):
        at = match.start()
        if at - start > _MAX_STRUCTURE_CHARS:
            return len(text)
        char = match.group()
        if at == escaped:
            continue
        if char == "\\":
            escaped = at + 1
        elif quote is not None:
            if char == quote:
                quote = None
        elif char in "\"'":
            quote = char
        elif char in "[{(":
            depth += 1
        elif char in "]})":
            depth -= 1
            if depth == 0:
                return at + 1
    return len(text)


_redactor = Redactor()
_installed: Callable[[Record], None] | None = None
_previous: Callable[[Record], None] | None = None


def log_redactor() -> Redactor:
    """Return the process's redactor, the one `install_log_redaction` installs."""
    return _redactor


PHONE_REGIONS_ENV = "PIPECAT_ACTIONS_PHONE_REGIONS"
"""Comma-separated country codes (``FR,BE``): `Redactor.phone_regions` when none is given."""


def install_log_redaction(
    *,
    policy: PolicySet | None = None,
    patcher: Callable[[Record], None] | None = None,
    phone_regions: Sequence[str] | None = None,
) -> Redactor:
    """Redact every loguru record of the process from now on; return the redactor.

    Installing twice keeps one patcher. A patcher configured before (``logger.configure(
    patcher=...)``) keeps running, before the redaction so that what it adds is redacted too;
    a patcher configured *after* this call replaces the redaction, so pass yours here instead.

    Args:
        policy: Also mask the redact paths of this policy.
        patcher: A patcher of the application's to run before redacting.
        phone_regions: The countries whose callers' national phone numbers are masked in any
            notation (`Redactor.phone_regions`). None: as set before, or at the first
            installation, ``$PIPECAT_ACTIONS_PHONE_REGIONS`` (none when unset).

    Raises:
        ConfigurationError: An unknown country code (given, or in the environment variable).
    """
    global _installed, _previous
    if phone_regions is None and _installed is None and os.environ.get(PHONE_REGIONS_ENV):
        listed = [r for r in os.environ[PHONE_REGIONS_ENV].split(",") if r.strip()]
        try:
            _redactor.phone_regions = listed
        except ConfigurationError as exc:
            raise ConfigurationError(f"${PHONE_REGIONS_ENV}: {exc}") from None
    if phone_regions is not None:
        _redactor.phone_regions = phone_regions
    if policy is not None:
        _redactor.add_policy(policy)
    # loguru (pinned) keeps the configured patcher on its core; there is no public getter.
    core = getattr(logger, "_core", None)
    current = getattr(core, "patcher", None)
    if current is not None and current is _installed and patcher is None:
        return _redactor
    before = patcher or (current if current is not _installed else _previous)

    def redact(record: Record) -> None:
        if before is not None:
            before(record)
        _redactor(record)

    _installed, _previous = redact, before
    logger.configure(patcher=redact)
    return _redactor


def uninstall_log_redaction() -> None:
    """Stop redacting log records (restores the patcher that ran before, if any)."""
    global _installed, _previous
    core = getattr(logger, "_core", None)
    if core is not None and _installed is not None and core.patcher is _installed:
        core.patcher = _previous
    _installed = _previous = None
