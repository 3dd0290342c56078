"""An application for `pipecat-actions reconcile --app tests._operator_app:app` in tests.

Its system of record is `COMMITTED` (idempotency key → result), set by the test before the
command runs in the same process.
"""

from __future__ import annotations

from typing import Any

from pipecat_actions import ActionContext, Reconciliation, action
from pipecat_actions.operator import OperatorApp
from pipecat_actions.policy import load_policy_text

POLICY = load_policy_text(
    "version: 1\ntools:\n  book_table:\n    kind: mutation\n  charge:\n    kind: mutation\n"
)
COMMITTED: dict[str, Any] = {}
PENDING: set[str] = set()
ASKED: list[str] = []


async def find_by_key(ctx: ActionContext) -> Reconciliation:
    ASKED.append(ctx.operation_id)
    if ctx.idempotency_key in PENDING:
        return Reconciliation.pending()
    found = COMMITTED.get(ctx.idempotency_key)
    return Reconciliation.committed(found) if found else Reconciliation.not_found()


@action(reconcile=find_by_key)
async def book_table(ctx: ActionContext, time: str) -> dict[str, Any]:
    """Book a table (never run by the operator: it only reconciles)."""
    raise AssertionError("the operator must not run effects")


@action
async def charge(ctx: ActionContext, amount_cents: int) -> dict[str, Any]:
    """Charge, with no reconcile hook."""
    raise AssertionError("the operator must not run effects")


def app() -> OperatorApp:
    return OperatorApp(policy=POLICY, actions=[book_table, charge])


async def async_app() -> OperatorApp:
    return app()


NOT_AN_APP = 42
