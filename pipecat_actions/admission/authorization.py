"""Authorization: may the session's principal do this? The application decides.

The runtime asks an `Authorizer` before admission, before every retry and before recovery runs
an operation again, so a permission revoked meanwhile stops further executions. Identity comes
from the session (set by the application), never from ids the LLM put in the arguments: those
are data to check against the principal, e.g. "is booking b-17 alice's?".
"""

from __future__ import annotations

__all__ = [
    "AllowAll",
    "AuthorizationRequest",
    "Authorizer",
    "AuthorizerFailed",
    "Decision",
    "ask",
]

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class AuthorizationRequest:
    """What is asked: may ``principal`` run ``tool`` with ``args``?

    Attributes:
        principal: The session's authenticated principal.
        tenant: The session's tenant.
        session_id: The conversation.
        tool: The tool name.
        kind: ``read`` or ``mutation``.
        args: The validated arguments (LLM-supplied data, not identity).
        resource_key: What the call affects, from the policy's ``resource`` template.
        stage: ``admission``, ``retry``, ``recovery`` or ``compensation``.
    """

    principal: str
    tenant: str
    session_id: str
    tool: str
    kind: str
    args: Mapping[str, Any]
    resource_key: str | None
    stage: str = "admission"


@dataclass(frozen=True, slots=True)
class Decision:
    """The answer: ``allowed``, and when not, a plain-language ``reason`` for the model."""

    allowed: bool
    reason: str = ""

    @classmethod
    def allow(cls) -> Decision:
        """Allow the call."""
        return cls(True)

    @classmethod
    def deny(cls, reason: str) -> Decision:
        """Refuse the call, saying why."""
        return cls(False, reason)


@runtime_checkable
class Authorizer(Protocol):
    """Decides whether the session's principal may make a call."""

    async def authorize(self, request: AuthorizationRequest) -> Decision:
        """Return the decision for ``request``."""
        ...


class AllowAll:
    """Allows every call. For demos and tests only: say so explicitly where you use it."""

    async def authorize(self, request: AuthorizationRequest) -> Decision:
        """Return `Decision.allow`."""
        return Decision.allow()


@dataclass(frozen=True, slots=True)
class AuthorizerFailed:
    """The authorizer gave no decision: it raised, or returned something other than a `Decision`.

    Authorization fails closed: whoever asked refuses the call.

    Attributes:
        error: What went wrong, for the audit trail and the logs (never for the model).
    """

    error: str


async def ask(authorizer: Authorizer, request: AuthorizationRequest) -> Decision | AuthorizerFailed:
    """Ask ``authorizer`` about ``request``; never raise, and only a `Decision` can allow it."""
    try:
        decision = await authorizer.authorize(request)
    except Exception as exc:
        return AuthorizerFailed(f"{type(exc).__name__}: {exc}"[:500])
    if not isinstance(decision, Decision):
        return AuthorizerFailed(f"the authorizer returned {type(decision).__name__}")
    return decision
