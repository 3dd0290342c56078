"""One operation (its page, revealing its sealed values, reconciling it) and one conversation.

Another tenant's operation or conversation is "not found", as one that does not exist.
"""

from __future__ import annotations

__all__ = ["router"]

from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from loguru import logger

from pipecat_actions.approvals import ApprovalRefused
from pipecat_actions.console.context import Console, ConsoleDep, Identity, OperatorScope, SignedIn
from pipecat_actions.console.scope import Scope
from pipecat_actions.console.timeline import session_timeline
from pipecat_actions.errors import OperationNotFound, PipecatActionsError
from pipecat_actions.ledger import Operation
from pipecat_actions.ledger.sealing import Sealer

router = APIRouter()
FormText = Annotated[str, Form()]


@router.get("/operations/{operation_id}", response_class=HTMLResponse)
async def operation(
    request: Request, operation_id: str, state: ConsoleDep, who: SignedIn, seen: OperatorScope
) -> Response:
    """An operation with its audit timeline and decisions."""
    try:
        op: Operation | None = await state.ledger.get(operation_id)
    except OperationNotFound:
        # A ledger that cannot be read is not a missing operation: that one goes to the
        # handler of PipecatActionsError (503, try again).
        op = None
    if op is None or not seen.sees(op):
        # Another tenant's operation is not found either: its existence is not theirs.
        return state.page(request, "missing.html", who, status_code=404, operation_id=operation_id)
    return await _operation_page(request, state, who, seen, op, sealer=None)


async def _operation_page(
    request: Request,
    state: Console,
    who: Identity,
    seen: Scope,
    op: Operation,
    *,
    sealer: Sealer | None,
) -> Response:
    view = await seen.view(op, sealer=sealer)
    events = await state.ledger.events(op.operation_id)
    return state.page(
        request,
        "operation.html",
        who,
        op=op,
        events=events,
        rule=view.rule,
        view=view,
        can_reveal=state.settings.reveal_role in who.approver.roles,
    )


@router.post("/operations/{operation_id}/reveal", response_class=HTMLResponse)
async def reveal(
    request: Request,
    operation_id: str,
    state: ConsoleDep,
    who: SignedIn,
    seen: OperatorScope,
    csrf: FormText = "",
) -> Response:
    """The operation's page with its sealed values shown (its reveal role; recorded first)."""
    from pipecat_actions import operator

    role = state.settings.reveal_role
    try:
        state.check_csrf(request, who, csrf)
        op = await state.ledger.get(operation_id)
        if not seen.sees(op):
            raise OperationNotFound(operation_id=operation_id)
        if role not in who.approver.roles:
            raise ApprovalRefused(f"revealing sealed values needs the role {role}")
        sealer = await operator.reveal(state.ledger, op, actor=f"console:{who.approver.name}")
    except OperationNotFound:
        return state.page(request, "missing.html", who, status_code=404, operation_id=operation_id)
    except PipecatActionsError as exc:
        state.flash(request, "error", f"Not revealed: {exc}")
        return RedirectResponse(f"/operations/{operation_id}", status_code=303)
    logger.info("console: {} revealed the sealed values of {}", who.approver.name, operation_id)
    return await _operation_page(request, state, who, seen, op, sealer=sealer)


@router.post("/operations/{operation_id}/reconcile")
async def reconcile(
    request: Request, operation_id: str, state: ConsoleDep, who: SignedIn, csrf: FormText = ""
) -> Response:
    """Ask the application's reconcile hook about the operation (``--app``), and record it."""
    from pipecat_actions import operator

    try:
        state.check_csrf(request, who, csrf)
        if state.settings.app is None:
            raise ApprovalRefused("no operator app is configured (--app MODULE:ATTR)")
        loaded = await operator.load_app(state.settings.app)
        (row,) = await operator.reconcile(
            state.ledger, loaded, operation_ids=[operation_id], actor=f"console:{who.approver.name}"
        )
    except PipecatActionsError as exc:
        state.flash(request, "error", f"Not reconciled: {exc}")
    else:
        state.flash(request, "ok", f"{operation_id}: {row['before']} → {row['after']}.")
    return RedirectResponse(f"/operations/{operation_id}", status_code=303)


@router.get("/sessions/{session_id:path}", response_class=HTMLResponse)
async def session(
    request: Request, session_id: str, state: ConsoleDep, who: SignedIn, seen: OperatorScope
) -> Response:
    """One conversation's timeline: what was asked, proposed, run, committed, told, heard."""
    trails = await seen.session(session_id)
    if not trails:
        return state.page(request, "missing.html", who, status_code=404, session_id=session_id)
    timeline = session_timeline(session_id, trails)
    return state.page(request, "session.html", who, timeline=timeline, session_id=session_id)
