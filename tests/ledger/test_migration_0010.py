"""Migration 0010: the lease owner joins ``ix_pa_operations_status_lease``; a 0009 ledger with
leased operations upgrades losing nothing, its heartbeat and recovery act as before, and back."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, event, inspect, select
from sqlalchemy.ext.asyncio import create_async_engine

from pipecat_actions.cli import main
from pipecat_actions.ledger import SqlLedger, migrate
from pipecat_actions.ledger.engine import normalize_url
from pipecat_actions.ledger.schema import LEASE_COLUMNS, LEASE_INDEX, events, operations
from pipecat_actions.ledger.sqlite import SqliteLedger
from pipecat_actions.status import ActionStatus
from tests.conftest import BACKENDS
from tests.ledger._support import alembic, sqlite_plans
from tests.ledger.test_operator_queries import _bulk_insert, _rows

S = ActionStatus
LIVE = 1e12  # a lease that has not run out (seconds since the epoch, far ahead)
RAN_OUT = 1.0


@pytest.fixture(params=BACKENDS)
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'old.db'}"
    url: str = request.getfixturevalue("pg_fresh_url")
    return url


async def _read(url: str) -> tuple[list[Any], list[Any], list[str]]:
    """Every operation and event row, in order, and the lease index's columns."""

    def read(conn: Connection) -> tuple[list[Any], list[Any], list[str]]:
        ops = conn.execute(select(operations).order_by(operations.c.operation_id)).all()
        trail = conn.execute(select(events).order_by(events.c.operation_id, events.c.seq)).all()
        (columns,) = [
            [str(c) for c in i["column_names"]]
            for i in inspect(conn).get_indexes("pa_operations")
            if i["name"] == LEASE_INDEX
        ]
        return ops, trail, columns

    engine = create_async_engine(normalize_url(url))
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(read)
    finally:
        await engine.dispose()


def _record_updates(ledger: SqlLedger) -> list[tuple[str, Any]]:
    """From now on, the UPDATEs ``ledger`` sends (SQLite writes on an engine of their own)."""
    issued: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if statement.lstrip().upper().startswith("UPDATE"):
            issued.append((statement, parameters))

    engines = [ledger._engine.sync_engine]
    if isinstance(ledger, SqliteLedger) and ledger._sqlite_writer is not None:
        engines.append(ledger._sqlite_writer)
    for engine in engines:
        event.listen(engine, "before_cursor_execute", record)
    return issued


def _leased(count: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Operations spread over three owners, open and settled, leases live and run out.

    i % 6: 0 and 1 are runtime-a's open (RUNNING, UNKNOWN), 2 runtime-b's open, 3 runtime-a's
    committed, 4 runtime-a's open with its lease run out, 5 nobody's and open.
    """
    ops, trail = _rows(count, at=1e9)
    for i, row in enumerate(ops):
        row["created_at"] = 1e9 + i
        owner, status, lease = {
            0: ("runtime-a", S.RUNNING, LIVE),
            1: ("runtime-a", S.UNKNOWN, LIVE),
            2: ("runtime-b", S.RUNNING, LIVE),
            3: ("runtime-a", S.COMMITTED, LIVE),
            4: ("runtime-a", S.UNKNOWN, RAN_OUT),
            5: (None, S.FAILED_RETRYABLE, None),
        }[i % 6]
        row.update(lease_owner=owner, status=status.value, lease_expires_at=lease)
    return ops, trail


async def test_a_0009_ledger_with_leases_upgrades_losing_nothing_and_renews_only_its_own(
    empty_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = empty_url
    sqlite = url.startswith("sqlite")
    if sqlite:
        sqlite3.connect(url.removeprefix("sqlite:///")).close()
    await alembic(url, "upgrade", "0009")
    ops, trail = _leased(60)
    await _bulk_insert(url, ops, trail)
    before_ops, before_trail, old_columns = await _read(url)
    assert old_columns == ["status", "lease_expires_at"]

    assert await asyncio.to_thread(main, ["db", "upgrade", "--ledger", url]) == 0
    assert f"from 0009 to {migrate.head_revision()}" in capsys.readouterr().out

    after_ops, after_trail, columns = await _read(url)
    assert (after_ops, after_trail) == (before_ops, before_trail)
    assert len(after_trail) == len(trail)
    assert columns == list(LEASE_COLUMNS) == ["status", "lease_owner", "lease_expires_at"]

    ids = [row["operation_id"] for row in ops]
    mine_open = [op_id for i, op_id in enumerate(ids) if i % 6 in (0, 1, 4)]
    left_to_expire = mine_open[0]
    ledger = await SqlLedger.create(url)
    issued = _record_updates(ledger)
    try:
        renewed = await ledger.renew_lease("runtime-a", lease_secs=30, except_ids=[left_to_expire])
        assert renewed == len(mine_open) - 1
        renew_sql = issued[:1]
        leases = {row["operation_id"]: row["lease_expires_at"] for row in ops}
        renewed_ids = {
            op.operation_id
            for op in await ledger.list()
            if op.lease_expires_at != leases[op.operation_id]
        }
        # Only runtime-a's open operations got a new lease; the one it leaves out did not.
        assert renewed_ids == set(mine_open) - {left_to_expire}
        # Recovery finds what nobody holds, and nothing held under a live lease.
        claimed = await ledger.claim_stale("runtime-c", lease_secs=30, limit=100)
        assert {op.operation_id for op in claimed} == {
            op_id for i, op_id in enumerate(ids) if i % 6 == 5
        }
        holders = await ledger.gone_owners(besides="runtime-c")
        assert holders == []  # none registered: their leases decide
    finally:
        await ledger.close()
    if sqlite:
        (plan,) = sqlite_plans(url.removeprefix("sqlite:///"), renew_sql)
        assert f"USING INDEX {LEASE_INDEX} (status=? AND lease_owner=?)" in plan, plan

    await alembic(url, "downgrade", "0009")
    *_, down_columns = await _read(url)
    assert down_columns == old_columns
