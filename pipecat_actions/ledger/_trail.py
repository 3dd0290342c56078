"""What an operation's audit trail says for `stats`, kept on its row as the trail is written.

`stats` used to read the audit events of every operation (3.4 of its 5 to 8 s at 1,000,000
operations on SQLite). Now every write that appends an audit event also folds what the event
says into three columns of its operation, in the same statement, so `stats` reads one row
per operation (through a covering index) and never the events:

* ``trail_marks``: `Mark` flags; once set, set for good;
* ``joined_calls``: how many duplicate calls were joined to it (summed over its events);
* ``reconcile_errors``: how many of its events record a reconcile hook's error.

What an event says is decided here alone (`TrailMarks.of_event`), by the writers as they
write and by migration 0004 when it fills the columns in from an older ledger's events.
"""

from __future__ import annotations

__all__ = ["NO_MARKS", "TRAIL_COLUMNS", "Mark", "TrailMarks"]

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import IntFlag
from typing import Any

from pipecat_actions.ledger.records import joined_calls
from pipecat_actions.status import ActionStatus

S = ActionStatus
TRAIL_COLUMNS = ("trail_marks", "joined_calls", "reconcile_errors")


class Mark(IntFlag):
    """Facts an operation's trail establishes once and for all."""

    TIMED_OUT = 1
    """The watchdog acted on it, or an event's detail says it timed out."""
    WENT_UNKNOWN = 2
    """It was UNKNOWN at some point."""
    CANCEL_REQUESTED = 4
    """A cancellation was asked of its provider (CANCEL_REQUESTED)."""
    CANCELLED_BEFORE_SEND = 8
    """It was cancelled with nothing (or no next attempt) sent."""
    TOLD_LATE = 16
    """Its outcome was told after the conversation moved on."""
    HANDED_OFF_PENDING = 32
    """It was still pending when its conversation was handed to another agent."""
    RECONCILED = 64
    """Its outcome was settled by reconciliation."""
    CONFLICT = 128
    """The system of record contradicted the outcome the ledger held (`Executor.correct`)."""


# Texts whose presence in an event's canonical detail JSON may make it count; a detail that
# has one is decoded and checked, so a false match costs a decode, never a wrong mark.
_DETAIL_MARKERS = (
    '"duplicates_joined"',
    '"duplicate_joined"',
    '"timed_out"',
    '"late":true',
    '"handoff_to"',
    '"reconcile_error"',
    '"reconciled"',
    '"conflict"',
)
_MAY_SAY = re.compile("|".join(re.escape(marker) for marker in _DETAIL_MARKERS)).search
"""Whether a detail JSON holds one of `_DETAIL_MARKERS`: one C call per event written."""
_NOTHING_SENT = frozenset({S.ADMITTED.value, S.FAILED_RETRYABLE.value})
_CANCELLED = S.CANCELLED.value
_TIMED_OUT = int(Mark.TIMED_OUT)
_CANCELLED_BEFORE_SEND = int(Mark.CANCELLED_BEFORE_SEND)
_TOLD_LATE = int(Mark.TOLD_LATE)
_HANDED_OFF_PENDING = int(Mark.HANDED_OFF_PENDING)
_RECONCILED = int(Mark.RECONCILED)
_CONFLICT = int(Mark.CONFLICT)
_BY_STATUS = {
    S.UNKNOWN.value: int(Mark.WENT_UNKNOWN),
    S.CANCEL_REQUESTED.value: int(Mark.CANCEL_REQUESTED),
}


@dataclass(frozen=True, slots=True)
class TrailMarks:
    """What one event (or a whole trail) says: see the module."""

    marks: int = 0
    joined_calls: int = 0
    reconcile_errors: int = 0

    def __bool__(self) -> bool:
        return bool(self.marks or self.joined_calls or self.reconcile_errors)

    def __or__(self, other: TrailMarks) -> TrailMarks:
        if not other:
            return self
        if not self:
            return other
        return TrailMarks(
            self.marks | other.marks,
            self.joined_calls + other.joined_calls,
            self.reconcile_errors + other.reconcile_errors,
        )

    def columns(self) -> dict[str, int]:
        """The three columns' values for a new row."""
        values = (self.marks, self.joined_calls, self.reconcile_errors)
        return dict(zip(TRAIL_COLUMNS, values, strict=True))

    @classmethod
    def of_event(
        cls,
        *,
        from_status: str | None,
        to_status: str | None,
        actor: str,
        detail_json: str | None,
    ) -> TrailMarks:
        """What one audit event says.

        ``to_status`` None: an annotation of a row whose status the writer does not know;
        what a status says was marked when the row reached it.
        """
        # Plain ints: an IntFlag's operators build enum members, a microsecond each, and
        # every write asks this once.
        marks = _TIMED_OUT if actor == "watchdog" else 0
        if to_status is not None:
            marks |= _BY_STATUS.get(to_status, 0)
            if to_status == _CANCELLED and from_status in _NOTHING_SENT:
                marks |= _CANCELLED_BEFORE_SEND
        detail = _detail(detail_json)
        if not detail:
            return cls(marks) if marks else NO_MARKS
        if detail.get("timed_out"):
            marks |= _TIMED_OUT
        if detail.get("delivered") and detail.get("late"):
            marks |= _TOLD_LATE
        if "handoff_to" in detail:
            marks |= _HANDED_OFF_PENDING
        if detail.get("reason") == "reconciled":
            marks |= _RECONCILED
        if detail.get("conflict"):
            marks |= _CONFLICT
        return cls(marks, joined_calls(detail), int("reconcile_error" in detail))

    @classmethod
    def of_steps(
        cls, steps: Sequence[tuple[str, str]], *, actor: str, detail_json: str | None
    ) -> TrailMarks:
        """What events of the status ``steps`` (from, to), all by one actor and detail, say.

        `of_trail` of those events, without building them. A new operation's creation
        events are such a trail; a detail that holds none of `_DETAIL_MARKERS` (nearly every
        one) says nothing, and only the statuses are looked at.
        """
        if detail_json and _MAY_SAY(detail_json) is not None:
            total = NO_MARKS
            for src, dst in steps:
                total |= cls.of_event(
                    from_status=src, to_status=dst, actor=actor, detail_json=detail_json
                )
            return total
        marks = _TIMED_OUT if steps and actor == "watchdog" else 0
        for src, dst in steps:
            marks |= _BY_STATUS.get(dst, 0)
            if dst == _CANCELLED and src in _NOTHING_SENT:
                marks |= _CANCELLED_BEFORE_SEND
        return cls(marks) if marks else NO_MARKS

    @classmethod
    def of_trail(cls, events: Iterable[Mapping[Any, Any]]) -> TrailMarks:
        """What a trail of event rows (``from_status``, ``to_status``, ...) says in all."""
        total = NO_MARKS
        for e in events:
            total |= cls.of_event(
                from_status=e["from_status"],
                to_status=e["to_status"],
                actor=e["actor"],
                detail_json=e["detail_json"],
            )
        return total


NO_MARKS = TrailMarks()
"""What an event that says nothing says."""


def _detail(detail_json: str | None) -> dict[str, Any] | None:
    """The detail, decoded only when it may say something (see `_DETAIL_MARKERS`)."""
    if not detail_json or _MAY_SAY(detail_json) is None:
        return None
    value = json.loads(detail_json)
    return value if isinstance(value, dict) else None
