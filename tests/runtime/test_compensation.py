"""Compensation: reversing a committed operation is a new, linked operation.

The original goes COMMITTED → COMPENSATING → COMPENSATED (or back to COMMITTED when the
compensation fails for good); the compensate hook gets the before-state the snapshot hook
stored; asking again joins the same compensation.
"""

from __future__ import annotations

import asyncio

import pytest

from pipecat_actions.admission.authorization import AllowAll
from pipecat_actions.clock import ManualClock
from pipecat_actions.errors import UnexpectedStatus
from pipecat_actions.ledger import ForwardingLedger, Ledger, Operation, SqlLedger
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.status import ActionStatus
from pipecat_actions.testing import FakeSystemOfRecord
from tests.runtime._execution_support import (
    Bookings,
    booking,
    eventually,
    gather_all,
    guarded,
    new_session,
    policy,
    running,
    transitions,
)
from tests.runtime._execution_support import S as Status

REVERSIBLE = """
    version: 1
    tools:
      book_table:
        kind: mutation
        deadline_secs: 30
"""


def fake(clock: ManualClock) -> FakeSystemOfRecord:
    sor = FakeSystemOfRecord(clock=clock)
    sor.add_restaurant("r1", tables=3)
    return sor


class KeyLookups(ForwardingLedger):
    """The real ledger, recording what each look-up of a compensation key answered, in order.

    ``compensate`` looks its key up before anything else: a call that found the compensation
    already RUNNING has joined it while it was in flight.
    """

    def __init__(self, inner: Ledger) -> None:
        super().__init__(inner)
        self.compensation_lookups: list[ActionStatus | None] = []

    async def find_by_key(self, tenant: str, idempotency_key: str) -> Operation | None:
        found = await super().find_by_key(tenant, idempotency_key)
        if idempotency_key.startswith("compensate|"):
            self.compensation_lookups.append(None if found is None else found.status)
        return found


async def committed_booking(runtime: ActionRuntime, bookings: Bookings) -> str:
    """Book a table (another guest already holds one in the slot); return the operation id."""
    await bookings.sor.book("r1", "2030-05-01", "21:00", 4, "Grace")
    told = await runtime.propose("book_table", booking(), new_session())
    assert told["status"] == "committed"
    return str(told["operation_id"])


async def test_compensating_a_committed_booking_runs_the_hook_as_a_linked_operation(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = fake(clock)
    bookings = Bookings(sor)
    action = bookings.action(snapshot=True, compensate=True)
    async with running(REVERSIBLE, [action], ledger_url=ledger_url, clock=clock) as runtime:
        bookings.ledger = runtime.ledger
        op_id = await committed_booking(runtime, bookings)
        before = await runtime.ledger.get(op_id)

        compensation = await runtime.compensate(op_id, actor="operator:bob", reason="wrong day")
        original = await runtime.ledger.get(op_id)
        original_trail = await runtime.ledger.events(op_id)
        compensation_trail = await runtime.ledger.events(compensation.operation_id)

    assert before.before_state == {"slot": "2030-05-01 21:00", "confirmed_before": ["bk_0001"]}
    assert compensation.operation_id != op_id
    assert compensation.compensates == op_id
    assert compensation.status is Status.COMMITTED
    assert compensation.result == {"booking_id": "bk_0002", "status": "cancelled"}
    assert compensation.before_state == before.before_state
    assert original.status is Status.COMPENSATED
    assert original.result == before.result
    assert transitions(original_trail) == [
        Status.COMMITTED,
        Status.COMPENSATING,
        Status.COMPENSATED,
    ]
    compensating = next(e for e in original_trail if e.to_status is Status.COMPENSATING)
    assert (compensating.actor, compensating.detail) == (
        "operator:bob",
        {"reason": "wrong day", "compensation": compensation.operation_id},
    )
    assert compensation_trail[0].actor == "operator:bob"
    [hook_ctx] = bookings.seen["compensate"]
    assert hook_ctx.operation is not None
    assert hook_ctx.operation.before_state == before.before_state
    assert sor.get_booking("bk_0002").status == "cancelled"
    assert sor.side_effects["cancel"] == 1


async def test_compensating_twice_joins_the_first_compensation(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = fake(clock)
    bookings = Bookings(sor)
    action = bookings.action(snapshot=True, compensate=True)
    async with running(REVERSIBLE, [action], ledger_url=ledger_url, clock=clock) as runtime:
        bookings.ledger = runtime.ledger
        op_id = await committed_booking(runtime, bookings)

        first = await runtime.compensate(op_id, actor="operator:bob", reason="wrong day")
        second = await runtime.compensate(op_id, actor="operator:eve", reason="wrong day")
        compensations = [op for op in await runtime.ledger.list() if op.compensates == op_id]

    assert second.operation_id == first.operation_id
    assert second.status is Status.COMMITTED
    assert len(compensations) == 1
    assert len(bookings.seen["compensate"]) == 1
    assert sor.side_effects["cancel"] == 1


async def test_a_compensation_asked_while_the_first_runs_joins_it(
    ledger_url: str, ledger: SqlLedger, clock: ManualClock
) -> None:
    sor = fake(clock)
    bookings = Bookings(sor)
    action = bookings.action(snapshot=True, compensate=True)
    lookups = KeyLookups(ledger)
    async with running(
        REVERSIBLE, [action], ledger_url=ledger_url, clock=clock, ledger=lookups
    ) as runtime:
        bookings.ledger = runtime.ledger
        op_id = await committed_booking(runtime, bookings)
        sor.faults.set_latency(1.0, kind="cancel")  # on the manual clock: held until advanced

        first = asyncio.ensure_future(
            runtime.compensate(op_id, actor="operator:bob", reason="wrong day")
        )
        await eventually(
            lambda: sor.calls["cancel"] == 1, what="the first compensation to call the provider"
        )
        second = asyncio.ensure_future(
            runtime.compensate(op_id, actor="user:alice", reason="cancel it")
        )
        await eventually(
            lambda: len(lookups.compensation_lookups) == 2,
            what="the second call to look the compensation up",
        )
        assert lookups.compensation_lookups == [None, Status.RUNNING]
        assert not second.done()
        clock.advance(1.0)
        answers = await gather_all(first, second)
        original = await runtime.ledger.get(op_id)

    assert answers[0].operation_id == answers[1].operation_id
    assert answers[1].status is Status.COMMITTED
    assert original.status is Status.COMPENSATED
    assert len(bookings.seen["compensate"]) == 1
    assert sor.side_effects["cancel"] == 1


async def test_compensations_asked_at_the_same_time_join_one(
    ledger_url: str, clock: ManualClock
) -> None:
    # Two people (an operator and the user) ask at the same instant, for five bookings.
    sor = fake(clock)
    bookings = Bookings(sor)
    action = bookings.action(snapshot=True, compensate=True)
    async with running(REVERSIBLE, [action], ledger_url=ledger_url, clock=clock) as runtime:
        bookings.ledger = runtime.ledger
        op_ids = []
        for time in ("19:00", "19:30", "20:00", "20:30", "21:00"):
            told = await runtime.propose("book_table", booking(time), new_session())
            op_ids.append(told["operation_id"])

        answers = await guarded(
            asyncio.gather(
                *(
                    runtime.compensate(op_id, actor=actor, reason="cancel it")
                    for op_id in op_ids
                    for actor in ("operator:bob", "user:alice")
                ),
                return_exceptions=True,
            ),
            what="ten compensations asked at the same time",
        )
        originals = [await runtime.ledger.get(op_id) for op_id in op_ids]

    errors = [a for a in answers if isinstance(a, BaseException)]
    assert errors == [], f"{len(errors)} of 10 compensations raised instead of joining: {errors!r}"
    for n in range(5):
        assert answers[2 * n].operation_id == answers[2 * n + 1].operation_id
    assert {op.status for op in originals} == {Status.COMPENSATED}
    assert sor.side_effects["cancel"] == 5


async def test_a_compensation_that_fails_for_good_leaves_the_original_committed(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = fake(clock)
    bookings = Bookings(sor)
    action = bookings.action(snapshot=True, compensate=True)
    async with running(REVERSIBLE, [action], ledger_url=ledger_url, clock=clock) as runtime:
        bookings.ledger = runtime.ledger
        op_id = await committed_booking(runtime, bookings)
        sor.faults.fail_after_send("cancel")  # the provider refuses to cancel it

        compensation = await runtime.compensate(op_id, actor="operator:bob", reason="wrong day")
        original = await runtime.ledger.get(op_id)
        trail = await runtime.ledger.events(op_id)

    assert compensation.status is Status.FAILED_FINAL
    assert compensation.compensates == op_id
    assert original.status is Status.COMMITTED
    assert transitions(trail) == [Status.COMMITTED, Status.COMPENSATING, Status.COMMITTED]
    assert trail[-1].detail == {
        "compensation": compensation.operation_id,
        "reason": f"its compensation {compensation.operation_id} ended FAILED_FINAL",
    }
    assert sor.get_booking("bk_0002").status == "confirmed"
    assert sor.side_effects["cancel"] == 0


async def test_the_compensate_hook_is_given_the_result_it_reverses(
    ledger_url: str, clock: ManualClock
) -> None:
    # actions.py: "compensate(ctx) -> result: reverse a committed operation, given its result
    # and before-state". The hook should not need the ledger to learn the booking id.
    sor = fake(clock)
    bookings = Bookings(sor)
    action = bookings.action(snapshot=True, compensate=True)
    async with running(REVERSIBLE, [action], ledger_url=ledger_url, clock=clock) as runtime:
        bookings.ledger = runtime.ledger
        op_id = await committed_booking(runtime, bookings)
        original = await runtime.ledger.get(op_id)

        await runtime.compensate(op_id, actor="operator:bob", reason="wrong day")

    [hook_ctx] = bookings.seen["compensate"]
    assert hook_ctx.operation is not None
    assert hook_ctx.operation.before_state == original.before_state
    assert hook_ctx.operation.result == original.result, (
        "the compensate hook's context carries no result of the operation it reverses"
    )


async def test_only_a_committed_operation_can_be_compensated(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = fake(clock)
    sor.faults.fail_after_send("book")
    bookings = Bookings(sor)
    action = bookings.action(snapshot=True, compensate=True)
    async with running(REVERSIBLE, [action], ledger_url=ledger_url, clock=clock) as runtime:
        bookings.ledger = runtime.ledger
        told = await runtime.propose("book_table", booking(), new_session())
        assert told["status"] == "failed_final"

        with pytest.raises(UnexpectedStatus):
            await runtime.compensate(told["operation_id"], actor="operator:bob", reason="x")
        remaining = await runtime.ledger.list()

    assert [op.compensates for op in remaining] == [None]
    assert bookings.seen["compensate"] == []


async def test_a_compensation_cut_off_by_a_restart_escalates_the_operation_it_reverses(
    ledger_url: str, clock: ManualClock
) -> None:
    # Found by the crash-point matrix (tests/crash, during_compensation): the compensation
    # could only be escalated (nothing can look it up), and the original stayed COMPENSATING
    # for ever, marked nowhere as needing a person.
    sor = fake(clock)
    sor.faults.hang(kind="cancel")  # the provider never answers the cancel
    bookings = Bookings(sor)
    action = bookings.action(compensate=True)
    first = await ActionRuntime.create(
        policy(REVERSIBLE),
        authorizer=AllowAll(),
        actions=[action],
        ledger_url=ledger_url,
        clock=clock,
        lease_secs=30.0,
    )
    op_id = await committed_booking(first, bookings)
    compensating = asyncio.ensure_future(first.compensate(op_id, actor="app", reason="wrong day"))
    await eventually(lambda: bookings.seen["compensate"], what="the compensate hook to start")
    await first.close(grace_secs=0)  # the process stops with the cancel in flight
    compensating.cancel()
    clock.advance(31)  # its lease runs out

    async with running(
        REVERSIBLE, [action], ledger_url=ledger_url, clock=clock, lease_secs=30.0
    ) as second:
        [compensation] = [op for op in await second.ledger.list() if op.compensates == op_id]
        settled = await second.wait(compensation.operation_id)
        original = await second.ledger.get(op_id)
        trail = await second.ledger.events(op_id)

    assert settled.status is Status.UNKNOWN
    assert settled.escalated_at is not None
    assert original.status is Status.COMPENSATING
    assert original.escalated_at is not None
    assert trail[-1].detail == {
        "escalated": f"its compensation {compensation.operation_id} has an unknown outcome",
        "compensation": compensation.operation_id,
    }
    assert sor.side_effects["cancel"] == 0
