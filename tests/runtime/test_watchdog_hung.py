"""An effect that hangs and ignores cancellation, bounded by the watchdog on the manual clock.

The watchdog bounds the wait to the deadline: the operation is UNKNOWN (maybe sent) or
FAILED_FINAL by then, other tools keep running, and when the hung call finally answers, the
answer is recorded as a late event. Per the executor's contract a late answer only settles an
operation that is still UNKNOWN; it never overwrites a terminal status.

Everything runs on one `ManualClock` (the runtime, its ledger and the fake provider), so no
assertion depends on how fast the machine is: the clock stands still until the booking is
sent, jumps to the deadline, and the audit trail must then say that the watchdog wrote UNKNOWN
at exactly that clock time.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pipecat_actions.actions import ActionContext, ActionDefinition, action
from pipecat_actions.clock import ManualClock
from pipecat_actions.execution.executor import ReconcileSchedule
from pipecat_actions.ledger.records import EventKind, Operation, OperationEvent
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.testing import FakeSystemOfRecord
from tests.runtime._execution_support import (
    T0,
    Bookings,
    annotations,
    booking,
    eventually,
    guarded,
    new_session,
    only_operation,
    reaches,
    running,
    transitions,
)
from tests.runtime._execution_support import S as Status

DEADLINE_SECS = 0.3

HUNG = f"""
    version: 1
    tools:
      book_table:
        kind: mutation
        deadline_secs: {DEADLINE_SECS}
      refund:
        kind: mutation
        deadline_secs: 5
"""

PROBE_OFTEN = ReconcileSchedule(initial_secs=0.02, multiplier=1.0, max_secs=0.02, max_probes=250)
"""Reconciliation keeps asking for five seconds of clock time (the clock stays at the deadline)."""

LONG_LEASE = 3600.0
"""No lease heartbeat falls due while the clock moves to the deadline."""


def hung_fake(clock: ManualClock) -> FakeSystemOfRecord:
    sor = FakeSystemOfRecord(clock=clock)
    sor.add_restaurant("r1", tables=3)
    sor.add_payment("pay_1", 10_000, "alice")
    sor.faults.hang("book", ignore_cancellation=True)
    return sor


def refund_action(sor: FakeSystemOfRecord) -> ActionDefinition:
    async def refund(ctx: ActionContext, payment_id: str, amount_cents: int) -> dict[str, str]:
        """Refund part of a payment."""
        made = await sor.refund(payment_id, amount_cents, idempotency_key=ctx.idempotency_key)
        return {"refund_id": made.refund_id}

    return action(refund)


async def late_events(runtime: ActionRuntime, op_id: str) -> list[dict[str, Any]]:
    return [a for a in annotations(await runtime.ledger.events(op_id)) if "late_answer" in a]


async def sent_and_hung(runtime: ActionRuntime, sor: FakeSystemOfRecord) -> Operation:
    """Wait until the booking reached the provider (and hangs there); return its operation."""
    await eventually(lambda: sor.calls["book"] == 1, what="the booking to be sent")
    op = await only_operation(runtime)
    assert op.status is Status.RUNNING, op
    assert op.deadline_at == T0 + DEADLINE_SECS
    return op


def trail_of(trail: list[OperationEvent], status: Status) -> OperationEvent:
    """The one transition event into ``status``."""
    [event] = [e for e in trail if e.kind is EventKind.TRANSITION and e.to_status is status]
    return event


def written_by_the_watchdog_at_the_deadline(trail: list[OperationEvent]) -> OperationEvent:
    """Return the UNKNOWN event, checking who wrote it, why, and at which clock time."""
    unknown = trail_of(trail, Status.UNKNOWN)
    assert unknown.from_status is Status.RUNNING
    assert unknown.actor == "watchdog"
    assert unknown.detail == {
        "reason": "deadline passed while it may have been sent",
        "deadline_at": T0 + DEADLINE_SECS,
    }
    assert unknown.at == T0 + DEADLINE_SECS
    return unknown


async def test_a_hung_effect_is_bounded_by_its_deadline_while_other_tools_flow(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = hung_fake(clock)
    bookings = Bookings(sor)
    async with running(
        HUNG,
        [bookings.action(reconcile="patient"), refund_action(sor)],
        ledger_url=ledger_url,
        clock=clock,
        schedule=PROBE_OFTEN,
        lease_secs=LONG_LEASE,
    ) as runtime:
        session = new_session()
        hung = asyncio.ensure_future(runtime.propose("book_table", booking(), session))
        sent = await sent_and_hung(runtime, sor)

        # The other tool flows while the booking hangs and the clock has not reached its
        # deadline: had the refunds waited for the hung call, they would never answer (the
        # clock does not move until they have) and the hang guard would fail the test.
        refunds = await guarded(
            asyncio.gather(
                *(
                    runtime.propose(
                        "refund", {"payment_id": "pay_1", "amount_cents": 100 + n}, session
                    )
                    for n in range(5)
                )
            ),
            what="the refunds while the booking hangs (they must not wait for it)",
        )
        flowed_at = clock.now()
        still_waiting = not hung.done()
        while_flowing = await runtime.ledger.get(sent.operation_id)

        clock.advance(DEADLINE_SECS)  # the deadline, to the exact clock tick
        told = await guarded(hung, what="the hung booking's answer at its deadline")
        op_id = told["operation_id"]
        at_deadline = await runtime.ledger.get(op_id)
        at_deadline_trail = await runtime.ledger.events(op_id)
        lateness = list(runtime.watchdog.lateness_secs)

        sor.release_hung()
        final = await reaches(runtime, op_id, Status.COMMITTED)
        await eventually(lambda: late_events(runtime, op_id), what="the late answer")
        trail = await runtime.ledger.events(op_id)

    assert [r["status"] for r in refunds] == ["committed"] * 5
    assert flowed_at == T0 < sent.deadline_at, "the other tool waited for the hung one"
    assert still_waiting, "the hung booking answered before its deadline"
    assert while_flowing.status is Status.RUNNING
    assert sor.side_effects["refund"] == 5
    assert op_id == sent.operation_id
    assert told["status"] == "unknown"
    assert at_deadline.status is Status.UNKNOWN
    written_by_the_watchdog_at_the_deadline(at_deadline_trail)
    assert lateness == [0.0], "the watchdog fired at another clock time than the deadline"
    # The truth arrives later: the booking did happen, exactly once, and the ledger says so.
    assert final.status is Status.COMMITTED
    assert final.result == {"booking_id": "bk_0001", "time": "21:00"}
    assert transitions(trail)[:2] == [Status.UNKNOWN, Status.COMMITTED]
    assert sor.side_effects["book"] == 1
    assert sor.calls["book"] == 1


async def test_a_late_answer_settles_an_unknown_operation_without_a_reconcile_hook(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = hung_fake(clock)
    bookings = Bookings(sor)
    async with running(
        HUNG,
        [bookings.action(reconcile=None), refund_action(sor)],
        ledger_url=ledger_url,
        clock=clock,
        lease_secs=LONG_LEASE,
    ) as runtime:
        call = asyncio.ensure_future(runtime.propose("book_table", booking(), new_session()))
        sent = await sent_and_hung(runtime, sor)
        still_waiting = not call.done()

        clock.advance(DEADLINE_SECS)
        told = await guarded(call, what="the hung booking's answer at its deadline")
        op_id = told["operation_id"]

        async def is_escalated() -> bool:
            return (await runtime.ledger.get(op_id)).escalated_at is not None

        await eventually(is_escalated, what="the escalation")
        escalated = await runtime.ledger.get(op_id)

        sor.release_hung()
        final = await reaches(runtime, op_id, Status.COMMITTED)
        late = await late_events(runtime, op_id)
        trail = await runtime.ledger.events(op_id)

    assert still_waiting, "the hung booking answered before its deadline"
    assert op_id == sent.operation_id
    assert told["status"] == "unknown"
    assert escalated.status is Status.UNKNOWN
    assert escalated.result is None
    assert escalated.escalated_at == T0 + DEADLINE_SECS
    written_by_the_watchdog_at_the_deadline(trail)
    assert final.result == {"booking_id": "bk_0001", "time": "21:00"}
    assert late == [{"late_answer": "result", "error": "None"}]
    assert transitions(trail) == [Status.UNKNOWN, Status.COMMITTED]
    assert trail[-1].detail == {"reason": "late answer"}
    assert sor.side_effects["book"] == 1


async def test_an_operators_check_before_the_horizon_leaves_it_unknown_and_the_late_answer_wins(
    ledger_url: str, clock: ManualClock
) -> None:
    # While the hung call is in flight, the runtime's own probe finding no trace is not final
    # (the effect may still commit). An operator in another process, who cannot see that
    # effect, reconciles it: no trace, but the provider may still apply the request until the
    # tool's commit horizon, so it is no proof and it stays UNKNOWN. The call then commits.
    sor = hung_fake(clock)
    bookings = Bookings(sor)
    async with (
        running(
            HUNG,
            [bookings.action(reconcile="lookup"), refund_action(sor)],
            ledger_url=ledger_url,
            clock=clock,
            lease_secs=LONG_LEASE,
        ) as runtime,
        running(
            HUNG,
            [bookings.action(reconcile="lookup"), refund_action(sor)],
            ledger_url=ledger_url,
            clock=clock,
            lease_secs=LONG_LEASE,
            recover=False,
        ) as elsewhere,
    ):
        call = asyncio.ensure_future(runtime.propose("book_table", booking(), new_session()))
        sent = await sent_and_hung(runtime, sor)
        still_waiting = not call.done()

        clock.advance(DEADLINE_SECS)
        told = await guarded(call, what="the hung booking's answer at its deadline")
        op_id = told["operation_id"]

        async def not_final() -> bool:
            trail = annotations(await runtime.ledger.events(op_id))
            return any("reconcile_not_final" in a for a in trail)

        await eventually(not_final, what="the runtime's own probe to find no trace yet")
        checked = await elsewhere.reconcile_unknown(op_id, actor="operator:bob")

        sor.release_hung()
        final = await reaches(runtime, op_id, Status.COMMITTED)
        trail = await runtime.ledger.events(op_id)

    assert still_waiting, "the hung booking answered before its deadline"
    assert op_id == sent.operation_id
    assert told["status"] == "unknown"
    written_by_the_watchdog_at_the_deadline(trail)
    assert checked.status is Status.UNKNOWN
    assert final.result == {"booking_id": "bk_0001", "time": "21:00"}
    assert transitions(trail) == [Status.UNKNOWN, Status.COMMITTED]
    assert Status.FAILED_FINAL not in transitions(trail)
    assert sor.side_effects["book"] == 1
