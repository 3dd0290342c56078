"""Sealed values: what the ledger stores in place of a tool's sensitive values, and reading it.

A policy marks paths of a tool's arguments, result and before-state ``encrypt`` or ``hash``
(`SealedFields`). Before an operation of that tool is written, every value found at such a
path is replaced, inside its JSON, by a marker:

* ``{"$enc": TOKEN}``: a Fernet token (see `pipecat_actions.ledger.keys`) of the value, bound
  to its operation and part: a token copied into another row or part does not open there;
* ``{"$hmac": HEX}``: the HMAC-SHA256 of the value's canonical JSON under the hash key. Equal
  values give equal markers; the value itself is kept nowhere.

A mapping that only looks like a marker (a model may send ``{"$enc": "x"}``) is stored as
``{"$lit": it}``, so that only the sealer's own markers are ever opened.

Read back, a stored value has three views:

* the runtime's (`Sealer.open`): ``$enc`` decrypted; one that does not open (a damaged token,
  a key no longer configured, a token of another row) becomes ``{"$unreadable": WHY}``, and
  the runtime sends no operation whose arguments hold one (`unreadable_reason`);
* an operator's, by default (`masked`, no key needed): ``••••`` for an encrypted value,
  ``•••• #`` and the start of its HMAC for a hashed one (equal values look equal);
* an operator's who reveals (`Sealer.reveal`): decrypted, what does not open said in words.

Free text of an operation (its error, rationale, audit details) cannot carry a marker: the
values found at its sensitive paths are masked in it instead (`scrub`).
"""

from __future__ import annotations

__all__ = [
    "MASK",
    "SealMode",
    "SealedFields",
    "SealedPath",
    "Sealer",
    "has_markers",
    "holds_sealed_values",
    "masked",
    "operator_view",
    "scalar_texts",
    "scrub",
    "secret_texts",
    "unreadable_reason",
]

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from cryptography.fernet import InvalidToken

from pipecat_actions.ledger._paths import Step, parse_path, replace_at, shown_path, values_at
from pipecat_actions.ledger.keys import ENV_LEDGER_KEYS, LedgerKeys
from pipecat_actions.ledger.records import Operation, canonical_json, hash_arguments

MASK = "••••"
"""What an operator sees in place of a sealed value, and what free text holds in its place."""

_ENC, _HMAC, _LIT, _UNREADABLE = "$enc", "$hmac", "$lit", "$unreadable"
_MARKERS = frozenset({_ENC, _HMAC, _LIT, _UNREADABLE})
_PARTS = ("args", "result", "before_state")
_MAX_DEPTH = 200
"""Values nested deeper are neither escaped nor opened (both stop at the same depth)."""
_MIN_SCRUBBED_CHARS = 4
"""A sensitive value shorter than this is not masked inside free text (it would blank digits
of every number there); it is still sealed where its path puts it."""
_OPERATION_ID = re.compile(r"op_[0-9a-f]{26}")


class SealMode(StrEnum):
    """How a sensitive value is stored.

    Attributes:
        ENCRYPT: Encrypted: an operator with the key can read it, the runtime runs with it.
        HASH: A keyed hash: only whether two values are equal can be told.
    """

    ENCRYPT = "encrypt"
    HASH = "hash"


@dataclass(frozen=True, slots=True)
class SealedPath:
    """One sensitive path of a tool, parsed.

    Attributes:
        written: The path as the policy writes it (``result.payment.card``).
        part: ``args``, ``result`` or ``before_state``.
        steps: The path inside that part (empty: the whole part).
        mode: How the values found there are stored.
    """

    written: str
    part: str
    steps: tuple[Step, ...]
    mode: SealMode

    @classmethod
    def of(cls, written: str, mode: str) -> SealedPath:
        """Parse a policy's path: ``result.…`` and ``before_state.…`` name those parts.

        Raises:
            ValueError: Not a path, or not a mode.
        """
        steps = parse_path(written)
        part = "args"
        if steps[0] in ("result", "before_state"):
            part, steps = str(steps[0]), steps[1:]
        return cls(written=written, part=part, steps=steps, mode=SealMode(mode))


@dataclass(frozen=True)
class SealedFields:
    """Every sensitive path of one tool, by part."""

    paths: tuple[SealedPath, ...]
    by_part: Mapping[str, tuple[SealedPath, ...]] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "by_part",
            {part: tuple(p for p in self.paths if p.part == part) for part in _PARTS},
        )

    @classmethod
    def of(cls, sensitive: Mapping[str, str]) -> SealedFields:
        """Parse a policy's ``sensitive:`` mapping (path → ``encrypt`` or ``hash``)."""
        return cls(tuple(SealedPath.of(path, mode) for path, mode in sensitive.items()))

    @property
    def modes(self) -> frozenset[SealMode]:
        """The modes its paths use."""
        return frozenset(p.mode for p in self.paths)


class _Marker(dict[str, Any]):
    """A marker the sealer made (the escaping pass leaves these alone)."""


class Sealer:
    """Seals and opens the sensitive values of the tools in ``tools`` with ``keys``.

    Args:
        tools: Each tool with sensitive paths (a compensation, ``<tool>.compensate``, is
            sealed as its tool).
        keys: The process's keys.

    Raises:
        LedgerKeysError: A tool needs a key that is not configured (one line, naming it).
    """

    def __init__(self, tools: Mapping[str, SealedFields], keys: LedgerKeys) -> None:
        self.tools = dict(tools)
        self.keys = keys
        for name, fields in self.tools.items():
            keys.require(
                encryption=SealMode.ENCRYPT in fields.modes,
                hashing=True,  # its arguments hash and idempotency key are keyed hashes
                why=f"the policy of {name} marks values sensitive",
            )

    def fields_for(self, tool: str) -> SealedFields | None:
        """The sensitive paths of ``tool`` (of its tool, for a compensation), or None."""
        found = self.tools.get(tool)
        if found is None and tool.endswith(".compensate"):
            found = self.tools.get(tool.removesuffix(".compensate"))
        return found

    # --- hashes ------------------------------------------------------------------------------

    def args_hash(self, tool: str, args: Mapping[str, Any]) -> str:
        """The arguments hash of a call: keyed for a tool with sensitive values, else SHA-256."""
        if self.fields_for(tool) is None:
            return hash_arguments(args)
        return self.keys.digest(b"args\0" + canonical_json(dict(args)).encode("utf-8"))

    def _hmac(self, value: Any) -> str:
        return self.keys.digest(b"value\0" + canonical_json(value).encode("utf-8"))

    # --- sealing -----------------------------------------------------------------------------

    def seal(self, value: Any, fields: SealedFields, part: str, operation_id: str) -> Any:
        """Return ``value`` (one part of an operation) with its sensitive values sealed.

        Raises:
            TypeError: A sensitive value cannot be encoded as JSON.
            ValueError: It holds NaN, infinity or a circular reference.
        """
        sealed = value
        for path in fields.by_part[part]:

            def seal_one(found: Any, _where: tuple[Step, ...], mode: SealMode = path.mode) -> Any:
                return self._marker(found, mode, part, operation_id)

            sealed = replace_at(sealed, path.steps, seal_one)
        return _escape(sealed, 0)

    def seal_whole(self, value: Any, part: str, operation_id: str) -> dict[str, Any]:
        """``value`` sealed as one (encrypted if a key is set, else hashed)."""
        mode = SealMode.ENCRYPT if self.keys.can_encrypt else SealMode.HASH
        return self._marker(value, mode, part, operation_id)

    def _marker(self, value: Any, mode: SealMode, part: str, operation_id: str) -> _Marker:
        if mode is SealMode.HASH:
            return _Marker({_HMAC: self._hmac(value)})
        plain = canonical_json({"at": f"{operation_id}/{part}", "v": value})
        return _Marker({_ENC: self.keys.encrypt(plain.encode("utf-8"))})

    # --- opening -----------------------------------------------------------------------------

    def open(
        self,
        value: Any,
        *,
        operation_id: str,
        part: str,
        opened: list[Any] | None = None,
    ) -> Any:
        """The runtime's view of a stored value: encrypted values decrypted.

        A value that does not open becomes ``{"$unreadable": WHY}``; a hashed one stays a
        marker. Each value decrypted is appended to ``opened``.
        """
        return _Opening(self, operation_id, part, reveal=False, opened=opened).walk(value, ())

    def reveal(self, value: Any, *, operation_id: str, part: str) -> Any:
        """An operator's view with the keys: decrypted, what does not open said in words."""
        return _Opening(self, operation_id, part, reveal=True, opened=None).walk(value, ())

    def open_text(
        self, text: str, *, operation_id: str, part: str, opened: list[Any] | None = None
    ) -> str:
        """`open` on canonical JSON text; the text itself when it holds no marker."""
        if not has_markers(text):
            return text
        return canonical_json(
            self.open(json.loads(text), operation_id=operation_id, part=part, opened=opened)
        )

    def unseal(self, token: str, *, operation_id: str, part: str, where: str) -> Any:
        """Decrypt one ``$enc`` token of ``operation_id``'s ``part``.

        Raises:
            _Unreadable: It does not open, or belongs to another operation or part.
        """
        if not self.keys.can_encrypt:
            raise _Unreadable(f"{where} is encrypted and {ENV_LEDGER_KEYS} is not set")
        try:
            plain = json.loads(self.keys.decrypt(token))
        except (InvalidToken, UnicodeError, ValueError):
            raise _Unreadable(
                f"{where} cannot be decrypted: it is damaged, or was encrypted with a key "
                f"that is not in {ENV_LEDGER_KEYS}"
            ) from None
        if not isinstance(plain, dict) or plain.get("at") != f"{operation_id}/{part}":
            raise _Unreadable(f"{where} holds an encrypted value of another operation")
        return plain.get("v")

    def rotate_text(self, text: str, *, part: str) -> tuple[str, int, list[str]]:
        """Re-encrypt, with the first key, every ``$enc`` token of stored JSON ``text``.

        Returns:
            The new text (``text`` itself when nothing changed), how many tokens were
            re-encrypted, and where (``args.card.number``) a token no key opens.
        """
        if not has_markers(text):
            return text, 0, []
        rotated = [0]
        unreadable: list[str] = []

        def walk(value: Any, at: tuple[Step, ...]) -> Any:
            if len(at) > _MAX_DEPTH:
                return value
            if isinstance(value, dict):
                marker = _marker_of(value)
                if marker == _ENC and isinstance(value[_ENC], str):
                    token = value[_ENC]
                    if self.keys.is_current(token):
                        return value
                    try:
                        fresh = self.keys.rotate(token)
                    except (InvalidToken, UnicodeError):
                        unreadable.append(shown_path(part, at))
                        return value
                    rotated[0] += 1
                    return {_ENC: fresh}
                if marker is not None:
                    return value
                return {k: walk(v, (*at, k)) for k, v in value.items()}
            if isinstance(value, list):
                return [walk(v, (*at, i)) for i, v in enumerate(value)]
            return value

        new = walk(json.loads(text), ())
        return (canonical_json(new) if rotated[0] else text), rotated[0], unreadable


class _Unreadable(Exception):
    """A sealed value that does not open (its text says why, naming where it is)."""


@dataclass
class _Opening:
    """One walk through a stored value, opening its markers."""

    sealer: Sealer | None
    operation_id: str
    part: str
    reveal: bool
    opened: list[Any] | None

    def walk(self, value: Any, at: tuple[Step, ...]) -> Any:
        if len(at) > _MAX_DEPTH:
            return value
        if isinstance(value, dict):
            marker = _marker_of(value)
            if marker is not None:
                return self._open(marker, value[marker], at)
            return {k: self.walk(v, (*at, k)) for k, v in value.items()}
        if isinstance(value, list):
            return [self.walk(v, (*at, i)) for i, v in enumerate(value)]
        return value

    def _open(self, marker: str, inner: Any, at: tuple[Step, ...]) -> Any:
        if marker == _LIT:
            return inner
        if marker == _HMAC:
            return _hash_mask(inner) if self.reveal else {_HMAC: inner}
        if marker == _UNREADABLE:
            return {_UNREADABLE: inner}
        where = shown_path(self.part, at)
        try:
            if self.sealer is None or not isinstance(inner, str):
                raise _Unreadable(f"{where} is not a value the ledger sealed")
            value = self.sealer.unseal(
                inner, operation_id=self.operation_id, part=self.part, where=where
            )
        except _Unreadable as exc:
            return f"[cannot be read: {exc}]" if self.reveal else {_UNREADABLE: str(exc)}
        if self.opened is not None:
            self.opened.append(value)
        return value


def _marker_of(value: dict[str, Any]) -> str | None:
    if len(value) != 1:
        return None
    (key,) = value
    return key if key in _MARKERS else None


def _escape(value: Any, depth: int) -> Any:
    """``value`` with every mapping that looks like a marker stored as ``{"$lit": it}``.

    What ``$lit`` wraps is kept as it is and read back as it is: no path can lead into it (a
    path's names never start with ``$``), so it holds no marker of the sealer's.
    """
    if depth > _MAX_DEPTH or isinstance(value, _Marker):
        return value
    if isinstance(value, Mapping):
        if len(value) == 1 and next(iter(value)) in _MARKERS:
            return {_LIT: value}
        return {k: _escape(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_escape(v, depth + 1) for v in value]
    return value


def has_markers(text: str | None) -> bool:
    """Whether stored JSON text may hold a marker (a mapping whose first key starts with $)."""
    return text is not None and '{"$' in text


def _hash_mask(digest: Any) -> str:
    return f"{MASK} #{digest[:12]}" if isinstance(digest, str) else MASK


def masked(value: Any) -> Any:
    """An operator's default view of a stored value: no key needed, no sealed value shown."""
    return _masked(value, 0)


def _masked(value: Any, depth: int) -> Any:
    if depth > _MAX_DEPTH:
        return value
    if isinstance(value, dict):
        marker = _marker_of(value)
        if marker == _LIT:
            return value[_LIT]
        if marker == _ENC:
            return MASK
        if marker == _HMAC:
            return _hash_mask(value[_HMAC])
        return {k: _masked(v, depth + 1) for k, v in value.items()}
    if isinstance(value, list):
        return [_masked(v, depth + 1) for v in value]
    return value


_COLUMNS = {"args": "args_json", "result": "result_json", "before_state": "before_state_json"}


def operator_view(op: Operation, part: str, sealer: Sealer | None = None) -> Any:
    """One JSON part of ``op`` (``args``, ``result``, ``before_state``) as an operator sees it.

    Its sealed values masked (`masked`), or, given the ``sealer`` of an operator who may see
    them, revealed (`Sealer.reveal`). None when the operation has no such part.
    """
    text: str | None = getattr(op, _COLUMNS[part])
    if text is None:
        return None
    value = json.loads(text)
    if not has_markers(text):
        return value
    if sealer is None:
        return masked(value)
    return sealer.reveal(value, operation_id=op.operation_id, part=part)


def holds_sealed_values(op: Operation) -> bool:
    """Whether ``op`` may hold values sealed by a policy's ``sensitive`` paths."""
    return any(has_markers(getattr(op, column)) for column in _COLUMNS.values())


def unreadable_reason(op: Operation) -> str | None:
    """Why ``op`` cannot be sent: a sealed argument or before-state value did not open."""
    for text in (op.args_json, op.before_state_json):
        if text is None or f'{{"{_UNREADABLE}"' not in text:
            continue
        found = _find_unreadable(json.loads(text), 0)
        if found is not None:
            return found
    return None


def _find_unreadable(value: Any, depth: int) -> str | None:
    if depth > _MAX_DEPTH:
        return None
    if isinstance(value, dict):
        if _marker_of(value) == _UNREADABLE:
            return str(value[_UNREADABLE])
        items: Iterable[Any] = value.values()
    elif isinstance(value, list):
        items = value
    else:
        return None
    for item in items:
        found = _find_unreadable(item, depth + 1)
        if found is not None:
            return found
    return None


# --- free text ---------------------------------------------------------------------------------


def secret_texts(value: Any, paths: Iterable[SealedPath]) -> list[str]:
    """The text of every scalar found at ``paths`` in ``value``, as `scrub` masks it."""
    found: list[str] = []
    for path in paths:
        for item in values_at(value, path.steps):
            _scalars(item, found, 0)
    return found


def scalar_texts(value: Any) -> list[str]:
    """The text of every scalar in ``value`` (text, numbers), at any depth."""
    found: list[str] = []
    _scalars(value, found, 0)
    return found


def _scalars(value: Any, into: list[str], depth: int) -> None:
    if depth > _MAX_DEPTH:
        return
    if isinstance(value, str):
        into.append(value)
    elif isinstance(value, bool) or value is None:
        return
    elif isinstance(value, int | float):
        into.append(str(value))
    elif isinstance(value, Mapping):
        for item in value.values():
            _scalars(item, into, depth + 1)
    elif isinstance(value, list | tuple):
        for item in value:
            _scalars(item, into, depth + 1)


def scrub(value: Any, secrets: Iterable[str]) -> Any:
    """``value`` (free text, or an audit detail) with each of ``secrets`` masked in its text.

    Secrets shorter than 4 characters are left (see `_MIN_SCRUBBED_CHARS`); so is text that
    is an operation id (a detail naming another operation keeps naming it).
    """
    wanted = sorted({s for s in secrets if len(s) >= _MIN_SCRUBBED_CHARS}, key=len, reverse=True)
    if not wanted or value is None:
        return value
    forms = {form for s in wanted for form in (s, json.dumps(s)[1:-1]) if form}
    pattern = re.compile("|".join(re.escape(f) for f in sorted(forms, key=len, reverse=True)))
    return _scrubbed(value, pattern, 0)


def _scrubbed(value: Any, pattern: re.Pattern[str], depth: int) -> Any:
    if isinstance(value, str):
        return value if _OPERATION_ID.fullmatch(value) else pattern.sub(MASK, value)
    if depth > _MAX_DEPTH:
        return value
    if isinstance(value, Mapping):
        return {
            _scrubbed(k, pattern, depth + 1): _scrubbed(v, pattern, depth + 1)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_scrubbed(v, pattern, depth + 1) for v in value]
    return value
