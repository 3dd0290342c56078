"""Migration 0011: `stats` from counts kept as rows change, and indexes for two slow pages.

A 0010 ledger with a mix of operations upgrades losing nothing; on PostgreSQL its groups are
counted and `stats` then gives, for every filter it takes from the groups (none, a tool, a
tenant, a time range cut inside an hour), the figures a pass over the rows gives, before and
after the ledger's own writes change rows (a refusal, a joined call, an operation gone
UNKNOWN and then reconciled, one told); ``--conflicts`` and a tool's open status are index
ranges; and back to 0010.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, func, inspect, select, text
from sqlalchemy.ext.asyncio import create_async_engine

from pipecat_actions.cli import main
from pipecat_actions.ledger import OperationFilter, SqlLedger, migrate
from pipecat_actions.ledger._filters import filter_conditions
from pipecat_actions.ledger._statistics import read_statistics
from pipecat_actions.ledger._trail import Mark
from pipecat_actions.ledger.engine import normalize_url
from pipecat_actions.ledger.records import First
from pipecat_actions.ledger.schema import CONFLICTS_INDEX, counts, deltas, events, operations
from pipecat_actions.status import ActionStatus
from tests.conftest import BACKENDS
from tests.ledger._support import alembic, record_selects, sqlite_plans
from tests.ledger.test_operator_queries import _bulk_insert, _rows, _story

S = ActionStatus
AT = 1_790_000_000.0  # on an hour (a multiple of 3600)
STEP = 97.0  # 300 operations over 8 hours


@pytest.fixture(params=BACKENDS)
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'old.db'}"
    url: str = request.getfixturevalue("pg_fresh_url")
    return url


def _mixed(count: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``count`` operations over hours, tools, tenants, statuses, marks, attempts and reasons."""
    ops, trail = _rows(count, at=AT)
    for i, row in enumerate(ops):
        created = AT + i * STEP
        row.update(
            tool=("book_table", "refund", "send_sms")[i % 3],
            tenant=("default", "tenant-1")[(i // 3) % 2],
            created_at=created,
            committed_at=created + 0.5 + i % 5,
            sent_at=created + 0.25,
            attempt=i % 3,
            joined_calls=i % 2,
            escalated_at=created + 1 if i % 11 == 0 else None,
        )
        kind = i % 7
        if kind == 0:
            row.update(
                status=S.UNKNOWN.value, committed_at=None, trail_marks=int(Mark.WENT_UNKNOWN)
            )
        elif kind == 1:
            row.update(status=S.REJECTED.value, committed_at=None, attempt=0)
            row.update(refusal_reason=("duplicate", "policy", None)[i % 3])
        elif kind == 2:
            row.update(status=S.FAILED_FINAL.value, committed_at=None, reconcile_errors=1)
        elif kind == 3:
            row.update(trail_marks=int(Mark.CONFLICT | Mark.RECONCILED))
        elif kind == 4:
            row.update(delivered_at=created + 2, acknowledged_at=created + 3 + i % 4)
    return ops, trail


async def _rows_read(url: str) -> tuple[list[Any], list[Any], set[str], set[str]]:
    """Every operation and event row, the tables and pa_operations' indexes."""

    def read(conn: Connection) -> tuple[list[Any], list[Any], set[str], set[str]]:
        ops = conn.execute(select(operations).order_by(operations.c.operation_id)).all()
        trail = conn.execute(select(events).order_by(events.c.operation_id, events.c.seq)).all()
        inspector = inspect(conn)
        indexes = {str(i["name"]) for i in inspector.get_indexes("pa_operations")}
        return ops, trail, set(inspector.get_table_names()), indexes

    engine = create_async_engine(normalize_url(url))
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(read)
    finally:
        await engine.dispose()


async def _over_the_rows(url: str, f: OperationFilter) -> dict[str, Any]:
    """`stats`' figures from a pass over the rows themselves (as before this migration)."""
    engine = create_async_engine(normalize_url(url))
    try:
        async with engine.begin() as conn:
            return await conn.run_sync(lambda c: read_statistics(c, filter_conditions(f)))
    finally:
        await engine.dispose()


FILTERS = [
    OperationFilter(),
    OperationFilter(tool="refund"),
    OperationFilter(tenant="tenant-1"),
    OperationFilter(tool="book_table", tenant="default"),
    OperationFilter(created_from=AT + 2.5 * 3600),  # from inside the third hour
    OperationFilter(created_from=AT + 1.2 * 3600, created_before=AT + 5.7 * 3600),
    OperationFilter(created_from=AT + 3600, created_before=AT + 4 * 3600),  # on hours
    OperationFilter(created_from=AT + 3.1 * 3600, created_before=AT + 3.9 * 3600),  # in one
    OperationFilter(session_id="call-3"),  # not from the groups: the rows
]


async def _assert_same_figures(url: str, ledger: SqlLedger) -> None:
    for f in FILTERS:
        assert await ledger.statistics(f) == await _over_the_rows(url, f), f


async def test_a_0010_ledger_upgrades_and_stats_counts_as_the_rows_say_while_they_change(
    empty_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    url = empty_url
    sqlite = url.startswith("sqlite")
    if sqlite:
        sqlite3.connect(url.removeprefix("sqlite:///")).close()
    await alembic(url, "upgrade", "0010")
    ops, trail = _mixed(300)
    await _bulk_insert(url, ops, trail)
    before_ops, before_trail, old_tables, old_indexes = await _rows_read(url)
    assert "pa_operation_counts" not in old_tables

    assert await asyncio.to_thread(main, ["db", "upgrade", "--ledger", url]) == 0
    assert f"from 0010 to {migrate.head_revision()}" in capsys.readouterr().out

    after_ops, after_trail, tables, indexes = await _rows_read(url)
    assert (after_ops, after_trail) == (before_ops, before_trail)
    assert {"pa_operation_counts", "pa_operation_deltas"} <= tables
    postgres_only = {"ix_pa_operations_tool_open", "ix_pa_operations_spread_sample"}
    assert indexes - old_indexes == {CONFLICTS_INDEX} | (set() if sqlite else postgres_only)

    ledger = await SqlLedger.create(url)
    try:
        groups = await ledger._read(
            lambda c: c.execute(select(counts.c.operations)).scalars().all()
        )
        # PostgreSQL counted the rows there into groups; SQLite keeps none.
        assert sum(groups) == (0 if sqlite else len(ops))
        await _assert_same_figures(url, ledger)

        await _story(ledger)  # a refusal, a call joined twice, one gone UNKNOWN
        lost = (await ledger.list(OperationFilter(status=[S.UNKNOWN], session_id="call-x")))[0]
        await ledger.transition(
            lost.operation_id, expected=S.UNKNOWN, to=S.COMMITTED, fence=1, actor="reconciler"
        )
        told = {"delivered_at": AT + 9 * 3600, "delivered_status": S.COMMITTED.value}
        await ledger.annotate(lost.operation_id, actor="runtime", changes=told)
        await ledger.annotate(
            lost.operation_id, actor="runtime", changes={"acknowledged_at": First(AT + 9.1 * 3600)}
        )
        await _assert_same_figures(url, ledger)  # deltas folded by the first stats
        await _assert_same_figures(url, ledger)  # and read from the counts alone
        assert (await ledger.statistics())["operations"] == len(ops) + 3

        conflicts = await _plan(url, ledger, OperationFilter(conflicted=True, limit=10))
        assert CONFLICTS_INDEX in conflicts, conflicts
        if not sqlite:
            open_page = OperationFilter(tool="refund", status=[S.UNKNOWN], limit=10)
            plan = await _plan(url, ledger, open_page)
            assert "ix_pa_operations_tool_open" in plan, plan
    finally:
        await ledger.close()

    await alembic(url, "downgrade", "0010")
    down_ops, _, down_tables, down_indexes = await _rows_read(url)
    assert "pa_operation_counts" not in down_tables
    assert down_indexes == old_indexes
    assert len(down_ops) == len(ops) + 3


async def _plan(url: str, ledger: SqlLedger, f: OperationFilter) -> str:
    """The plan of the page ``f`` asks for (PostgreSQL told not to scan the table: whether
    an index can answer it, whatever a few hundred rows would make it choose)."""
    issued = record_selects(ledger, lambda sql: "ORDER BY" in sql)  # the page, not a count
    await ledger.list(f)
    ((sql, params),) = issued
    if url.startswith("sqlite"):
        return " | ".join(sqlite_plans(url.removeprefix("sqlite:///"), [(sql, params)]))
    engine = create_async_engine(normalize_url(url))
    try:
        async with engine.begin() as conn:
            await conn.execute(text("SET LOCAL enable_seqscan = off"))
            raw = await conn.get_raw_connection()
            driver = raw.driver_connection
            assert driver is not None
            rows = await driver.fetch(f"EXPLAIN {sql}", *(params or ()))
            return " | ".join(r[0] for r in rows)
    finally:
        await engine.dispose()


@pytest.mark.postgres
async def test_each_heartbeat_folds_the_deltas_into_the_counts_on_postgres(
    pg_fresh_url: str,
) -> None:
    ledger = await SqlLedger.create(pg_fresh_url)
    try:
        await _story(ledger)  # three operations: inserts and changes, each a delta
        assert await _count_rows(ledger, deltas) > 0

        await ledger.renew_lease("runtime-a", lease_secs=30)

        assert await _count_rows(ledger, deltas) == 0
        assert (
            sum(
                await ledger._read(lambda c: c.execute(select(counts.c.operations)).scalars().all())
            )
            == 3
        )
        assert await ledger.statistics() == await _over_the_rows(pg_fresh_url, OperationFilter())
    finally:
        await ledger.close()


async def _count_rows(ledger: SqlLedger, table: Any) -> int:
    return int(
        await ledger._read(lambda c: c.execute(select(func.count()).select_from(table)).scalar())
    )
