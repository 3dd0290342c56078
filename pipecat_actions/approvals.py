"""Approving and rejecting operations that wait for a person, from any process.

The runtime that admitted an operation may be another process (the bot) than the one approving
it (``pipecat-actions approvals approve``). Approval is therefore a ledger transition,
AWAITING_APPROVAL → ADMITTED, bound to the arguments the approver saw (their hash) and refused
once the approval window has closed; the owning runtime notices the approved operation on its
next heartbeat and runs it.
"""

from __future__ import annotations

__all__ = ["ApprovalRefused", "approve_operation", "reject_operation"]

import contextlib

from pipecat_actions.errors import PipecatActionsError, TransitionRefused
from pipecat_actions.ledger import Ledger, Operation
from pipecat_actions.status import ActionStatus

S = ActionStatus


class ApprovalRefused(PipecatActionsError):
    """An approval or rejection could not be applied (wrong status, arguments, expired)."""


async def approve_operation(
    ledger: Ledger,
    operation_id: str,
    *,
    approver: str,
    reason: str,
    now: float,
    args_hash: str | None = None,
    fence: int | None = None,
    deadline_at: float | None = None,
) -> Operation:
    """Approve a waiting operation: AWAITING_APPROVAL → ADMITTED.

    Args:
        ledger: The ledger.
        operation_id: The operation.
        approver: Who approves (recorded).
        reason: Why (recorded).
        now: The current time, to refuse an expired approval.
        args_hash: The hash of the arguments the approver saw; refused if they differ.
        fence: The owner's fence, when the owner approves; else the stored one.
        deadline_at: The execution deadline from now on; None lets the owner set it.

    Raises:
        ApprovalRefused: Not waiting for approval, other arguments, or expired (then it is
            moved to EXPIRED).
    """
    op = await ledger.get(operation_id)
    if op.status is not S.AWAITING_APPROVAL:
        raise ApprovalRefused(f"operation {operation_id} is {op.status}, not awaiting approval")
    if args_hash is not None and args_hash != op.args_hash:
        raise ApprovalRefused(
            f"operation {operation_id} holds other arguments than the ones approved "
            f"(args hash {op.args_hash[:12]}…, approved {args_hash[:12]}…)"
        )
    if op.deadline_at is not None and now >= op.deadline_at:
        with contextlib.suppress(TransitionRefused):
            await ledger.transition(
                operation_id,
                expected=S.AWAITING_APPROVAL,
                to=S.EXPIRED,
                fence=op.fence if fence is None else fence,
                actor=f"approver:{approver}",
                detail={"reason": "approval came after the approval window closed"},
                changes={"error": "approval window closed"},
            )
        raise ApprovalRefused(f"operation {operation_id} expired before it was approved")
    try:
        return await ledger.transition(
            operation_id,
            expected=S.AWAITING_APPROVAL,
            to=S.ADMITTED,
            fence=op.fence if fence is None else fence,
            actor=f"approver:{approver}",
            detail={"reason": reason, "args_hash": op.args_hash},
            changes={"deadline_at": deadline_at},
        )
    except TransitionRefused as exc:
        raise ApprovalRefused(f"operation {operation_id} changed meanwhile: {exc}") from exc


async def reject_operation(
    ledger: Ledger, operation_id: str, *, approver: str, reason: str, fence: int | None = None
) -> Operation:
    """Reject a waiting operation: AWAITING_APPROVAL → REJECTED; nothing runs.

    Raises:
        ApprovalRefused: It is not waiting for approval.
    """
    op = await ledger.get(operation_id)
    if op.status is not S.AWAITING_APPROVAL:
        raise ApprovalRefused(f"operation {operation_id} is {op.status}, not awaiting approval")
    try:
        return await ledger.transition(
            operation_id,
            expected=S.AWAITING_APPROVAL,
            to=S.REJECTED,
            fence=op.fence if fence is None else fence,
            actor=f"approver:{approver}",
            detail={"reason": reason},
            changes={"error": f"rejected by {approver}: {reason}"},
        )
    except TransitionRefused as exc:
        raise ApprovalRefused(f"operation {operation_id} changed meanwhile: {exc}") from exc
