"""Operator queries on a large ledger: `stats`, `ledger list` and `undelivered`, in-process.

    .venv/bin/python bench/operator_queries.py [--operations N] [--no-postgres]

Builds an N-operation ledger itself (default 1,000,000) by bulk inserts straight into the
tables (SQLAlchemy Core executemany), on SQLite in a temporary directory and on PostgreSQL
when the server answers (``$PIPECAT_ACTIONS_PG_ADMIN_URL``, default
postgresql://postgres@127.0.0.1:5432/postgres: a database of its own, dropped afterwards).
The mix is plausible: five tools, mostly committed and delivered mutations, committed reads,
refusals, failures, UNKNOWN, cancellations and joined duplicates, two to five events each
(every told operation has its delivery recorded, as the delivery service writes it).

Then times, through `SqlLedger` as `pipecat-actions` calls it:

* ``stats``: `SqlLedger.statistics` over every row (target at most 2 s);
* ``ledger list`` and ``undelivered``: the first page of 200 (target at most 50 ms each),
  the median of 5 reads;
* ``stats`` and first pages with the filters the CLI and the API take (a tool, a time, a
  principal, a session, a status and a tool with a status), for figures only.

and, side by side in the same run, the old approaches:

* the same list queries with their indexes switched off (SQLite ``NOT INDEXED``,
  PostgreSQL ``enable_indexscan/bitmapscan=off``): a full scan and a sort, as before
  migration 0003;
* the old ``stats``, which read the operations and then every operation's events (16 at a
  time), timed on a 10,000-operation slice and extrapolated linearly to N (the old code read
  at most 100,000 of them and said nothing).

Figures, not pass/fail.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import create_async_engine

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipecat_actions.ledger import OperationFilter, SqlLedger
from pipecat_actions.ledger._trail import TrailMarks
from pipecat_actions.ledger.engine import normalize_url
from pipecat_actions.ledger.records import canonical_json, hash_canonical_json
from pipecat_actions.ledger.schema import events, operations
from pipecat_actions.status import ActionStatus

S = ActionStatus
PG_ADMIN_URL = os.environ.get(
    "PIPECAT_ACTIONS_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
TOOLS = ("book_table", "cancel_booking", "check_availability", "send_sms", "refund")
START = 1_790_000_000.0
SPAN_SECS = 30 * 86_400.0
BATCH = 20_000
STATS_TARGET_SECS = 2.0
PAGE_TARGET_MS = 50.0
OLD_STATS_SLICE = 10_000


def _operation_rows(count: int) -> Iterator[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Yield (operation row, its event rows), oldest first, in a deterministic mix."""
    args_json = canonical_json({"restaurant_id": "r-17", "time": "21:00", "party_size": 4})
    args_hash = hash_canonical_json(args_json)
    step = SPAN_SECS / max(count, 1)
    for i in range(count):
        created = START + i * step
        tool = TOOLS[i % len(TOOLS)]
        kind = "read" if tool == "check_availability" else "mutation"
        op_id = f"op_{int(created * 1000):012x}{i:014x}"
        roll = (i * 7919) % 100  # spreads the outcomes over tools and time
        row: dict[str, Any] = {
            "operation_id": op_id,
            "tenant": "default",
            "session_id": f"call-{i // 6}",
            "principal": f"user-{i % 5000}",
            "tool": tool,
            "kind": kind,
            "args_json": args_json,
            "args_hash": args_hash,
            "idempotency_key": f"{tool}:{i}",
            "key_slot": None,
            "key_expires_at": created + 86_400.0,
            "resource_key": None,
            "turn_id": None,
            "provider_call_id": f"call_{i}",
            "model_response_id": None,
            "rationale": None,
            "agent": None,
            "delivered_agent": None,
            "status": S.COMMITTED.value,
            "attempt": 1,
            "result_json": '{"ok":true}',
            "error": None,
            "before_state_json": None,
            "compensates": None,
            "deadline_at": None,
            "lease_owner": None,
            "lease_expires_at": None,
            "fence": 1,
            "event_seq": 0,
            "escalated_at": None,
            "created_at": created,
            "updated_at": created + 1.0,
            "admitted_at": created,
            "started_at": created + 0.01,
            "sent_at": created + 0.01,
            "committed_at": created + 0.2 + (i % 50) / 100,
            "finished_at": None,
            "delivered_at": created + 1.0,
            "acknowledged_at": created + 2.0,
            "delivered_status": S.COMMITTED.value,
        }
        path: list[tuple[str | None, str, str, str | None]] = []  # from, to, actor, detail

        def event(
            src: str | None,
            dst: str,
            actor: str = "runtime",
            detail: Any = None,
            path: list[tuple[str | None, str, str, str | None]] = path,
        ) -> None:
            path.append((src, dst, actor, None if detail is None else canonical_json(detail)))

        if kind == "read":
            event("REQUESTED", "COMMITTED")
        elif roll < 5:
            row.update(status=S.REJECTED.value, attempt=0, sent_at=None, committed_at=None,
                       admitted_at=None, started_at=None, delivered_at=None,
                       acknowledged_at=None, delivered_status=None, result_json=None)  # fmt: skip
            event("REQUESTED", "REJECTED", detail={"reason": "invalid_arguments"})
        else:
            event("REQUESTED", "ADMITTED")
            event("ADMITTED", "RUNNING")
            if roll < 8:
                row.update(status=S.FAILED_FINAL.value, committed_at=None, result_json=None,
                           delivered_status=S.FAILED_FINAL.value)  # fmt: skip
                event("RUNNING", "FAILED_FINAL", actor="watchdog", detail={"timed_out": True})
            elif roll < 10:
                row.update(status=S.UNKNOWN.value, committed_at=None, result_json=None,
                           delivered_at=None, acknowledged_at=None,
                           delivered_status=None)  # fmt: skip
                event("RUNNING", "UNKNOWN", detail={"error": "connection reset"})
            elif roll < 12:
                row.update(status=S.CANCELLED.value, committed_at=None, result_json=None,
                           attempt=0, sent_at=None, delivered_status=S.CANCELLED.value)  # fmt: skip
                path.pop()
                event("ADMITTED", "CANCELLED", detail={"reason": "user changed their mind"})
            else:
                event("RUNNING", "COMMITTED")
                if roll % 13 == 0:
                    row.update(delivered_at=None, acknowledged_at=None, delivered_status=None)
                if roll % 17 == 0:
                    event("COMMITTED", "COMMITTED", detail={"duplicates_joined": [{"turn": 2}]})
        if row["delivered_status"] is not None:
            # The delivery service's record of the telling, as every told operation has one
            # (about 1 in 30 of them told late, after the conversation moved on).
            told = {"agent": None, "delivered": row["delivered_status"], "late": roll % 30 == 0}
            event(row["status"], row["status"], actor=f"gate:call-{i // 6}", detail=told)
        if row["status"] in (S.COMMITTED.value, S.FAILED_FINAL.value, S.REJECTED.value,
                             S.CANCELLED.value):  # fmt: skip
            row["finished_at"] = row["committed_at"] or created + 0.5
        row["event_seq"] = len(path)
        trail = [
            {
                "operation_id": op_id,
                "seq": seq,
                "at": created + seq * 0.01,
                "kind": "created" if seq == 1 else "annotation" if src == dst else "transition",
                "from_status": src,
                "to_status": dst,
                "actor": actor,
                "detail_json": detail,
            }
            for seq, (src, dst, actor, detail) in enumerate(path, start=1)
        ]
        row.update(TrailMarks.of_trail(trail).columns())  # as the ledger's writers fold them in
        yield row, trail


async def build(url: str, count: int) -> int:
    """Create the schema and insert ``count`` operations; return how many events."""
    await (await SqlLedger.create(url)).close()
    engine = create_async_engine(normalize_url(url))
    written = 0
    try:
        ops: list[dict[str, Any]] = []
        trail: list[dict[str, Any]] = []
        rows = _operation_rows(count)
        while True:
            for row, its_events in rows:
                ops.append(row)
                trail += its_events
                if len(ops) == BATCH:
                    break
            if not ops:
                break
            async with engine.begin() as conn:
                await conn.execute(insert(operations), ops)
                await conn.execute(insert(events), trail)
            written += len(trail)
            ops, trail = [], []
        if url.startswith("sqlite"):
            async with engine.begin() as conn:
                await conn.exec_driver_sql("ANALYZE")
        else:
            # A month of writes has been vacuumed by autovacuum many times over: its pages
            # are all-visible and their hint bits set. A bulk load's are not, and the first
            # reads would pay for setting them.
            raw = await asyncpg.connect(url)
            try:
                await raw.execute("VACUUM ANALYZE pa_operations")
                await raw.execute("VACUUM ANALYZE pa_operation_events")
            finally:
                await raw.close()
    finally:
        await engine.dispose()
    return written


async def _median_secs(read: Callable[[], Awaitable[object]], times: int = 5) -> float:
    await read()  # warm the cache: an operator runs the command on a live database
    samples = []
    for _ in range(times):
        started = time.perf_counter()
        await read()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


async def _old_page_secs(url: str, undelivered: bool) -> float:
    """The first page by a full scan and sort: the indexes of migration 0003 not used."""
    engine = create_async_engine(normalize_url(url))
    sqlite = url.startswith("sqlite")
    where = "WHERE status = 'COMMITTED' AND delivered_at IS NULL " if undelivered else ""
    table = "pa_operations NOT INDEXED" if sqlite else "pa_operations"
    sql = f"SELECT * FROM {table} {where}ORDER BY created_at, operation_id LIMIT 201"
    try:
        async with engine.connect() as conn:
            if not sqlite:
                await conn.exec_driver_sql("SET enable_indexscan = off")
                await conn.exec_driver_sql("SET enable_bitmapscan = off")
                await conn.exec_driver_sql("SET enable_indexonlyscan = off")

            async def read() -> object:
                return (await conn.exec_driver_sql(sql)).all()

            return await _median_secs(read, times=3)
    finally:
        await engine.dispose()


async def _old_stats_slice_secs(ledger: SqlLedger) -> float:
    """The old reading: the operations, then each one's events, 16 at a time."""
    started = time.perf_counter()
    ops = await ledger.list(OperationFilter(limit=OLD_STATS_SLICE))
    wanted = [op for op in ops if op.kind != "read" or op.status is not S.COMMITTED]
    for start in range(0, len(wanted), 16):
        chunk = wanted[start : start + 16]
        await asyncio.gather(*(ledger.events(op.operation_id) for op in chunk))
    return time.perf_counter() - started


async def measure(url: str, label: str, count: int) -> None:
    started = time.perf_counter()
    written = await build(url, count)
    print(f"{label}: built {count:,} operations and {written:,} events "
          f"in {time.perf_counter() - started:.1f} s")  # fmt: skip
    ledger = await SqlLedger.create(url)
    try:
        started = time.perf_counter()
        stats = await ledger.statistics()
        stats_secs = time.perf_counter() - started
        assert stats["operations"] == count, stats["operations"]
        again = await _median_secs(ledger.statistics, times=2)
        first = OperationFilter(limit=201)
        undelivered = OperationFilter(status=[S.COMMITTED], undelivered=True, limit=201)
        list_secs = await _median_secs(lambda: ledger.list(first))
        undelivered_secs = await _median_secs(lambda: ledger.list(undelivered))
        old_list = await _old_page_secs(url, undelivered=False)
        old_undelivered = await _old_page_secs(url, undelivered=True)
        filtered = await _filtered_secs(ledger)
        slice_secs = await _old_stats_slice_secs(ledger)
    finally:
        await ledger.close()
    old_stats = slice_secs * count / OLD_STATS_SLICE
    print(f"  stats            {stats_secs:8.3f} s (again {again:.3f} s)   target <= "
          f"{STATS_TARGET_SECS:.0f} s   old: {old_stats:,.1f} s extrapolated from "
          f"{slice_secs:.2f} s for {OLD_STATS_SLICE:,} operations, and it read at most "
          f"100,000 of {count:,}")  # fmt: skip
    print(f"  ledger list      {list_secs * 1000:8.2f} ms  target <= {PAGE_TARGET_MS:.0f} ms   "
          f"old (no index, scan + sort): {old_list * 1000:,.1f} ms")  # fmt: skip
    print(f"  undelivered      {undelivered_secs * 1000:8.2f} ms  target <= "
          f"{PAGE_TARGET_MS:.0f} ms   old (no index, scan + sort): "
          f"{old_undelivered * 1000:,.1f} ms")  # fmt: skip
    for name, secs in filtered.items():
        unit, scale = ("s", 1) if name.startswith("stats") else ("ms", 1000)
        print(f"  {name:<42} {secs * scale:8.3f} {unit}")


FILTERED_STATS = {
    "stats --tool book_table": OperationFilter(tool="book_table"),
    "stats --since (the last day)": OperationFilter(created_from=START + SPAN_SECS - 86_400),
    "stats --since (the last 15 days)": OperationFilter(created_from=START + SPAN_SECS / 2),
    "stats of one principal": OperationFilter(principal="user-17"),
}
FILTERED_PAGES = {
    "list --tool refund": OperationFilter(tool="refund", limit=201),
    "list --principal user-17": OperationFilter(principal="user-17", limit=201),
    "list --session call-77": OperationFilter(session_id="call-77", limit=201),
    "list --status UNKNOWN": OperationFilter(status=[S.UNKNOWN], limit=201),
    "list --tool refund --status UNKNOWN": OperationFilter(
        tool="refund", status=[S.UNKNOWN], limit=201
    ),
    "list --tool book_table --status COMMITTED": OperationFilter(
        tool="book_table", status=[S.COMMITTED], limit=201
    ),
}


async def _filtered_secs(ledger: SqlLedger) -> dict[str, float]:
    """`stats` and first pages with the filters the CLI and the API take (medians)."""
    secs = {}
    for name, filters in FILTERED_STATS.items():
        secs[name] = await _median_secs(lambda f=filters: ledger.statistics(f), times=2)
    for name, filters in FILTERED_PAGES.items():
        secs[name] = await _median_secs(lambda f=filters: ledger.list(f))
    return secs


async def _pg_reachable() -> bool:
    try:
        conn = await asyncpg.connect(PG_ADMIN_URL, timeout=3)
    except (TimeoutError, OSError, asyncpg.PostgresError):
        return False
    await conn.close()
    return True


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as directory:
        await measure(f"sqlite:///{Path(directory) / 'ledger.db'}", "sqlite", args.operations)
    if args.no_postgres or not await _pg_reachable():
        print("postgres: skipped" + ("" if args.no_postgres else " (not reachable)"))
        return
    name = f"pa_bench_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(PG_ADMIN_URL)
    await admin.execute(f'CREATE DATABASE "{name}"')
    await admin.close()
    try:
        await measure(PG_ADMIN_URL.rpartition("/")[0] + "/" + name, "postgres", args.operations)
    finally:
        admin = await asyncpg.connect(PG_ADMIN_URL)
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--operations", type=int, default=1_000_000)
    parser.add_argument("--no-postgres", action="store_true")
    asyncio.run(main(parser.parse_args()))
