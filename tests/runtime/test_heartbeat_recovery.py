"""Recovery runs all the time, not only in `ActionRuntime.create` (issue 12, B3; issue 30).

A runtime restarted within the dead owner's lease used to find nothing to claim at its start
and never looked again: the dead owner's booking stayed RUNNING, and the user's repeat of it
joined the orphan and heard "running" forever. Now a gone owner's work is claimed at once (it
registered its life and its lock is free), and each heartbeat claims what an owner that never
registered left once its lease runs out.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, event

from pipecat_actions.clock import ManualClock
from pipecat_actions.ledger import SqlLedger
from pipecat_actions.ledger.records import NewOperation
from pipecat_actions.status import ActionStatus
from pipecat_actions.testing import FakeSystemOfRecord
from tests._waiting import eventually, guarded
from tests.runtime._execution_support import Bookings, booking, new_session, reaches, running
from tests.runtime._execution_support import S as Status

POLICY = """
    version: 1
    tools:
      book_table:
        kind: mutation
        deadline_secs: 600
"""
LEASE_SECS = 30.0


async def test_a_runtime_started_within_a_gone_owners_lease_claims_its_work_at_once(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = FakeSystemOfRecord(clock=clock)
    sor.add_restaurant("r1", tables=3)
    bookings = Bookings(sor)
    # The provider goes on with the booking when its caller dies, and books it once let go.
    sor.faults.hang("book", ignore_cancellation=True)
    options = {"ledger_url": ledger_url, "clock": clock, "lease_secs": LEASE_SECS}
    async with running(POLICY, [bookings.action()], **options) as dead:
        told = await dead.propose("book_table", booking(), new_session(), wait=False)
        op_id = str(told["operation_id"])
        await eventually(lambda: sor.calls["book"] == 1, what="the booking to be sent")
        clock.advance(LEASE_SECS / 2)  # it renewed its lease once more, then stopped
        await dead._recovery.beat()
    sor.release_hung()

    async with running(POLICY, [bookings.action()], **options) as restarted:
        # Within the dead owner's lease, but its owner is gone: claimed at start.
        assert (await restarted.ledger.get(op_id)).lease_owner == restarted.owner
        settled = await reaches(restarted, op_id, Status.COMMITTED)
        assert settled.result is not None
        # The user's repeat joins it and hears what happened, not "running".
        again = await guarded(
            restarted.propose("book_table", booking(), new_session()), what="the repeat"
        )
        assert again["operation_id"] == op_id
        assert again["status"] == "committed"
        assert sor.effects_for_key(settled.idempotency_key) == 1


async def test_a_heartbeat_claims_an_unregistered_owners_work_once_its_lease_expires(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = FakeSystemOfRecord(clock=clock)
    sor.add_restaurant("r1", tables=3)
    bookings = Bookings(sor)
    ledger = await SqlLedger.create(ledger_url, clock=clock)
    try:
        # Left by a runtime that never registered its life (an older version): admitted, not
        # sent, its lease valid for LEASE_SECS more.
        made = await ledger.admit(
            NewOperation(
                tool="book_table",
                kind="mutation",
                args=booking(),
                idempotency_key="k-unregistered",
                session_id="call-1",
                principal="alice",
                status=ActionStatus.ADMITTED,
                lease_owner="old-version",
                lease_secs=LEASE_SECS,
                deadline_at=clock.now() + 600,
            )
        )
    finally:
        await ledger.close()
    op_id = made.operation.operation_id
    options = {"ledger_url": ledger_url, "clock": clock, "lease_secs": LEASE_SECS}
    async with running(POLICY, [bookings.action()], **options) as later:
        assert (await later.ledger.get(op_id)).lease_owner == "old-version"

        async def claimed() -> bool:
            clock.advance(LEASE_SECS / 6)
            return (await later.ledger.get(op_id)).lease_owner == later.owner

        await eventually(claimed, what="a heartbeat to claim the stale operation")
        settled = await reaches(later, op_id, Status.COMMITTED)
        assert clock.now() >= made.operation.lease_expires_at  # type: ignore[operator]

    assert settled.result is not None
    assert sor.side_effects["book"] == 1


async def test_each_batch_of_a_recovery_pass_sends_the_same_statement_however_many_it_took(
    ledger_url: str, clock: ManualClock
) -> None:
    await _stale_approvals(ledger_url, clock, 120)  # three batches of 50, the last one short
    claims: list[int] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if statement.lstrip().upper().startswith("SELECT") and "lease_expires_at <=" in statement:
            claims.append(len(parameters))

    options = {"ledger_url": ledger_url, "clock": clock, "lease_secs": LEASE_SECS}
    async with running(
        POLICY, [Bookings(FakeSystemOfRecord(clock=clock)).action()], recover=False, **options
    ) as later:
        event.listen(Engine, "before_cursor_execute", record)
        try:
            taken = await later.recover()
        finally:
            event.remove(Engine, "before_cursor_execute", record)

    assert len(taken) == 120 == len({op.operation_id for op in taken})
    # The bound parameters of each batch's claim: what it sends (and reads) does not grow
    # with what the batches before it took, as a list of their ids left out did.
    assert len(claims) >= 4
    assert claims[:3] == [claims[0]] * 3


async def test_a_recovery_pass_longer_than_a_lease_does_not_claim_its_own_claims_again(
    ledger_url: str, clock: ManualClock
) -> None:
    await _stale_approvals(ledger_url, clock, 120)
    options = {"ledger_url": ledger_url, "clock": clock, "lease_secs": LEASE_SECS}
    async with running(
        POLICY, [Bookings(FakeSystemOfRecord(clock=clock)).action()], recover=False, **options
    ) as later:
        recovery = later._recovery
        resume = recovery._resume

        resumed: list[str] = []

        async def slow_resume(op: Any) -> None:
            # Each operation takes a fifth of a lease to take up: the pass lasts 24 leases
            # (and no longer if it took some twice: then it ends, and says so).
            await resume(op)
            resumed.append(op.operation_id)
            if len(resumed) <= 120:
                clock.advance(LEASE_SECS / 5)

        recovery._resume = slow_resume  # type: ignore[method-assign]
        taken = await later.recover()
        fences = {op.operation_id: (await later.ledger.get(op.operation_id)).fence for op in taken}

    # Each operation is claimed once in the pass: none of its own claims expired under it and
    # was claimed (its fence raised) again while the work it started on it went on.
    assert len(taken) == 120 == len({op.operation_id for op in taken}) == len(resumed)
    assert all(fences[op.operation_id] == op.fence for op in taken)


async def _stale_approvals(ledger_url: str, clock: ManualClock, count: int) -> None:
    """``count`` operations waiting for approval, left by an owner whose leases ran out."""
    ledger = await SqlLedger.create(ledger_url, clock=clock)
    try:
        for n in range(count):
            await ledger.admit(
                NewOperation(
                    tool="book_table",
                    kind="mutation",
                    args=booking(),
                    idempotency_key=f"k-{n}",
                    session_id=f"call-{n}",
                    principal="alice",
                    status=ActionStatus.AWAITING_APPROVAL,
                    lease_owner="old-version",
                    lease_secs=LEASE_SECS,
                    deadline_at=clock.now() + 6000,
                )
            )
    finally:
        await ledger.close()
    clock.advance(LEASE_SECS * 2)
