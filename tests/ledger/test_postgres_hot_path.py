"""PostgreSQL's hot path: each write one statement on asyncpg, and connections that stay sound.

Every write on a tool call's critical path (admit with a free key, transition, annotate) and
every read a waiting call makes (get, find_by_key) is one statement on the ledger's own asyncpg
connections, never SQLAlchemy's engine. A connection that fails or is cut off mid-statement is
never used again; a refused statement leaves its connection usable.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import asyncpg
import pytest
from sqlalchemy import event, make_url

from pipecat_actions.clock import ManualClock
from pipecat_actions.errors import (
    LedgerConfigurationError,
    LedgerIntegrityError,
    LedgerUnavailable,
)
from pipecat_actions.ledger import SqlLedger
from pipecat_actions.ledger.engine import LedgerSettings
from pipecat_actions.status import ActionStatus
from tests._waiting import eventually, guarded
from tests.ledger._support import new_op

S = ActionStatus
pytestmark = pytest.mark.postgres


class Statements:
    """Counts the statements sent on the hot path's connections, and the engine's checkouts."""

    def __init__(self, ledger: SqlLedger) -> None:
        self.sent: Counter[str] = Counter()
        self.engine_checkouts = 0
        event.listen(ledger._engine.sync_engine, "checkout", self._checked_out)
        fast = ledger._fast
        assert fast is not None
        call = fast._call

        async def counted(method: Any, sql: str, params: Any, **kwargs: Any) -> Any:
            async def counting(conn: asyncpg.Connection, *args: Any) -> Any:
                return await getattr(_Counting(conn, self.sent), method.__name__)(*args)

            return await call(counting, sql, params, **kwargs)

        fast._call = counted  # type: ignore[method-assign]

    def _checked_out(self, *_: Any) -> None:
        self.engine_checkouts += 1

    def total(self) -> int:
        """The statements of the calls themselves, not the notices' batches.

        Those (``execute``) are sent on the same connections once a settling write commits.
        """
        return sum(n for name, n in self.sent.items() if name != "execute")


class _Counting:
    def __init__(self, conn: asyncpg.Connection, sent: Counter[str]) -> None:
        self._conn, self._sent = conn, sent

    def __getattr__(self, name: str) -> Any:
        found = getattr(self._conn, name)
        if name in {"fetch", "fetchrow", "fetchval", "execute", "executemany"}:
            self._sent[name] += 1
        return found


async def test_each_hot_write_and_read_is_one_statement_and_none_uses_the_engine(
    pg_fresh_url: str,
) -> None:
    clock = ManualClock()
    async with await SqlLedger.create(pg_fresh_url, clock=clock) as ledger:
        seen = Statements(ledger)
        counts = []
        op = (await ledger.admit(new_op("k1"))).operation
        counts.append(seen.total())
        op = await ledger.transition(
            op.operation_id, expected=S.ADMITTED, to=S.RUNNING, fence=op.fence, actor="t"
        )
        counts.append(seen.total())
        await ledger.annotate(op.operation_id, actor="t", detail={"note": 1})
        counts.append(seen.total())
        await ledger.transition(
            op.operation_id,
            expected=S.RUNNING,
            to=S.COMMITTED,
            fence=op.fence,
            actor="t",
            changes={"result": {"booking_id": "bk_1"}},
        )
        counts.append(seen.total())
        await ledger.get(op.operation_id)
        counts.append(seen.total())
        await ledger.find_by_key("default", "k1")
        counts.append(seen.total())
        trail = await ledger.events(op.operation_id)
    assert counts == [1, 2, 3, 4, 5, 6]
    assert seen.engine_checkouts == 1  # only the audit trail's read, an operator query
    # One statement each, and the audit trail is whole: created, running, note, committed.
    assert [e.to_status for e in trail] == [S.ADMITTED, S.RUNNING, S.RUNNING, S.COMMITTED]


async def test_a_refused_write_is_an_integrity_error_and_its_connection_stays_usable(
    pg_fresh_url: str,
) -> None:
    async with await SqlLedger.create(pg_fresh_url, clock=ManualClock()) as ledger:
        fast = ledger._fast
        assert fast is not None
        idle_before = list(fast._idle)
        with pytest.raises(LedgerIntegrityError, match="refused the write"):
            await ledger.admit(new_op("k1", compensates="op_that_does_not_exist"))
        assert fast._idle == idle_before  # the same connection, back and usable
        admitted = await ledger.admit(new_op("k2"))
    assert admitted.created


async def test_a_read_cancelled_mid_statement_never_hands_its_connection_to_the_next_call(
    pg_fresh_url: str,
) -> None:
    async with await SqlLedger.create(pg_fresh_url, clock=ManualClock()) as ledger:
        fast = ledger._fast
        assert fast is not None
        op = (await ledger.admit(new_op("k1"))).operation
        used = fast._idle[-1]

        reading = asyncio.ensure_future(
            fast._call(asyncpg.Connection.fetchval, "SELECT pg_sleep(30)", (), read=True)
        )
        watcher = await asyncpg.connect(pg_fresh_url)
        try:

            async def on_the_server() -> bool:
                running = await watcher.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(30)' "
                    "AND state = 'active'"
                )
                return bool(running)

            await eventually(on_the_server, what="the statement to run on the server")
        finally:
            await watcher.close()
        reading.cancel()
        with pytest.raises(asyncio.CancelledError):
            await reading
        assert used.is_closed()
        assert used not in fast._idle
        read = await guarded(ledger.get(op.operation_id), what="a read after the cancel")
    assert read.status is S.ADMITTED


async def test_connections_dropped_by_the_server_are_replaced_and_reads_go_on(
    pg_fresh_url: str,
) -> None:
    # A restart or failover drops every connection: the first read that finds one dead
    # drops the idle ones too and tries again on a new one; the caller never sees it.
    async with await SqlLedger.create(pg_fresh_url, clock=ManualClock()) as ledger:
        fast = ledger._fast
        assert fast is not None
        op = (await ledger.admit(new_op("k1"))).operation
        conn = await asyncpg.connect(pg_fresh_url)
        try:
            await conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        finally:
            await conn.close()
        read = await ledger.get(op.operation_id)
        assert read.status is S.ADMITTED
        # A write on a connection found dead is not retried (it may have committed): it
        # fails as the ledger being unavailable, and the next write goes through.
        for dead in list(fast._idle):
            dead.terminate()
        fast._idle.append(await _dead_connection(pg_fresh_url))
        with pytest.raises(LedgerUnavailable):
            await ledger.annotate(op.operation_id, actor="t", detail={"n": 1})
        await ledger.annotate(op.operation_id, actor="t", detail={"n": 2})


async def _dead_connection(url: str) -> asyncpg.Connection:
    conn = await asyncpg.connect(url)
    killer = await asyncpg.connect(url)
    try:
        await killer.execute("SELECT pg_terminate_backend($1)", conn.get_server_pid())
    finally:
        await killer.close()
    return conn


class SlowConnects:
    """A relay to the server on 127.0.0.1 whose every new connection waits ``delay`` first."""

    def __init__(self, url: str, *, delay: float) -> None:
        self._target = make_url(url)
        self._delay = delay
        self._server: asyncio.Server | None = None
        self._relays: set[asyncio.Task[None]] = set()
        self.connections = 0

    async def __aenter__(self) -> str:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        return self._target.set(host="127.0.0.1", port=port).render_as_string(hide_password=False)

    async def __aexit__(self, *_: object) -> None:
        assert self._server is not None
        self._server.close()
        for relay in self._relays:
            relay.cancel()
        await asyncio.gather(*self._relays, return_exceptions=True)

    async def _relay(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        task = asyncio.current_task()
        assert task is not None
        self._relays.add(task)
        try:
            await asyncio.sleep(self._delay)  # a slow network or a busy server's accept
            up_reader, up_writer = await asyncio.open_connection(
                self._target.host, self._target.port
            )

            async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
                dst.close()

            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        except (OSError, asyncio.CancelledError):
            writer.close()
        finally:
            self._relays.discard(task)


async def test_a_connection_slower_to_open_than_the_pool_timeout_is_still_opened(
    pg_fresh_url: str,
) -> None:
    # Waiting for a free connection and opening a new one are different waits: a short
    # pool timeout (fail fast when the pool is exhausted) must not fail every connection that
    # the network takes longer than that to open. It used to (asyncpg was handed the pool
    # timeout), and a burst on a small pool lost audit notes to a `TimeoutError`.
    settings = LedgerSettings(pool_size=2, max_overflow=0, pool_timeout_secs=0.01)
    async with SlowConnects(pg_fresh_url, delay=0.2) as slow_url:
        led = await SqlLedger.create(slow_url, clock=ManualClock(), settings=settings)
        try:
            op = (await led.admit(new_op("k1"))).operation
            # Two writes at once: the second needs a connection of its own, opened now.
            await asyncio.gather(
                led.annotate(op.operation_id, actor="t", detail={"n": 1}),
                led.annotate(op.operation_id, actor="t", detail={"n": 2}),
            )
            trail = await led.events(op.operation_id)
        finally:
            await led.close()
    assert sorted(e.detail.get("n") for e in trail[1:]) == [1, 2]


def test_timeouts_must_be_positive() -> None:
    with pytest.raises(LedgerConfigurationError, match="connect_timeout_secs"):
        LedgerSettings(connect_timeout_secs=0)
