"""A recovered compensation is found through its link to the original, never by name (B11).

The compensation's tool is stored as ``<tool>.compensate`` cut to 64 characters. Recovery used to
find its action again by that suffix: with a 55-character tool name the suffix was cut off,
recovery logged "unknown tool", and the compensation stayed RUNNING, its lease renewed forever.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pipecat_actions.actions import ActionContext, action
from pipecat_actions.clock import ManualClock
from tests.runtime._execution_support import S as Status
from tests.runtime._execution_support import (
    booking,
    eventually,
    guarded,
    new_session,
    reaches,
    running,
)

LONG = "book_a_table_at_the_restaurant_the_caller_asked_for_now"
assert len(LONG) == 55
POLICY = f"""
    version: 1
    tools:
      {LONG}:
        kind: mutation
        deadline_secs: 30
"""
LEASE_SECS = 30.0


class Restaurant:
    """Bookings in a dict; the undo hangs in the first process until it is killed."""

    def __init__(self) -> None:
        self.booked: dict[str, dict[str, Any]] = {}
        self.undone: list[str] = []
        self.undo_hangs = True
        self.undo_started = asyncio.Event()

    def action(self) -> Any:
        async def book(
            ctx: ActionContext, restaurant_id: str, date: str, time: str, party_size: int
        ) -> dict[str, Any]:
            self.booked[ctx.idempotency_key] = {"time": time}
            return {"booking_id": ctx.idempotency_key[-6:]}

        async def undo(ctx: ActionContext) -> dict[str, Any]:
            self.undo_started.set()
            if self.undo_hangs:
                await asyncio.Event().wait()
            assert ctx.operation is not None
            self.undone.append(ctx.operation.operation_id)
            return {"cancelled": True}

        return action(name=LONG, description="Book a table.", compensate=undo)(book)


async def test_a_compensation_of_a_long_named_tool_cut_off_by_its_owner_is_recovered(
    ledger_url: str, clock: ManualClock
) -> None:
    restaurant = Restaurant()
    async with running(
        POLICY, [restaurant.action()], ledger_url=ledger_url, clock=clock, lease_secs=LEASE_SECS
    ) as first:
        told = await first.propose(LONG, booking(), new_session())
        original = str(told["operation_id"])
        assert told["status"] == "committed"
        reversing = asyncio.ensure_future(
            first.compensate(original, actor="ops", reason="the guest called to cancel")
        )
        await guarded(restaurant.undo_started.wait(), what="the undo to start")
        [compensation] = [op for op in await first.ledger.list() if op.compensates == original]
        assert compensation.status is Status.RUNNING
        assert not compensation.tool.endswith(".compensate")  # cut to 64 characters
        reversing.cancel()
    # The first process is gone mid-undo; its lease runs out.
    clock.advance(LEASE_SECS + 1)
    restaurant.undo_hangs = False
    async with running(
        POLICY, [restaurant.action()], ledger_url=ledger_url, clock=clock, lease_secs=LEASE_SECS
    ) as second:
        # Maybe sent and no reconcile hook: UNKNOWN and escalated, with its original.
        recovered = await reaches(second, compensation.operation_id, Status.UNKNOWN)

        async def both_escalated() -> bool:
            ops = [await second.ledger.get(i) for i in (compensation.operation_id, original)]
            return all(op.escalated_at is not None for op in ops)

        await eventually(both_escalated, what="the compensation and its original to be escalated")
        assert recovered.lease_owner == second.owner
        assert (await second.ledger.get(original)).status is Status.COMPENSATING
