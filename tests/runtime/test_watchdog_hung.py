"""An effect that hangs and ignores cancellation, on the real clock.

The watchdog bounds the wait to the deadline: the operation is UNKNOWN (maybe sent) or
FAILED_FINAL by then, other tools keep running, and when the hung call finally answers, the
answer is recorded as a late event. Per the executor's contract a late answer only settles an
operation that is still UNKNOWN; it never overwrites a terminal status.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from pipecat_actions.actions import ActionContext, ActionDefinition, action
from pipecat_actions.execution.executor import ReconcileSchedule
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.testing import FakeSystemOfRecord
from tests.runtime._execution_support import (
    Bookings,
    annotations,
    booking,
    eventually,
    new_session,
    reaches,
    running,
    transitions,
)
from tests.runtime._execution_support import S as Status

DEADLINE_SECS = 0.3
MARGIN_SECS = 0.05

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
"""Reconciliation keeps asking for about five seconds."""


def hung_fake() -> FakeSystemOfRecord:
    sor = FakeSystemOfRecord()
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


async def test_a_hung_effect_is_bounded_by_its_deadline_while_other_tools_flow(
    ledger_url: str,
) -> None:
    sor = hung_fake()
    bookings = Bookings(sor)
    async with running(
        HUNG,
        [bookings.action(reconcile="patient"), refund_action(sor)],
        ledger_url=ledger_url,
        schedule=PROBE_OFTEN,
    ) as runtime:
        session = new_session()
        started = time.monotonic()
        hung = asyncio.ensure_future(runtime.propose("book_table", booking(), session))
        await eventually(lambda: sor.calls["book"] == 1, what="the booking to be sent")

        refunds = await asyncio.gather(
            *(
                runtime.propose("refund", {"payment_id": "pay_1", "amount_cents": 100 + n}, session)
                for n in range(5)
            )
        )
        flowed_at = time.monotonic() - started
        told = await hung
        elapsed = time.monotonic() - started
        op_id = told["operation_id"]
        at_deadline = await runtime.ledger.get(op_id)
        lateness = list(runtime.watchdog.lateness_secs)
        marked = (await runtime.ledger.events(op_id))[-1].at - (at_deadline.deadline_at or 0)

        sor.release_hung()
        final = await reaches(runtime, op_id, Status.COMMITTED)
        await eventually(lambda: late_events(runtime, op_id), what="the late answer")
        trail = await runtime.ledger.events(op_id)

    assert [r["status"] for r in refunds] == ["committed"] * 5
    assert flowed_at < DEADLINE_SECS, "the other tool waited for the hung one"
    assert sor.side_effects["refund"] == 5
    assert elapsed <= DEADLINE_SECS + MARGIN_SECS, (
        f"answered after {elapsed:.3f} s; watchdog late by {lateness}, UNKNOWN written "
        f"{marked:.3f} s after the deadline"
    )
    assert told["status"] == "unknown"
    assert at_deadline.status is Status.UNKNOWN
    # The truth arrives later: the booking did happen, exactly once, and the ledger says so.
    assert final.status is Status.COMMITTED
    assert final.result == {"booking_id": "bk_0001", "time": "21:00"}
    assert transitions(trail)[:2] == [Status.UNKNOWN, Status.COMMITTED]
    assert sor.side_effects["book"] == 1
    assert sor.calls["book"] == 1


async def test_a_late_answer_settles_an_unknown_operation_without_a_reconcile_hook(
    ledger_url: str,
) -> None:
    sor = hung_fake()
    bookings = Bookings(sor)
    async with running(HUNG, [bookings.action(reconcile=None)], ledger_url=ledger_url) as runtime:
        started = time.monotonic()
        told = await runtime.propose("book_table", booking(), new_session())
        elapsed = time.monotonic() - started
        op_id = told["operation_id"]

        async def is_escalated() -> bool:
            return (await runtime.ledger.get(op_id)).escalated_at is not None

        await eventually(is_escalated, what="the escalation")
        escalated = await runtime.ledger.get(op_id)

        sor.release_hung()
        final = await reaches(runtime, op_id, Status.COMMITTED)
        late = await late_events(runtime, op_id)
        trail = await runtime.ledger.events(op_id)

    assert elapsed <= DEADLINE_SECS + MARGIN_SECS, f"answered after {elapsed:.3f} s"
    assert told["status"] == "unknown"
    assert escalated.status is Status.UNKNOWN
    assert escalated.result is None
    assert final.result == {"booking_id": "bk_0001", "time": "21:00"}
    assert late == [{"late_answer": "result", "error": "None"}]
    assert transitions(trail) == [Status.UNKNOWN, Status.COMMITTED]
    assert trail[-1].detail == {"reason": "late answer"}
    assert sor.side_effects["book"] == 1


async def test_a_late_answer_never_overwrites_a_terminal_status(ledger_url: str) -> None:
    # The reconcile probe finds no trace while the hung call is still in flight, so the
    # operation is FAILED_FINAL; the call then commits after all.
    sor = hung_fake()
    bookings = Bookings(sor)
    async with running(
        HUNG, [bookings.action(reconcile="lookup")], ledger_url=ledger_url
    ) as runtime:
        started = time.monotonic()
        told = await runtime.propose("book_table", booking(), new_session())
        elapsed = time.monotonic() - started
        op_id = told["operation_id"]
        failed = await reaches(runtime, op_id, Status.FAILED_FINAL)

        sor.release_hung()
        await eventually(lambda: late_events(runtime, op_id), what="the late answer")
        final = await runtime.ledger.get(op_id)
        late = await late_events(runtime, op_id)
        trail = await runtime.ledger.events(op_id)

    assert elapsed <= DEADLINE_SECS + MARGIN_SECS, f"answered after {elapsed:.3f} s"
    assert told["status"] in ("unknown", "failed_final")
    assert final.status is Status.FAILED_FINAL
    assert final.finished_at == failed.finished_at
    assert final.result is None
    assert transitions(trail) == [Status.UNKNOWN, Status.FAILED_FINAL]
    assert late == [{"late_answer": "result", "error": "None"}]
    assert sor.side_effects["book"] == 1
