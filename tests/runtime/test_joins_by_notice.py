"""A call joined to an operation another process runs hears its outcome when it settles.

The clock never moves in these tests: a waiter that polled would still be in its first pause,
so only the ledger's notice can wake it (PostgreSQL NOTIFY; on SQLite a datagram).
"""

from __future__ import annotations

import asyncio

from pipecat_actions.clock import ManualClock
from pipecat_actions.ledger import SqlLedger
from pipecat_actions.session import SessionState
from tests.runtime._execution_support import eventually, gather_all, guarded
from tests.runtime.test_ledger_saturation import CountingLedger, Gate, callers, open_runtime


async def test_joined_callers_hear_another_processs_outcome_without_the_clock_moving(
    ledger_url: str, clock: ManualClock
) -> None:
    gate = Gate()
    runner_ledger = await SqlLedger.create(ledger_url, clock=clock)
    runner = await open_runtime(runner_ledger, gate)
    waiter_ledger = CountingLedger(await SqlLedger.create(ledger_url, clock=clock))
    waiter = await open_runtime(waiter_ledger, Gate())
    try:
        first = asyncio.ensure_future(
            runner.propose("book_table", {"time": "21:00"}, SessionState("s-run", "p"))
        )
        await guarded(gate.started.wait(), what="the booking to start")
        joiners = [
            asyncio.ensure_future(waiter.propose("book_table", {"time": "21:00"}, s))
            for s in callers(20)
        ]
        await eventually(
            lambda: waiter._elsewhere.waiting == len(joiners),
            what="the joiners to wait for the booking",
        )
        reads_before = sum(waiter_ledger.gets.values())
        gate.release.set()
        committed = await guarded(first, what="the booking to commit")
        results = await gather_all(*joiners)
    finally:
        await waiter.close()
        await runner.close()
        await waiter_ledger.inner.close()
        await runner_ledger.close()

    assert {r["status"] for r in results} == {"committed"}
    assert {r["operation_id"] for r in results} == {committed["operation_id"]}
    assert sum(gate.bookings.values()) == 1
    # Woken once, by the notice: one re-read for all of them, not one per caller.
    assert sum(waiter_ledger.gets.values()) - reads_before <= 2
