"""Cancellation, verbal confirmation and approvals: decisions about operations already admitted."""

from __future__ import annotations

import asyncio
from typing import Any

from pipecat_actions.actions import ActionContext, CancelOutcome
from pipecat_actions.approvals import ApprovalRefused, approve_operation, reject_operation
from pipecat_actions.errors import (
    PipecatActionsError,
    TransitionRefused,
)
from pipecat_actions.execution.tracked import Tracked
from pipecat_actions.ledger import (
    Operation,
    OperationFilter,
)
from pipecat_actions.observability.correlation import operation_logger
from pipecat_actions.policy import OnInterruption
from pipecat_actions.results import refusal_result, render_operation
from pipecat_actions.runtime.base import RuntimeBase
from pipecat_actions.session import SessionState
from pipecat_actions.status import TERMINAL_STATUSES, ActionStatus

S = ActionStatus


class DecisionsMixin(RuntimeBase):
    """Cancellation per ``on_interruption``, verbal confirmation and approvals."""

    async def _interrupted(self, operation_id: str) -> None:
        tracked = self._tracked.get(operation_id)
        if tracked is None or self._closed:
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
        self, operation_id: str, *, reason: str, only_if_not_started: bool = False
    ) -> Operation:
        """Cancel an operation as far as the truth allows; return what the ledger then says.

        Nothing sent yet: CANCELLED. Sent, with a ``cancel`` hook and unless
        ``only_if_not_started``: CANCEL_REQUESTED, then CANCELLED only when the provider
        confirms; otherwise the operation goes on and its real outcome is recorded.
        """
        op = await self.ledger.get(operation_id)
        tracked = self._tracked.get(operation_id)
        if tracked is None or op.status in TERMINAL_STATUSES:
            return op
        if op.status in (S.ADMITTED, S.FAILED_RETRYABLE):
            return await self._cancel_not_started(op, tracked, reason)
        if op.status in (S.AWAITING_APPROVAL, S.AWAITING_CONFIRMATION):
            return await self._move(op, tracked, S.REJECTED, reason, finish=True)
        hook = tracked.binding.action.cancel
        if op.status is not S.RUNNING or only_if_not_started or hook is None:
            return op
        requested = await self._move(op, tracked, S.CANCEL_REQUESTED, reason)
        if requested.status is not S.CANCEL_REQUESTED:
            return requested
        try:
            answer = await hook(ActionContext.of(requested))
        except Exception as exc:
            operation_logger(op).warning("operation {}: cancel hook failed: {}", operation_id, exc)
            answer = CancelOutcome.UNKNOWN
        if answer is CancelOutcome.CANCELLED:
            tracked.takeover.set()
            if tracked.effect_task is not None:
                tracked.effect_task.cancel()
            return await self._move(requested, tracked, S.CANCELLED, "the provider confirmed", True)
        return await self.ledger.annotate(
            operation_id, actor=self.actor, detail={"cancel_answer": str(answer)}
        )

    async def confirm(self, operation_id: str, token: str, session: SessionState) -> dict[str, Any]:
        """Apply the user's verbal confirmation (the ``confirm_action`` tool)."""
        try:
            op = await self.ledger.get(operation_id)
        except PipecatActionsError:
            return refusal_result("There is no such operation.", code="unknown_operation")
        tracked = self._tracked.get(operation_id)
        problem = None
        if op.session_id != session.session_id or tracked is None:
            problem = "That operation does not belong to this conversation."
        elif op.status is not S.AWAITING_CONFIRMATION:
            problem = f"That operation is {op.status.value.lower()}, not waiting for a yes."
        elif token != op.args_hash[:12]:
            problem = "The confirmation does not match the request's details; ask again."
        elif session.user_turn <= int(op.turn_id or 0):
            problem = "The user has not answered yet: ask them and wait for their reply."
        elif op.deadline_at is not None and self.clock.now() >= op.deadline_at:
            problem = "The confirmation came too late; the request expired."
        if problem is not None or tracked is None:
            return refusal_result(
                problem or "", code="confirmation_refused", operation_id=operation_id
            )
        return await self._release(
            op,
            tracked,
            actor=f"user:{session.principal}",
            reason="confirmed by the user",
            wait=True,
        )

    async def approve(
        self, operation_id: str, *, approver: str, reason: str, args_hash: str | None = None
    ) -> Operation:
        """Approve an operation waiting for approval; it then runs.

        Raises:
            ApprovalRefused: Not waiting for approval, expired, or approved for other
                arguments than the ones it holds.
        """
        tracked = self._tracked.get(operation_id)
        try:
            approved = await approve_operation(
                self.ledger,
                operation_id,
                approver=approver,
                reason=reason,
                now=self.clock.now(),
                args_hash=args_hash,
                fence=tracked.fence if tracked else None,
                deadline_at=self.clock.now() + self._deadline_for(operation_id),
            )
        except ApprovalRefused:
            if tracked is not None:
                current = await self.ledger.get(operation_id)
                if current.status in TERMINAL_STATUSES:
                    self._finish(tracked, current)
            raise
        if tracked is not None and approved.deadline_at is not None:
            self.watchdog.arm(operation_id, approved.deadline_at)
            self._spawn(self._execute(approved, tracked, take_slot=True))
        return approved

    async def reject(self, operation_id: str, *, approver: str, reason: str) -> Operation:
        """Reject an operation waiting for approval (REJECTED; nothing runs)."""
        tracked = self._tracked.get(operation_id)
        rejected = await reject_operation(
            self.ledger,
            operation_id,
            approver=approver,
            reason=reason,
            fence=tracked.fence if tracked else None,
        )
        if tracked is not None:
            self._finish(tracked, rejected)
        return rejected

    async def _release(
        self, op: Operation, tracked: Tracked, *, actor: str, reason: str, wait: bool
    ) -> dict[str, Any]:
        deadline_at = self.clock.now() + self._deadline(op.tool)
        try:
            admitted = await self.ledger.transition(
                op.operation_id,
                expected=op.status,
                to=S.ADMITTED,
                fence=tracked.fence,
                actor=actor,
                detail={"reason": reason},
                changes={"deadline_at": deadline_at},
            )
        except TransitionRefused:
            return render_operation(await self.ledger.get(op.operation_id))
        self.watchdog.arm(op.operation_id, deadline_at)
        self._spawn(self._execute(admitted, tracked, take_slot=True))
        if not wait:
            return render_operation(admitted)
        return render_operation(await asyncio.shield(tracked.done))

    async def pending_approvals(self) -> list[Operation]:
        """Operations waiting for a person's approval, oldest first."""
        return await self.ledger.list(OperationFilter(status=[S.AWAITING_APPROVAL]))
