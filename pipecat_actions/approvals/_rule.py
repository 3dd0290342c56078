"""Who may decide on a request, and what they are shown: `Approver`, `ApprovalRule`."""

from __future__ import annotations

__all__ = [
    "ALL_TENANTS",
    "APPROVAL_RULE",
    "DECISION_REFUSED",
    "ApprovalRefused",
    "ApprovalRule",
    "Approver",
    "approval_rule",
    "check_decision",
    "may_decide",
]

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from pipecat_actions._people import same_person, shows_something
from pipecat_actions.errors import ApprovalRefused
from pipecat_actions.ledger import Ledger, Operation
from pipecat_actions.ledger.records import EventKind
from pipecat_actions.policy.fields import check_approver_name
from pipecat_actions.status import ActionStatus

S = ActionStatus

APPROVAL_RULE = "approval"
"""Creation-event detail key: the `ApprovalRule` of an operation that waits for approval."""

DECISION_REFUSED = "decision_refused"
"""Annotation detail key: a decision on the waiting operation was refused (approve or reject)."""

ALL_TENANTS = "*"
"""In an approver's ``tenants``: they decide in every tenant."""


def _names(value: Iterable[str] | str | None) -> frozenset[str]:
    if value is None:
        return frozenset()
    if isinstance(value, str):
        return frozenset({value})  # one tenant or role, never its letters
    return frozenset(value)


@dataclass(frozen=True, slots=True)
class Approver:
    """Who decides on a request, as their sign-in established it.

    Attributes:
        name: The name they signed in with (see `check_approver_name`).
        roles: The roles their sign-in gave them.
        tenants: The tenants whose operations they may decide on; `ALL_TENANTS` (``"*"``)
            among them for every tenant. Empty (the default): none, so every decision of
            theirs is refused until their sign-in says which.
        via: How their identity was established, recorded with the decision: the
            application vouching for it, the console's credentials file or proxy header,
            the CLI's credentials file (and which).
    """

    name: str
    roles: frozenset[str] = field(default_factory=frozenset)
    tenants: frozenset[str] = field(default_factory=frozenset)
    via: str = "application"

    def __post_init__(self) -> None:
        # A set, a list or one name are all taken; a plain string is one name, not letters.
        object.__setattr__(self, "roles", _names(self.roles))
        object.__setattr__(self, "tenants", _names(self.tenants))

    @classmethod
    def of(cls, who: Approver | str) -> Approver:
        """Return ``who`` as an `Approver` (a plain name has no roles and no tenants).

        Raises:
            ApprovalRefused: The name is blank or not an approver name.
        """
        approver = who if isinstance(who, Approver) else cls(name=who)
        if not isinstance(approver.name, str) or not approver.name.strip():
            raise ApprovalRefused("a decision needs the approver's name; none was given")
        try:
            check_approver_name(approver.name)
        except ValueError as exc:
            raise ApprovalRefused(str(exc)) from None
        return approver

    @property
    def every_tenant(self) -> bool:
        """Whether they decide in every tenant (`ALL_TENANTS`)."""
        return ALL_TENANTS in self.tenants

    def decides_in(self, tenant: str) -> bool:
        """Whether they may decide on an operation of ``tenant`` (compared exactly)."""
        return self.every_tenant or tenant in self.tenants

    def describe_tenants(self) -> str:
        """Their tenants, in words: ``every tenant``, ``tenant acme``, ``tenants a, b``."""
        if self.every_tenant:
            return "every tenant"
        if not self.tenants:
            return "no tenant"
        listed = ", ".join(sorted(self.tenants))
        return f"tenant {listed}" if len(self.tenants) == 1 else f"tenants {listed}"


def _no_tenant_fix(who: Approver) -> str:
    """How ``who`` is given tenants, for the way they signed in."""
    if who.via.startswith("console: proxy"):
        return (
            "the proxy in front of the console names an operator's tenants in the header "
            "given by --tenants-header ('*' for every tenant)"
        )
    if "credentials file" in who.via:
        return (
            f"give them tenants in the credentials file: `pipecat-actions users tenants "
            f"{who.name} --tenant TENANT` (or --all-tenants)"
        )
    return (
        f"pass Approver({who.name!r}, roles, tenants={{'TENANT'}}), or tenants={{'*'}} for "
        "every tenant"
    )


@dataclass(frozen=True, slots=True)
class ApprovalRule:
    """Who may decide on one request, and what they are shown, recorded when it was asked for.

    Attributes:
        approvers: Names that may decide.
        roles: Roles whose members may decide.
        risk: The tool's risk when it was asked for (shown to the approver).
        description: What the tool does, in plain words: the policy's ``description``, else
            the action's own (its docstring's summary).
        summary: The policy's ``confirmation.summary`` template (see
            `pipecat_actions.policy.summary`), filled in where it is shown.
    """

    approvers: tuple[str, ...] = ()
    roles: tuple[str, ...] = ()
    risk: str | None = None
    description: str | None = None
    summary: str | None = None

    def to_detail(self) -> dict[str, Any]:
        """Return the rule as the creation event's detail records it."""
        detail: dict[str, Any] = {
            "approvers": list(self.approvers),
            "roles": list(self.roles),
            "risk": self.risk,
        }
        for key in ("description", "summary"):
            if getattr(self, key) is not None:
                detail[key] = getattr(self, key)
        return detail

    @classmethod
    def from_detail(cls, detail: Mapping[str, Any] | None) -> ApprovalRule | None:
        """Read the rule back from a creation event's ``detail`` (None if it records none)."""
        if not isinstance(detail, Mapping):
            return None  # a creation event that records nothing: no rule
        recorded = detail.get(APPROVAL_RULE)
        if not isinstance(recorded, Mapping):
            return None
        names = recorded.get("approvers") or []
        roles = recorded.get("roles") or []
        texts = {
            key: str(recorded[key]) if recorded.get(key) is not None else None
            for key in ("risk", "description", "summary")
        }
        return cls(
            approvers=tuple(str(n) for n in names),
            roles=tuple(str(r) for r in roles),
            risk=texts["risk"],
            description=texts["description"],
            summary=texts["summary"],
        )

    def allows(self, approver: Approver) -> bool:
        """Whether ``approver`` is one of the rule's names or has one of its roles."""
        name = approver.name.casefold()
        return any(name == n.casefold() for n in self.approvers) or bool(self.roles_held(approver))

    def roles_held(self, approver: Approver) -> list[str]:
        """The rule's roles ``approver`` holds (compared without regard to case), sorted."""
        held = {role.casefold() for role in approver.roles}
        return sorted(role for role in self.roles if role.casefold() in held)

    def describe(self) -> str:
        """Who may decide, in words: ``rosa, sam or role manager``."""
        who = [*self.approvers, *(f"role {r}" for r in self.roles)]
        if len(who) <= 1:
            return who[0] if who else "nobody"
        return f"{', '.join(who[:-1])} or {who[-1]}"


async def approval_rule(ledger: Ledger, operation_id: str) -> ApprovalRule | None:
    """Return the `ApprovalRule` recorded when ``operation_id`` was asked for, or None."""
    for event in await ledger.events(operation_id):
        if event.kind is EventKind.CREATED and event.to_status is S.AWAITING_APPROVAL:
            return ApprovalRule.from_detail(event.detail)
    return None


def check_tenant(op: Operation, who: Approver, decision: str) -> None:
    """Refuse ``who`` if they belong to no tenant, or not to ``op``'s.

    Raises:
        ApprovalRefused: Naming the tenant, theirs, or how to give them some.
    """
    if not who.tenants:
        raise ApprovalRefused(
            f"{who.name} belongs to no tenant, so may {decision} nothing (an approver is never "
            f"global by default): {_no_tenant_fix(who)}"
        )
    if not who.decides_in(op.tenant):
        raise ApprovalRefused(
            f"{who.name} may not {decision} operation {op.operation_id}: it belongs to tenant "
            f"{op.tenant!r}, and {who.name} decides in {who.describe_tenants()} only"
        )


def check_decision(
    op: Operation,
    rule: ApprovalRule | None,
    approver: Approver | str,
    reason: str,
    *,
    decision: str = "approve",
) -> Approver:
    """Check that ``approver`` may ``decision`` (approve or reject) ``op``, with ``reason``.

    Returns:
        The approver, checked.

    Raises:
        ApprovalRefused: Not waiting for approval, a blank or malformed approver, one outside
            the operation's tenant (or in no tenant), the requester deciding on their own
            request, an approver the rule does not name, no rule recorded, or no reason.
    """
    if op.status is not S.AWAITING_APPROVAL:
        raise ApprovalRefused(f"operation {op.operation_id} is {op.status}, not awaiting approval")
    who = Approver.of(approver)
    check_tenant(op, who, decision)
    if same_person(who.name, op.principal):
        raise ApprovalRefused(
            f"{who.name} asked for operation {op.operation_id}: a requester never decides on "
            "their own request; another approver must"
        )
    if rule is None:
        raise ApprovalRefused(
            f"operation {op.operation_id} records nobody who may approve it (it was asked for "
            "before approvers were recorded): let it expire, and ask again"
        )
    if not rule.allows(who):
        raise ApprovalRefused(
            f"{who.name} may not {decision} {op.tool}: its policy lets {rule.describe()} decide"
        )
    if not isinstance(reason, str) or not shows_something(reason):
        raise ApprovalRefused(f"a decision needs a reason; none was given to {decision} it")
    return who


def may_decide(op: Operation, rule: ApprovalRule | None, approver: Approver) -> bool:
    """Whether ``approver`` could decide on ``op`` (with a reason): what a list of theirs shows.

    The requester's own request counts as one they may see (they are told why they may not
    decide it when they try).
    """
    if op.status is not S.AWAITING_APPROVAL or rule is None:
        return False
    return bool(approver.tenants) and approver.decides_in(op.tenant) and rule.allows(approver)
