"""Approving and rejecting operations that wait for a person, from any process.

The runtime that admitted an operation may be another process (the bot) than the one deciding
on it (the console, ``pipecat-actions approvals approve``). A decision is therefore a ledger
transition, AWAITING_APPROVAL → ADMITTED or REJECTED, and the same rules hold wherever it is
made, because they are checked here:

* **Who may decide is policy.** When the runtime asks for an approval it records, in the
  operation's creation event, who may decide: the tool's ``confirmation.approvers`` (names) and
  ``confirmation.approver_roles`` at that moment (`ApprovalRule`). A decision by anyone else is
  refused. An operation asked for by a version that recorded no rule cannot be decided on: it
  expires.
* **The requester never decides on their own request** (the operation's principal), whatever
  the rule lists; names are compared without regard to case.
* **A decision has a reason**, recorded with it.
* **What is approved is the arguments the approver saw**: their hash must equal the one the
  operation holds.
* **An expired request cannot be decided on**: an approval or a rejection that comes after
  the window closed is refused and moves it to EXPIRED (what really ended it).
* Names and roles are compared without regard to case.

Who the approver *is* is established by the caller: the console signs operators in (a hashed
credentials file, or a trusted header from a reverse proxy), the CLI checks the credentials
file, and an application calling `ActionRuntime.approve` vouches for the `Approver` it passes.
The owning runtime notices an approved operation on its next heartbeat and runs it.
"""

from __future__ import annotations

__all__ = [
    "APPROVAL_RULE",
    "ApprovalRefused",
    "ApprovalRule",
    "Approver",
    "approval_rule",
    "approve_operation",
    "check_decision",
    "reject_operation",
    "same_person",
]

import contextlib
import unicodedata
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pipecat_actions.errors import PipecatActionsError, TransitionRefused
from pipecat_actions.ledger import Ledger, Operation
from pipecat_actions.ledger.records import EventKind
from pipecat_actions.policy.fields import check_approver_name
from pipecat_actions.status import ActionStatus

S = ActionStatus

APPROVAL_RULE = "approval"
"""Creation-event detail key: the `ApprovalRule` of an operation that waits for approval."""


class ApprovalRefused(PipecatActionsError):
    """A decision could not be applied: wrong status, arguments, approver or reason; expired."""


@dataclass(frozen=True, slots=True)
class Approver:
    """Who decides on a request, as their sign-in established it.

    Attributes:
        name: The name they signed in with (see `check_approver_name`).
        roles: The roles their sign-in gave them.
        via: How their identity was established, recorded with the decision: the
            application vouching for it, the console's credentials file or proxy header,
            the CLI's credentials file (and which).
    """

    name: str
    roles: frozenset[str] = field(default_factory=frozenset)
    via: str = "application"

    @classmethod
    def of(cls, who: Approver | str) -> Approver:
        """Return ``who`` as an `Approver` (a plain name has no roles).

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


@dataclass(frozen=True, slots=True)
class ApprovalRule:
    """Who may decide on one request, recorded when it was asked for.

    Attributes:
        approvers: Names that may decide.
        roles: Roles whose members may decide.
        risk: The tool's risk when it was asked for (shown to the approver).
    """

    approvers: tuple[str, ...] = ()
    roles: tuple[str, ...] = ()
    risk: str | None = None

    def to_detail(self) -> dict[str, Any]:
        """Return the rule as the creation event's detail records it."""
        return {"approvers": list(self.approvers), "roles": list(self.roles), "risk": self.risk}

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
        risk = recorded.get("risk")
        return cls(
            approvers=tuple(str(n) for n in names),
            roles=tuple(str(r) for r in roles),
            risk=str(risk) if risk is not None else None,
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
        ApprovalRefused: Not waiting for approval, a blank or malformed approver, the
            requester deciding on their own request, an approver the rule does not name, no
            rule recorded, or no reason.
    """
    if op.status is not S.AWAITING_APPROVAL:
        raise ApprovalRefused(f"operation {op.operation_id} is {op.status}, not awaiting approval")
    who = Approver.of(approver)
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
    if not isinstance(reason, str) or not _shows_something(reason):
        raise ApprovalRefused(f"a decision needs a reason; none was given to {decision} it")
    return who


_LOOK_ALIKES = str.maketrans(
    # Cyrillic, Greek and Latin letters drawn as a Latin letter is (after NFKC, before casefold):
    # "\u0440\u043e\u0455\u0430" reads "rosa" on any screen. Approver names are ASCII
    # (`check_approver_name`), so only a principal can hold them.
    "\u0430\u0435\u043e\u0440\u0441\u0443\u0445\u0455\u0456\u0458\u04bb\u0501\u051b\u051d\u04cf"
    "\u0410\u0412\u0415\u041a\u041c\u041d\u041e\u0420\u0421\u0422\u0425\u0423\u0405\u0406\u0408"
    "\u051a\u051c\u04c0"
    "\u03b1\u03bf\u03c1\u03bd\u03b9\u03ba\u03c5\u03c7\u03f2"
    "\u0391\u0392\u0395\u0396\u0397\u0399\u039a\u039c\u039d\u039f\u03a1\u03a4\u03a5\u03a7"
    "\u0131\u0269\u0261",
    "aeopcyxsijhdqwlABEKMHOPCTXYSIJQWIaopvikuxcABEZHIKMNOPTYXiig",
)
_INVISIBLE = frozenset({"Cf", "Mn", "Me"})
"""Format characters (zero-width, bidi marks) and combining marks left over after NFKC (one
that composes with the letter before it is part of that letter by then)."""


_BLANK = frozenset({"Cc", "Cf", "Cs", "Cn", "Zs", "Zl", "Zp", "Mn", "Me"})
_BLANK_LETTERS = frozenset("\u115f\u1160\u3164\uffa0\u2800")
"""Hangul fillers and the blank braille pattern: letters and symbols that print as nothing."""


def _shows_something(text: str) -> bool:
    """Whether ``text`` holds a character a reader sees (a reason of zero-width spaces does not)."""
    return any(
        unicodedata.category(c) not in _BLANK and c not in _BLANK_LETTERS and not c.isspace()
        for c in text
    )


def same_person(name: str, principal: str) -> bool:
    """Whether an approver's ``name`` is the request's ``principal``.

    Compared as people would read them: without regard to case, Unicode compatibility forms
    (NFKC), invisible format characters (zero-width, bidi marks), combining marks left over,
    letters of another script drawn as a Latin one (Cyrillic o, Greek alpha) or surrounding
    whitespace, so ``"rosa "``, ``"ro\u200bsa"`` or ``"r\u043esa"`` as a principal is still
    rosa. It errs towards "the same": a refusal sends the request to another approver.
    """

    def plain(text: str) -> str:
        folded = unicodedata.normalize("NFKC", text)
        visible = "".join(c for c in folded if unicodedata.category(c) not in _INVISIBLE)
        return visible.translate(_LOOK_ALIKES).strip().casefold()

    return plain(name) == plain(principal)


def _actor(who: Approver) -> str:
    return f"approver:{who.name}"


def _decided_by(who: Approver, rule: ApprovalRule, reason: str) -> dict[str, Any]:
    detail: dict[str, Any] = {"reason": reason.strip(), "approver": who.name, "via": who.via}
    held = rule.roles_held(who)
    if held and not any(who.name.casefold() == n.casefold() for n in rule.approvers):
        detail["as_role"] = held
    return detail


async def _refuse_if_expired(
    ledger: Ledger,
    op: Operation,
    approver: Approver | str,
    *,
    now: float,
    fence: int | None,
    decision: str,
) -> None:
    """Refuse a decision after ``op``'s window closed, and record that it EXPIRED.

    Checked before anything else about the decision: whoever asks, and with whatever
    arguments, a request whose window closed is EXPIRED, and the ledger says so.
    """
    # Whether the runtime's own timer or this decision finds the window closed first is a
    # race; the approver is told the same either way.
    if op.status is S.AWAITING_APPROVAL:
        if op.deadline_at is None or now < op.deadline_at:
            return
        who = Approver.of(approver)
        with contextlib.suppress(TransitionRefused):
            await ledger.transition(
                op.operation_id,
                expected=S.AWAITING_APPROVAL,
                to=S.EXPIRED,
                fence=op.fence if fence is None else fence,
                actor=_actor(who),
                detail={"reason": f"{decision} came after the approval window closed"},
                changes={"error": "approval window closed"},
            )
    elif op.status is not S.EXPIRED:
        return
    raise ApprovalRefused(
        f"operation {op.operation_id} expired before this {decision}: its window closed, "
        "so it is EXPIRED and nothing ran"
    )


async def approve_operation(
    ledger: Ledger,
    operation_id: str,
    *,
    approver: Approver | str,
    reason: str,
    now: float,
    args_hash: str,
    fence: int | None = None,
    deadline_at: float | None = None,
) -> Operation:
    """Approve a waiting operation: AWAITING_APPROVAL → ADMITTED (see the module's rules).

    Args:
        ledger: The ledger.
        operation_id: The operation.
        approver: Who approves, as their sign-in established it (recorded).
        reason: Why (required, recorded).
        now: The current time, to refuse an expired approval.
        args_hash: The hash of the arguments the approver saw; refused if they differ.
        fence: The owner's fence, when the owner approves; else the stored one.
        deadline_at: The execution deadline from now on; None lets the owner set it.

    Raises:
        ApprovalRefused: See `check_decision`; other arguments than the ones approved; or
            expired (then it is moved to EXPIRED).
    """
    op = await ledger.get(operation_id)
    await _refuse_if_expired(ledger, op, approver, now=now, fence=fence, decision="approval")
    rule = await approval_rule(ledger, operation_id) if op.status is S.AWAITING_APPROVAL else None
    who = check_decision(op, rule, approver, reason)
    assert rule is not None  # check_decision refuses an operation without one
    if not isinstance(args_hash, str) or not args_hash:
        raise ApprovalRefused(
            f"an approval names the arguments it approves: give the args hash shown with "
            f"operation {operation_id}"
        )
    given = args_hash.strip().lower()  # hex: the same hash whatever its case
    if given != op.args_hash and len(given) < len(op.args_hash) and op.args_hash.startswith(given):
        raise ApprovalRefused(
            f"an approval names the whole args hash of the arguments it approves, not the "
            f"first {len(given)} characters: give the {len(op.args_hash)} that "
            f"`approvals show {operation_id}` prints"
        )
    if given != op.args_hash:
        raise ApprovalRefused(
            f"operation {operation_id} holds other arguments than the ones approved "
            f"(args hash {op.args_hash[:12]}…, approved {args_hash[:12]}…)"
        )
    try:
        return await ledger.transition(
            operation_id,
            expected=S.AWAITING_APPROVAL,
            to=S.ADMITTED,
            fence=op.fence if fence is None else fence,
            actor=_actor(who),
            detail={**_decided_by(who, rule, reason), "args_hash": op.args_hash},
            changes={"deadline_at": deadline_at},
        )
    except TransitionRefused as exc:
        raise ApprovalRefused(f"operation {operation_id} changed meanwhile: {exc}") from exc


async def reject_operation(
    ledger: Ledger,
    operation_id: str,
    *,
    approver: Approver | str,
    reason: str,
    now: float,
    fence: int | None = None,
) -> Operation:
    """Reject a waiting operation: AWAITING_APPROVAL → REJECTED; nothing runs.

    Args:
        ledger: The ledger.
        operation_id: The operation.
        approver: Who rejects, as their sign-in established it (recorded).
        reason: Why (required, recorded).
        now: The current time: a request whose window closed is EXPIRED, not rejected.
        fence: The owner's fence, when the owner rejects; else the stored one.

    Raises:
        ApprovalRefused: See `check_decision`; or expired (then it is moved to EXPIRED).
    """
    op = await ledger.get(operation_id)
    await _refuse_if_expired(ledger, op, approver, now=now, fence=fence, decision="rejection")
    rule = await approval_rule(ledger, operation_id) if op.status is S.AWAITING_APPROVAL else None
    who = check_decision(op, rule, approver, reason, decision="reject")
    assert rule is not None
    try:
        return await ledger.transition(
            operation_id,
            expected=S.AWAITING_APPROVAL,
            to=S.REJECTED,
            fence=op.fence if fence is None else fence,
            actor=_actor(who),
            detail=_decided_by(who, rule, reason),
            changes={"error": f"rejected by {who.name}: {reason.strip()}"},
        )
    except TransitionRefused as exc:
        raise ApprovalRefused(f"operation {operation_id} changed meanwhile: {exc}") from exc
