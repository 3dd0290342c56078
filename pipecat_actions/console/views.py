"""What the console's pages show of one operation: its summary, and its decisions in words.

An approver reads a request as a person would: what the tool does (the policy's description,
else the action's own), what exactly is being approved (the policy's ``confirmation.summary``
filled in from the arguments and the before-state), and every decision made or refused on it
with its reason, each a line of its own rather than a field of a JSON box. Everything here is
plain text: the templates escape it.
"""

from __future__ import annotations

__all__ = ["DecisionEntry", "OperationView", "decision_history", "operation_view"]

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pipecat_actions._printable import printable_json
from pipecat_actions.approvals import DECISION_REFUSED, ApprovalRule
from pipecat_actions.ledger import Operation, OperationEvent
from pipecat_actions.ledger.records import EventKind
from pipecat_actions.ledger.sealing import Sealer, holds_sealed_values, operator_view
from pipecat_actions.policy.summary import SummaryPart, render_summary
from pipecat_actions.status import ActionStatus

S = ActionStatus


@dataclass(frozen=True, slots=True)
class DecisionEntry:
    """One decision on a request, or one refused, in words.

    Attributes:
        at: When (epoch seconds).
        verdict: ``asked``, ``approved``, ``rejected``, ``expired``, ``refused`` (a decision
            that was not applied) or ``confirmed`` (a verbal yes).
        who: Who: the requester, an approver's name, the runtime.
        reason: The reason given (an approver's), or why it ended (expiry, refusal).
        via: How the approver was known (``console: credentials file``...), if recorded.
        tried: For a refused decision, what was tried (approve or reject).
    """

    at: float
    verdict: str
    who: str
    reason: str
    via: str | None = None
    tried: str | None = None


def _text(value: Any) -> str:
    return "" if value is None else str(value)


def _who(actor: str) -> str:
    return actor.removeprefix("approver:")


def decision_history(op: Operation, events: Sequence[OperationEvent]) -> list[DecisionEntry]:
    """The request and every decision on it, made or refused, oldest first."""
    entries: list[DecisionEntry] = []
    for event in events:
        detail = event.detail if isinstance(event.detail, dict) else {}
        reason = _text(detail.get("reason"))
        via = detail.get("via")
        if event.kind is EventKind.CREATED and event.to_status is S.AWAITING_APPROVAL:
            # The model's rationale, when it gave one; the admission's own words are not news.
            entries.append(DecisionEntry(event.at, "asked", op.principal, _text(op.rationale)))
        elif event.kind is EventKind.ANNOTATION and DECISION_REFUSED in detail:
            entries.append(
                DecisionEntry(
                    event.at,
                    "refused",
                    _text(detail.get("approver")) or _who(event.actor),
                    reason,
                    _text(via) or None,
                    _text(detail.get(DECISION_REFUSED)),
                )
            )
        elif event.kind is EventKind.TRANSITION and event.from_status in (
            S.AWAITING_APPROVAL,
            S.AWAITING_CONFIRMATION,
        ):
            verdict = {
                S.ADMITTED: "approved" if event.from_status is S.AWAITING_APPROVAL else "confirmed",
                S.REJECTED: "rejected",
                S.EXPIRED: "expired",
            }.get(event.to_status, event.to_status.value.lower())
            who = _text(detail.get("approver")) or _who(event.actor)
            roles = detail.get("as_role")
            if isinstance(roles, list) and roles:
                who = f"{who} (as {', '.join(str(r) for r in roles)})"
            entries.append(DecisionEntry(event.at, verdict, who, reason, _text(via) or None))
    return entries


@dataclass(frozen=True)
class OperationView:
    """An operation as a page shows it.

    Attributes:
        op: The operation.
        rule: Who may decide and what they are shown, if it waited for approval.
        args: The arguments as indented JSON.
        before_state: The before-state as indented JSON, if a snapshot was taken.
        result: The result as indented JSON, if any.
        description: What the tool does, in plain words, if recorded.
        summary: The summary's parts, if the policy had one.
        history: The request and its decisions.
        sealed: It holds sealed (``sensitive``) values: shown masked unless revealed.
        revealed: Its sealed values are shown (an operator with the reveal role asked).
    """

    op: Operation
    rule: ApprovalRule | None
    args: str
    before_state: str | None
    result: str | None
    description: str | None
    summary: tuple[SummaryPart, ...] | None
    history: list[DecisionEntry]
    sealed: bool = False
    revealed: bool = False


def operation_view(
    op: Operation,
    rule: ApprovalRule | None,
    events: Sequence[OperationEvent] = (),
    *,
    sealer: Sealer | None = None,
) -> OperationView:
    """Return ``op`` as a page shows it (``events``: its audit trail, for the history).

    Sealed values (a policy's ``sensitive`` paths) are masked, in the summary too, unless
    ``sealer`` (an operator's reveal) opens them.
    """
    args = operator_view(op, "args", sealer)
    before = operator_view(op, "before_state", sealer)
    result = operator_view(op, "result", sealer)
    summary = None
    if rule is not None and rule.summary is not None:
        summary = render_summary(rule.summary, args, before)
    return OperationView(
        op=op,
        rule=rule,
        args=printable_json(args if args is not None else {}, sort_keys=True),
        before_state=None if before is None else printable_json(before, sort_keys=True),
        result=None if result is None else printable_json(result, sort_keys=True),
        description=rule.description if rule is not None else None,
        summary=summary,
        history=decision_history(op, events),
        sealed=holds_sealed_values(op),
        revealed=sealer is not None,
    )
