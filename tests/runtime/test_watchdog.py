"""The watchdog: deadlines kept in the ledger, enforced whatever the effect does.

At expiry an operation never sent is FAILED_FINAL, one waiting for a yes is EXPIRED, one that
may have been sent is UNKNOWN and reconciled. The watchdog never claims a cancellation.
"""

from __future__ import annotations

import pytest

from pipecat_actions.approvals import Approver
from pipecat_actions.clock import ManualClock
from pipecat_actions.runtime import ApprovalRefused
from pipecat_actions.testing import FakeSystemOfRecord
from tests.runtime._execution_support import (
    T0,
    Bookings,
    booking,
    every_status,
    gather_all,
    new_session,
    reaches,
    running,
    transitions,
)
from tests.runtime._execution_support import S as Status

WATCHED = """
    version: 1
    tools:
      book_table:
        kind: mutation
        deadline_secs: 30
      book_when_settled:
        kind: mutation
        admit_when: turn_confirmed
        deadline_secs: 30
      book_with_approval:
        kind: mutation
        confirmation: {mode: approval, approvers: [bob], expires_after_secs: 60}
"""


def fake(clock: ManualClock) -> FakeSystemOfRecord:
    sor = FakeSystemOfRecord(clock=clock)
    sor.add_restaurant("r1", tables=500)
    return sor


def actions(bookings: Bookings) -> list:
    return [
        bookings.action(),
        bookings.action(name="book_when_settled"),
        bookings.action(name="book_with_approval"),
    ]


async def test_an_admitted_operation_never_sent_fails_final_at_its_deadline(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = fake(clock)
    async with running(
        WATCHED, actions(Bookings(sor)), ledger_url=ledger_url, clock=clock, lease_secs=3600.0
    ) as runtime:
        told = await runtime.propose("book_when_settled", booking(), new_session(), wait=False)
        op_id = told["operation_id"]
        assert told["status"] == "admitted"

        clock.advance(29.5)
        assert (await runtime.ledger.get(op_id)).status is Status.ADMITTED
        clock.advance(0.5)
        op = await reaches(runtime, op_id, Status.FAILED_FINAL)
        final = await runtime.wait(op_id)
        trail = await runtime.ledger.events(op_id)

    assert final.status is Status.FAILED_FINAL
    assert op.error == "deadline: deadline passed before it could be sent"
    assert transitions(trail) == [Status.FAILED_FINAL]
    assert trail[-1].actor == "watchdog"
    assert Status.CANCELLED not in every_status(trail)
    assert sor.calls["book"] == 0


async def test_an_approval_not_given_in_time_expires(ledger_url: str, clock: ManualClock) -> None:
    sor = fake(clock)
    async with running(
        WATCHED, actions(Bookings(sor)), ledger_url=ledger_url, clock=clock, lease_secs=3600.0
    ) as runtime:
        told = await runtime.propose("book_with_approval", booking(), new_session())
        op_id = told["operation_id"]
        assert told["status"] == "awaiting_approval"

        clock.advance(60)
        op = await reaches(runtime, op_id, Status.EXPIRED)
        with pytest.raises(ApprovalRefused):
            await runtime.approve(
                op_id,
                approver=Approver("bob", tenants={"default"}),
                reason="too late",
                args_hash=op.args_hash,
            )
        trail = await runtime.ledger.events(op_id)

    assert op.status is Status.EXPIRED
    assert op.finished_at == T0 + 60
    assert transitions(trail) == [Status.EXPIRED]
    assert Status.CANCELLED not in every_status(trail)
    assert sor.calls["book"] == 0


async def test_a_deadline_while_the_request_may_have_been_sent_is_unknown_then_reconciled(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = fake(clock)
    sor.faults.hang("book")  # abandoned (nothing commits) when the watchdog gives up on it
    async with running(
        WATCHED, actions(Bookings(sor)), ledger_url=ledger_url, clock=clock, lease_secs=3600.0
    ) as runtime:
        told = await runtime.propose("book_table", booking(), new_session(), wait=False)
        op_id = told["operation_id"]
        await reaches(runtime, op_id, Status.RUNNING)

        clock.advance(30)
        told_at_deadline = await runtime.wait(op_id)
        clock.advance(60)  # the default commit horizon: the provider cannot apply it any more
        final = await reaches(runtime, op_id, Status.FAILED_FINAL)
        trail = await runtime.ledger.events(op_id)

    # The waiting caller hears at the deadline that the outcome is not known yet; the
    # reconciliation the watchdog started settles it once "no trace" is proof.
    assert told_at_deadline.status is Status.UNKNOWN
    assert final.status is Status.FAILED_FINAL
    assert transitions(trail) == [Status.UNKNOWN, Status.FAILED_FINAL]
    unknown = next(e for e in trail if e.to_status is Status.UNKNOWN)
    assert unknown.actor == "watchdog"
    assert unknown.detail == {
        "reason": "deadline passed while it may have been sent",
        "deadline_at": T0 + 30,
    }
    assert trail[-1].detail == {"reason": "reconciled"}
    assert Status.CANCELLED not in every_status(trail)
    assert [c.outcome for c in sor.log] == ["abandoned"]
    assert sor.side_effects["book"] == 0


async def test_two_hundred_deadlines_all_fire(ledger_url: str, clock: ManualClock) -> None:
    sor = fake(clock)
    session = new_session()
    async with running(
        WATCHED, actions(Bookings(sor)), ledger_url=ledger_url, clock=clock, lease_secs=3600.0
    ) as runtime:
        ids: dict[str, str] = {}
        for batch in range(8):  # 8 batches of 25 concurrent calls, deadlines 1 s apart
            calls = [
                ("book_when_settled" if n % 2 else "book_with_approval", booking(party_size=n))
                for n in range(batch * 25 + 1, batch * 25 + 26)
            ]
            told = await gather_all(
                *(runtime.propose(tool, args, session, wait=False) for tool, args in calls)
            )
            ids.update({t["operation_id"]: tool for t, (tool, _) in zip(told, calls, strict=True)})
            clock.advance(1.0)
        assert runtime.watchdog.pending == 200

        clock.advance(60)
        finals = await gather_all(*(runtime.wait(op_id) for op_id in ids))
        lateness = list(runtime.watchdog.lateness_secs)
        pending = runtime.watchdog.pending

    expected = {"book_when_settled": Status.FAILED_FINAL, "book_with_approval": Status.EXPIRED}
    assert {op.operation_id: op.status for op in finals} == {
        op_id: expected[tool] for op_id, tool in ids.items()
    }
    assert len(lateness) == 200
    assert pending == 0
    assert sor.calls["book"] == 0
