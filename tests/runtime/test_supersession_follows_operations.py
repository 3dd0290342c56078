"""A change after the earlier outcome was told is told too: supersession follows the operations.

Observed: 21:00 is booked and told; the user changes to 21:30; 21:30 is booked; the model was
never told that 21:00 still stands or how to undo it, because the note was added only when the
earlier outcome was rendered, and it had been rendered before the change. Now whichever of the
two is told last carries the news: a newer request that commits while an earlier one of the
user still stands says so (``earlier_still_standing``), in place or told late.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pipecat_actions.clock import ManualClock
from pipecat_actions.ledger.records import OperationFilter
from pipecat_actions.testing import FakeSystemOfRecord
from tests._waiting import eventually
from tests.runtime._execution_support import Bookings, booking, new_session, reaches, running
from tests.runtime._execution_support import S as Status


def policy(compensation: str = "") -> str:
    return f"""
    version: 1
    tools:
      book_table:
        kind: mutation
        idempotency: {{key_fields: [restaurant_id, date, time, party_size]}}
        resource: "table:{{restaurant_id}}:{{date}}"
        {compensation}
      cancel_booking:
        kind: mutation
"""


def actions(bookings: Bookings) -> list[Any]:
    from pipecat_actions.actions import action

    async def cancel_booking(ctx: Any, booking_id: str) -> dict[str, Any]:
        """Cancel a booking."""
        return {"cancelled": booking_id}

    return [bookings.action(compensate=True), action(cancel_booking)]


def fake(clock: ManualClock) -> FakeSystemOfRecord:
    sor = FakeSystemOfRecord(clock=clock)
    sor.add_restaurant("r1", tables=3)
    return sor


async def test_a_newer_booking_told_after_the_earlier_one_was_told_says_the_earlier_stands(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = fake(clock)
    async with running(
        policy("compensation: {tool: cancel_booking}"),
        actions(Bookings(sor)),
        ledger_url=ledger_url,
        clock=clock,
    ) as runtime:
        session = new_session()
        session.start_user_turn()
        first = await runtime.propose("book_table", booking("21:00"), session)
        session.start_user_turn()  # "no, make it 21:30"
        second = await runtime.propose("book_table", booking("21:30"), session)

    assert first["status"] == "committed"
    assert "earlier_still_standing" not in first
    assert second["status"] == "committed"
    (standing,) = second["earlier_still_standing"]
    assert standing["operation_id"] == first["operation_id"]
    assert standing["arguments"]["time"] == "21:00"
    assert second["undo_tool"] == "cancel_booking"
    assert "still stands" in second["message"] and "cancel_booking" in second["message"]
    assert sor.side_effects["book"] == 2


async def test_an_earlier_request_already_undone_is_not_said_to_stand(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = fake(clock)
    async with running(
        policy("compensation: {tool: cancel_booking}"),
        actions(Bookings(sor)),
        ledger_url=ledger_url,
        clock=clock,
    ) as runtime:
        session = new_session()
        session.start_user_turn()
        first = await runtime.propose("book_table", booking("21:00"), session)
        await runtime.compensate(first["operation_id"], actor="user", reason="cancel it")
        session.start_user_turn()
        second = await runtime.propose("book_table", booking("21:30"), session)

    assert second["status"] == "committed"
    assert "earlier_still_standing" not in second


async def test_two_bookings_of_one_reply_do_not_stand_against_each_other(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = fake(clock)
    async with running(
        policy("compensation: {tool: cancel_booking}"),
        actions(Bookings(sor)),
        ledger_url=ledger_url,
        clock=clock,
    ) as runtime:
        session = new_session()
        session.start_user_turn()
        told = await asyncio.gather(
            runtime.propose("book_table", booking("21:00"), session),
            runtime.propose("book_table", booking("21:30", party_size=4), session),
        )

    assert all("earlier_still_standing" not in t for t in told)


async def test_a_newer_booking_told_late_says_the_earlier_stands(
    ledger_url: str, clock: ManualClock
) -> None:
    # The newer call's wait is cut (a barge-in): its outcome is told late, by the delivery
    # service, and still says that the earlier booking stands.
    from pipecat_actions.runtime.deliveries import Told

    sor = fake(clock)
    bookings = Bookings(sor)
    async with running(
        policy("compensation: {tool: cancel_booking}"),
        actions(bookings),
        ledger_url=ledger_url,
        clock=clock,
    ) as runtime:
        session = new_session()
        told: list[Told] = []

        class Outlet:
            def spawn(self, coroutine: Any) -> Any:
                return asyncio.ensure_future(coroutine)

            async def tell(self, item: Told) -> None:
                told.append(item)

            async def interrupt(self) -> None:
                return None

        delivery = runtime.deliveries.open(session, Outlet())
        delivery.start()
        session.start_user_turn()
        first = await runtime.propose("book_table", booking("21:00"), session)
        delivery.told_in_place(first["operation_id"])
        session.start_user_turn()
        sor.faults.set_latency(2.0)
        call = asyncio.ensure_future(runtime.propose("book_table", booking("21:30"), session))
        await eventually(lambda: sor.calls["book"] == 2, what="the 21:30 booking to be sent")
        call.cancel()  # the user barged in: the call is closed before its outcome
        (second,) = await runtime.ledger.list(
            OperationFilter(session_id=session.session_id, status=[Status.RUNNING])
        )
        delivery.await_outcome(second.operation_id)
        clock.advance(2.0)
        await reaches(runtime, second.operation_id, Status.COMMITTED)

        def told_committed() -> list[Told]:
            return [
                t
                for t in told
                if t.operation.operation_id == second.operation_id
                and t.content["status"] == "committed"
            ]

        await eventually(told_committed, what="the 21:30 outcome told late")
        delivery.close()

    (late,) = told_committed()
    assert late.content["status"] == "committed"
    assert [s["operation_id"] for s in late.content["earlier_still_standing"]] == [
        first["operation_id"]
    ]
    assert "still stands" in late.text
