"""Execution: write-ahead, classified outcomes, lost answers, reconciliation and retries.

Each test runs the real runtime on both ledger backends against a `FakeSystemOfRecord` that
counts real side effects, and checks what the ledger, the audit trail and the provider say.
"""

from __future__ import annotations

import asyncio

from pipecat_actions.clock import ManualClock
from pipecat_actions.ledger.records import EventKind
from pipecat_actions.testing import FakeSystemOfRecord
from tests.runtime._execution_support import (
    T0,
    Bookings,
    RecordingClock,
    annotations,
    booking,
    eventually,
    guarded,
    new_session,
    noted,
    only_operation,
    policy,
    reaches,
    running,
    transitions,
)
from tests.runtime._execution_support import S as Status

NON_IDEMPOTENT = """
    version: 1
    tools:
      book_table:
        kind: mutation
        idempotency: {key_fields: [restaurant_id, date, time, party_size]}
"""

RETRYING = """
    version: 1
    tools:
      book_table:
        kind: mutation
        deadline_secs: 200
        idempotency: {provider_dedupes: true}
        retry:
          max_attempts: 3
          initial_backoff_secs: 1.0
          multiplier: 3.0
          max_backoff_secs: 10.0
          jitter: 0.0
"""


def fake(clock: ManualClock | None = None, *, honours_keys: bool = True) -> FakeSystemOfRecord:
    sor = FakeSystemOfRecord(clock=clock, honours_idempotency_keys=honours_keys)
    sor.add_restaurant("r1", tables=3)
    return sor


# --- lost answers ------------------------------------------------------------------------


async def test_a_lost_answer_is_unknown_never_resent_and_reconciled_to_committed(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = fake(clock, honours_keys=False)
    sor.faults.lose_response_after_commit("book")
    bookings = Bookings(sor)
    async with running(
        NON_IDEMPOTENT, [bookings.action()], ledger_url=ledger_url, clock=clock
    ) as runtime:
        told = await runtime.propose("book_table", booking(), new_session())

        op = await only_operation(runtime)
        trail = await runtime.ledger.events(op.operation_id)

    assert sor.calls["book"] == 1
    assert sor.side_effects["book"] == 1
    assert sor.effects_for_key(op.idempotency_key) == 1
    assert op.status is Status.COMMITTED
    assert op.attempt == 1
    assert op.result == {"booking_id": "bk_0001", "time": "21:00"}
    assert transitions(trail) == [Status.UNKNOWN, Status.COMMITTED]
    assert trail[-1].detail == {"reason": "reconciled"}
    assert [ctx.idempotency_key for ctx in bookings.seen["reconcile"]] == [op.idempotency_key]
    assert told["status"] == "committed"
    assert told["result"] == {"booking_id": "bk_0001", "time": "21:00"}


async def test_a_lost_answer_without_a_reconcile_hook_stays_unknown_and_is_escalated(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = fake(clock, honours_keys=False)
    sor.faults.lose_response_after_commit("book")
    bookings = Bookings(sor)
    async with running(
        NON_IDEMPOTENT, [bookings.action(reconcile=None)], ledger_url=ledger_url, clock=clock
    ) as runtime:
        told = await runtime.propose("book_table", booking(), new_session())

        op = await only_operation(runtime)
        trail = await runtime.ledger.events(op.operation_id)

    assert sor.calls["book"] == 1
    assert sor.side_effects["book"] == 1
    assert op.status is Status.UNKNOWN
    assert op.attempt == 1
    assert op.escalated_at == T0
    assert transitions(trail) == [Status.UNKNOWN]
    escalations = [a for a in annotations(trail) if "escalated" in a]
    assert len(escalations) == 1
    assert "no reconcile hook" in escalations[0]["escalated"]
    assert told["status"] == "unknown"
    assert told["operation_id"] == op.operation_id
    assert "not yet known" in told["message"]
    words = told["message"].lower()
    assert "done" not in words and "cancel" not in words and "succeeded." not in words


async def test_a_lost_answer_the_provider_never_committed_fails_only_once_its_horizon_passed(
    ledger_url: str, clock: ManualClock
) -> None:
    # The client gives up while the provider is still working (its latency is on the manual
    # clock): "no trace" at once is no proof, since the provider may still apply the request
    # until its commit horizon (5 s here). Only after it does no trace mean it did not happen.
    sor = fake(clock, honours_keys=False)
    sor.faults.set_latency(10.0)
    bookings = Bookings(sor)
    bookings.client_gives_up = asyncio.Event()
    policy = NON_IDEMPOTENT + "        reconciliation: {commit_horizon_secs: 5}\n"
    async with running(policy, [bookings.action()], ledger_url=ledger_url, clock=clock) as runtime:
        call = asyncio.ensure_future(runtime.propose("book_table", booking(), new_session()))
        await eventually(lambda: sor.calls["book"] == 1, what="the request to be sent")
        bookings.client_gives_up.set()  # the client's own timeout, while the provider works
        told = await guarded(call, what="the answer after the client gave up")
        op = await only_operation(runtime)
        await eventually(
            lambda: noted(runtime, op.operation_id, "reconcile_not_final"),
            what="a probe that finds no trace before the horizon",
        )
        before = await runtime.ledger.get(op.operation_id)
        clock.advance(5.0)
        after = await reaches(runtime, op.operation_id, Status.FAILED_FINAL)

    assert told["status"] == "unknown"
    assert before.status is Status.UNKNOWN
    assert after.attempt == 1
    assert sor.calls["book"] == 1
    assert sor.side_effects["book"] == 0
    assert [c.outcome for c in sor.log] == ["abandoned"]


# --- write-ahead ------------------------------------------------------------------------


async def test_the_ledger_says_running_and_sent_before_the_provider_is_called(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = fake(clock)
    bookings = Bookings(sor)
    async with running(
        NON_IDEMPOTENT, [bookings.action()], ledger_url=ledger_url, clock=clock
    ) as runtime:
        bookings.ledger = runtime.ledger
        await runtime.propose("book_table", booking(), new_session())

    assert bookings.status_at_send == [(Status.RUNNING, T0)]


# --- retries ----------------------------------------------------------------------------


async def test_transient_failures_of_an_idempotent_tool_are_retried_on_the_policy_backoff(
    ledger_url: str,
) -> None:
    clock = RecordingClock()
    sor = fake(clock)
    sor.faults.error_before_send("book", times=2)
    bookings = Bookings(sor)
    retry = policy(RETRYING)["book_table"].retry
    first, second = retry.delay_for(1, rand=0.5), retry.delay_for(2, rand=0.5)
    assert (first, second) == (1.0, 3.0)
    async with running(
        RETRYING, [bookings.action()], ledger_url=ledger_url, clock=clock, lease_secs=3600.0
    ) as runtime:
        call = asyncio.ensure_future(runtime.propose("book_table", booking(), new_session()))
        for attempt, delay in ((1, first), (2, second)):
            await eventually(
                lambda n=attempt, d=delay: clock.requested.count(d) == 1 and sor.calls["book"] == n,
                what=f"the backoff sleep after attempt {attempt}",
            )
            waiting = clock.sleepers
            clock.advance(delay - 2**-10)
            assert clock.sleepers == waiting, "a retry woke up before its backoff was over"
            assert sor.calls["book"] == attempt
            clock.advance(2**-10)
            assert clock.sleepers == waiting - 1
        told = await guarded(call, what="the booking's outcome")

        op = await only_operation(runtime)
        trail = await runtime.ledger.events(op.operation_id)

    # The only short sleeps were the two backoffs (the heartbeat and watchdog wait far longer).
    assert [secs for secs in clock.requested if secs < 100] == [first, second]
    assert [(c.outcome, c.at) for c in sor.log] == [
        ("unavailable", T0),
        ("unavailable", T0 + first),
        ("committed", T0 + first + second),
    ]
    assert sor.effects_for_key(op.idempotency_key) == 1
    assert sor.side_effects["book"] == 1
    assert op.status is Status.COMMITTED
    assert op.attempt == 3
    assert told["status"] == "committed"
    steps = [(e.to_status, e.at) for e in trail if e.kind is EventKind.TRANSITION]
    assert steps == [
        (Status.FAILED_RETRYABLE, T0),
        (Status.RUNNING, T0 + first),
        (Status.FAILED_RETRYABLE, T0 + first),
        (Status.RUNNING, T0 + first + second),
        (Status.COMMITTED, T0 + first + second),
    ]


async def test_retries_stop_at_max_attempts_and_the_failure_is_final(ledger_url: str) -> None:
    clock = RecordingClock()
    sor = fake(clock)
    sor.faults.error_before_send("book", times=3)
    bookings = Bookings(sor)
    async with running(
        RETRYING, [bookings.action()], ledger_url=ledger_url, clock=clock, lease_secs=3600.0
    ) as runtime:
        call = asyncio.ensure_future(runtime.propose("book_table", booking(), new_session()))
        for attempt, delay in ((1, 1.0), (2, 3.0)):
            await eventually(
                lambda n=attempt, d=delay: sor.calls["book"] == n and d in clock.requested,
                what=f"the backoff after attempt {attempt}",
            )
            clock.advance(delay)
        told = await guarded(call, what="the booking's outcome")
        op = await only_operation(runtime)

    assert sor.calls["book"] == 3
    assert sor.side_effects["book"] == 0
    assert op.status is Status.FAILED_FINAL
    assert op.attempt == 3
    assert "no retry left" in (op.error or "")
    assert told["status"] == "failed_final"


async def test_a_refusal_after_sending_is_final_and_never_retried(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = fake(clock)
    sor.faults.fail_after_send("book")
    bookings = Bookings(sor)
    async with running(
        RETRYING, [bookings.action()], ledger_url=ledger_url, clock=clock, lease_secs=3600.0
    ) as runtime:
        told = await runtime.propose("book_table", booking(), new_session())
        op = await only_operation(runtime)

    assert sor.calls["book"] == 1
    assert sor.side_effects["book"] == 0
    assert op.status is Status.FAILED_FINAL
    assert op.attempt == 1
    assert told["status"] == "failed_final"
    assert "did not happen" in told["message"]


async def test_a_lost_answer_of_an_idempotent_tool_is_reconciled_not_retried(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = fake(clock)
    sor.faults.lose_response_after_commit("book")
    bookings = Bookings(sor)
    async with running(
        RETRYING, [bookings.action()], ledger_url=ledger_url, clock=clock, lease_secs=3600.0
    ) as runtime:
        told = await runtime.propose("book_table", booking(), new_session())
        op = await only_operation(runtime)

    assert sor.calls["book"] == 1
    assert op.status is Status.COMMITTED
    assert op.attempt == 1
    assert told["status"] == "committed"
