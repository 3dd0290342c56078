"""`Decisions`: cancellation, verbal confirmation and approvals of operations already admitted."""

from __future__ import annotations

__all__ = ["Decisions"]

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from pipecat_actions.actions import ActionContext, CancelOutcome
from pipecat_actions.approvals import (
    ApprovalRefused,
    Approver,
    approve_operation,
    reject_operation,
)
from pipecat_actions.clock import Clock
from pipecat_actions.durable._names import DURABLE_OWNER
from pipecat_actions.errors import PipecatActionsError, TransitionRefused
from pipecat_actions.execution.tracked import Tracked
from pipecat_actions.execution.watchdog import Watchdog
from pipecat_actions.ledger import Ledger, Operation, OperationFilter
from pipecat_actions.observability.correlation import operation_logger
from pipecat_actions.policy import ExecutionMode, OnInterruption
from pipecat_actions.results import ToolResult, refusal_result, render_operation
from pipecat_actions.runtime._operations import Operations
from pipecat_actions.runtime._runner import Runner
from pipecat_actions.session import SessionState
from pipecat_actions.status import (
    AWAITING_PERSON_STATUSES,
    TERMINAL_STATUSES,
    UNSENT_STATUSES,
    ActionStatus,
)

S = ActionStatus


class Decisions:
    """Cancellation per ``on_interruption``, verbal confirmation and approvals.

    Args:
        ledger: Where the decisions are written.
        clock: The runtime's clock (confirmation windows, new deadlines).
        operations: The operations this process owns.
        runner: Runs an operation once a person released it.
        watchdog: Armed with the deadline of a released operation.
        actor: Recorded on the runtime's own writes.
    """

    def __init__(
        self,
        *,
        ledger: Ledger,
        clock: Clock,
        operations: Operations,
        runner: Runner,
        watchdog: Watchdog,
        actor: str,
    ) -> None:
        self._ledger = ledger
        self._clock = clock
        self._operations = operations
        self._runner = runner
        self._watchdog = watchdog
        self._actor = actor

    async def interrupted(self, operation_id: str) -> None:
        """Apply the tool's ``on_interruption`` policy: the user barged in on the call."""
        tracked = self._operations.get(operation_id)
        if tracked is None or self._operations.closing:
            return  # a closing runtime leaves its operations to recovery, as they are
        mode = tracked.binding.policy.on_interruption
        if mode is OnInterruption.CONTINUE:
            return
        await self.cancel(
            operation_id,
            reason="the user interrupted",
            only_if_not_started=mode is OnInterruption.CANCEL_IF_NOT_STARTED,
        )

    async def cancel(
        self,
        operation_id: str,
        *,
        reason: str,
        only_if_not_started: bool = False,
        actor: str | None = None,
        detail: Mapping[str, Any] | None = None,
        wait_for_provider: bool = True,
    ) -> Operation:
        """Cancel an operation as far as the truth allows; see `ActionRuntime.cancel`.

        ``actor`` is who asked (default: this runtime), recorded with ``detail`` on each
        transition. Without ``wait_for_provider``, an operation already sent is returned as
        CANCEL_REQUESTED once that is written, and the provider's answer is awaited (and
        recorded) in a task of the runtime; its outcome reaches the listeners as usual.
        """
        op = await self._ledger.get(operation_id)
        tracked = self._operations.get(operation_id)
        if tracked is None or op.status in TERMINAL_STATUSES:
            return op
        if op.status in UNSENT_STATUSES:
            return await self._operations.cancel_not_started(
                op, tracked, reason, actor=actor, detail=detail
            )
        if op.status in AWAITING_PERSON_STATUSES:
            return await self._operations.move(
                op, tracked, S.REJECTED, reason, finish=True, actor=actor, detail=detail
            )
        hook = tracked.binding.action.cancel
        if op.status is not S.RUNNING or only_if_not_started or hook is None:
            return op
        requested = await self._operations.move(
            op, tracked, S.CANCEL_REQUESTED, reason, actor=actor, detail=detail
        )
        if requested.status is not S.CANCEL_REQUESTED:
            return requested
        asking = self._ask_provider(requested, tracked, hook)
        if not wait_for_provider:
            self._operations.spawn(asking)
            return requested
        return await asking

    async def _ask_provider(self, requested: Operation, tracked: Tracked, hook: Any) -> Operation:
        """Ask the ``cancel`` hook; CANCELLED only when the provider confirms it."""
        operation_id = requested.operation_id
        try:
            answer = await hook(ActionContext.of(requested))
        except Exception as exc:
            operation_logger(requested).warning(
                "operation {}: cancel hook failed: {}", operation_id, exc
            )
            answer = CancelOutcome.UNKNOWN
        if answer is CancelOutcome.CANCELLED:
            tracked.takeover.set()
            if tracked.effect_task is not None:
                tracked.effect_task.cancel()
            return await self._operations.move(
                requested, tracked, S.CANCELLED, "the provider confirmed", True
            )
        return await self._ledger.annotate(
            operation_id, actor=self._actor, detail={"cancel_answer": str(answer)}
        )

    async def confirm(
        self,
        operation_id: str,
        token: str,
        session: SessionState,
        *,
        on_started: Callable[[str], Awaitable[None]] | None = None,
    ) -> dict[str, Any]:
        """Apply the user's verbal confirmation (the ``confirm_action`` tool).

        A blocking tool's confirmation answers with the outcome. A background tool's answers
        once its action is released to run (its outcome is told when it comes), after
        ``on_started`` was awaited with the tool's name (the binding says its ``announce``).
        """
        try:
            op = await self._ledger.get(operation_id)
        except PipecatActionsError:
            return refusal_result("There is no such operation.", code="unknown_operation")
        tracked = self._operations.get(operation_id)
        problem = None
        if op.session_id != session.session_id or tracked is None:
            problem = "That operation does not belong to this conversation."
        elif op.status is not S.AWAITING_CONFIRMATION:
            problem = f"That operation is {op.status.value.lower()}, not waiting for a yes."
        elif token != op.args_hash[:12]:
            problem = "The confirmation does not match the request's details; ask again."
        elif session.user_turn <= int(op.turn_id or 0):
            problem = "The user has not answered yet: ask them and wait for their reply."
        elif op.deadline_at is not None and self._clock.now() >= op.deadline_at:
            problem = "The confirmation came too late; the request expired."
        if problem is not None or tracked is None:
            return refusal_result(
                problem or "", code="confirmation_refused", operation_id=operation_id
            )
        background = tracked.binding.policy.mode is ExecutionMode.BACKGROUND
        released = await self._release(
            op,
            tracked,
            actor=f"user:{session.principal}",
            reason="confirmed by the user",
            wait=not background,
        )
        admitted = ToolResult.of(released).status is ActionStatus.ADMITTED
        if background and on_started is not None and admitted:
            await on_started(op.tool)
        return released

    async def approve(
        self, operation_id: str, *, approver: Approver | str, reason: str, args_hash: str
    ) -> Operation:
        """Approve an operation waiting for approval; see `ActionRuntime.approve`."""
        tracked = self._operations.get(operation_id)
        if tracked is not None:
            deadline_secs = tracked.binding.policy.deadline_secs
        else:
            # Run by whoever recovers it: its own policy's deadline, not a default.
            waiting = await self._ledger.get(operation_id)
            deadline_secs = self._runner.deadline_secs(waiting.tool)
        try:
            approved = await approve_operation(
                self._ledger,
                operation_id,
                approver=approver,
                reason=reason,
                now=self._clock.now(),
                args_hash=args_hash,
                fence=tracked.fence if tracked else None,
                deadline_at=self._clock.now() + deadline_secs,
            )
        except ApprovalRefused:
            if tracked is not None:
                current = await self._ledger.get(operation_id)
                if current.status in TERMINAL_STATUSES:
                    self._operations.finish(tracked, current)
            raise
        if (
            tracked is not None
            and approved.deadline_at is not None
            and not self._runner.is_handed(operation_id)  # its DBOS workflow runs it
        ):
            self._watchdog.arm(operation_id, approved.deadline_at)
            self._operations.spawn(self._runner.execute(approved, tracked, take_slot=True))
        return approved

    async def reject(
        self, operation_id: str, *, approver: Approver | str, reason: str
    ) -> Operation:
        """Reject an operation waiting for approval (REJECTED; nothing runs)."""
        tracked = self._operations.get(operation_id)
        try:
            rejected = await reject_operation(
                self._ledger,
                operation_id,
                approver=approver,
                reason=reason,
                now=self._clock.now(),
                fence=tracked.fence if tracked else None,
            )
        except ApprovalRefused:
            if tracked is not None:
                current = await self._ledger.get(operation_id)
                if current.status in TERMINAL_STATUSES:
                    self._operations.finish(tracked, current)
            raise
        if tracked is not None and not self._runner.is_handed(operation_id):
            self._operations.finish(tracked, rejected)
        return rejected

    async def _release(
        self, op: Operation, tracked: Tracked, *, actor: str, reason: str, wait: bool
    ) -> dict[str, Any]:
        deadline_at = self._clock.now() + self._runner.deadline_secs(op.tool)
        checked = tracked.binding.action.reconcile is not None
        try:
            admitted = await self._ledger.transition(
                op.operation_id,
                expected=op.status,
                to=S.ADMITTED,
                fence=tracked.fence,
                actor=actor,
                detail={"reason": reason},
                changes={"deadline_at": deadline_at},
            )
        except TransitionRefused:
            return render_operation(await self._ledger.get(op.operation_id), reconcilable=checked)
        # A durable one's DBOS workflow runs it: the durable ledger woke it with the decision
        # (else it reads it at its next look); its outcome is awaited here as before.
        handed = admitted.lease_owner == DURABLE_OWNER or self._runner.is_handed(op.operation_id)
        if not handed:
            self._watchdog.arm(op.operation_id, deadline_at)
            self._operations.spawn(self._runner.execute(admitted, tracked, take_slot=True))
        if not wait:
            return render_operation(admitted, reconcilable=checked)
        # Answered (or the call stopped) when this ends: later outcomes are told as late ones.
        with self._operations.answering(op.session_id, op.operation_id):
            outcome = await asyncio.shield(tracked.done)
            # What the call is answered with, and tells in place once its result reaches the
            # gate: until then the delivery service must not tell it again as a late outcome
            # (a catch-up that read it meanwhile, say).
            self._operations.note_answered(outcome, op.session_id)
            return render_operation(outcome, reconcilable=checked)

    async def pending_approvals(self) -> list[Operation]:
        """Operations waiting for a person's approval, oldest first."""
        return await self._ledger.list(OperationFilter(status=[S.AWAITING_APPROVAL]))
