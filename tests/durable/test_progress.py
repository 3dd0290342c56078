"""A durable effect's progress reports reach the live call that handed it to a worker.

The effect runs on a real ``pipecat-actions worker --dbos`` process, whose runtime writes each
``ctx.report`` to the ledger; the bot (a runtime of this process, a DBOS client only) hears it
through the ledger's notice, or on its watcher's pause when notices are lost, and tells it in
the call per ``delivery.intermediate``, in order, once, and never once the outcome is known.
The tracked transfer reports, then waits behind a gate the test opens (a row the effect looks
for), so each report is heard before the next one is made.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from pipecat_actions.clock import ManualClock
from pipecat_actions.durable import DurableLedger
from pipecat_actions.ledger import SqlLedger
from pipecat_actions.status import ActionStatus
from tests._waiting import eventually, guarded
from tests.durable import _app
from tests.durable._support import Workers, bot, rows, session
from tests.runtime.test_deliveries import Recorder

pytestmark = pytest.mark.postgres
S = ActionStatus
ARGS = {"account": "acc-1", "amount_cents": 700}
CHECKING, SENDING = _app.TRACKED_REPORTS


async def _open_gate(url: str, operation_id: str, gate: int) -> None:
    await rows(url, "INSERT INTO provider_gates VALUES ($1, $2) RETURNING gate", operation_id, gate)


def _progress(outlet: Recorder) -> list[str]:
    return [told.content["progress"] for told in outlet.told if told.progress]


def _told(outlet: Recorder) -> list[str]:
    """What the call was told, in order: each report's message, or the outcome's status."""
    return [
        told.content["progress"] if told.progress else told.content.get("status", "?")
        for told in outlet.told
    ]


async def test_a_live_call_hears_its_workers_progress_in_order_then_the_outcome_once(
    durable_url: str, tmp_path: Path
) -> None:
    # The bot's clock stands still: its watcher's pause never ends, so what it hears, it
    # hears from the worker's notices.
    clock = ManualClock(time.time())
    workers = Workers(durable_url, tmp_path)
    await workers.start("w1")
    try:
        async with bot(durable_url, clock=clock) as runtime:
            outlet = Recorder()
            delivery = runtime.deliveries.open(session(), outlet)
            delivery.start()
            started = await runtime.propose("transfer_tracked", ARGS, session(), wait=False)
            op_id = started["operation_id"]
            delivery.await_outcome(op_id)  # the call was answered "started" (as the adapter does)
            # Each report is heard while the effect waits behind its gate: caused by the
            # worker's write and its notice.
            await eventually(lambda: _progress(outlet) == [CHECKING], what="the first report")
            await _open_gate(durable_url, op_id, 1)
            await eventually(
                lambda: _progress(outlet) == [CHECKING, SENDING], what="the second report"
            )
            await _open_gate(durable_url, op_id, 2)
            final = await guarded(runtime.wait(op_id), what="the worker's outcome")
            await eventually(lambda: "committed" in _told(outlet), what="the outcome told")
            await outlet.settled()
            told = _told(outlet)
            details = [t.content.get("details") for t in outlet.told if t.progress]
            ids = {t.operation.operation_id for t in outlet.told}
            delivery.close()
            outlet.stop()
    finally:
        await workers.stop()
    assert final.status is S.COMMITTED
    assert told == [CHECKING, SENDING, "committed"]
    assert details == [{"step": 1}, {"step": 2}]
    assert ids == {op_id}
    (effect,) = await rows(durable_url, "SELECT operation_id FROM provider_effects")
    assert effect["operation_id"] == op_id


class _Deaf(DurableLedger):
    """A durable ledger whose notices are all lost: its waiters hear nothing, ever."""

    @contextlib.asynccontextmanager
    async def notices(self, operation_id: str) -> AsyncIterator[asyncio.Event | None]:
        yield asyncio.Event()  # listening, and never woken


async def test_with_notices_lost_the_call_hears_progress_on_its_pause_and_none_after_the_outcome(
    durable_url: str, tmp_path: Path
) -> None:
    # The bot's clock is the test's: its watcher re-reads only when its pause ends, which is
    # when the test moves the clock. Anchored at the real time, as the worker's clock is.
    clock = ManualClock(time.time())
    workers = Workers(durable_url, tmp_path)
    await workers.start("w1")
    try:
        async with (
            bot(durable_url, durable=_Deaf, clock=clock) as runtime,
            await SqlLedger.create(durable_url) as ledger,
        ):
            outlet = Recorder()
            delivery = runtime.deliveries.open(session(), outlet)
            delivery.start()
            started = await runtime.propose("transfer_tracked", ARGS, session(), wait=False)
            op_id = started["operation_id"]
            delivery.await_outcome(op_id)  # the call was answered "started" (as the adapter does)

            async def reported(message: str) -> bool:
                trail = await ledger.events(op_id)
                return any((e.detail or {}).get("progress") == message for e in trail)

            await eventually(lambda: reported(CHECKING), what="the worker to record a report")

            def heard_on_a_pause() -> bool:
                clock.advance(1.0)  # the watcher's pause: it re-reads (no notice comes)
                return _progress(outlet) == [CHECKING]

            await eventually(heard_on_a_pause, what="the report read on the watcher's pause")
            # The second report and the outcome land while the watcher sleeps; a report
            # written after the outcome (a worker's write that raced it) lands too.
            await _open_gate(durable_url, op_id, 1)
            await _open_gate(durable_url, op_id, 2)
            await eventually(
                lambda: _status_is(ledger, op_id, S.COMMITTED), what="the worker's outcome"
            )
            await ledger.annotate(
                op_id, actor="runtime:dbos-worker:w1", detail={"progress": "late", "attempt": 1}
            )
            assert await reported(SENDING)

            def outcome_heard() -> bool:
                clock.advance(1.0)
                return runtime.has_outcome(op_id)

            await eventually(outcome_heard, what="the outcome read on the watcher's pause")
            await eventually(lambda: "committed" in _told(outlet), what="the outcome told")
            await outlet.settled()
            told = _told(outlet)
            delivery.close()
            outlet.stop()
    finally:
        await workers.stop()
    # The second report was read only once the outcome was known: the outcome is told, not it.
    assert told == [CHECKING, "committed"]


async def _status_is(ledger: SqlLedger, operation_id: str, status: ActionStatus) -> bool:
    return (await ledger.get(operation_id)).status is status
