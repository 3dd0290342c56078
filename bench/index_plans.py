"""Why each index of ``pa_operations`` is kept: the plan of every query that reads it.

    .venv/bin/python bench/index_plans.py [--rows N] [--no-postgres]

Every index is a page more for SQLite to write when a row is inserted, and when a change moves
its entry (issue 34: WAL frames per ``propose``); migration 0007 dropped the two that no
query read, and 0009 made ``ix_pa_operations_undelivered`` a partial index of the rows its one
query reads (committed, owed, never told); 0011 added partial ones for ``--conflicts`` and (on
PostgreSQL) a tool's open statuses and the spreads' sample of `stats` (read above 100,000
operations of a tool: ``bench/ten_million.py`` shows it). This builds a ledger of ``--rows``
operations (``operator_queries``' mix, default 20,000) on each backend, runs each query the product
makes through the ledger itself, records the SQL it sent, and prints the database's own plan
of it (SQLite ``EXPLAIN QUERY PLAN``, PostgreSQL ``EXPLAIN``) under the index it is there for.
A query whose plan names no index of its own is marked ``!``. ``make bench`` runs it after
``bench/work.py``.

The hot path's one-statement reads on PostgreSQL (``get``, ``find_by_key``) go to asyncpg,
not SQLAlchemy: their SQL is `_postgres`' own and explained the same way.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncpg
from _measure import drop_pg, fresh_pg
from _stats_scale import _build_postgres, _build_sqlite
from loguru import logger
from sqlalchemy import event

from pipecat_actions.ledger import OperationFilter, SqlLedger
from pipecat_actions.ledger._postgres import _BY_SLOT, _GET
from pipecat_actions.ledger.sqlite import SqliteLedger
from pipecat_actions.status import ActionStatus

S = ActionStatus
Call = Callable[[SqlLedger], Awaitable[object]]

QUERIES: list[tuple[str, str, Call]] = [
    ("uq_pa_operations_key_slot", "find_by_key (admission of a repeat)",
     lambda d: d.find_by_key("default", "book_table:7")),
    ("ix_pa_operations_session", "list(session) (deliveries, supersession)",
     lambda d: d.list(OperationFilter(session_id="call-40"))),
    ("ix_pa_operations_session", "list(session, tool, newest first) (model cancels)",
     lambda d: d.list(OperationFilter(session_id="call-40", tool="book_table",
                                      newest_first=True, limit=50))),
    ("ix_pa_operations_tool_created", "list(tool) page (ledger list --tool)",
     lambda d: d.list(OperationFilter(tool="book_table", limit=50))),
    ("ix_pa_operations_tool_created", "list(tool, since) (cli stats --tool)",
     lambda d: d.list(OperationFilter(tool="book_table", created_from=1.7e9, limit=50))),
    ("ix_pa_operations_principal", "list(principal) page (ledger list --principal)",
     lambda d: d.list(OperationFilter(principal="user-7", limit=50))),
    ("ix_pa_operations_created", "list() page (ledger list)",
     lambda d: d.list(OperationFilter(limit=50))),
    ("ix_pa_operations_created", "list(newest first) (console: recent)",
     lambda d: d.list(OperationFilter(limit=30, newest_first=True))),
    ("ix_pa_operations_undelivered", "list(COMMITTED, undelivered) (recovery, console)",
     lambda d: d.list(OperationFilter(status=[S.COMMITTED], undelivered=True, limit=51))),
    ("ix_pa_operations_status_lease", "list(UNKNOWN) (console, operator)",
     lambda d: d.list(OperationFilter(status=[S.UNKNOWN], limit=51))),
    ("ix_pa_operations_status_lease", "list(AWAITING_APPROVAL) (approvals)",
     lambda d: d.list(OperationFilter(status=[S.AWAITING_APPROVAL]))),
    ("ix_pa_operations_status_lease", "claim_stale (recovery, watchdog)",
     lambda d: d.claim_stale("bench", lease_secs=30, limit=10)),
    ("ix_pa_operations_status_lease", "renew_lease (heartbeat)",
     lambda d: d.renew_lease("bench", lease_secs=30)),
    ("ix_pa_operations_status_lease", "gone_owners (lease holders)",
     lambda d: d.gone_owners(besides="bench")),
    ("ix_pa_operations_stats", "statistics() (stats; SQLite only)",
     lambda d: d.statistics()),
    ("ix_pa_operations_conflicts", "list(conflicted) page (ledger list --conflicts)",
     lambda d: d.list(OperationFilter(conflicted=True, limit=51))),
    ("ix_pa_operations_tool_open", "list(tool, UNKNOWN) (ledger list --tool --status; PG only)",
     lambda d: d.list(OperationFilter(tool="refund", status=[S.UNKNOWN], limit=51))),
    ("ix_pa_operations_spread_sample", "statistics(): the spreads' sample (PostgreSQL only)",
     lambda d: d.statistics()),
]  # fmt: skip
POSTGRES_ONLY = frozenset({"ix_pa_operations_tool_open", "ix_pa_operations_spread_sample"})
SQLITE_ONLY = frozenset({"ix_pa_operations_stats"})


def _recorder(ledger: SqlLedger) -> list[tuple[str, Any]]:
    issued: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        words = statement.lstrip().split(None, 1)
        if words and words[0].upper() in ("SELECT", "UPDATE", "WITH") and "pa_" in statement:
            issued.append((statement, parameters))

    engines = [ledger._engine.sync_engine]
    if isinstance(ledger, SqliteLedger) and ledger._sqlite_writer is not None:
        engines.append(ledger._sqlite_writer)
    for engine in engines:
        event.listen(engine, "before_cursor_execute", record)
    return issued


def _sqlite_plan(path: Path, sql: str, params: Any) -> list[str]:
    with sqlite3.connect(path) as raw:
        return [step[3] for step in raw.execute(f"EXPLAIN QUERY PLAN {sql}", params or ())]


async def _pg_plan(url: str, sql: str, params: Any) -> list[str]:
    conn = await asyncpg.connect(url)
    try:
        rows = await conn.fetch(f"EXPLAIN {sql}", *(params or ()))
    finally:
        await conn.close()
    return [row[0] for row in rows]


async def plans(url: str, rows: int) -> list[str]:
    """Build a ledger of ``rows`` operations at ``url`` and print each query's plan."""
    sqlite = url.startswith("sqlite")
    await (await SqlLedger.create(url)).close()
    path = Path(url.removeprefix("sqlite:///"))
    if sqlite:
        _build_sqlite(path, rows)
    else:
        await _build_postgres(url, rows)
    raw_url = url.replace("postgresql+asyncpg", "postgresql")
    out = [f"== {'SQLite' if sqlite else 'PostgreSQL'}, {rows:,} operations"]
    ledger = await SqlLedger.create(url)
    issued = _recorder(ledger)
    try:
        for index, what, call in QUERIES:
            if index in (SQLITE_ONLY if not sqlite else POSTGRES_ONLY):
                continue
            issued.clear()
            await call(ledger)
            out.append(f"{index}: {what}")
            for sql, params in list(issued):
                steps = (
                    _sqlite_plan(path, sql, params)
                    if sqlite
                    else await _pg_plan(raw_url, sql, params)
                )
                mark = " " if any(index in s for s in steps) else "!"
                out += [f"  {mark} {step}" for step in steps]
        if not sqlite:
            for what, sql, params in (
                ("get (hot path, asyncpg)", _GET, ("op_x",)),
                ("find_by_key (hot path, asyncpg)", _BY_SLOT, ("default", "k")),
            ):
                out.append(f"pa_operations_pkey / uq_pa_operations_key_slot: {what}")
                out += [f"    {step}" for step in await _pg_plan(raw_url, sql, params)]
    finally:
        await ledger.close()
    return out


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="pa-bench-plans-") as directory:
        print("\n".join(await plans(f"sqlite:///{Path(directory) / 'plans.db'}", args.rows)))
    if args.no_postgres:
        return
    name, url = await fresh_pg()
    try:
        print("\n".join(await plans(url, args.rows)))
    finally:
        await drop_pg(name)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--no-postgres", action="store_true")
    logger.remove()
    asyncio.run(main(parser.parse_args()))
