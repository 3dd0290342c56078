"""Shared fixtures: real SQLite files and the real PostgreSQL server on 127.0.0.1:5432.

PostgreSQL tests use a database created for this test run and dropped after it
(``PIPECAT_ACTIONS_PG_ADMIN_URL`` names the server; default trust auth as ``postgres``). They are
not skipped when the server is missing: they fail, unless ``PIPECAT_ACTIONS_SKIP_PG=1`` is set.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import pytest

from pipecat_actions.clock import ManualClock
from pipecat_actions.ledger import SqlLedger

PG_ADMIN_URL = os.environ.get(
    "PIPECAT_ACTIONS_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
SKIP_PG = os.environ.get("PIPECAT_ACTIONS_SKIP_PG") == "1"
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]


def _pg_url(database: str) -> str:
    base, _, _ = PG_ADMIN_URL.rpartition("/")
    return f"{base}/{database}"


async def _admin(statement: str) -> None:
    conn = await asyncpg.connect(PG_ADMIN_URL)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


def create_pg_database(prefix: str = "pa_test") -> str:
    """Create an empty database and return its URL."""
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    asyncio.run(_admin(f'CREATE DATABASE "{name}"'))
    return _pg_url(name)


def drop_pg_database(url: str) -> None:
    """Drop a database made by `create_pg_database`, closing its leftover connections."""
    name = url.rpartition("/")[2]
    asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="session")
def pg_session_url() -> Iterator[str]:
    """One PostgreSQL database for the whole run; tests truncate its tables."""
    if SKIP_PG:
        pytest.skip("PIPECAT_ACTIONS_SKIP_PG=1")
    url = create_pg_database()
    try:
        yield url
    finally:
        drop_pg_database(url)


@pytest.fixture
def pg_fresh_url() -> Iterator[str]:
    """An empty PostgreSQL database of its own, dropped after the test."""
    if SKIP_PG:
        pytest.skip("PIPECAT_ACTIONS_SKIP_PG=1")
    url = create_pg_database()
    try:
        yield url
    finally:
        drop_pg_database(url)


async def _truncate(url: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        exists = await conn.fetchval("SELECT to_regclass('pa_operations') IS NOT NULL")
        if exists:
            await conn.execute("TRUNCATE pa_operation_events, pa_operations")
    finally:
        await conn.close()


@pytest.fixture(params=BACKENDS)
def ledger_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The URL of an empty ledger database, once per backend."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'ledger.db'}"
    url: str = request.getfixturevalue("pg_session_url")
    asyncio.run(_truncate(url))
    return url


@pytest.fixture
def clock() -> ManualClock:
    """A clock that moves only when the test says so."""
    return ManualClock()


@pytest.fixture
async def ledger(ledger_url: str, clock: ManualClock) -> AsyncIterator[SqlLedger]:
    """An open ledger on each backend, driven by the manual clock."""
    opened = await SqlLedger.create(ledger_url, clock=clock)
    try:
        yield opened
    finally:
        await opened.close()
