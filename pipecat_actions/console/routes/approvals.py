"""Decisions on requests waiting for approval: every one goes through `pipecat_actions.approvals`.

The console enforces exactly the rules the CLI and the runtime enforce (the approver's tenant
and role, never the requester, a reason, the arguments' hash shown, the request's window),
whatever a form says.
"""

from __future__ import annotations

__all__ = ["router"]

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response
from loguru import logger

from pipecat_actions._printable import printable
from pipecat_actions.approvals import ApprovalRefused, approve_operation, reject_operation
from pipecat_actions.console.context import Console, ConsoleDep, Identity, SignedIn
from pipecat_actions.errors import PipecatActionsError

router = APIRouter(prefix="/approvals")
FormText = Annotated[str, Form()]


@router.post("/{operation_id}/approve")
async def approve(
    request: Request,
    operation_id: str,
    state: ConsoleDep,
    who: SignedIn,
    reason: FormText = "",
    args_hash: FormText = "",
    csrf: FormText = "",
) -> Response:
    """Approve the request, for the arguments whose hash the page showed."""
    return await _decide(request, state, who, operation_id, "approve", reason, args_hash, csrf)


@router.post("/{operation_id}/reject")
async def reject(
    request: Request,
    operation_id: str,
    state: ConsoleDep,
    who: SignedIn,
    reason: FormText = "",
    csrf: FormText = "",
) -> Response:
    """Reject the request."""
    return await _decide(request, state, who, operation_id, "reject", reason, "", csrf)


async def _decide(
    request: Request,
    state: Console,
    who: Identity,
    operation_id: str,
    decision: str,
    reason: str,
    args_hash: str,
    csrf: str,
) -> Response:
    verb = "approved" if decision == "approve" else "rejected"
    now = state.settings.now()
    try:
        state.check_csrf(request, who, csrf)
        if decision == "approve":
            op = await approve_operation(
                state.ledger,
                operation_id,
                approver=who.approver,
                reason=reason,
                now=now,
                args_hash=args_hash,
            )
        else:
            op = await reject_operation(
                state.ledger, operation_id, approver=who.approver, reason=reason, now=now
            )
    except ApprovalRefused as exc:
        logger.warning(
            "console: {} could not {} {}: {}", who.approver.name, decision, operation_id, exc
        )
        state.flash(request, "error", f"Not {verb}: {exc}")
    except PipecatActionsError as exc:
        state.flash(request, "error", f"Not {verb}: {exc}")
    else:
        logger.info("console: {} {} {}", who.approver.name, verb, operation_id)
        state.flash(request, "ok", f"{printable(op.tool)} {op.operation_id} {verb}.")
    return RedirectResponse("/", status_code=303)
