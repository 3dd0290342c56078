"""`Progress`: what a running effect reports before its outcome (``ctx.report``).

A report is written to the operation's audit trail first (an annotation with ``progress``, the
attempt and the details), so an operator reads how far a long operation got even after a
crash; then it is handed to the session's listeners (the delivery service), which tell it per
the tool's ``delivery.intermediate``. A report is never told once the operation's outcome is
known: it is dropped when it comes after the outcome, and again, by the listener, if the
outcome came while it waited to be told. Whether a report was told is not recorded, and a
report is never owed to a later pipeline: it is news of a moment, and the outcome that follows
is what the conversation owes the user.

A durable operation's effect runs on a DBOS worker, whose runtime writes its reports; the call's
process hears them through the ledger (`Progress.follower`): the write's notice wakes the
bot's watcher of the operation (which re-reads on its pause too, in case a notice is lost), and
each new report in the trail is handed to the session's listeners once, in order, and never
once the outcome is known.
"""

from __future__ import annotations

__all__ = ["MAX_PROGRESS_CHARS", "Progress", "ProgressListener", "ProgressReport"]

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from loguru import logger

from pipecat_actions.actions import Reporter
from pipecat_actions.execution.tracked import Tracked
from pipecat_actions.ledger import Ledger, Operation
from pipecat_actions.ledger.records import PROGRESS, EventKind
from pipecat_actions.runtime._operations import Operations
from pipecat_actions.status import TERMINAL_STATUSES, ActionStatus

MAX_PROGRESS_CHARS = 500
"""The longest progress message kept and told; longer text is cut and ends with an ellipsis."""

_OUTCOMES = TERMINAL_STATUSES | {ActionStatus.UNKNOWN}


@dataclass(frozen=True)
class ProgressReport:
    """One progress report of a running effect.

    Attributes:
        operation: The operation as its attempt started (RUNNING).
        message: What the effect said, at most `MAX_PROGRESS_CHARS`.
        details: The plain data it gave with it.
        at: When it was reported, on the clock of the runtime that runs the effect.
    """

    operation: Operation
    message: str
    details: Mapping[str, Any] = field(default_factory=dict)
    at: float = 0.0


ProgressListener = Callable[[ProgressReport], None]
"""Called with each progress report of the session it listens to; must not block or raise."""


class Progress:
    """Writes effects' progress reports to the audit trail and hands them to listeners.

    Args:
        ledger: Where each report is recorded.
        operations: Which operations still wait for their outcome.
        now: The runtime's clock.
        actor: Recorded on each report (``runtime:<owner>``, which runs the effect).
    """

    def __init__(
        self, *, ledger: Ledger, operations: Operations, now: Callable[[], float], actor: str
    ) -> None:
        self._ledger = ledger
        self._operations = operations
        self._now = now
        self._actor = actor
        self._listeners: dict[str, list[ProgressListener]] = {}

    def reporter(self, op: Operation, tracked: Tracked) -> Reporter:
        """Where the effect of ``op``'s attempt sends its reports (`ActionContext.reporter`)."""

        async def report(message: str, details: Mapping[str, Any]) -> None:
            await self.report(op, tracked, message, details)

        return report

    def has_outcome(self, operation_id: str) -> bool:
        """Whether ``operation_id``'s outcome is known (or this process does not run it)."""
        tracked = self._operations.get(operation_id)
        return tracked is None or tracked.done.done()

    async def report(
        self, op: Operation, tracked: Tracked, message: str, details: Mapping[str, Any]
    ) -> None:
        """Record ``message`` in ``op``'s audit trail, then tell the session's listeners."""
        if tracked.done.done():
            logger.bind(operation_id=op.operation_id).debug(
                "operation {}: progress after its outcome, dropped: {}", op.operation_id, message
            )
            return
        text = (
            message
            if len(message) <= MAX_PROGRESS_CHARS
            else message[: MAX_PROGRESS_CHARS - 1] + "…"
        )
        plain = _plain(details)
        detail: dict[str, Any] = {PROGRESS: text, "attempt": op.attempt}
        if plain:
            detail["details"] = plain
        try:
            await self._ledger.annotate(op.operation_id, actor=self._actor, detail=detail)
        except Exception as exc:  # the report is still true: it is told, the trail lacks it
            logger.bind(operation_id=op.operation_id).warning(
                "operation {}: progress not recorded: {}", op.operation_id, exc
            )
        if tracked.done.done():
            return  # the outcome came while the report was being written
        self._tell(ProgressReport(operation=op, message=text, details=plain, at=self._now()))

    def follower(self, op: Operation) -> Callable[[Operation], Awaitable[None]]:
        """What tells ``op``'s progress as another process records it (a DBOS worker's).

        Call it with the operation each time it is re-read without an outcome: when its trail
        grew, the new events (only those: `Ledger.events_after`) are read and each new progress
        report among them is handed to the session's listeners, once and in order. A report
        that comes after an outcome in the trail is never told, nor is any once the outcome is
        known here (`has_outcome`). A trail that cannot be read is read again at the next call.
        """
        seen = op.event_seq
        ended = False

        async def follow(current: Operation) -> None:
            nonlocal seen, ended
            if ended or current.event_seq <= seen or self.has_outcome(current.operation_id):
                return
            try:
                trail = await self._ledger.events_after(current.operation_id, seen)
            except Exception as exc:  # read again at the next look
                logger.bind(operation_id=current.operation_id).debug(
                    "operation {}: progress not read: {}", current.operation_id, exc
                )
                return
            for event in trail:
                if event.seq <= seen:
                    continue
                seen = event.seq
                if event.to_status in _OUTCOMES:
                    ended = True  # what follows an outcome in the trail is not told
                    return
                detail = event.detail if event.kind is EventKind.ANNOTATION else None
                if not isinstance(detail, dict) or not isinstance(detail.get(PROGRESS), str):
                    continue
                if self.has_outcome(current.operation_id):
                    return
                details = detail.get("details")
                self._tell(
                    ProgressReport(
                        operation=current,
                        message=detail[PROGRESS],
                        details=details if isinstance(details, dict) else {},
                        at=event.at,
                    )
                )

        return follow

    def _tell(self, report: ProgressReport) -> None:
        for listener in list(self._listeners.get(report.operation.session_id, ())):
            listener(report)

    def listen(self, session_id: str, listener: ProgressListener) -> None:
        """Call ``listener`` with each progress report of ``session_id``'s operations."""
        self._listeners.setdefault(session_id, []).append(listener)

    def unlisten(self, session_id: str, listener: ProgressListener) -> None:
        """Stop calling ``listener``."""
        listeners = self._listeners.get(session_id, [])
        if listener in listeners:
            listeners.remove(listener)
        if not listeners:
            self._listeners.pop(session_id, None)


def _plain(details: Mapping[str, Any]) -> dict[str, Any]:
    """``details`` as JSON data: what JSON cannot hold is kept as its text."""
    try:
        loaded = json.loads(json.dumps(dict(details), default=str, allow_nan=False))
    except (TypeError, ValueError):  # e.g. a key that is not text, NaN
        return {str(key): str(value) for key, value in details.items()}
    return loaded if isinstance(loaded, dict) else {}
