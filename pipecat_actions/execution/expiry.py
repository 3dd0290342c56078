"""What a deadline does: the rule the watchdog applies to an operation whose time is up.

* AWAITING_CONFIRMATION, AWAITING_APPROVAL → EXPIRED: not confirmed or approved in time;
* ADMITTED, FAILED_RETRYABLE (nothing in flight) → FAILED_FINAL: it could not be sent in time;
* RUNNING, CANCEL_REQUESTED (it may have been sent) → UNKNOWN, then reconciled;
* any other status (terminal, UNKNOWN, ...) stays as it is.

The deadline applied is the one the ledger holds when the watchdog fires, not the one armed in
memory: an approval given elsewhere (the CLI) replaces the approval window's deadline, and the
owner arms the new one when it picks the approval up; the old one then does nothing.

A deadline never claims a cancellation. When this process owns the operation, its executor is
taken over (it stops waiting for the effect, whose late answer is still recorded) and the
outcome is told to its waiters; a running read is stopped instead.

`Expiry` knows nothing of the runtime: it is given the operations this process owns, a way to
stop a running read, and the executor's reconciliation.
"""

from __future__ import annotations

__all__ = ["Expiry", "OwnedOperations", "expiry_rule"]

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol

from pipecat_actions.errors import TransitionRefused
from pipecat_actions.execution.tracked import Tracked
from pipecat_actions.ledger import Ledger, Operation
from pipecat_actions.status import (
    AWAITING_PERSON_STATUSES,
    MAYBE_SENT_STATUSES,
    UNSENT_STATUSES,
    ActionStatus,
)

S = ActionStatus


class OwnedOperations(Protocol):
    """The operations this process owns, as the expiry rule needs them."""

    def get(self, operation_id: str) -> Tracked | None:
        """Return what is kept about ``operation_id``, if this process owns it."""
        ...

    def finish(self, tracked: Tracked, final: Operation) -> None:
        """Tell the operation's waiters and listeners its outcome."""
        ...

    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        """Start a task the runtime owns (closing waits for it)."""
        ...


def expiry_rule(status: ActionStatus) -> tuple[ActionStatus, str] | None:
    """Return the status a deadline moves ``status`` to, and why; None: it stays as it is."""
    if status in AWAITING_PERSON_STATUSES:
        return S.EXPIRED, "not confirmed or approved in time"
    if status in UNSENT_STATUSES:
        return S.FAILED_FINAL, "deadline passed before it could be sent"
    if status in MAYBE_SENT_STATUSES:
        return S.UNKNOWN, "deadline passed while it may have been sent"
    return None


class Expiry:
    """Applies the deadline rule to an operation whose deadline is due (the watchdog's callback).

    Args:
        ledger: Where the operation is read and moved (as the ``watchdog`` actor).
        operations: The operations this process owns.
        now: The clock's time: a deadline the ledger holds for later is not due yet.
        stop_read: Stops a read running under ``operation_id``; returns False when there is
            no such read.
        reconcile: The executor's reconciliation of an UNKNOWN operation.
    """

    def __init__(
        self,
        ledger: Ledger,
        operations: OwnedOperations,
        *,
        now: Callable[[], float],
        stop_read: Callable[[str], bool],
        reconcile: Callable[[Operation, Tracked], Awaitable[Operation]],
    ) -> None:
        self._ledger = ledger
        self._now = now
        self._operations = operations
        self._stop_read = stop_read
        self._reconcile = reconcile

    async def expire(self, operation_id: str) -> None:
        """Apply the deadline rule to ``operation_id`` (see the module docstring)."""
        if self._stop_read(operation_id):
            return
        op = await self._ledger.get(operation_id)
        tracked = self._operations.get(operation_id)
        fence = tracked.fence if tracked else op.fence
        moved = None
        for _ in range(3):
            if op.deadline_at is None or op.deadline_at > self._now():
                # Replaced meanwhile (approved elsewhere: its owner arms the new deadline).
                return
            # The status may change between the read and the write (an attempt starting):
            # read again and apply the rule for the new status, so no deadline is lost.
            rule = expiry_rule(op.status)
            if rule is None:
                return
            to, why = rule
            try:
                moved = await self._ledger.transition(
                    operation_id,
                    expected=op.status,
                    to=to,
                    fence=fence,
                    actor="watchdog",
                    detail={"reason": why, "deadline_at": op.deadline_at},
                    changes={"error": f"deadline: {why}"},
                )
                break
            except TransitionRefused:
                op = await self._ledger.get(operation_id)
        if moved is None or tracked is None:
            return
        tracked.takeover.set()
        if tracked.effect_task is not None and not tracked.effect_task.done():
            tracked.effect_task.cancel()
        if moved.status is S.UNKNOWN:
            self._operations.spawn(self._reconcile_and_finish(moved, tracked))
        else:
            self._operations.finish(tracked, moved)

    async def _reconcile_and_finish(self, op: Operation, tracked: Tracked) -> None:
        final = await self._reconcile(op, tracked)
        self._operations.finish(tracked, final)
