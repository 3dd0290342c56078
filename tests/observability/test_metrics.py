"""In-process metrics from real runs: the real runtime and ledger (both backends), the fake
system of record with its fault switches; every count read back with `runtime.metrics`."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from typing import Any

from pipecat_actions.actions import ActionContext, action
from pipecat_actions.clock import ManualClock
from pipecat_actions.testing import FakeSystemOfRecord
from tests.runtime._execution_support import (
    Bookings,
    RecordingClock,
    annotations,
    booking,
    eventually,
    new_session,
    reaches,
    running,
)
from tests.runtime._execution_support import S as Status

# The fake provider forgets a call whose client left (commit horizon 0): once the deadline
# stopped the effect, no trace of the booking is the truth at once.
POLICY = """
    version: 1
    defaults:
      reconciliation: {commit_horizon_secs: 0}
    tools:
      book_table:
        kind: mutation
        deadline_secs: 30
      book_later:
        kind: mutation
        admit_when: turn_confirmed
        deadline_secs: 30
      book_cancellable:
        kind: mutation
        on_interruption: request_cancel
        deadline_secs: 30
      book_retrying:
        kind: mutation
        deadline_secs: 200
        idempotency: {provider_dedupes: true}
        retry: {max_attempts: 3, initial_backoff_secs: 1.0, jitter: 0.0}
      find_tables:
        kind: read
"""


def fake(clock: ManualClock, **options: Any) -> FakeSystemOfRecord:
    sor = FakeSystemOfRecord(clock=clock, **options)
    sor.add_restaurant("r1", tables=50)
    return sor


def actions(bookings: Bookings, *, reconcile: str | None = "lookup") -> list[Any]:
    async def find_tables(ctx: ActionContext, restaurant_id: str) -> dict[str, Any]:
        """Find free tables."""
        return {"free": 3}

    return [
        bookings.action(reconcile=reconcile, compensate=True),
        bookings.action(name="book_later"),
        bookings.action(name="book_cancellable", cancel=True),
        bookings.action(name="book_retrying"),
        action(name="find_tables")(find_tables),
    ]


def tool(runtime: Any, name: str = "book_table") -> dict[str, Any]:
    return runtime.metrics.snapshot()["tools"].get(name, {})


async def test_a_repeated_call_is_counted_as_a_suppressed_duplicate_and_runs_once(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = fake(clock)
    async with running(POLICY, actions(Bookings(sor)), ledger_url=ledger_url, clock=clock) as rt:
        session = new_session()
        first = await rt.propose("book_table", booking(), session, tool_call_id="call-a")
        again = await rt.propose("book_table", booking(), session, tool_call_id="call-b")
        await rt.flush()  # the join's audit note is written after the call is answered
        trail = await rt.ledger.events(first["operation_id"])
        seen = tool(rt)

    assert first["operation_id"] == again["operation_id"]
    assert sor.side_effects["book"] == 1
    assert seen["proposals"] == {"admitted": 1, "joined": 1}
    assert seen["duplicates_suppressed"] == {"joined": 1}
    assert seen["operations"] == 1
    assert seen["attempts"] == 1
    assert seen["outcomes"] == {"COMMITTED": 1}
    assert seen["admission_latency_secs"]["count"] == 2
    assert seen["execution_to_commit_secs"]["count"] == 1
    assert seen["rates"]["duplicate_rate"] == 0.5
    # The ledger says the second call was the model repeating itself, not a retry of ours.
    joined = [a for a in annotations(trail) if "duplicates_joined" in a]
    assert joined == [
        {"duplicates_joined": [{"tool_call_id": "call-b", "turn_id": "0", "session_id": "call-1"}]}
    ]


async def test_a_deadline_while_sent_counts_a_timeout_and_unknown_until_reconciled(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = fake(clock)
    sor.faults.hang("book")
    async with running(
        POLICY, actions(Bookings(sor)), ledger_url=ledger_url, clock=clock, lease_secs=3600.0
    ) as rt:
        told = await rt.propose("book_table", booking(), new_session(), wait=False)
        await reaches(rt, told["operation_id"], Status.RUNNING)
        clock.advance(30)
        await reaches(rt, told["operation_id"], Status.FAILED_FINAL)
        seen = tool(rt)

    assert seen["timeouts"] == 1
    assert seen["unknown"] == 1
    assert seen["unknown_now"] == 0
    assert seen["reconciliations"] == {"not_happened": 1}
    assert seen["outcomes"] == {"FAILED_FINAL": 1}
    assert seen["rates"]["timeout_rate"] == 1.0


async def test_an_unknown_that_cannot_be_checked_stays_on_the_unknown_gauge(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = fake(clock)
    sor.faults.lose_response_after_commit("book", times=2)
    bookings = Bookings(sor)
    async with running(
        POLICY, actions(bookings, reconcile=None), ledger_url=ledger_url, clock=clock
    ) as rt:
        one = await rt.propose("book_table", booking("21:00"), new_session())
        two = await rt.propose("book_table", booking("22:00"), new_session())
        seen = tool(rt)

    assert (one["status"], two["status"]) == ("unknown", "unknown")
    assert seen["unknown"] == 2
    assert seen["unknown_now"] == 2
    assert seen["escalations"] == 2
    assert "outcomes" not in seen


async def test_a_transient_failure_retried_counts_two_attempts_and_one_retry(
    ledger_url: str,
) -> None:
    clock = RecordingClock()
    sor = fake(clock)
    sor.faults.error_before_send("book", times=1)
    async with running(
        POLICY, actions(Bookings(sor)), ledger_url=ledger_url, clock=clock, lease_secs=3600.0
    ) as rt:
        call = asyncio.ensure_future(rt.propose("book_retrying", booking(), new_session()))
        await eventually(lambda: 1.0 in clock.requested, what="the backoff")
        clock.advance(1.0)
        told = await asyncio.wait_for(call, 60)  # a hang guard
        seen = tool(rt, "book_retrying")

    assert told["status"] == "committed"
    assert seen["attempts"] == 2
    assert seen["retries"] == 1
    assert seen["rates"]["retry_rate"] == 1.0
    assert seen["outcomes"] == {"COMMITTED": 1}


async def test_cancellations_are_counted_as_requested_confirmed_or_before_sending(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = fake(clock)
    sor.faults.set_latency(10.0)
    async with running(
        POLICY, actions(Bookings(sor)), ledger_url=ledger_url, clock=clock, lease_secs=3600.0
    ) as rt:
        waiting = await rt.propose("book_later", booking(), new_session(), wait=False)
        await rt.cancel(waiting["operation_id"], reason="changed their mind")
        sent = await rt.propose("book_cancellable", booking(), new_session(), wait=False)
        await eventually(lambda: sor.calls["book"] == 1, what="the request to be sent")
        cancelled = await rt.cancel(sent["operation_id"], reason="the user interrupted")
        later, cancellable = tool(rt, "book_later"), tool(rt, "book_cancellable")

    assert cancelled.status is Status.CANCELLED
    assert later["cancelled_before_send"] == 1
    assert "cancellations_requested" not in later
    assert cancellable["cancellations_requested"] == 1
    assert cancellable["cancellations_confirmed"] == 1
    assert cancellable["rates"]["cancel_confirm_rate"] == 1.0


async def test_a_compensation_counts_on_the_compensation_and_the_reversed_tool(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = fake(clock)
    async with running(POLICY, actions(Bookings(sor)), ledger_url=ledger_url, clock=clock) as rt:
        told = await rt.propose("book_table", booking(), new_session())
        await rt.compensate(told["operation_id"], actor="operator:bob", reason="wrong day")
        original, compensation = tool(rt), tool(rt, "book_table.compensate")

    assert original["compensated"] == 1
    assert original["outcomes"] == {"COMMITTED": 1, "COMPENSATED": 1}
    assert compensation["compensations"] == 1
    assert compensation["outcomes"] == {"COMMITTED": 1}


async def test_refusals_count_by_reason_and_reads_count_once_recorded(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = fake(clock)
    async with running(POLICY, actions(Bookings(sor)), ledger_url=ledger_url, clock=clock) as rt:
        await rt.propose("book_table", {"restaurant_id": "r1"}, new_session())
        await rt.propose("find_tables", {"restaurant_id": "r1"}, new_session())
        await rt.flush()
        booking_, read = tool(rt), tool(rt, "find_tables")

    assert booking_["refusals"] == {"invalid_arguments": 1}
    assert booking_["proposals"] == {"refused": 1}
    assert read["proposals"] == {"read": 1}
    assert (read["operations"], read["attempts"]) == (1, 1)
    assert read["outcomes"] == {"COMMITTED": 1}


def test_importing_the_package_and_running_a_call_imports_no_exporter() -> None:
    code = """
import asyncio, sys, tempfile
from pipecat_actions import ActionRuntime, AllowAll, SessionState, action, load_policy_text
import pipecat_actions.observability

@action
async def find_tables(ctx, restaurant_id: str) -> dict:
    '''Find free tables.'''
    return {"free": 3}

async def main():
    policy = load_policy_text("version: 1\\ntools:\\n  find_tables: {kind: read}\\n")
    with tempfile.TemporaryDirectory() as where:
        rt = await ActionRuntime.create(policy, authorizer=AllowAll(), actions=[find_tables],
                                        ledger_url=f"sqlite:///{where}/l.db")
        await rt.propose("find_tables", {"restaurant_id": "r1"}, SessionState("s", "p"))
        assert rt.metrics.snapshot()["tools"]["find_tables"]["proposals"] == {"read": 1}
        await rt.close()

asyncio.run(main())
loaded = sorted({m.split(".")[0] for m in sys.modules} & {"opentelemetry", "prometheus_client"})
print(loaded)
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert done.stdout.strip().splitlines()[-1] == "[]", done.stderr
