"""What every route of the console shares, and the dependencies that hand it to them.

`Console` is the application's state (its settings, the ledger, the templates, who is signed
in), kept on ``app.state.console`` by `pipecat_actions.console.app.create_app`. A route asks
for what it needs with FastAPI's ``Depends``:

* `ConsoleDep`: the `Console`;
* `SignedIn`: the operator making the request (`Identity`), or the sign-in page
  (`SignInNeeded`, answered by the application's handler) when nobody is signed in;
* `OperatorScope`: the ledger as that operator may see it (`Scope`: their tenants only).
"""

from __future__ import annotations

__all__ = [
    "Console",
    "ConsoleDep",
    "Identity",
    "OperatorScope",
    "SignInNeeded",
    "SignedIn",
    "console",
    "operator_scope",
    "signed_in",
]

import contextlib
import hmac
import secrets
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, Request
from fastapi.responses import HTMLResponse
from fastapi.templating import Jinja2Templates
from loguru import logger

from pipecat_actions._printable import printable
from pipecat_actions.approvals import ApprovalRefused, Approver
from pipecat_actions.console.live import Changes
from pipecat_actions.console.scope import Rules, Scope
from pipecat_actions.console.settings import ConsoleSettings
from pipecat_actions.console.sign_ins import Failures, SignIns
from pipecat_actions.console.users import UsersFileError, check_tenants
from pipecat_actions.ledger import Ledger
from pipecat_actions.policy.fields import check_approver_name


@dataclass(frozen=True)
class Identity:
    """The operator making a request."""

    approver: Approver
    csrf: str


class SignInNeeded(Exception):
    """Nobody (or nobody valid) is signed in: the application answers with its sign-in."""

    def __init__(self, why: str | None = None) -> None:
        super().__init__(why)
        self.why = why


@dataclass(frozen=True)
class Console:
    """The console's state, shared by its routes.

    Attributes:
        settings: Sign-in and behaviour.
        ledger: The ledger it reads and decides in (as stored: sealed values stay sealed).
        templates: Its pages.
        rules: The approval rule of each operation, read once.
        sign_ins: Who is signed in.
        failures: Failed sign-ins, per name and address.
        changes: What the pages show, watched for live updates.
    """

    settings: ConsoleSettings
    ledger: Ledger
    templates: Jinja2Templates
    rules: Rules
    sign_ins: SignIns
    failures: Failures
    changes: Changes

    def identify(self, request: Request) -> Identity:
        """Who makes ``request``; raises `SignInNeeded` if nobody (valid) is signed in."""
        settings = self.settings
        session = request.session
        stored = session.get("csrf")
        csrf = stored if isinstance(stored, str) else secrets.token_urlsafe(24)
        session["csrf"] = csrf
        if settings.user_header is not None:
            name = _one_header(request, settings.user_header).strip()
            try:
                check_approver_name(name)
            except ValueError:
                raise SignInNeeded() from None
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
        operator = self.sign_ins.find(session.get("sign_in"), settings.users)
        if operator is None:
            session.pop("sign_in", None)
            raise SignInNeeded()
        return Identity(operator.approver("console: credentials file"), csrf)

    def check_csrf(self, request: Request, who: Identity, token: str) -> None:
        """Refuse a form whose token is not ``who``'s, or that came from another origin."""
        if not hmac.compare_digest(token.encode(), who.csrf.encode()):
            raise ApprovalRefused("the form is stale or came from elsewhere; reload the page")
        origins = request.headers.getlist("origin")
        if not origins:
            return  # not sent by every browser for same-origin forms; the token decides
        public = self.settings.public_origin
        expected = public or f"{request.url.scheme}://{request.url.netloc}"
        if len(origins) > 1 or origins[0].strip().rstrip("/").lower() != expected.lower():
            logger.warning(
                "console: a form came with Origin {!r}, not {}{}",
                printable(",".join(origins)[:200]),
                expected,
                "" if public else " (behind a proxy? set --public-origin)",
            )
            raise ApprovalRefused("the form came from another site")

    def scope(self, who: Identity) -> Scope:
        """The ledger as ``who`` may see it."""
        return Scope(self.ledger, who.approver, self.rules)

    def page(
        self,
        request: Request,
        name: str,
        who: Identity | None,
        *,
        whole: bool = True,
        status_code: int = 200,
        **values: Any,
    ) -> HTMLResponse:
        """Render the template ``name`` (a whole page shows the flash message, once)."""
        settings = self.settings
        shown = request.session.pop("flash", None) if whole else None
        return self.templates.TemplateResponse(
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

    @staticmethod
    def flash(request: Request, kind: str, text: str) -> None:
        """Show ``text`` at the top of the next whole page."""
        request.session["flash"] = {"kind": kind, "text": text}


def console(request: Request) -> Console:
    """The dependency: the `Console` of the application serving ``request``."""
    state: Console = request.app.state.console
    return state


ConsoleDep = Annotated[Console, Depends(console)]


def signed_in(request: Request, state: ConsoleDep) -> Identity:
    """The dependency: the signed-in operator (else `SignInNeeded`: the sign-in page)."""
    return state.identify(request)


SignedIn = Annotated[Identity, Depends(signed_in)]


def operator_scope(who: SignedIn, state: ConsoleDep) -> Scope:
    """The dependency: the ledger as the signed-in operator may see it (their tenants)."""
    return state.scope(who)


OperatorScope = Annotated[Scope, Depends(operator_scope)]


def _one_header(request: Request, name: str | None) -> str:
    """The one value of a trusted header; sent several times, it names nobody for sure."""
    if name is None:
        return ""
    values = request.headers.getlist(name)
    if len(values) > 1:
        raise SignInNeeded(f"{name} was sent {len(values)} times; it must name one operator")
    return values[0] if values else ""
