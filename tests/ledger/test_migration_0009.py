"""Migration 0009: a 0008 ledger with operations and events upgrades to the partial
``ix_pa_operations_undelivered`` losing nothing, on both backends, and back."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, inspect, select
from sqlalchemy.ext.asyncio import create_async_engine

from pipecat_actions.cli import main
from pipecat_actions.ledger import OperationFilter, SqlLedger, migrate
from pipecat_actions.ledger.engine import normalize_url
from pipecat_actions.ledger.records import OWED_KIND
from pipecat_actions.ledger.schema import (
    STATS_COLUMNS,
    UNDELIVERED_INDEX,
    UNDELIVERED_WHERE,
    events,
    operations,
)
from pipecat_actions.status import ActionStatus
from tests.conftest import BACKENDS
from tests.ledger._support import alembic, record_selects, sqlite_plans
from tests.ledger.test_operator_queries import _bulk_insert, _rows

S = ActionStatus


@pytest.fixture(params=BACKENDS)
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'old.db'}"
    url: str = request.getfixturevalue("pg_fresh_url")
    return url


async def _read(url: str) -> tuple[list[Any], list[Any], dict[str, list[str]]]:
    """Every operation row and event row, in order, and the columns of the indexes 0009 makes."""

    def read(conn: Connection) -> tuple[list[Any], list[Any], dict[str, list[str]]]:
        ops = conn.execute(select(operations).order_by(operations.c.operation_id)).all()
        trail = conn.execute(select(events).order_by(events.c.operation_id, events.c.seq)).all()
        indexes = {
            str(i["name"]): [str(c) for c in i["column_names"]]
            for i in inspect(conn).get_indexes("pa_operations")
            if i["name"] in (UNDELIVERED_INDEX, "ix_pa_operations_stats")
        }
        return ops, trail, indexes

    engine = create_async_engine(normalize_url(url))
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(read)
    finally:
        await engine.dispose()


def test_the_partial_index_names_the_status_and_kind_owed() -> None:
    assert (
        f"status = '{S.COMMITTED.value}' AND delivered_at IS NULL AND kind = '{OWED_KIND}'"
    ) == UNDELIVERED_WHERE


async def test_a_0008_ledger_with_rows_and_events_upgrades_losing_nothing(
    empty_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = empty_url
    if url.startswith("sqlite"):
        sqlite3.connect(url.removeprefix("sqlite:///")).close()
    await alembic(url, "upgrade", "0008")
    ops, trail = _rows(60, at=1e9)
    # Told, a read (owed to nobody), failed, still running: none of them is owed untold.
    for i, row in enumerate(ops):
        row["created_at"] = 1e9 + i
        if i % 4 == 1:
            row["delivered_at"] = 1e9 + i + 1
        elif i % 4 == 2:
            row["kind"] = "read"
        elif i % 4 == 3:
            row["status"] = S.FAILED_FINAL.value if i % 8 == 3 else S.RUNNING.value
    await _bulk_insert(url, ops, trail)
    before_ops, before_trail, old_columns = await _read(url)
    assert old_columns[UNDELIVERED_INDEX] == [
        "status",
        "delivered_at",
        "kind",
        "created_at",
        "operation_id",
    ]
    sqlite = url.startswith("sqlite")
    assert ("ix_pa_operations_stats" in old_columns) is sqlite  # on SQLite only

    assert await asyncio.to_thread(main, ["db", "upgrade", "--ledger", url]) == 0
    assert f"from 0008 to {migrate.head_revision()}" in capsys.readouterr().out

    after_ops, after_trail, columns = await _read(url)
    assert (after_ops, after_trail) == (before_ops, before_trail)
    assert len(after_trail) == len(trail) == 3 * 60
    assert columns[UNDELIVERED_INDEX] == ["created_at", "operation_id"]
    if sqlite:
        assert columns["ix_pa_operations_stats"] == list(STATS_COLUMNS)
        assert columns["ix_pa_operations_stats"] != old_columns["ix_pa_operations_stats"]
        # The same columns, the operation's place moved up to follow what is grouped by.
        assert sorted(columns["ix_pa_operations_stats"]) == sorted(
            old_columns["ix_pa_operations_stats"]
        )

    owed = sorted(r["operation_id"] for i, r in enumerate(ops) if i % 4 == 0)
    ledger = await SqlLedger.create(url)
    issued = record_selects(ledger) if sqlite else []
    try:
        undelivered = OperationFilter(status=[S.COMMITTED], undelivered=True, limit=10)
        first = await ledger.list(undelivered)
        rest = await ledger.list(
            OperationFilter(
                status=[S.COMMITTED],
                undelivered=True,
                after=(first[-1].created_at, first[-1].operation_id),
            )
        )
        assert [op.operation_id for op in first + rest] == owed
        # The other side of the filter is every other row, read without the index.
        told = await ledger.list(OperationFilter(undelivered=False))
        assert {op.operation_id for op in told} == {
            r["operation_id"] for i, r in enumerate(ops) if i % 4 in (1, 2)
        }
        stats = await ledger.statistics()
        assert stats["operations"] == 60
        assert stats["tools"]["book_table"]["committed_undelivered"] == len(owed)
        trail_of = await ledger.events(owed[0])
        assert [e.to_status for e in trail_of][-1] is S.COMMITTED
    finally:
        await ledger.close()
    if sqlite:
        plans = sqlite_plans(url.removeprefix("sqlite:///"), issued[:2])
        assert all(f"USING INDEX {UNDELIVERED_INDEX}" in p for p in plans), plans

    # And back: 0008's index over every row again, nothing lost either way.
    await alembic(url, "downgrade", "0008")
    down_ops, down_trail, down_columns = await _read(url)
    assert (down_ops, down_trail) == (before_ops, before_trail)
    assert down_columns == old_columns


async def test_rows_enter_the_partial_index_when_committed_untold_and_leave_when_told(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.db"
    url = f"sqlite:///{path}"
    await (await SqlLedger.create(url)).close()
    ops, trail = _rows(3, at=1e9)
    ops[0]["status"] = S.RUNNING.value
    await _bulk_insert(url, ops, trail)

    def in_index() -> list[str]:
        with sqlite3.connect(path) as raw:
            query = f"SELECT operation_id FROM pa_operations INDEXED BY {UNDELIVERED_INDEX}"
            return [r[0] for r in raw.execute(f"{query} WHERE {UNDELIVERED_WHERE}")]

    assert in_index() == [ops[1]["operation_id"], ops[2]["operation_id"]]
    with sqlite3.connect(path) as raw:
        raw.execute(
            "UPDATE pa_operations SET delivered_at = 5 WHERE operation_id = ?",
            (ops[1]["operation_id"],),
        )
    assert in_index() == [ops[2]["operation_id"]]
