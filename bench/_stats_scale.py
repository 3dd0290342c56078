"""``stats`` on a ledger of many operations, beside one indexed aggregate over the same rows.

Imported by ``bench/work.py``. The operations are ``operator_queries._operation_rows``' mix
(five tools, mostly committed mutations, refusals, failures, UNKNOWN, cancellations, joined
duplicates, two to five events each), written the fastest way each backend takes: plain
``sqlite3`` ``executemany`` in transactions of `BATCH` operations (synchronous off: the file is
thrown away), PostgreSQL ``COPY``, then ``ANALYZE`` (and ``VACUUM`` on PostgreSQL, whose pages a
month of autovacuum would have set all-visible). Then:

* ``stats``: `SqlLedger.statistics` over every row, as ``pipecat-actions stats`` calls it: the
  first call and the median of two more (seconds);
* floor: ``SELECT tool, status, count(*) ... GROUP BY tool, status`` on the raw driver (on
  SQLite it reads ``ix_pa_operations_stats``), the median of three after a first.
"""

from __future__ import annotations

import sqlite3
import statistics
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
from operator_queries import _operation_rows

from pipecat_actions.ledger import SqlLedger

BATCH = 50_000
FLOOR_SQL = "SELECT tool, status, count(*) FROM pa_operations GROUP BY tool, status"


@dataclass
class StatsTiming:
    """Seconds of ``stats`` and of its floor on a ledger of ``operations`` operations."""

    operations: int
    events: int
    build_secs: float
    first_secs: float
    stats_secs: float
    floor_secs: float


def _batches(count: int) -> Iterator[tuple[list[dict[str, Any]], list[dict[str, Any]]]]:
    ops: list[dict[str, Any]] = []
    trail: list[dict[str, Any]] = []
    for row, its_events in _operation_rows(count):
        ops.append(row)
        trail += its_events
        if len(ops) == BATCH:
            yield ops, trail
            ops, trail = [], []
    if ops:
        yield ops, trail


def _build_sqlite(database: Path, count: int) -> int:
    conn = sqlite3.connect(database, isolation_level=None)
    written = 0
    try:
        conn.execute("PRAGMA synchronous=OFF")
        for ops, trail in _batches(count):
            conn.execute("BEGIN")
            for table, rows in (("pa_operations", ops), ("pa_operation_events", trail)):
                columns = list(rows[0])
                conn.executemany(
                    f"INSERT INTO {table} ({', '.join(columns)}) "
                    f"VALUES ({', '.join('?' * len(columns))})",
                    [tuple(row[c] for c in columns) for row in rows],
                )
            conn.execute("COMMIT")
            written += len(trail)
        conn.execute("ANALYZE")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return written


async def _build_postgres(url: str, count: int) -> int:
    conn = await asyncpg.connect(url)
    written = 0
    try:
        for ops, trail in _batches(count):
            async with conn.transaction():
                for table, rows in (("pa_operations", ops), ("pa_operation_events", trail)):
                    columns = list(rows[0])
                    await conn.copy_records_to_table(
                        table, records=[tuple(row[c] for c in columns) for row in rows],
                        columns=columns,
                    )  # fmt: skip
            written += len(trail)
        await conn.execute("VACUUM ANALYZE pa_operations")
        await conn.execute("VACUUM ANALYZE pa_operation_events")
    finally:
        await conn.close()
    return written


async def _secs(call: Callable[[], Awaitable[object]]) -> float:
    started = time.perf_counter()
    await call()
    return time.perf_counter() - started


async def _median(call: Callable[[], Awaitable[object]], times: int) -> float:
    return statistics.median([await _secs(call) for _ in range(times)])


async def measure_stats(url: str, count: int) -> StatsTiming:
    """Build a ledger of ``count`` operations at ``url`` (empty) and time ``stats`` on it."""
    await (await SqlLedger.create(url)).close()
    started = time.perf_counter()
    if url.startswith("sqlite"):
        database = Path(url.removeprefix("sqlite:///"))
        events = _build_sqlite(database, count)
        raw = sqlite3.connect(database)

        async def floor() -> object:
            return raw.execute(FLOOR_SQL).fetchall()

    else:
        events = await _build_postgres(url, count)
        raw = await asyncpg.connect(url)

        async def floor() -> object:
            return await raw.fetch(FLOOR_SQL)

    build_secs = time.perf_counter() - started
    ledger = await SqlLedger.create(url)
    try:
        started = time.perf_counter()
        found = (await ledger.statistics())["operations"]
        first = time.perf_counter() - started
        if found != count:
            raise RuntimeError(f"stats counted {found} operations of {count}")
        again = await _median(ledger.statistics, 2)
        await floor()
        floor_secs = await _median(floor, 3)
    finally:
        await ledger.close()
        close = raw.close()
        if close is not None:
            await close
    return StatsTiming(count, events, build_secs, first, again, floor_secs)
