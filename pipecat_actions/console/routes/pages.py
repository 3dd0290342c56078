"""The front page, its fragments (each list, fetched again when it changed) and ``/events``."""

from __future__ import annotations

__all__ = ["FRAGMENTS", "router"]

from collections.abc import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, Response, StreamingResponse

from pipecat_actions.console.context import ConsoleDep, OperatorScope, SignedIn, SignInNeeded
from pipecat_actions.console.users import UsersFileError

router = APIRouter()
FRAGMENTS = ("approvals", "conflicts", "undelivered", "unknown", "recent")
"""The front page's parts that a live page fetches again (``/fragments/NAME``)."""


@router.get("/", response_class=HTMLResponse)
async def index(
    request: Request, state: ConsoleDep, who: SignedIn, seen: OperatorScope
) -> Response:
    """The front page: what waits for the operator, and what they should know."""
    sections = await seen.sections(state.settings.now())
    return state.page(request, "index.html", who, **sections)


@router.get("/fragments/{name}", response_class=HTMLResponse)
async def fragment(
    request: Request, name: str, state: ConsoleDep, who: SignedIn, seen: OperatorScope
) -> Response:
    """One part of the front page, as it is now."""
    if name not in FRAGMENTS:
        return Response(status_code=404)
    sections = await seen.sections(state.settings.now())
    return state.page(request, f"_{name}.html", who, whole=False, **sections)


@router.get("/events")
async def events(request: Request, state: ConsoleDep, who: SignedIn) -> Response:
    """Server-sent events: ``changed`` whenever what the pages show changed in the ledger."""
    changes = state.changes
    stopping = request.app.state.stopping

    async def stream() -> AsyncIterator[str]:
        version = changes.version
        quiet = 0
        yield "retry: 2000\n\n"
        # Checked every second: the page left, or the server is stopping (a stream that
        # waited for its next change would hold the shutdown up).
        while not changes.stopped and not stopping():
            if await request.is_disconnected():
                return
            try:
                state.identify(request)  # signed out, expired or removed meanwhile: it ends
            except (SignInNeeded, UsersFileError):
                return
            now = await changes.after(version, within_secs=1.0)
            if now != version:
                version, quiet = now, 0
                yield f"event: changed\ndata: {version}\n\n"
            elif (quiet := quiet + 1) >= 15:
                quiet = 0
                yield ": still here\n\n"

    return StreamingResponse(
        stream(),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )
