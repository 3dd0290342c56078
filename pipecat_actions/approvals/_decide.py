"""Deciding on a waiting request: approve, reject, expire, and the audit of a refusal."""

from __future__ import annotations

__all__ = ["approve_operation", "reject_operation"]

import contextlib
from typing import Any

from loguru import logger

from pipecat_actions.approvals._rule import (
    DECISION_REFUSED,
    ApprovalRefused,
    ApprovalRule,
    Approver,
    approval_rule,
    check_decision,
    check_tenant,
)
from pipecat_actions.errors import PipecatActionsError, TransitionRefused
from pipecat_actions.ledger import Ledger, Operation
from pipecat_actions.status import ActionStatus

S = ActionStatus


def _actor(who: Approver) -> str:
    return f"approver:{who.name}"


def _decided_by(who: Approver, rule: ApprovalRule, reason: str) -> dict[str, Any]:
    detail: dict[str, Any] = {"reason": reason.strip(), "approver": who.name, "via": who.via}
    held = rule.roles_held(who)
    if held and not any(who.name.casefold() == n.casefold() for n in rule.approvers):
        detail["as_role"] = held
    return detail


async def _audit_refusal(
    ledger: Ledger, op: Operation, approver: Approver | str, decision: str, why: str
) -> None:
    """Record on a waiting ``op`` that a decision was refused: who tried, how known, why.

    Nothing is recorded for an approver with no usable name (nobody to name) or an operation
    no longer waiting. A ledger that cannot take the note is logged: the refusal stands.
    """
    if op.status is not S.AWAITING_APPROVAL:
        return
    try:
        who = Approver.of(approver)
    except ApprovalRefused:
        return
    detail = {
        DECISION_REFUSED: decision,
        "approver": who.name,
        "via": who.via,
        "tenants": sorted(who.tenants),
        "reason": why,
    }
    try:
        await ledger.annotate(
            op.operation_id, actor=_actor(who), detail=detail, expected=S.AWAITING_APPROVAL
        )
    except TransitionRefused:
        pass  # decided or expired meanwhile: what it is now is recorded already
    except PipecatActionsError as exc:
        logger.warning(
            "operation {}: a refused {} by {} could not be recorded: {}",
            op.operation_id,
            decision,
            who.name,
            exc,
        )


async def _refuse_outsider(
    ledger: Ledger, op: Operation, approver: Approver | str, decision: str
) -> None:
    """Refuse (and audit) an approver with no usable name or outside ``op``'s tenant.

    Checked first: one who may not act in the operation's tenant changes nothing there, not
    even the expiry of a request whose window closed.
    """
    who = Approver.of(approver)
    try:
        check_tenant(op, who, decision)
    except ApprovalRefused as exc:
        await _audit_refusal(ledger, op, who, decision, str(exc))
        raise


async def _refuse_if_expired(
    ledger: Ledger,
    op: Operation,
    approver: Approver | str,
    *,
    now: float,
    fence: int | None,
    decision: str,
) -> None:
    """Refuse a decision after ``op``'s window closed, and record that it EXPIRED.

    Checked before anything else about the decision but the tenant: whoever of the tenant
    asks, and with whatever arguments, a request whose window closed is EXPIRED, and the
    ledger says so. The window is the deadline the ledger holds, against ``now`` (the
    decider's clock): no other process need have noticed it closed.
    """
    # Whether the runtime's own timer or this decision finds the window closed first is a
    # race; the approver is told the same either way.
    if op.status is S.AWAITING_APPROVAL:
        if op.deadline_at is None or now < op.deadline_at:
            return
        who = Approver.of(approver)
        with contextlib.suppress(TransitionRefused):
            await ledger.transition(
                op.operation_id,
                expected=S.AWAITING_APPROVAL,
                to=S.EXPIRED,
                fence=op.fence if fence is None else fence,
                actor=_actor(who),
                detail={"reason": f"{decision} came after the approval window closed"},
                changes={"error": "approval window closed"},
            )
    elif op.status is not S.EXPIRED:
        return
    raise ApprovalRefused(
        f"operation {op.operation_id} expired before this {decision}: its window closed, "
        "so it is EXPIRED and nothing ran"
    )


def _check_args_hash(op: Operation, args_hash: str) -> None:
    operation_id = op.operation_id
    if not isinstance(args_hash, str) or not args_hash:
        raise ApprovalRefused(
            f"an approval names the arguments it approves: give the args hash shown with "
            f"operation {operation_id}"
        )
    given = args_hash.strip().lower()  # hex: the same hash whatever its case
    if given != op.args_hash and len(given) < len(op.args_hash) and op.args_hash.startswith(given):
        raise ApprovalRefused(
            f"an approval names the whole args hash of the arguments it approves, not the "
            f"first {len(given)} characters: give the {len(op.args_hash)} that "
            f"`approvals show {operation_id}` prints"
        )
    if given != op.args_hash:
        raise ApprovalRefused(
            f"operation {operation_id} holds other arguments than the ones approved "
            f"(args hash {op.args_hash[:12]}…, approved {args_hash[:12]}…)"
        )


async def approve_operation(
    ledger: Ledger,
    operation_id: str,
    *,
    approver: Approver | str,
    reason: str,
    now: float,
    args_hash: str,
    fence: int | None = None,
    deadline_at: float | None = None,
) -> Operation:
    """Approve a waiting operation: AWAITING_APPROVAL → ADMITTED (see the module's rules).

    Args:
        ledger: The ledger.
        operation_id: The operation.
        approver: Who approves, as their sign-in established it (recorded).
        reason: Why (required, recorded).
        now: The current time, to refuse an expired approval.
        args_hash: The hash of the arguments the approver saw; refused if they differ.
        fence: The owner's fence, when the owner approves; else the stored one.
        deadline_at: The execution deadline from now on; None lets the owner set it.

    Raises:
        ApprovalRefused: See `check_decision`; other arguments than the ones approved; or
            expired (then it is moved to EXPIRED). A refusal on a waiting operation is
            audited on it.
    """
    op = await ledger.get(operation_id)
    await _refuse_outsider(ledger, op, approver, "approve")
    await _refuse_if_expired(ledger, op, approver, now=now, fence=fence, decision="approval")
    rule = await approval_rule(ledger, operation_id) if op.status is S.AWAITING_APPROVAL else None
    try:
        who = check_decision(op, rule, approver, reason)
        _check_args_hash(op, args_hash)
    except ApprovalRefused as exc:
        await _audit_refusal(ledger, op, approver, "approve", str(exc))
        raise
    assert rule is not None  # check_decision refuses an operation without one
    try:
        return await ledger.transition(
            operation_id,
            expected=S.AWAITING_APPROVAL,
            to=S.ADMITTED,
            fence=op.fence if fence is None else fence,
            actor=_actor(who),
            detail={**_decided_by(who, rule, reason), "args_hash": op.args_hash},
            changes={"deadline_at": deadline_at},
        )
    except TransitionRefused as exc:
        raise ApprovalRefused(f"operation {operation_id} changed meanwhile: {exc}") from exc


async def reject_operation(
    ledger: Ledger,
    operation_id: str,
    *,
    approver: Approver | str,
    reason: str,
    now: float,
    fence: int | None = None,
) -> Operation:
    """Reject a waiting operation: AWAITING_APPROVAL → REJECTED; nothing runs.

    Args:
        ledger: The ledger.
        operation_id: The operation.
        approver: Who rejects, as their sign-in established it (recorded).
        reason: Why (required, recorded).
        now: The current time: a request whose window closed is EXPIRED, not rejected.
        fence: The owner's fence, when the owner rejects; else the stored one.

    Raises:
        ApprovalRefused: See `check_decision`; or expired (then it is moved to EXPIRED). A
            refusal on a waiting operation is audited on it.
    """
    op = await ledger.get(operation_id)
    await _refuse_outsider(ledger, op, approver, "reject")
    await _refuse_if_expired(ledger, op, approver, now=now, fence=fence, decision="rejection")
    rule = await approval_rule(ledger, operation_id) if op.status is S.AWAITING_APPROVAL else None
    try:
        who = check_decision(op, rule, approver, reason, decision="reject")
    except ApprovalRefused as exc:
        await _audit_refusal(ledger, op, approver, "reject", str(exc))
        raise
    assert rule is not None
    try:
        return await ledger.transition(
            operation_id,
            expected=S.AWAITING_APPROVAL,
            to=S.REJECTED,
            fence=op.fence if fence is None else fence,
            actor=_actor(who),
            detail=_decided_by(who, rule, reason),
            changes={"error": f"rejected by {who.name}: {reason.strip()}"},
        )
    except TransitionRefused as exc:
        raise ApprovalRefused(f"operation {operation_id} changed meanwhile: {exc}") from exc
