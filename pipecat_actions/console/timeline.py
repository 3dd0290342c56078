"""One conversation as the ledger tells it: a timeline of its operations, drawn as a picture.

Built from the ledger only (the operations of one session and their audit events), so it
shows what any process can prove afterwards: what the model proposed in which of the user's
turns, what was admitted, approved, run, committed or failed, what the conversation was told
and whether it was heard, and the barge-ins the trail records (a status changed because the
user interrupted). The ledger holds no transcript: "asked" is the user's turn a call was
proposed in, and what was proposed is the call itself.

Each operation is a lane; each thing that happened is a mark in the next column, in the
order it happened across the whole session (columns, not a time scale: an approval that took
twenty minutes and a commit that took twenty milliseconds each take one step, and the time is
written under the mark). A telling whose status is not the one the ledger held when it was
told, and an operation whose last telling is not what the ledger holds now, are mismatches:
their marks and their lane are drawn in red, with the two statuses in words. The scenario
runner's timeline (`pipecat_actions.scenarios.timeline`) is the live counterpart of this
one: stamped in-process as a run goes, it can order frames the ledger never sees, but it does
not outlive the run.
"""

from __future__ import annotations

__all__ = ["Lane", "Mark", "SessionTimeline", "session_timeline"]

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipecat_actions.approvals import DECISION_REFUSED
from pipecat_actions.ledger import Operation, OperationEvent
from pipecat_actions.ledger.records import EventKind
from pipecat_actions.status import ActionStatus

S = ActionStatus

COLUMN_PX = 64
"""The width of one column of the picture (a mark's words alternate above and below it)."""
LANE_PX = 84
"""The height of one lane."""
LABEL_PX = 210
"""The width of the lanes' labels, left of the first column."""
TOP_PX = 44
"""The height of the band above the lanes: the user's turns."""
MAX_MARKS = 600
"""The most marks drawn; a longer session is cut, and the page says so."""

_STATUS_MARK = {
    S.ADMITTED: ("admitted", "admitted"),
    S.RUNNING: ("running", "running"),
    S.COMMITTED: ("committed", "committed"),
    S.FAILED_RETRYABLE: ("failed", "failed, retry"),
    S.FAILED_FINAL: ("failed", "failed"),
    S.UNKNOWN: ("unknown", "unknown"),
    S.CANCEL_REQUESTED: ("cancelling", "cancel asked"),
    S.CANCELLED: ("cancelled", "cancelled"),
    S.REJECTED: ("rejected", "rejected"),
    S.EXPIRED: ("expired", "expired"),
    S.AWAITING_APPROVAL: ("waiting", "waits: approval"),
    S.AWAITING_CONFIRMATION: ("waiting", "waits: user yes"),
    S.COMPENSATING: ("running", "undoing"),
    S.COMPENSATED: ("cancelled", "undone"),
}
"""What a status looks like as a mark: its kind (the drawing's style) and its short label."""


@dataclass(frozen=True, slots=True)
class Mark:
    """One thing that happened to an operation.

    Attributes:
        at: When (epoch seconds).
        kind: How it is drawn: proposed, admitted, approved, running, committed, failed,
            unknown, cancelling, cancelled, rejected, expired, waiting, refused, told, heard,
            barge_in, claimed, escalated, suppressed.
        label: A word or two under the mark.
        detail: What the audit says about it (a reason, who), for the tooltip and the list.
        actor: Who wrote it.
        mismatch: A telling of another status than the ledger held.
        column: Its column in the picture, in the order things happened.
    """

    at: float
    kind: str
    label: str
    detail: str = ""
    actor: str = ""
    mismatch: bool = False
    column: int = 0


@dataclass
class Lane:
    """One operation of the session and its marks.

    Attributes:
        op: The operation as the ledger holds it now.
        marks: What happened to it, in order.
        mismatch: What the conversation was told last against what the ledger holds, in
            words, when they differ (None: they agree, or nothing was told yet).
        index: Its place among the lanes, from the top.
    """

    op: Operation
    marks: list[Mark] = field(default_factory=list)
    mismatch: str | None = None
    index: int = 0

    @property
    def told_held(self) -> tuple[str, str] | None:
        """The two sides of a mismatch, each a few words, for two short lines."""
        if self.mismatch is None:
            return None
        told, _, held = self.mismatch.partition("; ")
        return told, held

    @property
    def y(self) -> int:
        """The lane's middle, in the picture."""
        return TOP_PX + self.index * LANE_PX + LANE_PX // 2

    @property
    def span(self) -> tuple[int, int]:
        """The x of its first and last marks."""
        if not self.marks:
            return (LABEL_PX, LABEL_PX)
        return (_x(self.marks[0].column), _x(self.marks[-1].column))


@dataclass(frozen=True, slots=True)
class Turn:
    """A user's turn in which a call was proposed, above the column of its first proposal."""

    turn_id: str
    column: int

    @property
    def x(self) -> int:
        """Its x in the picture."""
        return _x(self.column)


@dataclass
class SessionTimeline:
    """A session's operations as lanes of marks, laid out for drawing.

    Attributes:
        session_id: The session.
        lanes: One per operation, oldest first.
        turns: The user's turns calls were proposed in.
        start: When the first thing happened (times are shown from it).
        columns: How many columns the marks take.
        cut: Marks left out past `MAX_MARKS`.
    """

    session_id: str
    lanes: list[Lane]
    turns: list[Turn]
    start: float
    columns: int
    cut: int = 0

    @property
    def width(self) -> int:
        """The picture's width."""
        # A column more on the right: a last mark's words reach past its own column.
        return LABEL_PX + (max(self.columns, 1) + 1) * COLUMN_PX

    @property
    def height(self) -> int:
        """The picture's height."""
        return TOP_PX + max(len(self.lanes), 1) * LANE_PX + 8

    @property
    def mismatches(self) -> int:
        """How many operations' tellings disagree with the ledger."""
        return sum(1 for lane in self.lanes if lane.mismatch is not None)

    @property
    def steps(self) -> list[tuple[Lane, Mark]]:
        """Every mark with its lane, in the order things happened."""
        return sorted(
            ((lane, mark) for lane in self.lanes for mark in lane.marks),
            key=lambda step: step[1].column,
        )

    def x(self, column: int) -> int:
        """The x of a column's middle."""
        return _x(column)

    @staticmethod
    def above(column: int) -> bool:
        """Whether a mark's words go above it: every other column, so neighbours never touch."""
        return column % 2 == 1

    def after(self, at: float) -> str:
        """``at`` from the session's start, in words: ``+0.0 s``, ``+12 min``."""
        secs = max(0.0, at - self.start)
        if secs < 60:
            return f"+{secs:.1f} s"
        if secs < 3600:
            return f"+{secs / 60:.0f} min"
        return f"+{secs / 3600:.1f} h"


def _x(column: int) -> int:
    return LABEL_PX + column * COLUMN_PX + COLUMN_PX // 2


def _reason(detail: Mapping[str, Any]) -> str:
    reason = detail.get("reason")
    return "" if reason is None else str(reason)


def _marks_of(event: OperationEvent, op: Operation, first: bool) -> list[Mark]:
    """What one audit event shows, as marks (none for bookkeeping)."""
    raw = event.detail
    detail: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    at, actor, reason = event.at, event.actor, _reason(detail)
    marks: list[Mark] = []
    if event.kind is EventKind.CREATED:
        if first:
            asked = f"asked by {op.principal}" + (
                f"; rationale: {op.rationale}" if op.rationale else ""
            )
            marks.append(Mark(at, "proposed", "proposed", asked, actor))
        if event.to_status is S.REJECTED:
            marks.append(Mark(at, "rejected", "refused", op.error or reason, actor))
        elif event.to_status in _STATUS_MARK:
            kind, label = _STATUS_MARK[event.to_status]
            marks.append(Mark(at, kind, label, reason, actor))
        return marks
    if event.kind is EventKind.TRANSITION:
        if "interrupt" in reason.lower():
            marks.append(Mark(at, "barge_in", "barge-in", reason, actor))
        kind, label = _STATUS_MARK.get(event.to_status, ("other", event.to_status.value.lower()))
        if event.from_status is S.AWAITING_APPROVAL and event.to_status is S.ADMITTED:
            who = detail.get("approver") or actor.removeprefix("approver:")
            kind, label = "approved", "approved"
            reason = f"approved by {who}: {reason}"
        elif event.from_status is S.AWAITING_APPROVAL and event.to_status is S.REJECTED:
            reason = f"rejected by {detail.get('approver') or actor}: {reason}"
        elif event.from_status is S.AWAITING_CONFIRMATION and event.to_status is S.ADMITTED:
            kind, label = "approved", "user said yes"
        marks.append(Mark(at, kind, label, reason, actor))
        return marks
    if event.kind is EventKind.LEASE_CLAIMED:
        return [Mark(at, "claimed", "taken over", f"{actor} took it over (restart)", actor)]
    if event.kind is not EventKind.ANNOTATION:
        return []
    if "delivered" in detail:
        told = str(detail["delivered"])
        held = event.to_status.value
        wrong = told != held
        said = f"told {told}" + (f"; the ledger held {held}" if wrong else "")
        if detail.get("late"):
            said += " (late)"
        marks.append(Mark(at, "told", f"told {told.lower()}", said, actor, mismatch=wrong))
    if detail.get("acknowledged"):
        marks.append(Mark(at, "heard", "heard", "heard to the end", actor))
    if detail.get("delivery") == "suppressed":
        marks.append(Mark(at, "suppressed", "not told", "suppressed by its policy", actor))
    if DECISION_REFUSED in detail:
        who = detail.get("approver") or actor
        tried = detail[DECISION_REFUSED]
        marks.append(Mark(at, "refused", f"{tried} refused", f"{who}: {reason}", actor))
    if "escalated" in detail:
        marks.append(Mark(at, "escalated", "escalated", str(detail["escalated"]), actor))
    return marks


def _lane_mismatch(op: Operation) -> str | None:
    told = op.delivered_status
    if told is None or told is op.status:
        return None
    return f"told {told.value}; the ledger holds {op.status.value}"


def session_timeline(
    session_id: str,
    trails: Sequence[tuple[Operation, Sequence[OperationEvent]]],
) -> SessionTimeline:
    """Lay out ``session_id``'s operations (each with its audit events) as a timeline.

    Args:
        session_id: The session.
        trails: Its operations, each with its events in order.
    """
    ordered = sorted(trails, key=lambda trail: (trail[0].created_at, trail[0].operation_id))
    lanes = []
    # Every mark of the session, in the order it happened: time, then the lane's age (two
    # operations written at one instant), then the event's own order.
    placed: list[tuple[float, int, int, int, Lane, Mark]] = []
    for index, (op, events) in enumerate(ordered):
        lane = Lane(op=op, mismatch=_lane_mismatch(op), index=index)
        lanes.append(lane)
        for order, event in enumerate(events):
            for within, mark in enumerate(_marks_of(event, op, first=order == 0)):
                placed.append((mark.at, index, order, within, lane, mark))
    placed.sort(key=lambda entry: entry[:4])
    cut = max(0, len(placed) - MAX_MARKS)
    placed = placed[:MAX_MARKS]
    for column, (*_, lane, mark) in enumerate(placed):
        lane.marks.append(_at_column(mark, column))
    for lane in lanes:
        wrong = next((mark for mark in lane.marks if mark.mismatch), None)
        if lane.mismatch is None and wrong is not None:
            lane.mismatch = wrong.detail
    turns: list[Turn] = []
    seen: set[str] = set()
    for lane in lanes:
        turn = lane.op.turn_id
        if turn is not None and turn not in seen and lane.marks:
            seen.add(turn)
            turns.append(Turn(turn, lane.marks[0].column))
    start = placed[0][0] if placed else 0.0
    return SessionTimeline(session_id, lanes, turns, start, len(placed), cut)


def _at_column(mark: Mark, column: int) -> Mark:
    return Mark(mark.at, mark.kind, mark.label, mark.detail, mark.actor, mark.mismatch, column)
