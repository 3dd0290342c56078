"""What one signed-in operator sees: the operations of their tenants, and what they may decide.

An operator belongs to tenants (or to every tenant, ``*``), as their sign-in says
(`pipecat_actions.approvals.Approver`). The console shows them the operations of those
tenants only, in every list and on every page (another tenant's operation is "not found", as
one that does not exist), and of the requests waiting for approval only those they may decide
on: the tenant's, and the policy's rule names them or a role of theirs. What they are not
shown they cannot decide on either: every decision is checked again by
`pipecat_actions.approvals`, whatever form it came from.
"""

from __future__ import annotations

__all__ = ["LISTS", "PAGE", "Rules", "Scope", "all_lists"]

import asyncio
import builtins
import dataclasses
from collections.abc import Mapping
from typing import Any

from pipecat_actions.approvals import ApprovalRule, Approver, approval_rule, may_decide
from pipecat_actions.console.views import OperationView, operation_view
from pipecat_actions.ledger import Ledger, Operation, OperationFilter
from pipecat_actions.ledger.sealing import Sealer
from pipecat_actions.status import ActionStatus

S = ActionStatus

PAGE = 100
"""The most rows a list on a page shows (the CLI lists them all)."""
_WAITING_READ = 1000
"""The most waiting requests read to find those an operator may decide (expiring first)."""
_RULES_KEPT = 10_000


LISTS = {
    "conflicts": OperationFilter(conflicted=True, limit=PAGE + 1),
    "unknown": OperationFilter(status=[S.UNKNOWN], limit=PAGE + 1),
    "undelivered": OperationFilter(status=[S.COMMITTED], undelivered=True, limit=PAGE + 1),
    "recent": OperationFilter(limit=30, newest_first=True),
}
"""The lists of operations the front page shows besides the approvals, each a page and one
more row (which says more are not shown). ``conflicts``: what the system of record reported
committed while the ledger held it as failed (see ``Executor.correct``); ``undelivered``:
committed, owed to someone and never told (reads are owed to nobody)."""


class Rules:
    """The approval rule of each operation, read once: it is recorded when it is asked for.

    Args:
        ledger: Where the rules are recorded.
    """

    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger
        self._known: dict[str, ApprovalRule | None] = {}

    async def get(self, operation_id: str) -> ApprovalRule | None:
        """The rule recorded with ``operation_id`` (None: it records none)."""
        if operation_id in self._known:
            return self._known[operation_id]
        rule = await approval_rule(self._ledger, operation_id)
        if len(self._known) >= _RULES_KEPT:
            del self._known[next(iter(self._known))]
        self._known[operation_id] = rule
        return rule


async def all_lists(ledger: Ledger) -> dict[str, list[Operation]]:
    """Every list the pages show, whoever reads them: what a change to any of them is seen by."""
    waiting, *shown = await asyncio.gather(
        ledger.list(OperationFilter(status=[S.AWAITING_APPROVAL], limit=_WAITING_READ)),
        *(ledger.list(wanted) for wanted in LISTS.values()),
    )
    return {"approvals": waiting, **dict(zip(LISTS, shown, strict=True))}


class Scope:
    """The ledger as one operator may see it.

    Args:
        ledger: The ledger.
        approver: The signed-in operator.
        rules: The console's `Rules`.
    """

    def __init__(self, ledger: Ledger, approver: Approver, rules: Rules) -> None:
        self._ledger = ledger
        self.approver = approver
        self._rules = rules

    def sees(self, op: Operation) -> bool:
        """Whether ``op`` is of one of the operator's tenants."""
        return bool(self.approver.tenants) and self.approver.decides_in(op.tenant)

    async def list(self, filters: OperationFilter) -> builtins.list[Operation]:
        """The operations ``filters`` matches in the operator's tenants, in the ledger's order."""
        who = self.approver
        if not who.tenants:
            return []
        if who.every_tenant:
            return await self._ledger.list(filters)
        found = await asyncio.gather(
            *(
                self._ledger.list(dataclasses.replace(filters, tenant=tenant))
                for tenant in sorted(who.tenants)
            )
        )
        merged = [op for ops in found for op in ops]
        merged.sort(key=lambda op: (op.created_at, op.operation_id), reverse=filters.newest_first)
        return merged[: filters.limit]

    async def decidable(self) -> builtins.list[Operation]:
        """The waiting requests the operator may decide on, expiring first."""
        waiting = await self.list(
            OperationFilter(status=[S.AWAITING_APPROVAL], limit=_WAITING_READ)
        )
        waiting.sort(key=lambda op: (op.deadline_at or float("inf"), op.created_at))
        rules = await asyncio.gather(*(self._rules.get(op.operation_id) for op in waiting))
        return [
            op
            for op, rule in zip(waiting, rules, strict=True)
            if may_decide(op, rule, self.approver)
        ]

    async def view(self, op: Operation, *, sealer: Sealer | None = None) -> OperationView:
        """``op`` as a page shows it, with its decisions (sealed values as `operation_view`)."""
        events = await self._ledger.events(op.operation_id)
        return operation_view(op, await self._rules.get(op.operation_id), events, sealer=sealer)

    async def sections(self, now: float) -> Mapping[str, Any]:
        """What the front page shows the operator."""
        decidable, *found = await asyncio.gather(
            self.decidable(), *(self.list(wanted) for wanted in LISTS.values())
        )
        lists = {"approvals": decidable, **dict(zip(LISTS, found, strict=True))}
        more = {name: len(ops) > PAGE for name, ops in lists.items()}
        shown = {name: ops[:PAGE] for name, ops in lists.items()}
        views = await asyncio.gather(*(self.view(op) for op in shown["approvals"]))
        return {
            **shown,
            "approvals": list(views),
            "more": more,
            "page": PAGE,
            "now": now,
            "no_tenant": not self.approver.tenants,
        }

    async def session(self, session_id: str) -> builtins.list[tuple[Operation, builtins.list[Any]]]:
        """The operations of ``session_id`` the operator sees, each with its audit events."""
        ops = await self.list(OperationFilter(session_id=session_id, limit=_WAITING_READ))
        trails = await asyncio.gather(*(self._ledger.events(op.operation_id) for op in ops))
        return list(zip(ops, trails, strict=True))
