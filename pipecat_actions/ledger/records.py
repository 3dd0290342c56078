"""Records the ledger reads and writes: `NewOperation` in, `Operation` and `OperationEvent` out."""

from __future__ import annotations

__all__ = [
    "DUPLICATES_JOINED",
    "OWED_KIND",
    "PROGRESS",
    "AdmitResult",
    "EventKind",
    "First",
    "NewOperation",
    "Operation",
    "OperationEvent",
    "OperationFilter",
    "canonical_json",
    "hash_arguments",
    "hash_canonical_json",
    "joined_calls",
    "may_be_owed",
    "new_operation_id",
]

import hashlib
import json
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from pipecat_actions.status import ActionStatus


def canonical_json(value: Any) -> str:
    """Encode ``value`` as canonical JSON: sorted keys, no spaces, non-ASCII escaped.

    Equal values always give equal text, so the text can be hashed and compared. Escaping
    every non-ASCII character keeps the text storable anywhere, even when it holds a lone
    surrogate or a NUL from hostile input.

    Raises:
        TypeError: ``value`` holds something JSON cannot represent.
        ValueError: ``value`` holds NaN or infinity, or a circular reference.
    """
    if _MAKE_ENCODER is None:  # pragma: no cover - CPython has the C encoder
        return _CANONICAL(value)
    # What JSONEncoder.encode does for a container, without its two Python frames (and the
    # closure it makes) per call: the C encoder, a fresh one each time (its markers find
    # circular references), with the same settings as `_CANONICAL`.
    return "".join(
        _MAKE_ENCODER({}, _DEFAULT, _ESCAPE, None, ":", ",", True, False, False)(value, 0)
    )


_CANONICAL = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
).encode
"""`canonical_json`'s encoder, made once (``json.dumps`` with options makes one per call)."""
_MAKE_ENCODER: Callable[..., Any] | None = getattr(json.encoder, "c_make_encoder", None)
_DEFAULT = json.JSONEncoder().default
"""What meets a value JSON cannot hold: ``TypeError``, as `_CANONICAL` raises."""
_ESCAPE = json.encoder.encode_basestring_ascii


def hash_arguments(args: Mapping[str, Any]) -> str:
    """Return the SHA-256 hex digest of the canonical JSON of ``args``."""
    return hash_canonical_json(canonical_json(args))


def hash_canonical_json(text: str) -> str:
    """Return the SHA-256 hex digest of text made by `canonical_json`."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def new_operation_id() -> str:
    """Return a new operation id (``op_`` and 26 lowercase hex characters, time-ordered)."""
    # Time-ordered (milliseconds first, like UUIDv7) so the primary key index grows at its end.
    return f"op_{time.time_ns() // 1_000_000:012x}{os.urandom(7).hex()}"


class EventKind(StrEnum):
    """What an audit event records."""

    CREATED = "created"
    """The operation was inserted; one event per status on its way from REQUESTED."""
    TRANSITION = "transition"
    """The status changed."""
    ANNOTATION = "annotation"
    """Something about the operation was recorded without a status change (delivery, ...)."""
    LEASE_CLAIMED = "lease_claimed"
    """A runtime took over an operation whose owner's lease had expired."""
    KEY_RELEASED = "key_released"
    """The idempotency key's retention window closed and the key was freed for a new operation."""


OWED_KIND = "mutation"
"""The kind of operation whose outcome can be owed to someone: a mutation (`may_be_owed`)."""


def may_be_owed(op: Operation) -> bool:
    """Whether anyone can be owed ``op``'s outcome: the one definition of what can be owed.

    A mutation's outcome is owed to its conversation until it is told and heard (the
    runtime's `Deliveries`), and one committed and never told is what `undelivered`, `stats`
    (``committed_undelivered``) and the console list (`OperationFilter.undelivered`). A read
    is never owed: it is answered in its call or not at all (a read's answer is not told
    later, and its record, written after the answer, carries no delivery).
    """
    return op.kind == OWED_KIND


@dataclass(frozen=True, slots=True)
class First:
    """A change of a column that holds its first value: written only where it holds none.

    ``changes={"acknowledged_at": First(now)}`` records when the outcome told was first heard
    to the end; a later hearing (a call that joined the operation and was told it again) is an
    audit event of its own and leaves the time as it was. A plain value (None among them)
    still replaces what the column holds: telling a new status makes its hearing owed again.
    """

    value: Any


DUPLICATES_JOINED = "duplicates_joined"
"""Annotation key: the calls (tool call, turn, session each) that joined the operation."""
PROGRESS = "progress"
"""Annotation key: a running effect's progress report (``ctx.report``); the ledger notifies
waiters of it, as of an outcome, so that a call in another process hears it."""

_DUPLICATE_JOINED = "duplicate_joined"  # one call per annotation, as written by version 0.1.0


def joined_calls(detail: Mapping[str, Any]) -> int:
    """Return how many joined calls one audit event's ``detail`` records."""
    joined = detail.get(DUPLICATES_JOINED)
    if isinstance(joined, list):
        return len(joined)
    return 1 if _DUPLICATE_JOINED in detail else 0


@dataclass(frozen=True, slots=True)
class NewOperation:
    """An operation to insert with `Ledger.admit`.

    The ledger encodes ``args`` as canonical JSON and hashes it (unless ``args_hash`` is
    given); the idempotency key is computed by the caller from the tool's policy (never the
    provider's tool_call_id).
    """

    tool: str
    kind: str
    args: Mapping[str, Any]
    idempotency_key: str
    session_id: str
    principal: str
    tenant: str = "default"
    status: ActionStatus = ActionStatus.ADMITTED
    operation_id: str = field(default_factory=new_operation_id)
    idempotency_window_secs: float = 86_400.0
    resource_key: str | None = None
    turn_id: str | None = None
    provider_call_id: str | None = None
    model_response_id: str | None = None
    rationale: str | None = None
    agent: str | None = None
    before_state: Any = None
    compensates: str | None = None
    deadline_at: float | None = None
    lease_owner: str | None = None
    lease_secs: float = 30.0
    error: str | None = None
    result: Any = None
    actor: str = "runtime"
    detail: Mapping[str, Any] | None = None
    args_hash: str | None = None
    """The arguments' hash as stored and compared, when the caller computed it (a keyed hash
    of the plain arguments, which are stored sealed: see `pipecat_actions.ledger.sealing`);
    None: the SHA-256 of the stored canonical JSON."""


@dataclass(frozen=True, slots=True)
class Operation:
    """One operation as the ledger holds it. Times are epoch seconds (UTC)."""

    operation_id: str
    tenant: str
    session_id: str
    principal: str
    tool: str
    kind: str
    args_json: str
    args_hash: str
    idempotency_key: str
    key_expires_at: float
    resource_key: str | None
    turn_id: str | None
    provider_call_id: str | None
    model_response_id: str | None
    rationale: str | None
    agent: str | None
    delivered_agent: str | None
    status: ActionStatus
    attempt: int
    result_json: str | None
    error: str | None
    before_state_json: str | None
    compensates: str | None
    deadline_at: float | None
    lease_owner: str | None
    lease_expires_at: float | None
    fence: int
    event_seq: int
    escalated_at: float | None
    created_at: float
    updated_at: float
    admitted_at: float | None
    started_at: float | None
    sent_at: float | None
    committed_at: float | None
    finished_at: float | None
    delivered_at: float | None
    acknowledged_at: float | None
    delivered_status: ActionStatus | None = None
    """The status the conversation was told last (None: never told)."""

    @property
    def args(self) -> Any:
        """The tool arguments, decoded."""
        return json.loads(self.args_json)

    @property
    def result(self) -> Any:
        """The effect's result, decoded, or None."""
        return None if self.result_json is None else json.loads(self.result_json)

    @property
    def before_state(self) -> Any:
        """The before-state snapshot, decoded, or None."""
        return None if self.before_state_json is None else json.loads(self.before_state_json)


@dataclass(frozen=True, slots=True)
class OperationEvent:
    """One append-only audit event of an operation."""

    operation_id: str
    seq: int
    at: float
    kind: EventKind
    from_status: ActionStatus | None
    to_status: ActionStatus
    actor: str
    detail_json: str | None

    @property
    def detail(self) -> Any:
        """The event's detail, decoded, or None."""
        return None if self.detail_json is None else json.loads(self.detail_json)


@dataclass(frozen=True, slots=True)
class AdmitResult:
    """What `Ledger.admit` found or made.

    Attributes:
        operation: The operation bound to the idempotency key.
        created: True when this call inserted it, False when it already existed.
    """

    operation: Operation
    created: bool


@dataclass(frozen=True, slots=True)
class OperationFilter:
    """Filters for `Ledger.list`; every field left at None matches everything."""

    status: Sequence[ActionStatus] | None = None
    session_id: str | None = None
    tool: str | None = None
    tenant: str | None = None
    principal: str | None = None
    resource_key: str | None = None
    lease_owner: str | None = None
    created_from: float | None = None
    created_before: float | None = None
    undelivered: bool | None = None
    """True: only operations whose outcome someone is owed (`may_be_owed`: mutations, never
    reads) and that were never told to anyone (no ``delivered_at``); False: every other one."""
    conflicted: bool | None = None
    """True: only operations whose outcome the system of record contradicted after the ledger
    recorded it (a commit reported for an operation held as failed); see `Executor.correct`."""
    after: tuple[float, str] | None = None
    """A keyset cursor ``(created_at, operation_id)``: only operations ordered after it.

    The last row of a page gives the next page's cursor; equal ``created_at`` values are
    ordered by ``operation_id``, so no row is read twice or skipped.
    """
    limit: int = 1000
    newest_first: bool = False
    """Order newest first (``after`` then reads the page of older ones); else oldest first."""
