"""'It did not happen' only once it can no longer happen; a contradiction is a fact of its own.

A booking sent at once, a deadline at 0.4 s, the provider committing at 1.1 s: the deadline
stops the effect, and the reconcile hook finds no trace yet. That "not found" is no evidence:
the provider may still apply the request until the tool's commit horizon has passed since the
request could last have left. Until then the operation stays UNKNOWN and the user hears that it
is being checked; the provider's commit is what reconciliation then finds. And if the system of
record ever reports a commit for an operation the ledger holds as failed, the ledger follows it,
the conflict is audited, counted, listed and escalated, and the conversation is told.
Everything runs on the manual clock.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pipecat_actions.actions import ActionContext, CancelOutcome, action
from pipecat_actions.clock import ManualClock
from pipecat_actions.execution.executor import ReconcileSchedule
from pipecat_actions.ledger import NewOperation
from pipecat_actions.ledger.records import OperationFilter
from pipecat_actions.testing import FakeSystemOfRecord
from tests._waiting import eventually, guarded
from tests.runtime._execution_support import (
    Bookings,
    annotations,
    booking,
    new_session,
    noted,
    only_operation,
    running,
    transitions,
)
from tests.runtime._execution_support import S as Status

SCHEDULE = ReconcileSchedule(initial_secs=0.5, multiplier=1.0, max_secs=0.5, max_probes=4)
LONG_LEASE = 3600.0


def horizon_policy(horizon_secs: float, *, cancel_to_settle: bool = False) -> str:
    settle = "true" if cancel_to_settle else "false"
    return f"""
    version: 1
    tools:
      book_table:
        kind: mutation
        timeout_secs: 0.4
        deadline_secs: 0.4
        reconciliation: {{commit_horizon_secs: {horizon_secs}, cancel_to_settle: {settle}}}
"""


def fake(clock: ManualClock) -> FakeSystemOfRecord:
    sor = FakeSystemOfRecord(clock=clock)
    sor.add_restaurant("r1", tables=3)
    return sor


async def advance_until(clock: ManualClock, step: float, done: Any, *, what: str) -> None:
    """Move the clock ``step`` at a time until ``done()`` (awaitable or not) holds."""

    async def check() -> bool:
        value = done()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return True
        clock.advance(step)
        return False

    await eventually(check, what=what)


async def test_a_provider_that_commits_after_the_deadline_is_found_committed_never_failed(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = fake(clock)
    sor.faults.set_latency(1.1, kind="book")
    sor.faults.apply_when_abandoned("book")  # a real server goes on when the client leaves
    bookings = Bookings(sor)
    async with running(
        horizon_policy(30),
        [bookings.action(reconcile="lookup")],
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
        clock.advance(0.4)  # the deadline: the effect is stopped, the request is not
        told = await guarded(call, what="the answer at the deadline")
        await eventually(
            lambda: noted(runtime, op.operation_id, "reconcile_not_final"),
            what="a probe that finds no trace yet",
        )
        checking = await runtime.ledger.get(op.operation_id)
        await advance_until(
            clock,
            0.25,
            lambda: sor.side_effects["book"] == 1,
            what="the provider to commit at 1.1 s",
        )
        final = await advance_until_status(runtime, clock, op.operation_id, Status.COMMITTED)
        trail = await runtime.ledger.events(op.operation_id)
        await eventually(lambda: Status.COMMITTED in heard, what="the conversation to be told")

    assert told["status"] == "unknown"
    assert "being checked" in told["message"]
    assert checking.status is Status.UNKNOWN
    assert Status.FAILED_FINAL not in transitions(trail)
    assert final.result == {"booking_id": "bk_0001", "time": "21:00"}
    assert heard == [Status.UNKNOWN, Status.COMMITTED]
    assert sor.side_effects["book"] == 1


async def advance_until_status(
    runtime: Any, clock: ManualClock, operation_id: str, status: Status, step: float = 0.25
) -> Any:
    async def there() -> bool:
        return (await runtime.ledger.get(operation_id)).status is status

    await advance_until(clock, step, there, what=f"{operation_id} to reach {status.value}")
    return await runtime.ledger.get(operation_id)


async def test_no_trace_is_final_only_once_the_horizon_has_passed(
    ledger_url: str, clock: ManualClock
) -> None:
    # The provider never applies it (the fake abandons a call whose client left): after the
    # horizon, and not one probe before, "no trace" is the truth.
    sor = fake(clock)
    sor.faults.hang("book")
    bookings = Bookings(sor)
    async with running(
        horizon_policy(10),
        [bookings.action(reconcile="lookup")],
        ledger_url=ledger_url,
        clock=clock,
        schedule=SCHEDULE,
        lease_secs=LONG_LEASE,
    ) as runtime:
        call = asyncio.ensure_future(runtime.propose("book_table", booking(), new_session()))
        await eventually(lambda: sor.calls["book"] == 1, what="the booking to be sent")
        op = await only_operation(runtime)
        clock.advance(0.4)
        await guarded(call, what="the answer at the deadline")
        unknown_at = clock.now()
        final = await advance_until_status(
            runtime, clock, op.operation_id, Status.FAILED_FINAL, step=0.5
        )
        trail = await runtime.ledger.events(op.operation_id)

    settled_at = next(e.at for e in trail if e.to_status is Status.FAILED_FINAL)
    assert settled_at >= unknown_at + 10
    waits = [a for a in annotations(trail) if "reconcile_not_final" in a]
    assert waits and all(a["horizon_at"] == unknown_at + 10 for a in waits)
    assert final.error is not None and "can no longer be applied" in final.error
    assert not any("escalated" in a for a in annotations(trail))  # waiting spent no probe
    assert sor.side_effects["book"] == 0


async def test_a_cancel_the_provider_confirms_by_key_settles_no_trace_before_the_horizon(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = fake(clock)
    sor.faults.hang("book")
    sor.faults.apply_when_abandoned("book")  # still pending at the provider after the deadline
    bookings = Bookings(sor)
    async with running(
        horizon_policy(600, cancel_to_settle=True),
        [bookings.action(reconcile="lookup", cancel=True)],
        ledger_url=ledger_url,
        clock=clock,
        schedule=SCHEDULE,
        lease_secs=LONG_LEASE,
    ) as runtime:
        call = asyncio.ensure_future(runtime.propose("book_table", booking(), new_session()))
        await eventually(lambda: sor.calls["book"] == 1, what="the booking to be sent")
        op = await only_operation(runtime)
        clock.advance(0.4)
        await guarded(call, what="the answer at the deadline")
        final = await advance_until_status(runtime, clock, op.operation_id, Status.FAILED_FINAL)
        sor.release_hung()  # the aborted request cannot commit any more
        await asyncio.sleep(0)
        trail = await runtime.ledger.events(op.operation_id)

    assert clock.now() < op.created_at + 600
    assert [c.idempotency_key for c in bookings.seen["cancel"]] == [op.idempotency_key]
    assert {"cancel_to_settle": "cancelled"} in annotations(trail)
    assert final.error is not None and "confirmed it cancelled by its key" in final.error
    assert sor.side_effects["book"] == 0


async def test_a_cancel_the_provider_cannot_confirm_leaves_it_to_the_horizon(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = fake(clock)
    sor.faults.hang("book")
    bookings = Bookings(sor)  # the client's task was cancelled: the provider forgot the call
    asked: list[str] = []

    async def cannot_say(ctx: ActionContext) -> CancelOutcome:
        asked.append(ctx.idempotency_key)
        return CancelOutcome.UNKNOWN

    book = action(name="book_table", reconcile=bookings.find, cancel=cannot_say)(bookings.book)
    async with running(
        horizon_policy(5, cancel_to_settle=True),
        [book],
        ledger_url=ledger_url,
        clock=clock,
        schedule=SCHEDULE,
        lease_secs=LONG_LEASE,
    ) as runtime:
        call = asyncio.ensure_future(runtime.propose("book_table", booking(), new_session()))
        await eventually(lambda: sor.calls["book"] == 1, what="the booking to be sent")
        op = await only_operation(runtime)
        clock.advance(0.4)
        await guarded(call, what="the answer at the deadline")
        unknown_at = clock.now()
        await advance_until_status(runtime, clock, op.operation_id, Status.FAILED_FINAL)
        trail = await runtime.ledger.events(op.operation_id)

    assert len(asked) == 1  # asked once; its answer stands
    settled_at = next(e.at for e in trail if e.to_status is Status.FAILED_FINAL)
    assert settled_at >= unknown_at + 5


async def failed_by_a_horizon_too_short(
    runtime: Any, clock: ManualClock, sor: FakeSystemOfRecord, session: Any
) -> Any:
    """Book, with a provider that commits at 3 s: the horizon of 0.5 s is wrong."""
    call = asyncio.ensure_future(runtime.propose("book_table", booking(), session))
    await eventually(lambda: sor.calls["book"] == 1, what="the booking to be sent")
    op = await only_operation(runtime)
    clock.advance(0.4)
    await guarded(call, what="the answer at the deadline")
    await advance_until_status(runtime, clock, op.operation_id, Status.FAILED_FINAL)
    await advance_until(
        clock, 0.5, lambda: sor.side_effects["book"] == 1, what="the provider's late commit"
    )
    return op


async def test_a_commit_reported_after_the_ledger_failed_it_is_a_conflict_recorded_and_told(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = fake(clock)
    sor.faults.set_latency(3.0, kind="book")
    sor.faults.apply_when_abandoned("book")
    bookings = Bookings(sor)
    async with running(
        horizon_policy(0.5),
        [bookings.action(reconcile="lookup")],
        ledger_url=ledger_url,
        clock=clock,
        schedule=SCHEDULE,
        lease_secs=LONG_LEASE,
    ) as runtime:
        session = new_session()
        heard: list[Status] = []
        runtime.listen(session.session_id, lambda op: heard.append(op.status))
        op = await failed_by_a_horizon_too_short(runtime, clock, sor, session)
        # Someone asks the system of record again (the operator's `reconcile`): it has it.
        checked = await runtime.reconcile_unknown(op.operation_id, actor="operator:bob")
        conflicts = await runtime.ledger.list(OperationFilter(conflicted=True))
        others = await runtime.ledger.list(OperationFilter(conflicted=False))
        metrics = runtime.metrics.snapshot()
        trail = await runtime.ledger.events(op.operation_id)

    assert checked.status is Status.COMMITTED
    assert checked.result == {"booking_id": "bk_0001", "time": "21:00"}
    assert checked.escalated_at is not None
    assert transitions(trail)[-2:] == [Status.FAILED_FINAL, Status.COMMITTED]
    conflict = trail[-1].detail
    assert trail[-1].actor == "operator:bob"
    assert "ledger held it as failed" in conflict["conflict"]
    assert [c.operation_id for c in conflicts] == [op.operation_id]
    assert others == []
    assert metrics["tools"]["book_table"]["conflicts"] == 1
    assert heard[-1] is Status.COMMITTED  # a live conversation of the session hears it
    assert sor.side_effects["book"] == 1


async def test_a_failed_operation_the_system_of_record_has_no_trace_of_stays_failed(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = fake(clock)
    sor.faults.hang("book")
    bookings = Bookings(sor)
    async with running(
        horizon_policy(0.5),
        [bookings.action(reconcile="lookup")],
        ledger_url=ledger_url,
        clock=clock,
        schedule=SCHEDULE,
        lease_secs=LONG_LEASE,
    ) as runtime:
        call = asyncio.ensure_future(runtime.propose("book_table", booking(), new_session()))
        await eventually(lambda: sor.calls["book"] == 1, what="the booking to be sent")
        op = await only_operation(runtime)
        clock.advance(0.4)
        await guarded(call, what="the answer at the deadline")
        await advance_until_status(runtime, clock, op.operation_id, Status.FAILED_FINAL)
        checked = await runtime.reconcile_unknown(op.operation_id, actor="operator:bob")
        conflicts = await runtime.ledger.list(OperationFilter(conflicted=True))

    assert checked.status is Status.FAILED_FINAL
    assert conflicts == []


async def test_a_conflict_corrects_what_the_conversation_was_told_in_words(
    ledger_url: str, clock: ManualClock
) -> None:
    from pipecat_actions.results import render_operation

    sor = fake(clock)
    sor.faults.set_latency(3.0, kind="book")
    sor.faults.apply_when_abandoned("book")
    bookings = Bookings(sor)
    async with running(
        horizon_policy(0.5),
        [bookings.action(reconcile="lookup")],
        ledger_url=ledger_url,
        clock=clock,
        schedule=SCHEDULE,
        lease_secs=LONG_LEASE,
    ) as runtime:
        session = new_session()
        op = await failed_by_a_horizon_too_short(runtime, clock, sor, session)
        # The conversation was told it failed.
        await runtime.ledger.annotate(
            op.operation_id,
            actor="gate:call-1",
            changes={"delivered_status": Status.FAILED_FINAL.value, "delivered_at": clock.now()},
        )
        final = await runtime.reconcile_unknown(op.operation_id, actor="operator:bob")

    told = render_operation(final, reconcilable=True)
    assert told["status"] == "committed"
    assert "told earlier" in told["correction"] and "did not happen" in told["correction"]
    assert told["correction"] in told["message"]


def _cli(capsys: Any, *argv: str) -> tuple[str, str]:
    from pipecat_actions.cli import main

    assert main(list(argv)) == 0
    captured = capsys.readouterr()
    return captured.out, captured.err


async def test_an_operator_lists_and_counts_the_conflicts_and_nothing_else(
    ledger_url: str, clock: ManualClock, capsys: Any
) -> None:
    import json

    sor = fake(clock)
    sor.faults.set_latency(3.0, kind="book")
    sor.faults.apply_when_abandoned("book")
    bookings = Bookings(sor)
    async with running(
        horizon_policy(0.5),
        [bookings.action(reconcile="lookup")],
        ledger_url=ledger_url,
        clock=clock,
        schedule=SCHEDULE,
        lease_secs=LONG_LEASE,
    ) as runtime:
        session = new_session()
        op = await failed_by_a_horizon_too_short(runtime, clock, sor, session)
        await runtime.reconcile_unknown(op.operation_id, actor="operator:bob")
        # A booking another process ran and committed: no conflict.
        other = NewOperation(
            tool="book_table",
            kind="mutation",
            args=booking("22:00"),
            idempotency_key="book|22:00",
            session_id="call-2",
            principal="alice",
            status=Status.RUNNING,
        )
        admitted = (await runtime.ledger.admit(other)).operation
        await runtime.ledger.transition(
            admitted.operation_id,
            expected=Status.RUNNING,
            to=Status.COMMITTED,
            fence=admitted.fence,
            actor="worker:elsewhere",
        )
        fine = {"operation_id": admitted.operation_id}

    listed, _ = await asyncio.to_thread(
        _cli, capsys, "ledger", "list", "--conflicts", "--ledger", ledger_url, "--json"
    )
    text, _ = await asyncio.to_thread(
        _cli, capsys, "ledger", "list", "--conflicts", "--ledger", ledger_url
    )
    everything, _ = await asyncio.to_thread(
        _cli, capsys, "ledger", "list", "--ledger", ledger_url, "--json"
    )
    stats, _ = await asyncio.to_thread(_cli, capsys, "stats", "--ledger", ledger_url, "--json")
    stats_text, _ = await asyncio.to_thread(_cli, capsys, "stats", "--ledger", ledger_url)

    rows = json.loads(listed)
    assert [(r["operation_id"], r["status"], r["escalated"]) for r in rows] == [
        (op.operation_id, "COMMITTED", True)
    ]
    assert op.operation_id in text and fine["operation_id"] not in text
    assert {r["operation_id"] for r in json.loads(everything)} == {
        op.operation_id,
        fine["operation_id"],
    }
    figures = json.loads(stats)
    assert figures["conflicts"] == 1
    assert figures["tools"]["book_table"]["conflicts"] == 1
    assert figures["tools"]["book_table"]["by_status"] == {"COMMITTED": 2}
    assert stats_text.splitlines()[1].startswith("CONFLICTS: 1 ")  # after the ledger line
    assert "conflicts                  1" in stats_text
