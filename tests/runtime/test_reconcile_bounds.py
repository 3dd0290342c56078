"""Reconciliation is bounded, and never concludes "it did not happen" while the effect still runs.

A reconcile hook that never answered left the operation UNKNOWN forever, never escalated. And a
deadline that fell while the provider was still working on a booking led to "no trace of it"
3 ms later, FAILED_FINAL ("it did not happen"), and then the provider booked it after all.
Both run on the manual clock: the probe's time limit and the deadline fall when the test says.
"""

from __future__ import annotations

import asyncio

from pipecat_actions.actions import ActionContext, Reconciliation, action
from pipecat_actions.clock import ManualClock
from pipecat_actions.execution.executor import ReconcileSchedule
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.testing import FakeSystemOfRecord
from tests._waiting import eventually, guarded
from tests.runtime._execution_support import (
    Bookings,
    annotations,
    booking,
    new_session,
    only_operation,
    reaches,
    running,
    transitions,
)
from tests.runtime._execution_support import S as Status

DEADLINE_SECS = 5.0
POLICY = f"""
    version: 1
    tools:
      book_table:
        kind: mutation
        deadline_secs: {DEADLINE_SECS}
"""
SCHEDULE = ReconcileSchedule(
    initial_secs=1.0, multiplier=1.0, max_secs=1.0, max_probes=3, probe_timeout_secs=2.0
)
LONG_LEASE = 3600.0


async def run_the_clock_until_reconciled(
    runtime: ActionRuntime, clock: ManualClock, operation_id: str
) -> None:
    """Move the clock a second at a time until reconciliation ends: the operation is escalated
    (still UNKNOWN) or has left UNKNOWN.

    Only the reconciler's own waits on the clock (a probe's time limit, the pause between
    probes) end meanwhile, so how many probes it makes does not depend on the pace; the hang
    guard fails the test if reconciliation never ends.
    """

    async def ended_or_a_second_later() -> bool:
        op = await runtime.ledger.get(operation_id)
        if op.escalated_at is not None or op.status is not Status.UNKNOWN:
            return True
        clock.advance(1.0)
        return False

    await eventually(ended_or_a_second_later, what=f"the reconciliation of {operation_id} to end")


def fake(clock: ManualClock) -> FakeSystemOfRecord:
    sor = FakeSystemOfRecord(clock=clock)
    sor.add_restaurant("r1", tables=3)
    return sor


async def test_a_reconcile_hook_that_never_answers_is_abandoned_and_the_operation_escalated(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = fake(clock)
    sor.faults.lose_response_after_commit("book")  # committed, answer lost: UNKNOWN
    asked: list[str] = []
    never = asyncio.Event()

    async def silent(ctx: ActionContext) -> Reconciliation:
        asked.append(ctx.operation_id)
        await never.wait()  # the system of record never answers
        raise AssertionError("not reached")

    definition = action(name="book_table", reconcile=silent)(Bookings(sor).book)
    async with running(
        POLICY,
        [definition],
        ledger_url=ledger_url,
        clock=clock,
        schedule=SCHEDULE,
        lease_secs=LONG_LEASE,
    ) as runtime:
        call = asyncio.ensure_future(runtime.propose("book_table", booking(), new_session()))
        await eventually(lambda: asked, what="the first probe")
        op_id = asked[0]

        # Each probe waits at most 2 s of clock time, then 1 s until the next: 3 probes.
        await run_the_clock_until_reconciled(runtime, clock, op_id)
        told = await guarded(call, what="the booking's answer")
        final = await runtime.ledger.get(op_id)
        trail = await runtime.ledger.events(op_id)

    assert told["status"] == "unknown"
    assert "not yet known" in told["message"]
    assert final.status is Status.UNKNOWN
    assert len(asked) == SCHEDULE.max_probes
    errors = [a["reconcile_error"] for a in annotations(trail) if "reconcile_error" in a]
    assert errors == ["TimeoutError: the reconcile hook gave no answer within 2.0 s"] * 3
    assert any(
        "still unknown after 3 checks" in str(a.get("escalated")) for a in annotations(trail)
    )


async def test_no_trace_while_the_effect_still_runs_is_not_final_and_its_late_success_commits(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = fake(clock)
    sor.faults.hang("book", ignore_cancellation=True)  # still working after the deadline
    bookings = Bookings(sor)
    async with running(
        POLICY,
        [bookings.action(reconcile="lookup")],  # the provider has no trace while it works
        ledger_url=ledger_url,
        clock=clock,
        schedule=SCHEDULE,
        lease_secs=LONG_LEASE,
    ) as runtime:
        session = new_session()
        heard: list[Status] = []
        runtime.listen(session.session_id, lambda op: heard.append(op.status))
        call = asyncio.ensure_future(runtime.propose("book_table", booking(), session))
        await eventually(lambda: sor.calls["book"] == 1, what="the booking to be sent")
        op = await only_operation(runtime)
        clock.advance(DEADLINE_SECS)
        told = await guarded(call, what="the answer at the deadline")
        # Reconciliation asks while the effect is still running: no trace, yet not final, at
        # every probe, until it hands the operation to a person. Only then does the provider
        # finish (a release while a probe is under way would race that probe).
        await run_the_clock_until_reconciled(runtime, clock, op.operation_id)
        while_running = await runtime.ledger.get(op.operation_id)
        sor.release_hung()  # the provider finishes: the booking happened after all
        final = await reaches(runtime, op.operation_id, Status.COMMITTED)
        await eventually(lambda: Status.COMMITTED in heard, what="the conversation to be told")
        trail = await runtime.ledger.events(op.operation_id)

    assert told["status"] == "unknown"
    # The late truth reaches the listeners, after they heard it was handed to a person.
    assert heard == [Status.UNKNOWN, Status.UNKNOWN, Status.COMMITTED]
    assert while_running.status is Status.UNKNOWN
    assert Status.FAILED_FINAL not in transitions(trail)
    assert any("reconcile_not_final" in a for a in annotations(trail))
    assert [a["probe"] for a in annotations(trail) if "reconcile_not_final" in a] == [1, 2, 3]
    assert final.status is Status.COMMITTED
    assert final.result == {"booking_id": "bk_0001", "time": "21:00"}
    assert sor.side_effects["book"] == 1


async def test_no_trace_after_the_effect_ended_is_final_for_a_provider_with_no_horizon(
    ledger_url: str, clock: ManualClock
) -> None:
    # The effect stops when the deadline cancels it (it honours cancellation), and this
    # provider applies nothing once its caller left (commit horizon 0): "no trace" is the
    # truth at once (test_commit_horizon.py has a provider that takes longer).
    sor = fake(clock)
    sor.faults.hang("book")
    bookings = Bookings(sor)
    async with running(
        POLICY + "        reconciliation: {commit_horizon_secs: 0}\n",
        [bookings.action(reconcile="lookup")],
        ledger_url=ledger_url,
        clock=clock,
        schedule=SCHEDULE,
        lease_secs=LONG_LEASE,
    ) as runtime:
        call = asyncio.ensure_future(runtime.propose("book_table", booking(), new_session()))
        await eventually(lambda: sor.calls["book"] == 1, what="the booking to be sent")
        op = await only_operation(runtime)
        clock.advance(DEADLINE_SECS)
        await guarded(call, what="the answer at the deadline")
        final = await reaches(runtime, op.operation_id, Status.FAILED_FINAL)

    assert final.error == (
        "the system of record has no trace of it, and it can no longer be applied: it did not "
        "happen"
    )
    assert sor.side_effects["book"] == 0
