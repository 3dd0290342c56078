"""Cancellation: only what the truth allows, and a cancelled handler is not a cancelled action.

A barge-in is simulated here the way Pipecat does it: the task awaiting `ActionRuntime.propose`
(the tool handler) is cancelled. The pipeline tests repeat the important cases end to end.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pipecat_actions.actions import ActionContext, action
from pipecat_actions.clock import ManualClock
from pipecat_actions.ledger.records import Operation
from pipecat_actions.testing import FakeSystemOfRecord
from tests.runtime._execution_support import (
    T0,
    Bookings,
    RecordingClock,
    annotations,
    booking,
    eventually,
    is_settled,
    new_session,
    only_operation,
    reaches,
    running,
    status_of,
    transitions,
)
from tests.runtime._execution_support import S as Status

CANCELLABLE = """
    version: 1
    tools:
      book_table:
        kind: mutation
        on_interruption: request_cancel
      book_when_settled:
        kind: mutation
        admit_when: turn_confirmed
        on_interruption: cancel_if_not_started
      book_if_not_started:
        kind: mutation
        on_interruption: cancel_if_not_started
      book_anyway:
        kind: mutation
"""


def fake(clock: ManualClock, **options: Any) -> FakeSystemOfRecord:
    sor = FakeSystemOfRecord(clock=clock, **options)
    sor.add_restaurant("r1", tables=3)
    return sor


def cancellable(bookings: Bookings) -> list:
    return [
        bookings.action(cancel=True),
        bookings.action(name="book_when_settled"),
        bookings.action(name="book_if_not_started"),
        bookings.action(name="book_anyway"),
    ]


async def barge_in(call: asyncio.Future[Any]) -> None:
    """Cancel the waiting handler, as Pipecat does on an interruption."""
    call.cancel()
    await asyncio.gather(call, return_exceptions=True)


async def test_a_barge_in_during_admission_still_settles_the_admitted_operation(
    ledger_url: str, clock: ManualClock
) -> None:
    # The handler is cancelled while the ledger insert is in flight: the insert commits (it is
    # shielded), so the operation exists as RUNNING. With on_interruption continue it must
    # run to an outcome (or be settled some other way), never sit RUNNING with nothing running.
    sor = fake(clock)
    bookings = Bookings(sor)
    handler: dict[str, asyncio.Future[Any]] = {}

    async def cancel_the_handler_next(ctx: ActionContext) -> dict[str, Any]:
        asyncio.get_running_loop().call_soon(handler["call"].cancel)
        return {"slot": f"{ctx.args['date']} {ctx.args['time']}"}

    definition = action(name="book_anyway", snapshot=cancel_the_handler_next)(bookings.book)
    others = [a for a in cancellable(bookings) if a.name != "book_anyway"]
    async with running(
        CANCELLABLE, [*others, definition], ledger_url=ledger_url, clock=clock
    ) as runtime:
        handler["call"] = asyncio.ensure_future(
            runtime.propose("book_anyway", booking(), new_session())
        )
        await asyncio.gather(handler["call"], return_exceptions=True)
        assert handler["call"].cancelled()

        # The handler is gone before the shielded insert has committed: wait for its row.
        async def admitted() -> bool:
            return any(op.tool == "book_anyway" for op in await runtime.ledger.list())

        await eventually(admitted, what="the insert of the call cancelled during admission")
        op = await only_operation(runtime, "book_anyway")
        seen: list[Operation] = [op]

        async def settled() -> bool:
            seen[0] = await runtime.ledger.get(op.operation_id)
            return is_settled(seen[0])

        # Nothing else moves it (the clock stands still): if it is left RUNNING with nothing
        # running, only the hang guard ends this wait, with the state it was left in.
        await eventually(
            settled,
            what=lambda: (
                f"the admitted operation to settle; left {seen[0].status} (attempt "
                f"{seen[0].attempt}, sent_at {seen[0].sent_at}) with {sor.calls['book']} "
                "provider calls"
            ),
        )
        final = await runtime.ledger.get(op.operation_id)

    assert final.status is Status.COMMITTED, (
        f"left {final.status} (attempt {final.attempt}, sent_at {final.sent_at}) with "
        f"{sor.calls['book']} provider calls"
    )
    assert sor.side_effects["book"] == 1


async def test_cancelling_before_anything_was_sent_is_cancelled(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = fake(clock)
    async with running(
        CANCELLABLE, cancellable(Bookings(sor)), ledger_url=ledger_url, clock=clock
    ) as runtime:
        told = await runtime.propose("book_when_settled", booking(), new_session(), wait=False)
        op_id = told["operation_id"]
        assert told["status"] == "admitted"

        cancelled = await runtime.cancel(op_id, reason="the user changed their mind")
        final = await runtime.wait(op_id)
        trail = await runtime.ledger.events(op_id)

    assert cancelled.status is Status.CANCELLED
    assert final.status is Status.CANCELLED
    assert transitions(trail) == [Status.CANCELLED]
    assert trail[-1].detail == {"reason": "the user changed their mind"}
    assert sor.calls["book"] == 0


async def test_request_cancel_is_cancelled_only_once_the_provider_confirms(
    ledger_url: str,
) -> None:
    clock = RecordingClock()
    sor = fake(clock, slow_cancel_secs=2.0)
    sor.faults.set_latency(10.0)
    async with running(
        CANCELLABLE,
        cancellable(Bookings(sor)),
        ledger_url=ledger_url,
        clock=clock,
        lease_secs=3600.0,
    ) as runtime:
        call = asyncio.ensure_future(runtime.propose("book_table", booking(), new_session()))
        await eventually(
            lambda: sor.calls["book"] == 1 and 10.0 in clock.requested,
            what="the request to be sent",
        )
        await barge_in(call)
        await eventually(lambda: 2.0 in clock.requested, what="the provider to start cancelling")
        op = await only_operation(runtime)
        while_asking = await status_of(runtime, op.operation_id)

        clock.advance(2.0)
        final = await reaches(runtime, op.operation_id, Status.CANCELLED)
        trail = await runtime.ledger.events(op.operation_id)

    assert while_asking is Status.CANCEL_REQUESTED
    assert transitions(trail) == [Status.CANCEL_REQUESTED, Status.CANCELLED]
    requested, cancelled = (e for e in trail if e.kind.value == "transition")
    assert (requested.at, cancelled.at) == (T0, T0 + 2.0)
    assert cancelled.detail == {"reason": "the provider confirmed"}
    assert final.error == "the provider confirmed"
    assert sor.side_effects["book"] == 0
    assert [c.outcome for c in sor.log] in (["cancelled"], ["abandoned"])


async def test_request_cancel_that_comes_too_late_reports_committed(ledger_url: str) -> None:
    clock = RecordingClock()
    sor = fake(clock, slow_cancel_secs=2.0)
    sor.faults.set_latency(1.0)
    async with running(
        CANCELLABLE,
        cancellable(Bookings(sor)),
        ledger_url=ledger_url,
        clock=clock,
        lease_secs=3600.0,
    ) as runtime:
        call = asyncio.ensure_future(runtime.propose("book_table", booking(), new_session()))
        await eventually(
            lambda: sor.calls["book"] == 1 and 1.0 in clock.requested,
            what="the request to be sent",
        )
        await barge_in(call)
        await eventually(lambda: 2.0 in clock.requested, what="the provider to start cancelling")
        op = await only_operation(runtime)

        clock.advance(1.0)  # the provider commits while the cancel is still on its way
        committed = await reaches(runtime, op.operation_id, Status.COMMITTED)
        clock.advance(1.0)

        async def answered() -> bool:
            trail = await runtime.ledger.events(op.operation_id)
            return any("cancel_answer" in a for a in annotations(trail))

        await eventually(answered, what="the provider's answer to the cancel")
        final = await runtime.ledger.get(op.operation_id)
        trail = await runtime.ledger.events(op.operation_id)

    assert committed.result == {"booking_id": "bk_0001", "time": "21:00"}
    assert final.status is Status.COMMITTED
    assert transitions(trail) == [Status.CANCEL_REQUESTED, Status.COMMITTED]
    assert {"cancel_answer": "too_late"} in annotations(trail)
    assert sor.side_effects["book"] == 1


async def test_a_provider_that_cannot_cancel_leaves_the_outcome_to_the_effect(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = fake(clock, supports_cancel=False)
    sor.faults.set_latency(1.0)
    async with running(
        CANCELLABLE, cancellable(Bookings(sor)), ledger_url=ledger_url, clock=clock
    ) as runtime:
        call = asyncio.ensure_future(runtime.propose("book_table", booking(), new_session()))
        await eventually(lambda: sor.calls["book"] == 1, what="the request to be sent")
        await barge_in(call)
        op = await only_operation(runtime)

        async def answered() -> bool:
            trail = await runtime.ledger.events(op.operation_id)
            return any("cancel_answer" in a for a in annotations(trail))

        await eventually(answered, what="the cancel hook's answer")
        asking = await status_of(runtime, op.operation_id)
        clock.advance(1.0)
        final = await reaches(runtime, op.operation_id, Status.COMMITTED)
        trail = await runtime.ledger.events(op.operation_id)

    assert asking is Status.CANCEL_REQUESTED
    assert {"cancel_answer": "unknown"} in annotations(trail)
    assert final.status is Status.COMMITTED
    assert sor.calls["cancel_pending"] == 1
    assert sor.side_effects["book"] == 1


async def test_cancel_if_not_started_lets_a_request_already_sent_finish(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = fake(clock)
    sor.faults.set_latency(1.0)
    async with running(
        CANCELLABLE, cancellable(Bookings(sor)), ledger_url=ledger_url, clock=clock
    ) as runtime:
        call = asyncio.ensure_future(
            runtime.propose("book_if_not_started", booking(), new_session())
        )
        await eventually(lambda: sor.calls["book"] == 1, what="the request to be sent")
        await barge_in(call)
        op = await only_operation(runtime, "book_if_not_started")
        assert await status_of(runtime, op.operation_id) is Status.RUNNING

        clock.advance(1.0)
        final = await runtime.wait(op.operation_id)
        trail = await runtime.ledger.events(op.operation_id)

    assert final.status is Status.COMMITTED
    assert transitions(trail) == [Status.COMMITTED]
    assert sor.side_effects["book"] == 1
