"""Approving and rejecting operations that wait for a person, from any process.

The runtime that admitted an operation may be another process (the bot) than the one deciding
on it (the console, ``pipecat-actions approvals approve``). A decision is therefore a ledger
transition, AWAITING_APPROVAL → ADMITTED or REJECTED, and the same rules hold wherever it is
made, because they are checked here:

* **An approver decides in their tenants only.** An `Approver` belongs to ``tenants`` (the
  ledger's ``tenant`` of the operations they may decide on), or to every tenant when that set
  holds `ALL_TENANTS` (``"*"``). One who belongs to no tenant decides on nothing: a name alone
  is never global. Tenants compare exactly (``Acme`` and ``acme`` are two tenants in the
  ledger, whose idempotency keys are apart).
* **Who may decide is policy.** When the runtime asks for an approval it records, in the
  operation's creation event, who may decide: the tool's ``confirmation.approvers`` (names) and
  ``confirmation.approver_roles`` at that moment (`ApprovalRule`), with what the approver is
  shown (the tool's description, its ``confirmation.summary`` template). A decision by anyone
  else is refused. An operation asked for by a version that recorded no rule cannot be decided
  on: it expires.
* **The requester never decides on their own request** (the operation's principal), whatever
  the rule lists; names are compared as people read them (`same_person`).
* **A decision has a reason**, recorded with it.
* **What is approved is the arguments the approver saw**: their hash must equal the one the
  operation holds.
* **An expired request cannot be decided on**: the window is the request's deadline as the
  ledger holds it, read against the decider's clock at the decision, whatever another process
  did or did not write meanwhile. An approval or a rejection that comes after it closed is
  refused and moves the request to EXPIRED (what really ended it) there and then.
* Names and roles are compared without regard to case.

A refused decision on a waiting operation is audited on it (an annotation naming who tried,
how they were known and why it was refused); its status does not change.

Who the approver *is* is established by the caller: the console signs operators in (a hashed
credentials file, or trusted headers from a reverse proxy), the CLI checks the credentials
file, and an application calling `ActionRuntime.approve` vouches for the `Approver` it passes.
The owning runtime notices an approved operation on its next heartbeat and runs it.
"""

from __future__ import annotations

__all__ = [
    "ALL_TENANTS",
    "APPROVAL_RULE",
    "DECISION_REFUSED",
    "ApprovalRefused",
    "ApprovalRule",
    "Approver",
    "approval_rule",
    "approve_operation",
    "check_decision",
    "may_decide",
    "reject_operation",
    "same_person",
]

from pipecat_actions._people import same_person
from pipecat_actions.approvals._decide import approve_operation, reject_operation
from pipecat_actions.approvals._rule import (
    ALL_TENANTS,
    APPROVAL_RULE,
    DECISION_REFUSED,
    ApprovalRefused,
    ApprovalRule,
    Approver,
    approval_rule,
    check_decision,
    may_decide,
)
