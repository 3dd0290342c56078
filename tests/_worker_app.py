"""An application for ``pipecat-actions worker --app tests._worker_app:app`` in tests.

Its system of record is `BOOKED` (idempotency key → result), shared by the "bot" runtime a test
kills and the worker that takes over, as a real database would be.
"""

from __future__ import annotations

from typing import Any

from pipecat_actions import ActionContext, Reconciliation, action
from pipecat_actions.admission.authorization import AllowAll
from pipecat_actions.operator import OperatorApp
from pipecat_actions.policy import load_policy_text

POLICY_TEXT = """
version: 1
tools:
  book_table:
    kind: mutation
    deadline_secs: 600
  book_later:
    kind: mutation
    admit_when: turn_confirmed
    deadline_secs: 600
  refund:
    kind: mutation
    confirmation: {mode: approval, approvers: [ops], expires_after_secs: 300}
    deadline_secs: 600
"""
POLICY = load_policy_text(POLICY_TEXT)
BOOKED: dict[str, Any] = {}
SENT: list[str] = []


async def find_by_key(ctx: ActionContext) -> Reconciliation:
    found = BOOKED.get(ctx.idempotency_key)
    return Reconciliation.committed(found) if found else Reconciliation.not_found()


async def _book(ctx: ActionContext, time: str) -> dict[str, Any]:
    SENT.append(ctx.operation_id)
    BOOKED[ctx.idempotency_key] = {"booking_id": f"bk_{len(BOOKED) + 1}", "time": time}
    return BOOKED[ctx.idempotency_key]


@action(reconcile=find_by_key)
async def book_table(ctx: ActionContext, time: str) -> dict[str, Any]:
    """Book a table."""
    return await _book(ctx, time)


@action(reconcile=find_by_key)
async def book_later(ctx: ActionContext, time: str) -> dict[str, Any]:
    """Book a table once the user's turn ends."""
    return await _book(ctx, time)


@action(reconcile=find_by_key)
async def refund(ctx: ActionContext, amount_cents: int) -> dict[str, Any]:
    """Refund, once a person approves."""
    SENT.append(ctx.operation_id)
    BOOKED[ctx.idempotency_key] = {"refunded_cents": amount_cents}
    return BOOKED[ctx.idempotency_key]


ACTIONS = [book_table, book_later, refund]


def app() -> OperatorApp:
    return OperatorApp(policy=POLICY, actions=ACTIONS, authorizer=AllowAll())


def app_without_authorizer() -> OperatorApp:
    return OperatorApp(policy=POLICY, actions=ACTIONS)


def app_without_bookings() -> OperatorApp:
    """The application of a process that does not run ``book_table`` (another service does)."""
    return OperatorApp(
        policy=POLICY, actions=[book_later, refund], authorizer=AllowAll(), routed=["book_table"]
    )
