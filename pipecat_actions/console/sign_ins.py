"""Who is signed in to the console (`SignIns`), and failed sign-ins held back (`Failures`)."""

from __future__ import annotations

__all__ = ["FAILURES_ALLOWED", "FAILURE_WINDOW_SECS", "SIGN_INS", "Failures", "SignIns"]

import hmac
import secrets
from collections.abc import Callable
from dataclasses import dataclass

from pipecat_actions.console.users import Credentials, Operator

SIGN_INS = 10_000
"""The most sign-ins the console holds at once; past it the oldest is signed out."""
FAILURES_ALLOWED = 5
FAILURE_WINDOW_SECS = 900.0
"""Failed sign-ins allowed for one name from one address within the window, then a pause."""


@dataclass(frozen=True, slots=True)
class _SignIn:
    name: str
    password_hash: str
    expires_at: float


class SignIns:
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
        """Sign ``operator`` in; return the new sign-in's id (for the session cookie)."""
        now = self._now()
        for sid in [sid for sid, held in self._held.items() if held.expires_at <= now]:
            del self._held[sid]
        while len(self._held) >= SIGN_INS:
            del self._held[next(iter(self._held))]
        sid = secrets.token_urlsafe(32)
        self._held[sid] = _SignIn(operator.name, operator.password_hash, now + self._lifetime_secs)
        return sid

    def find(self, sid: object, credentials: Credentials) -> Operator | None:
        """The operator signed in as ``sid``, if that sign-in still holds (else it ends)."""
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
        """Sign ``sid`` out."""
        if isinstance(sid, str):
            self._held.pop(sid, None)


class Failures:
    """Failed sign-ins per name and client address: past a few, that pair waits a while."""

    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now
        self._seen: dict[tuple[str, str], list[float]] = {}

    def _recent(self, key: tuple[str, str]) -> list[float]:
        since = self._now() - FAILURE_WINDOW_SECS
        recent = [at for at in self._seen.get(key, ()) if at > since]
        if recent:
            self._seen[key] = recent
        else:
            self._seen.pop(key, None)
        return recent

    def wait_secs(self, key: tuple[str, str]) -> float:
        """How long ``key`` must wait before trying again (0: it may try now)."""
        recent = self._recent(key)
        if len(recent) < FAILURES_ALLOWED:
            return 0.0
        return recent[-FAILURES_ALLOWED] + FAILURE_WINDOW_SECS - self._now()

    def failed(self, key: tuple[str, str]) -> None:
        """Count an attempt against ``key`` (before it is checked: attempts made at once count)."""
        if len(self._seen) >= SIGN_INS and key not in self._seen:
            for old in list(self._seen):
                self._recent(old)  # forget what has aged out
            if len(self._seen) >= SIGN_INS:
                # The pair with the fewest recent failures goes: flooding the table with
                # names tried once never clears the record of the name being guessed.
                del self._seen[min(self._seen, key=lambda k: len(self._seen[k]))]
        self._seen.setdefault(key, []).append(self._now())

    def forget(self, key: tuple[str, str]) -> None:
        """Forget the failures of ``key`` (it signed in)."""
        self._seen.pop(key, None)
