"""How the console signs operators in and what it shows: `ConsoleSettings`."""

from __future__ import annotations

__all__ = ["ConsoleSettings"]

import secrets
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field

from pipecat_actions._printable import printable
from pipecat_actions.console.users import Credentials, UsersFileError


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
