"""`Ledger.notices`: a waiter in one process is woken when another process settles its operation.

Two `SqlLedger` instances on one database stand for two processes: each has its own
connections, and a notice crosses the database server as it would between processes.
"""

from __future__ import annotations

import asyncio
import socket
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import asyncpg
import pytest

from pipecat_actions.clock import ManualClock
from pipecat_actions.ledger import SqlLedger, _notices
from pipecat_actions.ledger._notices import Notices
from pipecat_actions.status import ActionStatus
from tests._waiting import guarded
from tests.ledger._support import new_op

S = ActionStatus


@pytest.fixture
async def two_processes(
    ledger_url: str, clock: ManualClock
) -> AsyncIterator[tuple[SqlLedger, SqlLedger]]:
    runner = await SqlLedger.create(ledger_url, clock=clock)
    waiter = await SqlLedger.create(ledger_url, clock=clock)
    try:
        yield runner, waiter
    finally:
        await waiter.close()
        await runner.close()


async def _running(ledger: SqlLedger, key: str) -> str:
    op = (await ledger.admit(new_op(key))).operation
    await ledger.transition(op.operation_id, expected=S.ADMITTED, to=S.RUNNING, fence=1, actor="t")
    return op.operation_id


async def test_a_waiter_is_woken_when_another_process_settles_its_operation(
    two_processes: tuple[SqlLedger, SqlLedger],
) -> None:
    runner, waiter = two_processes
    op_id = await _running(runner, "k1")
    async with waiter.notices(op_id) as changed:
        assert changed is not None
        assert not changed.is_set()
        await runner.transition(op_id, expected=S.RUNNING, to=S.COMMITTED, fence=1, actor="t")
        await guarded(changed.wait(), what="the notice of the commit")
    assert (await waiter.get(op_id)).status is S.COMMITTED


async def test_writes_that_settle_nothing_send_no_notice(
    two_processes: tuple[SqlLedger, SqlLedger],
) -> None:
    # Notices arrive in the order they were sent: once the later settle's notice is here, any
    # notice the earlier writes sent would have arrived before it.
    runner, waiter = two_processes
    quiet = (await runner.admit(new_op("quiet"))).operation.operation_id
    marker = await _running(runner, "marker")
    async with waiter.notices(quiet) as about_quiet, waiter.notices(marker) as about_marker:
        assert about_quiet is not None and about_marker is not None
        await runner.transition(quiet, expected=S.ADMITTED, to=S.RUNNING, fence=1, actor="t")
        await runner.annotate(quiet, actor="t", detail={"note": "still running"})
        await runner.transition(marker, expected=S.RUNNING, to=S.COMMITTED, fence=1, actor="t")
        await guarded(about_marker.wait(), what="the notice of the later commit")
        assert not about_quiet.is_set()


@pytest.mark.postgres
async def test_a_lost_notice_connection_wakes_every_waiter_and_is_opened_again(
    pg_fresh_url: str, clock: ManualClock
) -> None:
    async with (
        await SqlLedger.create(pg_fresh_url, clock=clock) as runner,
        await SqlLedger.create(pg_fresh_url, clock=clock) as waiter,
    ):
        await _lost_and_found(runner, waiter, pg_fresh_url)


async def _lost_and_found(runner: SqlLedger, waiter: SqlLedger, pg_url: str) -> None:
    first = await _running(runner, "k1")
    second = await _running(runner, "k2")
    async with waiter.notices(first) as changed:
        assert changed is not None
        listening = await _listeners(pg_url)
        assert len(listening) == 1
        admin = await asyncpg.connect(pg_url)
        try:
            await admin.execute("SELECT pg_terminate_backend($1)", listening[0])
        finally:
            await admin.close()
        # Woken although nothing settled: the waiter re-reads rather than miss a notice.
        await guarded(changed.wait(), what="the waiter to be woken by the lost connection")
    async with waiter.notices(second) as changed:
        assert changed is not None
        await runner.transition(second, expected=S.RUNNING, to=S.FAILED_FINAL, fence=1, actor="t")
        await guarded(changed.wait(), what="the notice on the new connection")


async def _listeners(url: str) -> list[int]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND query LIKE 'LISTEN %'"
        )
    finally:
        await conn.close()
    return [r["pid"] for r in rows]


async def test_a_dead_sqlite_waiter_is_forgotten_and_the_live_ones_still_woken(
    tmp_path: Path, clock: ManualClock
) -> None:
    url = f"sqlite:///{tmp_path / 'l.db'}"
    async with (
        await SqlLedger.create(url, clock=clock) as runner,
        await SqlLedger.create(url, clock=clock) as waiter,
    ):
        op_id = await _running(runner, "k1")
        async with waiter.notices(op_id) as changed:
            assert changed is not None
            directory = waiter._notices.directory  # type: ignore[union-attr]
            assert stat.S_IMODE(directory.stat().st_mode) == 0o700
            dead = directory / "4194304-deadbeef"  # a waiter killed before it unbound
            gone = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            gone.bind(str(dead))
            gone.close()
            await runner.transition(op_id, expected=S.RUNNING, to=S.COMMITTED, fence=1, actor="t")
            await guarded(changed.wait(), what="the notice of the commit")
        assert not dead.exists()
    assert list(directory.iterdir()) == []  # the waiter unbound its socket when it closed


class SlowToListen(Notices):
    """Listening starts only when the test lets it (a server slow to accept the connection)."""

    def __init__(self) -> None:
        super().__init__(url="test")
        self.accept = asyncio.Event()
        self.up = False

    def _listening(self) -> bool:
        return self.up

    async def _listen(self) -> None:
        await self.accept.wait()
        self.up = True


async def test_a_waiter_goes_on_without_a_slow_listener_and_is_woken_once_it_listens(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # It must not wait on the connection (its re-reads on its own pause go on), and nothing
    # that settled before listening started may be missed: it is woken to re-read then.
    monkeypatch.setattr(_notices, "OPEN_WAIT_SECS", 0.01)
    notices = SlowToListen()
    first = await guarded(notices.subscribe("op_1"), what="subscribe without the listener")
    second = await guarded(notices.subscribe("op_2"), what="a second subscribe")
    assert not first.is_set() and not second.is_set()
    notices.accept.set()
    await guarded(first.wait(), what="the wake-up once listening started")
    await guarded(second.wait(), what="the other waiter's wake-up")
    await notices.close()
