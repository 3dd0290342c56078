"""The durability settings the ledger promises are really in force on every connection.

SQLite: WAL, ``synchronous`` FULL by default (NORMAL only on request), ``foreign_keys`` on and a
``busy_timeout``, read back from the ledger's own writer and reader connections. PostgreSQL: a
database or role running with ``synchronous_commit=off`` is refused unless the caller accepts it.

This file reaches into the ledger's engine and write path (``_engine``, ``_write``, ``_read``)
to ask the very connections the ledger uses; no other test file does.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from sqlalchemy import Connection

from pipecat_actions.errors import LedgerConfigurationError, LedgerError
from pipecat_actions.ledger import LedgerSettings, SqlLedger

from ..conftest import PG_ADMIN_URL
from ._support import new_op

PRAGMAS = ("journal_mode", "synchronous", "foreign_keys", "busy_timeout")


def _read_pragmas(conn: Connection) -> dict[str, Any]:
    return {name: conn.exec_driver_sql(f"PRAGMA {name}").scalar() for name in PRAGMAS}


async def _reader_pragmas(ledger: SqlLedger, connections: int) -> list[dict[str, Any]]:
    """Read the pragmas on ``connections`` reader connections held open at the same time."""
    found = []
    async with contextlib.AsyncExitStack() as stack:
        for _ in range(connections):
            conn = await stack.enter_async_context(ledger._engine.connect())
            found.append(await conn.run_sync(_read_pragmas))
    return found


@contextlib.asynccontextmanager
async def opened(url: str, settings: LedgerSettings | None = None) -> AsyncIterator[SqlLedger]:
    ledger = await SqlLedger.create(url, settings=settings)
    try:
        yield ledger
    finally:
        await ledger.close()


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'ledger.db'}"


async def test_sqlite_ledger_file_is_in_wal_mode(sqlite_url: str, tmp_path: Path) -> None:
    async with opened(sqlite_url) as ledger:
        await ledger.admit(new_op("k"))
        raw = sqlite3.connect(tmp_path / "ledger.db")
        try:
            assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            # The row is there for any other reader of the file too.
            assert raw.execute("SELECT count(*) FROM pa_operations").fetchone()[0] == 1
        finally:
            raw.close()


async def test_sqlite_writer_and_readers_run_with_synchronous_full_by_default(
    sqlite_url: str,
) -> None:
    async with opened(sqlite_url) as ledger:
        writer = await ledger._write(_read_pragmas)
        readers = await _reader_pragmas(ledger, 3)
        read_path = await ledger._read(_read_pragmas)

    expected = {"journal_mode": "wal", "synchronous": 2, "foreign_keys": 1, "busy_timeout": 10_000}
    assert writer == expected
    assert readers == [expected] * 3
    assert read_path == expected


async def test_sqlite_synchronous_normal_is_used_only_when_asked_for(sqlite_url: str) -> None:
    settings = LedgerSettings(sqlite_synchronous="NORMAL", sqlite_busy_timeout_ms=1_234)
    async with opened(sqlite_url, settings=settings) as ledger:
        writer = await ledger._write(_read_pragmas)
        readers = await _reader_pragmas(ledger, 2)

    expected = {"journal_mode": "wal", "synchronous": 1, "foreign_keys": 1, "busy_timeout": 1_234}
    assert writer == expected
    assert readers == [expected] * 2


async def test_sqlite_foreign_keys_are_enforced_on_the_write_connection(sqlite_url: str) -> None:
    async with opened(sqlite_url) as ledger:
        with pytest.raises(LedgerError, match="FOREIGN KEY"):
            await ledger._write(
                lambda conn: conn.exec_driver_sql(
                    "INSERT INTO pa_operation_events (operation_id, seq, at, kind, to_status, "
                    "actor) VALUES ('op_missing', 1, 0, 'created', 'ADMITTED', 'test')"
                )
            )
        assert await ledger.events("op_missing") == []


# --- PostgreSQL --------------------------------------------------------------------------------


async def _admin(statement: str, url: str = PG_ADMIN_URL) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


def _database_name(url: str) -> str:
    return url.rpartition("/")[2]


async def _synchronous_commit_seen_by_ledger(ledger: SqlLedger) -> str:
    def work(conn: Connection) -> str:
        return str(conn.exec_driver_sql("SHOW synchronous_commit").scalar())

    return await ledger._write(work)


@pytest.mark.postgres
async def test_postgres_ledger_runs_with_synchronous_commit_on(pg_fresh_url: str) -> None:
    async with opened(pg_fresh_url) as ledger:
        assert await _synchronous_commit_seen_by_ledger(ledger) == "on"


@pytest.mark.postgres
async def test_postgres_database_with_synchronous_commit_off_is_refused(pg_fresh_url: str) -> None:
    await _admin(f'ALTER DATABASE "{_database_name(pg_fresh_url)}" SET synchronous_commit = off')

    with pytest.raises(LedgerConfigurationError, match="synchronous_commit"):
        await SqlLedger.create(pg_fresh_url)


@pytest.mark.postgres
async def test_postgres_database_with_synchronous_commit_off_opens_when_explicitly_allowed(
    pg_fresh_url: str,
) -> None:
    await _admin(f'ALTER DATABASE "{_database_name(pg_fresh_url)}" SET synchronous_commit = off')
    settings = LedgerSettings(allow_unsafe_postgres=True)

    async with opened(pg_fresh_url, settings=settings) as ledger:
        assert await _synchronous_commit_seen_by_ledger(ledger) == "off"
        assert (await ledger.admit(new_op("k"))).created is True


@pytest.fixture
def unsafe_role(pg_fresh_url: str) -> Iterator[str]:
    """A login role whose sessions default to ``synchronous_commit=off``; dropped afterwards."""
    role = f"pa_unsafe_{uuid.uuid4().hex[:8]}"
    asyncio.run(_admin(f'CREATE ROLE "{role}" LOGIN'))
    asyncio.run(_admin(f'ALTER ROLE "{role}" SET synchronous_commit = off'))
    try:
        yield role
    finally:
        asyncio.run(_admin(f'DROP ROLE IF EXISTS "{role}"'))


@pytest.mark.postgres
async def test_postgres_role_with_synchronous_commit_off_is_refused(
    unsafe_role: str, pg_fresh_url: str
) -> None:
    role_url = pg_fresh_url.replace("postgresql://postgres@", f"postgresql://{unsafe_role}@", 1)
    assert role_url != pg_fresh_url

    with pytest.raises(LedgerConfigurationError, match="synchronous_commit"):
        await SqlLedger.create(role_url)
