"""PostgreSQL notices leave the write's transaction: sent after it commits, in batches.

PostgreSQL commits notifying transactions one at a time (no group commit), so a settling write
no longer calls ``pg_notify`` itself: once it has committed, its operation's id goes to the
ledger's `PostgresNotifier`, which sends every id queued since its last batch as one statement
on one of the ledger's connections (it opens none of its own), while the next batch gathers. A
notice is a hint (waiters re-read on their own pause): a batch that fails is logged once and
dropped, and `close` sends what is queued and reports what it could not send in one line.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Iterator
from typing import Any

import asyncpg
import pytest
from loguru import logger
from sqlalchemy import make_url

from pipecat_actions.clock import ManualClock
from pipecat_actions.ledger import SqlLedger
from pipecat_actions.ledger._notices import PostgresNotifier
from pipecat_actions.ledger._postgres import asyncpg_dsn, update_sql
from pipecat_actions.status import ActionStatus
from tests._waiting import eventually, guarded
from tests.ledger._support import new_op

S = ActionStatus
pytestmark = pytest.mark.postgres


class HeldBatches:
    """Records each batch the notifier sends; while ``gate`` is clear, a batch waits in flight."""

    def __init__(self, notifier: PostgresNotifier) -> None:
        self.batches: list[list[str]] = []
        self.outcomes: list[str] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.in_flight = asyncio.Event()
        deliver = notifier._deliver

        async def held(batch: list[str]) -> None:
            self.batches.append(list(batch))
            self.in_flight.set()
            await self.gate.wait()
            try:
                await deliver(batch)
            except Exception:
                self.outcomes.append("failed")
                raise
            self.outcomes.append("sent")

        notifier._deliver = held  # type: ignore[method-assign]


def refused_by(notifier: PostgresNotifier, dead_dsn: str) -> Callable[[], None]:
    """Send the notifier's batches to a server that refuses connections; return the undo."""
    live = notifier._execute

    async def refused(sql: str, *params: Any) -> None:
        await asyncpg.connect(dead_dsn, timeout=1)  # raises: nothing listens there

    notifier._execute = refused

    def undo() -> None:
        notifier._execute = live

    return undo


def _notifier(ledger: SqlLedger) -> PostgresNotifier:
    notifier: PostgresNotifier = ledger._notifier  # type: ignore[attr-defined]
    return notifier


async def _running(ledger: SqlLedger, key: str) -> str:
    op = (await ledger.admit(new_op(key))).operation
    await ledger.transition(op.operation_id, expected=S.ADMITTED, to=S.RUNNING, fence=1, actor="t")
    return op.operation_id


async def _commit(ledger: SqlLedger, op_id: str) -> None:
    await ledger.transition(op_id, expected=S.RUNNING, to=S.COMMITTED, fence=1, actor="t")


@pytest.fixture
def dead_dsn(pg_fresh_url: str) -> str:
    """The test database's DSN on a local port where nothing listens (connections refused)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    return asyncpg_dsn(make_url(pg_fresh_url).set(host="127.0.0.1", port=port))


@pytest.fixture
def warnings_said() -> Iterator[list[str]]:
    said: list[str] = []
    sink = logger.add(lambda m: said.append(m.record["message"]), level="WARNING")
    try:
        yield said
    finally:
        logger.remove(sink)


def test_the_settling_statement_itself_sends_no_notice() -> None:
    sql = update_sql(
        ("status", "updated_at"),
        starts_attempt=False,
        match_status=True,
        match_fence=True,
        marks=False,
    )
    assert "pg_notify" not in sql


async def test_notices_queued_while_a_batch_is_in_flight_go_together_in_order(
    pg_fresh_url: str,
) -> None:
    clock = ManualClock()
    async with (
        await SqlLedger.create(pg_fresh_url, clock=clock) as runner,
        await SqlLedger.create(pg_fresh_url, clock=clock) as waiter,
    ):
        held = HeldBatches(_notifier(runner))
        first = await _running(runner, "first")
        later = [await _running(runner, f"k{i}") for i in range(5)]
        async with (
            waiter.notices(first) as about_first,
            waiter.notices(later[-1]) as about_last,
        ):
            assert about_first is not None and about_last is not None
            held.gate.clear()
            await _commit(runner, first)  # answered once committed: its notice is queued
            await guarded(held.in_flight.wait(), what="the first batch to be in flight")
            task = _notifier(runner)._task
            for op_id in later:
                await _commit(runner, op_id)
            assert not about_first.is_set()  # held in flight: nothing sent yet
            held.gate.set()
            await guarded(about_first.wait(), what="the first batch's notice")
            await guarded(about_last.wait(), what="the second batch's notices")
        await eventually(lambda: len(held.outcomes) == 2, what="the second batch to end")
        assert held.batches == [[first], later]
        assert held.outcomes == ["sent", "sent"]
        assert _notifier(runner)._task is task  # one long-lived task sent both batches
        for op_id in later:
            assert (await waiter.get(op_id)).status is S.COMMITTED


async def test_an_operation_queued_twice_before_its_batch_is_sent_once_after_both() -> None:
    sent: list[list[str]] = []
    gate = asyncio.Event()

    class Recording(PostgresNotifier):
        async def _deliver(self, batch: list[str]) -> None:
            sent.append(list(batch))
            await gate.wait()

    notifier = Recording(dsn="postgresql://unused", url="test", connect_timeout=1)
    notifier.send("op_a")
    await eventually(lambda: sent == [["op_a"]], what="the first batch in flight")
    for op_id in ("op_b", "op_a", "op_c", "op_b"):
        notifier.send(op_id)
    gate.set()
    await guarded(notifier.close(), what="the close")
    assert sent == [["op_a"], ["op_b", "op_a", "op_c"]]


async def test_a_failed_batch_is_logged_once_and_dropped_and_writes_go_on(
    pg_fresh_url: str, dead_dsn: str, warnings_said: list[str]
) -> None:
    clock = ManualClock()
    async with (
        await SqlLedger.create(pg_fresh_url, clock=clock) as runner,
        await SqlLedger.create(pg_fresh_url, clock=clock) as waiter,
    ):
        notifier = _notifier(runner)
        held = HeldBatches(notifier)
        server_back = refused_by(notifier, dead_dsn)
        ops = [await _running(runner, f"k{i}") for i in range(4)]
        for n, op_id in enumerate(ops[:3], start=1):
            await _commit(runner, op_id)  # the write itself succeeds
            await eventually(lambda n=n: len(held.outcomes) == n, what=f"batch {n} to end")
        assert held.outcomes == ["failed", "failed", "failed"]
        assert len(warnings_said) == 1
        assert "notices not sent" in warnings_said[0]
        assert "ConnectionRefusedError" in warnings_said[0] or "OSError" in warnings_said[0]
        assert not notifier._pending  # dropped, not kept for later
        server_back()
        async with waiter.notices(ops[3]) as changed:
            assert changed is not None
            await _commit(runner, ops[3])
            await guarded(changed.wait(), what="the notice once the server is back")
        assert held.batches[-1] == [ops[3]]
        for op_id in ops:
            assert (await waiter.get(op_id)).status is S.COMMITTED
    assert len(warnings_said) == 1


async def test_close_sends_the_notices_still_queued(pg_fresh_url: str) -> None:
    clock = ManualClock()
    async with await SqlLedger.create(pg_fresh_url, clock=clock) as waiter:
        runner = await SqlLedger.create(pg_fresh_url, clock=clock)
        held = HeldBatches(_notifier(runner))
        first, second = await _running(runner, "k1"), await _running(runner, "k2")
        async with waiter.notices(second) as changed:
            assert changed is not None
            held.gate.clear()
            await _commit(runner, first)
            await guarded(held.in_flight.wait(), what="the first batch in flight")
            await _commit(runner, second)  # queued behind it
            closing = asyncio.ensure_future(runner.close())
            await eventually(lambda: _notifier(runner)._closing, what="the close to begin")
            held.gate.set()
            await guarded(closing, what="the close")
            assert held.batches == [[first], [second]]
            assert held.outcomes == ["sent", "sent"]
            await guarded(changed.wait(), what="the notice sent by the close")


async def test_close_reports_every_notice_it_could_not_send_in_one_line(
    pg_fresh_url: str, dead_dsn: str, warnings_said: list[str]
) -> None:
    runner = await SqlLedger.create(pg_fresh_url, clock=ManualClock())
    notifier = _notifier(runner)
    held = HeldBatches(notifier)
    refused_by(notifier, dead_dsn)
    ops = [await _running(runner, f"k{i}") for i in range(4)]
    held.gate.clear()
    await _commit(runner, ops[0])
    await guarded(held.in_flight.wait(), what="the first batch in flight")
    for op_id in ops[1:]:
        await _commit(runner, op_id)
    closing = asyncio.ensure_future(runner.close())
    await eventually(lambda: notifier._closing, what="the close to begin")
    held.gate.set()
    await guarded(closing, what="the close")
    assert held.batches == [ops[:1], ops[1:]]
    assert held.outcomes == ["failed", "failed"]
    assert len(warnings_said) == 1
    assert "4 notice(s) not sent at close" in warnings_said[0]


async def test_a_notice_after_close_is_ignored_and_starts_nothing() -> None:
    notifier = PostgresNotifier(dsn="postgresql://unused", url="test", connect_timeout=1)
    await notifier.close()
    notifier.send("op_late")
    assert notifier._task is None
    assert not notifier._pending


async def test_the_notices_go_on_the_ledgers_own_connections_and_open_none(
    pg_fresh_url: str,
) -> None:
    async with await SqlLedger.create(pg_fresh_url, clock=ManualClock()) as runner:
        notifier = _notifier(runner)
        held = HeldBatches(notifier)
        fast = runner._fast
        idle = list(fast._idle)
        op_id = await _running(runner, "k1")
        await _commit(runner, op_id)
        await eventually(lambda: held.outcomes == ["sent"], what="the first notice")
        assert notifier._conn is None
        assert fast._idle == idle  # the same connection, back on the ledger's stack
