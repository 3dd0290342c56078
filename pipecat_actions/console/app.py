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

import asyncio
import contextlib
import hmac
import html
import secrets
import shlex
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Form, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from loguru import logger
from starlette.middleware.sessions import SessionMiddleware

from pipecat_actions._printable import printable, printable_json
from pipecat_actions.approvals import (
    ApprovalRefused,
    Approver,
    approve_operation,
    reject_operation,
)
from pipecat_actions.console.scope import Rules, Scope, all_lists
from pipecat_actions.console.timeline import session_timeline
from pipecat_actions.console.users import (
    Credentials,
    Operator,
    UsersFileError,
    check_tenants,
)
from pipecat_actions.errors import OperationNotFound, PipecatActionsError
from pipecat_actions.ledger import Ledger, Operation
from pipecat_actions.ledger.sealed import stored_ledger
from pipecat_actions.ledger.sealing import Sealer
from pipecat_actions.policy.fields import check_approver_name
from pipecat_actions.status import ActionStatus

S = ActionStatus
_HERE = Path(__file__).parent
_SIGN_INS = 10_000
"""The most sign-ins the console holds at once; past it the oldest is signed out."""
_FAILURES_ALLOWED = 5
_FAILURE_WINDOW_SECS = 900.0
"""Failed sign-ins allowed for one name from one address within the window, then a pause."""


@dataclass(frozen=True)
class ConsoleSettings:
    """How the console signs operators in and what it shows.

    Exactly one sign-in: ``users`` (a credentials file, see `pipecat_actions.console.users`),
    or ``user_header`` (a reverse proxy in front of the console authenticates operators and
    names them in this header, their roles comma-separated in ``roles_header``, their tenants
    in ``tenants_header``; the console must then be reachable only through the proxy).

    Attributes:
        users: The credentials file.
        user_header: The trusted header naming the signed-in operator.
        roles_header: The trusted header listing their roles.
        tenants_header: The trusted header listing the tenants they decide in (``*``: every
            one). Without it, operators signed in by the proxy belong to no tenant.
        app: The application's `OperatorApp` (``module:attr``), for the reconcile action.
        poll_secs: How often the ledger is read for changes to push to open pages.
        session_secs: How long a sign-in lasts, from signing in (it does not slide).
        secret: Signs the session cookies; random per start. Sign-ins are held by the
            console process, so a restart signs everyone out whatever the secret.
        secure_cookies: Send the session cookie over HTTPS only (behind a TLS proxy).
        public_origin: The console's address as browsers reach it (``https://host[:port]``),
            when a proxy in front of it changes the Host it sees. A decision's ``Origin``
            must be this; without it, the address the request was made to.
        cookie_name: The session cookie's name (browsers share cookies between the ports of
            one host: give consoles on one host names of their own).
        reveal_role: The role whose members may reveal an operation's sealed (``sensitive``)
            values, with the keys in the console's environment; everyone else sees ``••••``.
            Each reveal is recorded on the operation.
        now: The time, for approval windows, countdowns and sign-in lifetimes.
    """

    users: Credentials | None = None
    user_header: str | None = None
    roles_header: str | None = None
    tenants_header: str | None = None
    app: str | None = None
    poll_secs: float = 1.0
    session_secs: float = 8 * 3600.0
    secret: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    secure_cookies: bool = False
    public_origin: str | None = None
    cookie_name: str = "pipecat_actions_console"
    reveal_role: str = "reveal"
    now: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        if (self.users is None) == (self.user_header is None):
            raise UsersFileError(
                "the console signs operators in one way: give a credentials file (--users) "
                "or a trusted proxy header (--user-header), not both or neither"
            )
        if self.tenants_header is not None and self.user_header is None:
            raise UsersFileError(
                "--tenants-header goes with --user-header (a credentials file names each "
                "operator's tenants itself)"
            )
        if self.poll_secs <= 0:
            raise UsersFileError("poll_secs must be positive")
        if self.session_secs <= 0:
            raise UsersFileError("session_secs must be positive")
        if self.public_origin is not None:
            object.__setattr__(self, "public_origin", _origin_of(self.public_origin))


def _origin_of(text: str) -> str:
    """``scheme://host[:port]``, checked: the form browsers send in ``Origin``."""
    parts = urllib.parse.urlsplit(text.strip())
    if (
        parts.scheme not in ("http", "https")
        or not parts.netloc
        or parts.path not in ("", "/")
        or parts.query
        or parts.fragment
        or "@" in parts.netloc
    ):
        raise UsersFileError(
            f"the public origin must be scheme://host[:port] (e.g. https://console.example.com), "
            f"not {printable(text[:200])!r}"
        )
    return f"{parts.scheme}://{parts.netloc}".lower()


@dataclass(frozen=True)
class Identity:
    """The operator making a request."""

    approver: Approver
    csrf: str


class _SignInNeeded(Exception):
    def __init__(self, why: str | None = None) -> None:
        super().__init__(why)
        self.why = why


@dataclass(frozen=True, slots=True)
class _SignIn:
    name: str
    password_hash: str
    expires_at: float


class _SignIns:
    """Who is signed in, held by the console: a session cookie names a sign-in, never a user.

    A sign-in ends when its operator signs out, ``session_secs`` after it began (not sliding),
    when their line leaves the credentials file or when their password changes, so a copied
    cookie is worth nothing once any of these happened.
    """

    def __init__(self, now: Callable[[], float], lifetime_secs: float) -> None:
        self._now = now
        self._lifetime_secs = lifetime_secs
        self._held: dict[str, _SignIn] = {}

    def open(self, operator: Operator) -> str:
        now = self._now()
        for sid in [sid for sid, held in self._held.items() if held.expires_at <= now]:
            del self._held[sid]
        while len(self._held) >= _SIGN_INS:
            del self._held[next(iter(self._held))]
        sid = secrets.token_urlsafe(32)
        self._held[sid] = _SignIn(operator.name, operator.password_hash, now + self._lifetime_secs)
        return sid

    def find(self, sid: object, credentials: Credentials) -> Operator | None:
        held = self._held.get(sid) if isinstance(sid, str) else None
        if held is None:
            return None
        operator = credentials.find(held.name)
        if (
            self._now() >= held.expires_at
            or operator is None
            or not hmac.compare_digest(operator.password_hash, held.password_hash)
        ):
            del self._held[sid]  # type: ignore[arg-type]
            return None
        return operator

    def close(self, sid: object) -> None:
        if isinstance(sid, str):
            self._held.pop(sid, None)


class _Failures:
    """Failed sign-ins per name and client address: past a few, that pair waits a while."""

    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now
        self._seen: dict[tuple[str, str], list[float]] = {}

    def _recent(self, key: tuple[str, str]) -> list[float]:
        since = self._now() - _FAILURE_WINDOW_SECS
        recent = [at for at in self._seen.get(key, ()) if at > since]
        if recent:
            self._seen[key] = recent
        else:
            self._seen.pop(key, None)
        return recent

    def wait_secs(self, key: tuple[str, str]) -> float:
        """How long ``key`` must wait before trying again (0: it may try now)."""
        recent = self._recent(key)
        if len(recent) < _FAILURES_ALLOWED:
            return 0.0
        return recent[-_FAILURES_ALLOWED] + _FAILURE_WINDOW_SECS - self._now()

    def failed(self, key: tuple[str, str]) -> None:
        """Count an attempt against ``key`` (before it is checked: attempts made at once count)."""
        if len(self._seen) >= _SIGN_INS and key not in self._seen:
            for old in list(self._seen):
                self._recent(old)  # forget what has aged out
            if len(self._seen) >= _SIGN_INS:
                # The pair with the fewest recent failures goes: flooding the table with
                # names tried once never clears the record of the name being guessed.
                del self._seen[min(self._seen, key=lambda k: len(self._seen[k]))]
        self._seen.setdefault(key, []).append(self._now())

    def forget(self, key: tuple[str, str]) -> None:
        self._seen.pop(key, None)


class _Changes:
    """What the pages show, read every ``poll_secs``; a new version when it changed."""

    def __init__(self, read: Callable[[], Awaitable[Any]], poll_secs: float) -> None:
        self._read = read
        self._poll_secs = poll_secs
        self.version = 0
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self.stopped = False

    def start(self) -> None:
        self._task = asyncio.ensure_future(self._watch())

    async def stop(self) -> None:
        self.stopped = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        async with self._changed:
            self._changed.notify_all()

    async def _watch(self) -> None:
        seen: Any = None
        failing = False
        while True:
            try:
                now = await self._read()
                if failing:
                    logger.info("console: the ledger can be read again")
                failing = False
            except PipecatActionsError as exc:
                if not failing:
                    logger.warning("console: reading the ledger failed: {}", exc)
                failing = True
                now = seen
            except Exception:  # live updates go on after any failure
                if not failing:
                    logger.opt(exception=True).error("console: watching the ledger failed")
                failing = True
                now = seen
            if now != seen:
                seen = now
                async with self._changed:
                    self.version += 1
                    self._changed.notify_all()
            await asyncio.sleep(self._poll_secs)

    async def after(self, version: int, within_secs: float) -> int:
        """Wait until the version is past ``version`` (or ``within_secs``); return it."""
        async with self._changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: self.version > version or self.stopped),
                    within_secs,
                )
            return self.version


def _when(at: float | None) -> str:
    if at is None:
        return ""
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _sorted_json(value: Any) -> str:
    return printable_json(value, sort_keys=True)


def create_app(settings: ConsoleSettings, ledger: Ledger, *, ledger_name: str) -> FastAPI:
    """Return the console's application on ``ledger`` (opened and closed by the caller).

    Args:
        settings: Sign-in and behaviour.
        ledger: The ledger the agent writes (given a runtime's, the console reads what it
            stores: sealed values stay masked until an operator reveals them).
        ledger_name: How the pages name it (its URL, password hidden).
    """
    ledger = stored_ledger(ledger)
    templates = Jinja2Templates(directory=str(_HERE / "templates"))
    env = templates.env
    env.filters["visible"] = lambda value: printable("" if value is None else str(value))
    env.filters["pretty"] = _sorted_json
    env.filters["when"] = _when
    # A session id is the application's: "/" and ".." in it must stay in the one path segment.
    env.filters["pathpart"] = lambda value: urllib.parse.quote(str(value), safe="")
    env.globals["ledger_name"] = printable(ledger_name)
    env.globals["ledger_arg"] = shlex.quote(printable(ledger_name))

    async def fingerprint() -> Any:
        lists = await all_lists(ledger)
        return {name: [(op.operation_id, op.status, op.event_seq) for op in ops]
                for name, ops in lists.items()}  # fmt: skip

    changes = _Changes(fingerprint, settings.poll_secs)
    rules = Rules(ledger)
    sign_ins = _SignIns(settings.now, settings.session_secs)
    failures = _Failures(settings.now)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        changes.start()
        try:
            yield
        finally:
            await changes.stop()

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
    app.state.stopping = lambda: False  # the server that runs it says when it stops

    def identity(request: Request) -> Identity:
        session = request.session
        stored = session.get("csrf")
        csrf = stored if isinstance(stored, str) else secrets.token_urlsafe(24)
        session["csrf"] = csrf
        if settings.user_header is not None:
            name = _one_header(request, settings.user_header).strip()
            try:
                check_approver_name(name)
            except ValueError:
                raise _SignInNeeded() from None
            roles_text = _one_header(request, settings.roles_header)
            roles = set()
            for role in roles_text.split(","):
                with contextlib.suppress(ValueError):
                    roles.add(check_approver_name(role.strip()))
            via = f"console: proxy header {settings.user_header}"
            tenants: frozenset[str] = frozenset()
            with contextlib.suppress(UsersFileError):  # none, or none well-formed: no tenant
                tenants = check_tenants(_one_header(request, settings.tenants_header).split(","))
            return Identity(Approver(name, frozenset(roles), tenants, via), csrf)
        assert settings.users is not None
        operator = sign_ins.find(session.get("sign_in"), settings.users)
        if operator is None:
            session.pop("sign_in", None)
            raise _SignInNeeded()
        return Identity(operator.approver("console: credentials file"), csrf)

    def check_csrf(request: Request, who: Identity, token: str) -> None:
        if not hmac.compare_digest(token.encode(), who.csrf.encode()):
            raise ApprovalRefused("the form is stale or came from elsewhere; reload the page")
        origins = request.headers.getlist("origin")
        if not origins:
            return  # not sent by every browser for same-origin forms; the token decides
        expected = settings.public_origin or f"{request.url.scheme}://{request.url.netloc}"
        if len(origins) > 1 or origins[0].strip().rstrip("/").lower() != expected.lower():
            logger.warning(
                "console: a form came with Origin {!r}, not {}{}",
                printable(",".join(origins)[:200]),
                expected,
                "" if settings.public_origin else " (behind a proxy? set --public-origin)",
            )
            raise ApprovalRefused("the form came from another site")

    @app.exception_handler(_SignInNeeded)
    async def sign_in(request: Request, exc: _SignInNeeded) -> Response:
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

    def flash(request: Request, kind: str, text: str) -> None:
        request.session["flash"] = {"kind": kind, "text": text}

    def page(
        request: Request,
        name: str,
        who: Identity | None,
        *,
        whole: bool = True,
        status_code: int = 200,
        **values: Any,
    ) -> HTMLResponse:
        shown = request.session.pop("flash", None) if whole else None
        return templates.TemplateResponse(
            request,
            name,
            {
                "who": who,
                "flash": shown,
                "now": settings.now(),
                "header_sign_in": settings.user_header is not None,
                "can_reconcile": settings.app is not None,
                **values,
            },
            status_code=status_code,
        )

    # --- sign-in ---------------------------------------------------------------------------

    @app.get("/login", response_class=HTMLResponse)
    async def login_form(request: Request) -> Response:
        if settings.user_header is not None:
            return RedirectResponse("/", status_code=303)
        request.session.setdefault("csrf", secrets.token_urlsafe(24))
        return page(request, "login.html", None, csrf=request.session["csrf"])

    @app.post("/login")
    async def login(
        request: Request,
        name: str = Form(""),
        password: str = Form(""),
        csrf: str = Form(""),
    ) -> Response:
        if settings.users is None:  # sign-in is the proxy's
            return RedirectResponse("/", status_code=303)
        expected = request.session.get("csrf", "")
        if not isinstance(expected, str) or not hmac.compare_digest(
            csrf.encode(), expected.encode()
        ):
            flash(request, "error", "The sign-in form was stale; try again.")
            return RedirectResponse("/login", status_code=303)
        tried = (name.strip().casefold()[:128], request.client.host if request.client else "")
        wait_secs = failures.wait_secs(tried)
        if wait_secs > 0:
            logger.warning("console: sign-in as {!r} paused after failures", printable(name[:64]))
            flash(
                request,
                "error",
                f"Too many failed sign-ins for this name; try again in "
                f"{max(1, round(wait_secs / 60))} min.",
            )
            return RedirectResponse("/login", status_code=303)
        failures.failed(tried)  # counted before the check: attempts sent at once all count
        operator = await asyncio.to_thread(settings.users.authenticate, name.strip(), password)
        if operator is None:
            logger.warning("console: failed sign-in as {!r}", printable(name[:64]))
            flash(request, "error", "Unknown name or wrong password.")
            return RedirectResponse("/login", status_code=303)
        failures.forget(tried)
        sign_ins.close(request.session.get("sign_in"))
        request.session.clear()
        request.session["sign_in"] = sign_ins.open(operator)
        request.session["csrf"] = secrets.token_urlsafe(24)
        logger.info("console: {} signed in", operator.name)
        return RedirectResponse("/", status_code=303)

    @app.post("/logout")
    async def logout(request: Request, csrf: str = Form("")) -> Response:
        who = identity(request)
        try:
            check_csrf(request, who, csrf)
        except ApprovalRefused:
            return RedirectResponse("/", status_code=303)
        sign_ins.close(request.session.get("sign_in"))
        request.session.clear()
        logger.info("console: {} signed out", who.approver.name)
        return RedirectResponse("/login", status_code=303)

    # --- pages -----------------------------------------------------------------------------

    def scope(who: Identity) -> Scope:
        return Scope(ledger, who.approver, rules)

    @app.get("/", response_class=HTMLResponse)
    async def index(request: Request) -> Response:
        who = identity(request)
        sections = await scope(who).sections(settings.now())
        return page(request, "index.html", who, **sections)

    @app.get("/fragments/{name}", response_class=HTMLResponse)
    async def fragment(request: Request, name: str) -> Response:
        who = identity(request)
        if name not in _FRAGMENTS:
            return Response(status_code=404)
        sections = await scope(who).sections(settings.now())
        return page(request, f"_{name}.html", who, whole=False, **sections)

    @app.get("/operations/{operation_id}", response_class=HTMLResponse)
    async def operation(request: Request, operation_id: str) -> Response:
        who = identity(request)
        seen = scope(who)
        try:
            op = await ledger.get(operation_id)
        except OperationNotFound:
            # A ledger that cannot be read is not a missing operation: that one goes to
            # the handler of PipecatActionsError (503, try again).
            op = None
        if op is None or not seen.sees(op):
            # Another tenant's operation is not found either: its existence is not theirs.
            return page(request, "missing.html", who, status_code=404, operation_id=operation_id)
        return await operation_page(request, who, seen, op, sealer=None)

    async def operation_page(
        request: Request, who: Identity, seen: Scope, op: Operation, *, sealer: Sealer | None
    ) -> Response:
        view = await seen.view(op, sealer=sealer)
        events = await ledger.events(op.operation_id)
        return page(
            request,
            "operation.html",
            who,
            op=op,
            events=events,
            rule=view.rule,
            view=view,
            can_reveal=settings.reveal_role in who.approver.roles,
        )

    @app.post("/operations/{operation_id}/reveal", response_class=HTMLResponse)
    async def reveal(request: Request, operation_id: str, csrf: str = Form("")) -> Response:
        from pipecat_actions import operator

        who = identity(request)
        seen = scope(who)
        try:
            check_csrf(request, who, csrf)
            op = await ledger.get(operation_id)
            if not seen.sees(op):
                raise OperationNotFound(operation_id=operation_id)
            if settings.reveal_role not in who.approver.roles:
                raise ApprovalRefused(
                    f"revealing sealed values needs the role {settings.reveal_role}"
                )
            sealer = await operator.reveal(ledger, op, actor=f"console:{who.approver.name}")
        except OperationNotFound:
            return page(request, "missing.html", who, status_code=404, operation_id=operation_id)
        except PipecatActionsError as exc:
            flash(request, "error", f"Not revealed: {exc}")
            return RedirectResponse(f"/operations/{operation_id}", status_code=303)
        logger.info("console: {} revealed the sealed values of {}", who.approver.name, operation_id)
        return await operation_page(request, who, seen, op, sealer=sealer)

    @app.get("/sessions/{session_id:path}", response_class=HTMLResponse)
    async def session(request: Request, session_id: str) -> Response:
        who = identity(request)
        trails = await scope(who).session(session_id)
        if not trails:
            return page(request, "missing.html", who, status_code=404, session_id=session_id)
        timeline = session_timeline(session_id, trails)
        return page(request, "session.html", who, timeline=timeline, session_id=session_id)

    @app.get("/events")
    async def events(request: Request) -> Response:
        identity(request)

        async def stream() -> AsyncIterator[str]:
            version = changes.version
            quiet = 0
            yield "retry: 2000\n\n"
            # Checked every second: the page left, or the server is stopping (a stream that
            # waited for its next change would hold the shutdown up).
            while not changes.stopped and not app.state.stopping():
                if await request.is_disconnected():
                    return
                try:
                    identity(request)  # signed out, expired or removed meanwhile: the stream ends
                except (_SignInNeeded, UsersFileError):
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

    # --- decisions -------------------------------------------------------------------------

    async def decide(
        request: Request, operation_id: str, decision: str, reason: str, args_hash: str, csrf: str
    ) -> Response:
        who = identity(request)
        verb = "approved" if decision == "approve" else "rejected"
        try:
            check_csrf(request, who, csrf)
            if decision == "approve":
                op = await approve_operation(
                    ledger,
                    operation_id,
                    approver=who.approver,
                    reason=reason,
                    now=settings.now(),
                    args_hash=args_hash,
                )
            else:
                op = await reject_operation(
                    ledger, operation_id, approver=who.approver, reason=reason, now=settings.now()
                )
        except ApprovalRefused as exc:
            logger.warning(
                "console: {} could not {} {}: {}", who.approver.name, decision, operation_id, exc
            )
            flash(request, "error", f"Not {verb}: {exc}")
        except PipecatActionsError as exc:
            flash(request, "error", f"Not {verb}: {exc}")
        else:
            logger.info("console: {} {} {}", who.approver.name, verb, operation_id)
            flash(request, "ok", f"{printable(op.tool)} {op.operation_id} {verb}.")
        return RedirectResponse("/", status_code=303)

    @app.post("/approvals/{operation_id}/approve")
    async def approve(
        request: Request,
        operation_id: str,
        reason: str = Form(""),
        args_hash: str = Form(""),
        csrf: str = Form(""),
    ) -> Response:
        return await decide(request, operation_id, "approve", reason, args_hash, csrf)

    @app.post("/approvals/{operation_id}/reject")
    async def reject(
        request: Request,
        operation_id: str,
        reason: str = Form(""),
        csrf: str = Form(""),
    ) -> Response:
        return await decide(request, operation_id, "reject", reason, "", csrf)

    @app.post("/operations/{operation_id}/reconcile")
    async def reconcile(request: Request, operation_id: str, csrf: str = Form("")) -> Response:
        from pipecat_actions import operator

        who = identity(request)
        try:
            check_csrf(request, who, csrf)
            if settings.app is None:
                raise ApprovalRefused("no operator app is configured (--app MODULE:ATTR)")
            loaded = await operator.load_app(settings.app)
            (row,) = await operator.reconcile(
                ledger, loaded, operation_ids=[operation_id], actor=f"console:{who.approver.name}"
            )
        except PipecatActionsError as exc:
            flash(request, "error", f"Not reconciled: {exc}")
        else:
            flash(request, "ok", f"{operation_id}: {row['before']} → {row['after']}.")
        return RedirectResponse(f"/operations/{operation_id}", status_code=303)

    return app


_FRAGMENTS = ("approvals", "conflicts", "undelivered", "unknown", "recent")


def _one_header(request: Request, name: str | None) -> str:
    """The one value of a trusted header; sent several times, it names nobody for sure."""
    if name is None:
        return ""
    values = request.headers.getlist(name)
    if len(values) > 1:
        raise _SignInNeeded(f"{name} was sent {len(values)} times; it must name one operator")
    return values[0] if values else ""


def _trouble(request: Request, text: str) -> Response:
    """What a page says when it cannot be shown: a line, never a traceback."""
    if request.url.path.startswith(("/fragments", "/events")):
        return Response(status_code=503)
    return HTMLResponse(
        f"<!doctype html><title>Console: not available</title><p>{html.escape(text)}</p>"
        '<p><a href="/">Try again</a></p>',
        status_code=503,
    )
