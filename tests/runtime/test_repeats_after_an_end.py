"""A repeat of an intent joins what is alive, and is a new operation after what is dead.

Alive: in flight, waiting for a person, UNKNOWN (it may have happened), COMMITTED. Dead: the
operation ended with nothing standing (CANCELLED, FAILED_FINAL, EXPIRED, REJECTED,
COMPENSATED). Before, the user's "go ahead" after a booking was cancelled before it was sent, or
after it failed, joined the dead operation for the whole 24 h idempotency window and could never
be made again.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pipecat_actions.approvals import Approver
from pipecat_actions.clock import ManualClock
from pipecat_actions.ledger.records import EventKind
from pipecat_actions.testing import FakeSystemOfRecord
from tests.runtime._execution_support import (
    Bookings,
    booking,
    new_session,
    running,
)
from tests.runtime._execution_support import S as Status

POLICY = """
    version: 1
    tools:
      book_table:
        kind: mutation
        on_duplicate: {mode}
      book_when_settled:
        kind: mutation
        admit_when: turn_confirmed
        on_interruption: cancel_if_not_started
      book_approved:
        kind: mutation
        confirmation: {{mode: approval, approvers: [manager], expires_after_secs: 60}}
"""


def fake(clock: ManualClock) -> FakeSystemOfRecord:
    sor = FakeSystemOfRecord(clock=clock)
    sor.add_restaurant("r1", tables=5)
    return sor


def actions(bookings: Bookings) -> list[Any]:
    return [
        bookings.action(),
        bookings.action(name="book_when_settled"),
        bookings.action(name="book_approved"),
    ]


@pytest.mark.parametrize("mode", ["join", "reject"])
async def test_a_repeat_after_a_failure_is_a_new_operation_that_can_succeed(
    ledger_url: str, clock: ManualClock, mode: str
) -> None:
    sor = fake(clock)
    sor.faults.fail_after_send("book")
    async with running(
        POLICY.format(mode=mode), actions(Bookings(sor)), ledger_url=ledger_url, clock=clock
    ) as runtime:
        session = new_session()
        failed = await runtime.propose("book_table", booking(), session)
        again = await runtime.propose("book_table", booking(), session)
        first_trail = await runtime.ledger.events(failed["operation_id"])

    assert failed["status"] == "failed_final"
    assert again["status"] == "committed"
    assert again["operation_id"] != failed["operation_id"]
    assert sor.side_effects["book"] == 1
    # The dead operation let go of its key, on the record, and stays as it was.
    released = [e for e in first_trail if e.kind is EventKind.KEY_RELEASED]
    assert len(released) == 1
    assert "ended FAILED_FINAL" in released[0].detail["reason"]
    assert first_trail[-1].to_status is Status.FAILED_FINAL


async def test_a_repeat_after_a_cancellation_before_sending_books_it(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = fake(clock)
    async with running(
        POLICY.format(mode="join"), actions(Bookings(sor)), ledger_url=ledger_url, clock=clock
    ) as runtime:
        session = new_session()
        told = await runtime.propose("book_when_settled", booking(), session, wait=False)
        cancelled = await runtime.cancel(told["operation_id"], reason="the user said wait")
        again = await runtime.propose("book_when_settled", booking(), session, wait=False)
        session.settle_generation()  # the reply that proposed it stood
        final = await runtime.wait(again["operation_id"])

    assert cancelled.status is Status.CANCELLED
    assert again["operation_id"] != told["operation_id"]
    assert final.status is Status.COMMITTED
    assert sor.side_effects["book"] == 1


async def test_a_repeat_after_a_rejected_approval_asks_again(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = fake(clock)
    async with running(
        POLICY.format(mode="join"), actions(Bookings(sor)), ledger_url=ledger_url, clock=clock
    ) as runtime:
        session = new_session()
        waiting = await runtime.propose("book_approved", booking(), session)
        await runtime.reject(
            waiting["operation_id"],
            approver=Approver("manager", tenants={"default"}),
            reason="not now",
        )
        again = await runtime.propose("book_approved", booking(), session)

    assert waiting["status"] == again["status"] == "awaiting_approval"
    assert again["operation_id"] != waiting["operation_id"]
    assert sor.calls["book"] == 0


@pytest.mark.parametrize("mode", ["join", "reject"])
async def test_a_repeat_of_a_committed_or_unknown_operation_never_makes_a_second_one(
    ledger_url: str, clock: ManualClock, mode: str
) -> None:
    sor = fake(clock)
    async with running(
        POLICY.format(mode=mode), actions(Bookings(sor)), ledger_url=ledger_url, clock=clock
    ) as runtime:
        session = new_session()
        done = await runtime.propose("book_table", booking(), session)
        again = await runtime.propose("book_table", booking(), session)
        sor.faults.lose_response_after_commit("book")
        unknown = await runtime.propose("book_table", booking("22:00"), session)
        repeat_unknown = await runtime.propose("book_table", booking("22:00"), session)

    assert done["status"] == "committed"
    assert again["operation_id"] == done["operation_id"] or again["status"] == "refused"
    assert unknown["status"] in ("unknown", "committed")
    assert (
        repeat_unknown["operation_id"] == unknown["operation_id"]
        or repeat_unknown["status"] == "refused"
    )
    assert sor.side_effects["book"] == 2  # one per intent, never a second for either


CAPPED = """
    version: 1
    tools:
      book_table:
        kind: mutation
        on_duplicate: join
        limits: {{per_principal: {cap}}}
"""


@pytest.mark.parametrize("cap", [1, 2])
async def test_identical_calls_in_one_response_all_join_one_operation_never_busy(
    ledger_url: str, clock: ManualClock, cap: int
) -> None:
    sor = fake(clock)
    async with running(
        CAPPED.format(cap=cap), [Bookings(sor).action()], ledger_url=ledger_url, clock=clock
    ) as runtime:
        session = new_session()
        told = await asyncio.gather(
            *(
                runtime.propose("book_table", booking(), session, tool_call_id=f"call-{n}")
                for n in range(5)
            )
        )
        calls = {runtime.operation_for_call(f"call-{n}") for n in range(5)}

    assert [t["status"] for t in told] == ["committed"] * 5, told
    assert len({t["operation_id"] for t in told}) == 1
    assert calls == {told[0]["operation_id"]}
    assert sor.side_effects["book"] == 1
