"""The console's web application: pages on the ledger, and the decisions made from them.

Every page needs a signed-in operator (`Identity`) and shows the operations of their tenants
only, of the requests waiting for approval those they may decide (`Scope`); every decision
goes through `pipecat_actions.approvals`, so the console enforces exactly the rules the CLI and
the runtime enforce, whatever a form says. Pages are rendered on the server (Jinja2,
autoescaped, every value from the ledger shown through `printable`); a small script keeps them
live: it listens to ``/events`` (server-sent events), sent when what the pages show changed in
the ledger (the agent asked for an approval, an operation settled), and swaps in the new
fragments, keeping what an operator is typing.
"""

from __future__ import annotations

__all__ = ["ConsoleSettings", "create_app"]

import contextlib
import html
import shlex
import urllib.parse
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from loguru import logger
from starlette.middleware.sessions import SessionMiddleware

from pipecat_actions._printable import printable, printable_json
from pipecat_actions.console.context import Console, SignInNeeded
from pipecat_actions.console.live import Changes
from pipecat_actions.console.routes import ROUTERS
from pipecat_actions.console.scope import Rules, all_lists
from pipecat_actions.console.settings import ConsoleSettings
from pipecat_actions.console.sign_ins import Failures, SignIns
from pipecat_actions.console.users import UsersFileError
from pipecat_actions.errors import PipecatActionsError
from pipecat_actions.ledger import Ledger
from pipecat_actions.ledger.sealed import stored_ledger

_HERE = Path(__file__).parent


def create_app(settings: ConsoleSettings, ledger: Ledger, *, ledger_name: str) -> FastAPI:
    """Return the console's application on ``ledger`` (opened and closed by the caller).

    Its routes are routers per area (`pipecat_actions.console.routes`); what they share, the
    `Console`, is on ``app.state.console``, and each asks for the signed-in operator with a
    dependency (`pipecat_actions.console.context`).

    Args:
        settings: Sign-in and behaviour.
        ledger: The ledger the agent writes (given a runtime's, the console reads what it
            stores: sealed values stay masked until an operator reveals them).
        ledger_name: How the pages name it (its URL, password hidden).
    """
    ledger = stored_ledger(ledger)

    async def fingerprint() -> Any:
        lists = await all_lists(ledger)
        return {name: [(op.operation_id, op.status, op.event_seq) for op in ops]
                for name, ops in lists.items()}  # fmt: skip

    state = Console(
        settings=settings,
        ledger=ledger,
        templates=_templates(ledger_name),
        rules=Rules(ledger),
        sign_ins=SignIns(settings.now, settings.session_secs),
        failures=Failures(settings.now),
        changes=Changes(fingerprint, settings.poll_secs),
    )

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state.changes.start()
        try:
            yield
        finally:
            await state.changes.stop()

    app = FastAPI(lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(
        SessionMiddleware,
        secret_key=settings.secret,
        session_cookie=settings.cookie_name,
        max_age=int(settings.session_secs),
        same_site="strict",
        https_only=settings.secure_cookies,
    )
    app.mount("/static", StaticFiles(directory=str(_HERE / "static")), name="static")
    app.state.console = state
    app.state.stopping = lambda: False  # the server that runs it says when it stops
    _answer_failures(app, settings)
    for router in ROUTERS:
        app.include_router(router)
    return app


def _templates(ledger_name: str) -> Jinja2Templates:
    """The pages, with the filters they show ledger values through."""
    templates = Jinja2Templates(directory=str(_HERE / "templates"))
    env = templates.env
    env.filters["visible"] = lambda value: printable("" if value is None else str(value))
    env.filters["pretty"] = _sorted_json
    env.filters["when"] = _when
    # A session id is the application's: "/" and ".." in it must stay in the one path segment.
    env.filters["pathpart"] = lambda value: urllib.parse.quote(str(value), safe="")
    env.globals["ledger_name"] = printable(ledger_name)
    env.globals["ledger_arg"] = shlex.quote(printable(ledger_name))
    return templates


def _answer_failures(app: FastAPI, settings: ConsoleSettings) -> None:
    """What a request that cannot be served is answered: a line, never a traceback."""

    @app.exception_handler(SignInNeeded)
    async def sign_in(request: Request, exc: SignInNeeded) -> Response:
        if settings.user_header is not None:
            why = exc.why or f"no operator named in {settings.user_header}"
            return HTMLResponse(
                html.escape(f"Sign-in is by the proxy in front of this console: {why}."),
                status_code=401,
            )
        if request.url.path.startswith(("/fragments", "/events")):
            return Response(status_code=401)
        return RedirectResponse("/login", status_code=303)

    @app.exception_handler(PipecatActionsError)
    async def ledger_failed(request: Request, exc: PipecatActionsError) -> Response:
        logger.warning("console: {} failed: {}", request.url.path, exc)
        return _trouble(
            request,
            f"The ledger could not be read ({printable(str(exc))[:300]}). Reload to try again; "
            "the console's log has the details.",
        )

    @app.exception_handler(Exception)
    async def failed(request: Request, exc: Exception) -> Response:
        logger.opt(exception=exc).error("console: {} failed", request.url.path)
        return _trouble(request, "The console failed on this page; its log has the details.")

    @app.exception_handler(UsersFileError)
    async def users_file_broken(_: Request, exc: UsersFileError) -> Response:
        logger.error("console: {}", exc)
        return HTMLResponse(
            "The console cannot read its credentials file; see its log.", status_code=503
        )


def _when(at: float | None) -> str:
    if at is None:
        return ""
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _sorted_json(value: Any) -> str:
    return printable_json(value, sort_keys=True)


def _trouble(request: Request, text: str) -> Response:
    """What a page says when it cannot be shown: a line, never a traceback."""
    if request.url.path.startswith(("/fragments", "/events")):
        return Response(status_code=503)
    return HTMLResponse(
        f"<!doctype html><title>Console: not available</title><p>{html.escape(text)}</p>"
        '<p><a href="/">Try again</a></p>',
        status_code=503,
    )
