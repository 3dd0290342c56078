"""Signing in with the credentials file, and out (a proxy's sign-in has neither)."""

from __future__ import annotations

__all__ = ["router"]

import asyncio
import hmac
import secrets
from typing import Annotated

from fastapi import APIRouter, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from loguru import logger

from pipecat_actions._printable import printable
from pipecat_actions.approvals import ApprovalRefused
from pipecat_actions.console.context import ConsoleDep, SignedIn

router = APIRouter()
FormText = Annotated[str, Form()]


@router.get("/login", response_class=HTMLResponse)
async def login_form(request: Request, state: ConsoleDep) -> Response:
    """The sign-in form (with a proxy's sign-in, the front page)."""
    if state.settings.user_header is not None:
        return RedirectResponse("/", status_code=303)
    request.session.setdefault("csrf", secrets.token_urlsafe(24))
    return state.page(request, "login.html", None, csrf=request.session["csrf"])


@router.post("/login")
async def login(
    request: Request,
    state: ConsoleDep,
    name: FormText = "",
    password: FormText = "",
    csrf: FormText = "",
) -> Response:
    """Sign in: a stale form, a paused name or a wrong password goes back to the form."""
    users = state.settings.users
    if users is None:  # sign-in is the proxy's
        return RedirectResponse("/", status_code=303)
    expected = request.session.get("csrf", "")
    if not isinstance(expected, str) or not hmac.compare_digest(csrf.encode(), expected.encode()):
        state.flash(request, "error", "The sign-in form was stale; try again.")
        return RedirectResponse("/login", status_code=303)
    tried = (name.strip().casefold()[:128], request.client.host if request.client else "")
    wait_secs = state.failures.wait_secs(tried)
    if wait_secs > 0:
        logger.warning("console: sign-in as {!r} paused after failures", printable(name[:64]))
        state.flash(
            request,
            "error",
            f"Too many failed sign-ins for this name; try again in "
            f"{max(1, round(wait_secs / 60))} min.",
        )
        return RedirectResponse("/login", status_code=303)
    state.failures.failed(tried)  # counted before the check: attempts sent at once all count
    operator = await asyncio.to_thread(users.authenticate, name.strip(), password)
    if operator is None:
        logger.warning("console: failed sign-in as {!r}", printable(name[:64]))
        state.flash(request, "error", "Unknown name or wrong password.")
        return RedirectResponse("/login", status_code=303)
    state.failures.forget(tried)
    state.sign_ins.close(request.session.get("sign_in"))
    request.session.clear()
    request.session["sign_in"] = state.sign_ins.open(operator)
    request.session["csrf"] = secrets.token_urlsafe(24)
    logger.info("console: {} signed in", operator.name)
    return RedirectResponse("/", status_code=303)


@router.post("/logout")
async def logout(
    request: Request, state: ConsoleDep, who: SignedIn, csrf: FormText = ""
) -> Response:
    """Sign out (a stale form changes nothing)."""
    try:
        state.check_csrf(request, who, csrf)
    except ApprovalRefused:
        return RedirectResponse("/", status_code=303)
    state.sign_ins.close(request.session.get("sign_in"))
    request.session.clear()
    logger.info("console: {} signed out", who.approver.name)
    return RedirectResponse("/login", status_code=303)
