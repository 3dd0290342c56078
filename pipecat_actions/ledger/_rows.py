"""Rows and statements of the ledger: conversions, prebuilt SQL, values of a new operation."""

from __future__ import annotations

__all__ = [
    "ADMIT_STATUSES",
    "CHANGEABLE_FIELDS",
    "NON_TERMINAL",
    "Audit",
    "EncodedOperation",
    "RowUpdate",
    "column_changes",
    "creation_arrays",
    "creation_events",
    "encode_detail",
    "new_row",
    "operation_from_row",
    "refusal_reason",
    "storable",
    "to_event",
    "to_operation",
]

import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from sqlalchemy import Row, String

from pipecat_actions.ledger._trail import NO_MARKS, TRAIL_COLUMNS, TrailMarks
from pipecat_actions.ledger.records import (
    EventKind,
    First,
    NewOperation,
    Operation,
    OperationEvent,
    canonical_json,
    hash_canonical_json,
)
from pipecat_actions.ledger.schema import operations
from pipecat_actions.status import TERMINAL_STATUSES, ActionStatus, path_from_requested

ADMIT_STATUSES = frozenset(
    {
        ActionStatus.ADMITTED,
        ActionStatus.RUNNING,
        ActionStatus.AWAITING_CONFIRMATION,
        ActionStatus.AWAITING_APPROVAL,
    }
)
NON_TERMINAL = sorted(set(ActionStatus) - TERMINAL_STATUSES - {ActionStatus.REQUESTED})

CHANGEABLE_FIELDS: Mapping[str, str] = {
    "result": "result_json",
    "before_state": "before_state_json",
    "error": "error",
    "deadline_at": "deadline_at",
    "sent_at": "sent_at",
    "delivered_at": "delivered_at",
    "delivered_agent": "delivered_agent",
    "acknowledged_at": "acknowledged_at",
    "delivered_status": "delivered_status",
    "escalated_at": "escalated_at",
    "provider_call_id": "provider_call_id",
    "model_response_id": "model_response_id",
}
"""Fields a `transition` or `annotate` may set besides the status, and their columns.

``result`` and ``before_state`` take any JSON value and are stored as canonical JSON.
"""

_JSON_FIELDS = frozenset({"result", "before_state"})
_ROW_ONLY = frozenset({"key_slot", "refusal_reason", *TRAIL_COLUMNS})
OPERATION_COLUMNS = tuple(c.name for c in operations.c if c.name not in _ROW_ONLY)
"""The columns an `Operation` has (the key slot and what only `stats` reads aside)."""
_MAY_BE_REFUSED = frozenset(
    {ActionStatus.REJECTED, ActionStatus.AWAITING_CONFIRMATION, ActionStatus.AWAITING_APPROVAL}
)
"""Created so, an operation keeps its creation's reason: it is its reason if it is refused."""


@dataclass(frozen=True, slots=True)
class Audit:
    """The audit event an update writes, and what else it does."""

    kind: EventKind
    actor: str
    detail_json: str | None
    starts_attempt: bool = False
    """The update starts a new attempt: ``attempt`` goes up, ``started_at`` is set once."""
    notify: bool = False
    """Wake other processes' waiters at commit (see `Ledger.notices`)."""
    marks: TrailMarks = NO_MARKS
    """What the event says for `stats`, folded into the row's trail columns (see `_trail`)."""


@dataclass(frozen=True, slots=True)
class RowUpdate:
    """One conditional update of an operation and its audit event, as both drivers run it.

    It matches ``operation_id`` and, when given, the ``expected`` status (also the event's
    from-status; else the row's) and the ``fence``; it sets ``values`` (column → value) and
    bumps ``event_seq``; the event is written at ``now``.
    """

    operation_id: str
    values: Mapping[str, Any]
    expected: str | None
    fence: int | None
    audit: Audit
    now: float

    def binding(self) -> tuple[tuple[str, ...], tuple[str, ...], list[Any]]:
        """The columns set, those of them set only where empty, and their values, as bound.

        Columns in the order their values are bound; the second are those whose value is a
        `First` (set only where the column holds nothing yet), in the same order.
        """
        values = self.values
        columns = tuple(sorted(values))
        firsts: list[str] = []
        bound: list[Any] = []
        for column in columns:
            value = values[column]
            if isinstance(value, First):
                firsts.append(column)
                value = value.value
            bound.append(value)
        return columns, tuple(firsts), bound


def to_operation(row: Row[Any]) -> Operation:
    """Build an `Operation` from a row of the operations table."""
    return operation_from_row(row._mapping)


_STATUSES = {status.value: status for status in ActionStatus}
_SETTERS = tuple(
    (f.name, Operation.__dict__[f.name].__set__)
    for f in fields(Operation)
    if f.name not in ("status", "delivered_status")
)
_SET_STATUS = Operation.__dict__["status"].__set__
_SET_TOLD = Operation.__dict__["delivered_status"].__set__


def operation_from_row(row: Mapping[Any, Any]) -> Operation:
    """Build an `Operation` from a row's values (a row read, or the values just written).

    Through its slots, not its ``__init__``: the generated ``__init__`` of a frozen dataclass
    sets each of its 39 fields with ``object.__setattr__`` found through a global, 24 us per
    `Operation` on this machine, and a `propose` builds three; this is 3 us. The fields are
    the same ones, all set, and the instance as frozen (a test compares the two ways).
    """
    op = object.__new__(Operation)
    for name, put in _SETTERS:
        put(op, row[name])
    _SET_STATUS(op, _STATUSES[row["status"]])
    told = row["delivered_status"]
    _SET_TOLD(op, None if told is None else _STATUSES[told])
    return op


def to_event(row: Row[Any]) -> OperationEvent:
    """Build an `OperationEvent` from a row of the events table."""
    m = row._mapping
    return OperationEvent(
        operation_id=m["operation_id"],
        seq=m["seq"],
        at=m["at"],
        kind=EventKind(m["kind"]),
        from_status=None if m["from_status"] is None else ActionStatus(m["from_status"]),
        to_status=ActionStatus(m["to_status"]),
        actor=m["actor"],
        detail_json=m["detail_json"],
    )


def encode_detail(detail: Mapping[str, Any] | None) -> str | None:
    """Encode an audit detail as canonical JSON."""
    return None if detail is None else canonical_json(dict(detail))


def column_changes(changes: Mapping[str, Any] | None) -> dict[str, Any]:
    """Map `CHANGEABLE_FIELDS` names to columns, encoding JSON ones.

    Raises:
        ValueError: A name that may not be changed this way.
    """
    if not changes:
        return {}
    unknown = sorted(set(changes) - set(CHANGEABLE_FIELDS))
    if unknown:
        raise ValueError(
            f"cannot change {', '.join(unknown)}: allowed are {', '.join(CHANGEABLE_FIELDS)}"
        )
    return {
        CHANGEABLE_FIELDS[k]: First(_column_value(k, v.value))
        if isinstance(v, First)
        else _column_value(k, v)
        for k, v in changes.items()
    }


def _column_value(name: str, value: Any) -> Any:
    if name in _JSON_FIELDS:
        return None if value is None else canonical_json(value)
    return storable(value, CHANGEABLE_FIELDS[name]) if isinstance(value, str) else value


@dataclass(frozen=True, slots=True)
class EncodedOperation:
    """A `NewOperation` with its JSON already encoded, so the write itself cannot fail on it."""

    new: NewOperation
    args_json: str
    args_hash: str
    before_state_json: str | None
    detail_json: str | None
    result_json: str | None

    @classmethod
    def of(cls, new: NewOperation) -> EncodedOperation:
        """Encode ``new``.

        Raises:
            TypeError: Arguments, before-state or detail hold something JSON cannot hold.
            ValueError: They hold NaN, infinity or a circular reference.
        """
        args_json = canonical_json(dict(new.args))
        return cls(
            new=new,
            args_json=args_json,
            args_hash=new.args_hash or hash_canonical_json(args_json),
            before_state_json=(
                None if new.before_state is None else canonical_json(new.before_state)
            ),
            detail_json=encode_detail(new.detail),
            result_json=None if new.result is None else canonical_json(new.result),
        )


_NO_LIMIT = 1 << 62
_TEXT_COLUMNS = tuple(c.name for c in operations.c if isinstance(c.type, String))
"""The columns that hold text (the others hold numbers: `storable` has nothing to do there)."""
_LIMITS: dict[str, int] = {
    c.name: c.type.length for c in operations.c if isinstance(c.type, String) and c.type.length
}


def storable(value: str | None, column: str | None = None) -> str | None:
    """Return ``value`` as text every backend stores: no NUL, no lone surrogate, fitting.

    PostgreSQL refuses NUL in text and both backends refuse unencodable surrogates; an id
    longer than its column keeps its start and a hash of the whole, so distinct ids stay
    distinct. These come from hostile input (a tool_call_id, a resource template filled with
    LLM arguments); refusing to record them would lose the audit of the refusal itself.
    """
    if value is None:
        return None
    text = value.replace("\x00", "\ufffd").encode("utf-8", "backslashreplace").decode("utf-8")
    limit = _LIMITS.get(column or "")
    if limit is not None and len(text) > limit:
        digest = hash_canonical_json(text)[:16]
        text = f"{text[: limit - 18]}~{digest}"
    return text


def refusal_reason(detail_json: str | None) -> str | None:
    """The reason a creation event's detail gives, as ``refusal_reason`` stores it."""
    value = None if detail_json is None else json.loads(detail_json)
    reason = value.get("reason") if isinstance(value, dict) else None
    return storable(str(reason), "refusal_reason") if reason else None


def new_row(encoded: EncodedOperation, now: float, *, key_slot: str | None) -> dict[str, Any]:
    """Return the operations row of a new operation as first inserted at ``now``."""
    row = _raw_row(encoded, now, key_slot=key_slot)
    for column in _TEXT_COLUMNS:
        value = row[column]
        # ASCII without NUL, within its column's length, is stored as it is (nearly every
        # value): checked here, without a call of `storable` per column.
        if isinstance(value, str) and not (
            value.isascii() and "\x00" not in value and len(value) <= _LIMITS.get(column, _NO_LIMIT)
        ):
            row[column] = storable(value, column)
    return row


@dataclass(frozen=True, slots=True)
class _Creation:
    """What a new operation's status decides about its row and its creation events."""

    status: str
    steps: tuple[tuple[str, str], ...]
    """(from, to) of each creation event: one per status step from ``REQUESTED``."""
    columns: tuple[tuple[int, ...], tuple[str, ...], tuple[str, ...]]
    """The events' seq, from_status and to_status, column by column."""
    attempt: int
    admitted: bool
    running: bool
    committed: bool
    finished: bool
    may_be_refused: bool


def _creation_of(status: ActionStatus) -> _Creation:
    path = path_from_requested(status)
    running = ActionStatus.RUNNING in path
    steps = tuple((src.value, dst.value) for src, dst in itertools.pairwise(path))
    return _Creation(
        status=status.value,
        steps=steps,
        columns=(
            tuple(range(1, len(steps) + 1)),
            tuple(src for src, _ in steps),
            tuple(dst for _, dst in steps),
        ),
        attempt=1 if running else 0,
        admitted=ActionStatus.ADMITTED in path,
        running=running,
        committed=status is ActionStatus.COMMITTED,
        finished=status in TERMINAL_STATUSES,
        may_be_refused=status in _MAY_BE_REFUSED,
    )


_CREATIONS = {status.value: _creation_of(status) for status in ActionStatus}
"""Each status's `_Creation`, made once (a status is its text: either one finds it)."""
_CREATED = EventKind.CREATED.value


def _creation(status: ActionStatus | str) -> _Creation:
    found = _CREATIONS.get(status)
    return found if found is not None else _creation_of(ActionStatus(status))


def _raw_row(encoded: EncodedOperation, now: float, *, key_slot: str | None) -> dict[str, Any]:
    new, args_json, args_hash = encoded.new, encoded.args_json, encoded.args_hash
    created = _creation(new.status)
    running = created.running
    marks = TrailMarks.of_steps(created.steps, actor=new.actor, detail_json=encoded.detail_json)
    return {
        "operation_id": new.operation_id,
        "tenant": new.tenant,
        "session_id": new.session_id,
        "principal": new.principal,
        "tool": new.tool,
        "kind": new.kind,
        "args_json": args_json,
        "args_hash": args_hash,
        "idempotency_key": new.idempotency_key,
        "key_slot": key_slot,
        "key_expires_at": now + new.idempotency_window_secs,
        "resource_key": new.resource_key,
        "turn_id": new.turn_id,
        "provider_call_id": new.provider_call_id,
        "model_response_id": new.model_response_id,
        "rationale": new.rationale,
        "agent": new.agent,
        "delivered_agent": None,
        "status": created.status,
        "attempt": created.attempt,
        "result_json": encoded.result_json,
        "error": new.error,
        "before_state_json": encoded.before_state_json,
        "compensates": new.compensates,
        "deadline_at": new.deadline_at,
        "lease_owner": new.lease_owner,
        "lease_expires_at": None if new.lease_owner is None else now + new.lease_secs,
        "fence": 1,
        "event_seq": len(created.steps),
        "escalated_at": None,
        "created_at": now,
        "updated_at": now,
        "admitted_at": now if created.admitted else None,
        "started_at": now if running else None,
        "sent_at": now if running else None,
        "committed_at": now if created.committed else None,
        "finished_at": now if created.finished else None,
        "delivered_at": None,
        "acknowledged_at": None,
        "delivered_status": None,
        "trail_marks": marks.marks,
        "joined_calls": marks.joined_calls,
        "reconcile_errors": marks.reconcile_errors,
        "refusal_reason": (refusal_reason(encoded.detail_json) if created.may_be_refused else None),
    }


def creation_events(encoded: EncodedOperation, now: float) -> list[dict[str, Any]]:
    """Return the audit rows of a new operation: one per status step from REQUESTED."""
    new, detail_json = encoded.new, encoded.detail_json
    return [
        {
            "operation_id": new.operation_id,
            "seq": seq,
            "at": now,
            "kind": _CREATED,
            "from_status": src,
            "to_status": dst,
            "actor": new.actor,
            "detail_json": detail_json,
        }
        for seq, (src, dst) in enumerate(_creation(new.status).steps, start=1)
    ]


def creation_arrays(encoded: EncodedOperation, now: float) -> list[list[Any]]:
    """The rows of `creation_events` column by column, as PostgreSQL's ``unnest`` takes them.

    Seven arrays: seq, at, kind, from_status, to_status, actor, detail_json.
    """
    seqs, froms, tos = _creation(encoded.new.status).columns
    n = len(seqs)
    return [
        list(seqs),
        [now] * n,
        [_CREATED] * n,
        list(froms),
        list(tos),
        [encoded.new.actor] * n,
        [encoded.detail_json] * n,
    ]
