"""The PostgreSQL ledger at 10M operations beside the same ledger empty, in one run (issue 34).

    .venv/bin/python bench/ten_million.py [--rows N] [--template T] [--proposes P]

On a database created for the run (dropped after it, whatever happens), measured first on the
empty ledger and then again once it holds ``--rows`` operations (default 10,000,000):

* **admit**: `ActionRuntime.propose` of a non-idempotent mutation whose 0-ms effect returns at
  once, one at a time: p50 and p99 latency, and the work counted by the server for this
  database alone (``pg_stat_database``): buffer pages touched (hit + read), pages read from
  outside PostgreSQL's cache, transactions committed, rows inserted, each per propose. Each
  figure is the difference between a runtime making 2P proposes and one making P (each opened,
  used and closed: a backend's counters reach ``pg_stat_database`` when it exits), over P,
  so that opening and closing cancel out. Goal: the same as on the empty ledger (the B-trees
  are a level deeper at 10M: a few pages more per insert is the floor, not a scan).
* **stats**: `SqlLedger.statistics` over every row, as ``pipecat-actions stats`` calls it: the
  first call and the median of two more. Goal <= 2 s.
* **pages** of ``ledger list`` (201 rows: a page of 200 and the one that says more follow, as
  the CLI asks): the first page, the newest, a deep page by keyset cursor (90 % of the way in),
  and pages filtered by tool (and deep), status, tool and status, session, tenant (a common and
  a rare one), principal, conflicts and ``undelivered``; the median of 5 reads after one.
  Goal <= 50 ms each.

* **recovery**: how many operations there are in a status a runtime's recovery claims (not
  terminal: the UNKNOWN ones of the mix), and the seconds of one ``claim_stale`` batch of 50 as
  recovery sends it, leaving out no operation and then 5,000 (the measured runtimes open with
  ``recover=False``: the admit path alone).

A query over its goal has its plan printed (``EXPLAIN (ANALYZE, BUFFERS)`` of each statement
the ledger sent for it, recorded as ``bench/index_plans.py`` records them).

**The ledger built**: ``operator_queries``' mix (five tools, mostly committed and delivered
mutations, committed reads, refusals, failures, UNKNOWN, cancellations, joined duplicates, two
to five events each, as the ledger writes them) for ``--template`` operations (default
100,000), sent by ``COPY`` to staging tables, then copied server-side ``INSERT ... SELECT``
until there are ``--rows``: copy *j* of the template is moved in time to its own slice of the
month (every timestamp of a row and of its events moved together), with operation ids, keys,
provider call ids, sessions (6 operations each) and principals of its own, tenants per session
(half ``default``, the rest spread over 25 others, 2 % each), and about 3 in 20,000 committed
mutations marked contradicted by the system of record (``ledger list --conflicts``). To load it
cheaply, the tables' indexes and constraints are dropped while the rows go in and created again
after, by their own definitions (checked identical afterwards), then ``VACUUM ANALYZE`` (as
months of autovacuum would have left the pages). At 10M the database takes about 15 GB: the
run checks the server's disk first and refuses when it lacks room.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import shutil
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncpg
from _measure import PG_ADMIN_URL, drop_pg, fresh_pg
from _per_propose import POLICY, booking_action, propose
from index_plans import _recorder
from loguru import logger
from operator_queries import SPAN_SECS, START, _operation_rows

from pipecat_actions import ActionRuntime, AllowAll
from pipecat_actions.ledger import OperationFilter, SqlLedger
from pipecat_actions.ledger._counts import BACKFILL
from pipecat_actions.ledger._trail import Mark
from pipecat_actions.policy import load_policy_text
from pipecat_actions.status import TERMINAL_STATUSES, ActionStatus

S = ActionStatus
STATS_GOAL_SECS = 2.0
PAGE_GOAL_MS = 50.0
PAGE = 201
BYTES_PER_OPERATION = 1600
"""Disk per operation with its events and indexes (15 GB at 10M; for the disk check)."""
TIMES = (
    "key_expires_at", "deadline_at", "lease_expires_at", "escalated_at", "created_at",
    "updated_at", "admitted_at", "started_at", "sent_at", "committed_at", "finished_at",
    "delivered_at", "acknowledged_at",
)  # fmt: skip
"""Every timestamp column of ``pa_operations``, moved with its copy of the template."""
CONFLICT_EVERY = 20_000


@dataclass
class Admit:
    """Proposes on one ledger: latencies of the 2P run and work per propose (2P - P)."""

    p50_ms: float
    p99_ms: float
    per_propose: dict[str, float]


@dataclass
class State:
    """The figures of one ledger: empty or full."""

    operations: int
    admit: Admit | None = None
    stats_first: float = 0.0
    stats_secs: float = 0.0
    pages_ms: dict[str, float] = field(default_factory=dict)
    plans: list[str] = field(default_factory=list)
    recovery_secs: dict[str, float] = field(default_factory=dict)
    stale: int = 0
    """Operations in a status that recovery claims (not terminal)."""


# --- admit ----------------------------------------------------------------------------------

COUNTERS = ("blks_hit", "blks_read", "xact_commit", "tup_inserted", "tup_updated")


async def _server_counters(admin: asyncpg.Connection, name: str) -> dict[str, int]:
    """This database's counters once every backend of it has gone (and so reported them)."""
    for _ in range(200):
        left = await admin.fetchval(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
            name,
        )
        if left == 0:
            break
        await asyncio.sleep(0.05)
    await admin.execute("SELECT pg_stat_clear_snapshot()")
    row = await admin.fetchrow(
        f"SELECT {', '.join(COUNTERS)} FROM pg_stat_database WHERE datname = $1", name
    )
    return dict(row)


async def _propose_run(
    url: str, name: str, admin: asyncpg.Connection, first: int, count: int, prefix: str
) -> tuple[list[float], dict[str, int]]:
    """Proposes number ``first`` to ``first + count - 1`` (new arguments each: none joins)."""
    before = await _server_counters(admin, name)
    # recover=False: the admit path alone. With it, a runtime opened on the built ledger first
    # claims every UNKNOWN operation there (2 % of them; see `measure_recovery`).
    runtime = await ActionRuntime.create(
        load_policy_text(POLICY),
        authorizer=AllowAll(),
        actions=[booking_action()],
        ledger_url=url,
        recover=False,
    )
    latencies = []
    try:
        for i in range(first, first + count):
            started = time.perf_counter()
            await propose(runtime, i, prefix)
            latencies.append(time.perf_counter() - started)
    finally:
        await runtime.close()
    after = await _server_counters(admin, name)
    return latencies, {k: after[k] - before[k] for k in COUNTERS}


async def measure_admit(url: str, name: str, proposes: int, first: int, prefix: str = "") -> Admit:
    admin = await asyncpg.connect(PG_ADMIN_URL)
    try:
        await _propose_run(url, name, admin, first, proposes, prefix)
        _, once = await _propose_run(url, name, admin, first + proposes, proposes, prefix)
        latencies, twice = await _propose_run(
            url, name, admin, first + 2 * proposes, 2 * proposes, prefix
        )
    finally:
        await admin.close()
    ordered = sorted(latencies)
    return Admit(
        p50_ms=statistics.median(ordered) * 1000,
        p99_ms=ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
        per_propose={k: (twice[k] - once[k]) / proposes for k in COUNTERS},
    )


async def measure_recovery(url: str) -> dict[str, float]:
    """Seconds of one `claim_stale` batch (50) as a runtime's recovery makes it, when it leaves
    out no operation and when it leaves out 5,000 (the operations of tools it does not serve,
    already claimed and let go, grow that list batch by batch)."""
    ledger = await SqlLedger.create(url)
    try:
        secs = {}
        for left in (0, 5_000):
            leave = [f"op_not_here_{n}" for n in range(left)]
            started = time.perf_counter()
            await ledger.claim_stale("bench-recovery", lease_secs=30, limit=50, except_ids=leave)
            secs[f"claim_stale, 50, leaving out {left:,}"] = time.perf_counter() - started
        return secs
    finally:
        await ledger.close()


# --- reads ----------------------------------------------------------------------------------


async def _median_secs(read: Callable[[], Awaitable[object]], times: int) -> float:
    await read()  # an operator's command runs on a live database, its pages cached
    samples = []
    for _ in range(times):
        started = time.perf_counter()
        await read()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


async def pages(ledger: SqlLedger, rows: int) -> dict[str, OperationFilter]:
    """The pages read, with cursors and a session taken from the ledger itself."""
    late = START + SPAN_SECS * 0.9
    found = await ledger.list(OperationFilter(created_from=late, limit=1))
    cursor = (found[0].created_at, found[0].operation_id) if found else None
    refund = await ledger.list(OperationFilter(tool="refund", created_from=late, limit=1))
    refund_cursor = (refund[0].created_at, refund[0].operation_id) if refund else None
    return {
        "first page": OperationFilter(limit=PAGE),
        "newest first": OperationFilter(limit=PAGE, newest_first=True),
        "deep page (cursor 90 % in)": OperationFilter(after=cursor, limit=PAGE),
        "--tool refund": OperationFilter(tool="refund", limit=PAGE),
        "--tool refund, deep (cursor)": OperationFilter(
            tool="refund", after=refund_cursor, limit=PAGE
        ),
        "--status UNKNOWN": OperationFilter(status=[S.UNKNOWN], limit=PAGE),
        "--status FAILED_FINAL, deep (cursor)": OperationFilter(
            status=[S.FAILED_FINAL], after=cursor, limit=PAGE
        ),
        "--tool book_table --status COMMITTED": OperationFilter(
            tool="book_table", status=[S.COMMITTED], limit=PAGE
        ),
        "--tool refund --status UNKNOWN": OperationFilter(
            tool="refund", status=[S.UNKNOWN], limit=PAGE
        ),
        "--session (one late in the month)": OperationFilter(
            session_id=f"call-{int(rows * 0.9) // 6}", limit=PAGE
        ),
        "--principal user-17": OperationFilter(principal="user-17", limit=PAGE),
        "tenant default (API)": OperationFilter(tenant="default", limit=PAGE),
        "tenant tenant-7, 2 % (API)": OperationFilter(tenant="tenant-7", limit=PAGE),
        "--conflicts": OperationFilter(conflicted=True, limit=PAGE),
        "undelivered": OperationFilter(status=[S.COMMITTED], undelivered=True, limit=PAGE),
    }


async def _plans(
    ledger: SqlLedger, url: str, what: str, read: Callable[[], Awaitable[Any]]
) -> list[str]:
    """``EXPLAIN (ANALYZE, BUFFERS)`` of every statement ``read`` makes the ledger send."""
    issued = _recorder(ledger)
    await read()
    out = [f"-- {what}"]
    conn = await asyncpg.connect(url)
    try:
        for sql, params in list(issued):
            out.append(f"   {' '.join(sql.split())[:400]}")
            rows = await conn.fetch(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", *(params or ()))
            out += [f"     {row[0]}" for row in rows]
    finally:
        await conn.close()
    return out


async def measure_reads(url: str, state: State, rows: int, stats_times: int) -> None:
    ledger = await SqlLedger.create(url)
    try:
        started = time.perf_counter()
        found = (await ledger.statistics())["operations"]
        state.stats_first = time.perf_counter() - started
        if found != state.operations:
            raise RuntimeError(f"stats counted {found} operations of {state.operations}")
        samples = []
        for _ in range(stats_times):
            started = time.perf_counter()
            await ledger.statistics()
            samples.append(time.perf_counter() - started)
        state.stats_secs = statistics.median(samples)
        wanted = await pages(ledger, rows)
        for what, filters in wanted.items():
            state.pages_ms[what] = 1000 * await _median_secs(lambda f=filters: ledger.list(f), 5)
        if state.stats_secs > STATS_GOAL_SECS:
            state.plans += await _plans(ledger, url, "stats", ledger.statistics)
        for what, ms in state.pages_ms.items():
            if ms > PAGE_GOAL_MS:
                filters = wanted[what]
                state.plans += await _plans(
                    ledger, url, f"list: {what}", lambda f=filters: ledger.list(f)
                )
    finally:
        await ledger.close()


# --- the build ------------------------------------------------------------------------------


async def _definitions(conn: asyncpg.Connection) -> tuple[list[tuple[str, str, str]], list[str]]:
    """The constraints (table, name, definition; foreign keys last) and the other indexes."""
    constraints = await conn.fetch(
        "SELECT c.conrelid::regclass::text AS tab, c.conname, pg_get_constraintdef(c.oid) AS def"
        " FROM pg_constraint c WHERE c.conrelid IN"
        " ('pa_operations'::regclass, 'pa_operation_events'::regclass)"
        " AND c.contype IN ('p', 'u', 'f') ORDER BY c.contype = 'f', c.conname"
    )
    indexes = await conn.fetch(
        "SELECT pg_get_indexdef(i.indexrelid) FROM pg_index i"
        " WHERE i.indrelid IN ('pa_operations'::regclass, 'pa_operation_events'::regclass)"
        " AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid)"
        " ORDER BY 1"
    )
    return [(r["tab"], r["conname"], r["def"]) for r in constraints], [r[0] for r in indexes]


async def _stage_template(conn: asyncpg.Connection, template: int) -> None:
    """COPY ``template`` operations and their events into unlogged staging tables."""
    await conn.execute(
        "CREATE UNLOGGED TABLE stage_ops (LIKE pa_operations INCLUDING DEFAULTS, n bigint);"
        "CREATE UNLOGGED TABLE stage_events (LIKE pa_operation_events, n bigint,"
        " op_created double precision)"
    )
    ops: list[dict[str, Any]] = []
    trail: list[dict[str, Any]] = []

    async def flush() -> None:
        for table, rows in (("stage_ops", ops), ("stage_events", trail)):
            columns = list(rows[0])
            await conn.copy_records_to_table(
                table, records=[tuple(r[c] for c in columns) for r in rows], columns=columns
            )
        ops.clear()
        trail.clear()

    for n, (row, its_events) in enumerate(_operation_rows(template)):
        ops.append({**row, "n": n})
        trail += [{**e, "n": n, "op_created": row["created_at"]} for e in its_events]
        if len(ops) == 20_000:
            await flush()
    if ops:
        await flush()


async def _columns(conn: asyncpg.Connection, table: str) -> list[str]:
    rows = await conn.fetch(
        "SELECT attname FROM pg_attribute WHERE attrelid = $1::regclass AND attnum > 0"
        " AND NOT attisdropped ORDER BY attnum",
        table,
    )
    return [r[0] for r in rows]


def _copy_sql(columns: list[str], events_columns: list[str]) -> tuple[str, str]:
    """The INSERT ... SELECT of copy $1 (the first $3 rows of it) of $2 copies."""
    # $1 copy j, $2 copies, $3 rows of it, $4 the template's size. i: the operation's number
    # over the whole ledger; d: how far copy j moves the operation in time.
    j, k, take, size = "$1::bigint", "$2::float8", "$3::bigint", "$4::bigint"
    i = f"({j} * {size} + s.n)"
    moved = f"({START} + (s.{{at}} - {START}) / {k} + {j} * {SPAN_SECS} / {k} - s.{{at}})"
    op_id = (
        "'op_' || lpad(to_hex(((s.{at} + d) * 1000)::bigint), 12, '0')"
        f" || lpad(to_hex({i}), 14, '0')"
    )
    session = f"({i} / 6)"
    ops_exprs = {
        "operation_id": op_id.format(at="created_at"),
        "tenant": (
            f"CASE WHEN ({session} * 7919) % 100 < 50 THEN 'default'"
            f" ELSE 'tenant-' || (({session} * 7919) % 25) END"
        ),
        "session_id": f"'call-' || {session}",
        "principal": f"'user-' || ({i} % 5000)",
        "idempotency_key": f"s.tool || ':' || {i}",
        "provider_call_id": f"'call_' || {i}",
        "trail_marks": (
            f"CASE WHEN s.kind = 'mutation' AND s.status = 'COMMITTED'"
            f" AND {i} % {CONFLICT_EVERY} < 5"
            f" THEN s.trail_marks | {int(Mark.CONFLICT)} ELSE s.trail_marks END"
        ),
        **{t: f"s.{t} + d" for t in TIMES},
    }
    select_ops = ", ".join(ops_exprs.get(c, f"s.{c}") for c in columns)
    ops_sql = (
        f"INSERT INTO pa_operations ({', '.join(columns)})"
        f" SELECT {select_ops} FROM stage_ops s,"
        f" LATERAL (SELECT {moved.format(at='created_at')} AS d) m"
        f" WHERE s.n < {take} ORDER BY s.n"
    )
    events_exprs = {
        "operation_id": op_id.format(at="op_created"),
        "at": "s.at + d",
        "actor": f"CASE WHEN s.actor LIKE 'gate:%' THEN 'gate:call-' || {session} ELSE s.actor END",
    }
    select_events = ", ".join(events_exprs.get(c, f"s.{c}") for c in events_columns)
    events_sql = (
        f"INSERT INTO pa_operation_events ({', '.join(events_columns)})"
        f" SELECT {select_events} FROM stage_events s,"
        f" LATERAL (SELECT {moved.format(at='op_created')} AS d) m"
        f" WHERE s.n < {take} ORDER BY s.n, s.seq"
    )
    return ops_sql, events_sql


async def build(url: str, rows: int, template: int) -> tuple[int, str]:
    """Fill the empty ledger at ``url`` with ``rows`` operations; return events, its size."""
    template = min(template, rows)
    copies = math.ceil(rows / template)
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("SET maintenance_work_mem = '256MB'")
        constraints, indexes = await _definitions(conn)
        await _stage_template(conn, template)
        ops_sql, events_sql = _copy_sql(
            await _columns(conn, "pa_operations"), await _columns(conn, "pa_operation_events")
        )
        for table, name, _ in reversed(constraints):
            await conn.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
        for definition in indexes:
            name = definition.split(" INDEX ", 1)[1].split(" ON ", 1)[0]
            await conn.execute(f"DROP INDEX {name}")
        # The trigger that counts each row for `stats` (migration 0011) is off while the rows
        # go in; their groups are counted once after, as the migration counts a ledger's.
        await conn.execute("ALTER TABLE pa_operations DISABLE TRIGGER USER")
        started = time.perf_counter()
        for j in range(copies):
            take = min(template, rows - j * template)
            await conn.execute(ops_sql, j, copies, take, template)
            await conn.execute(events_sql, j, copies, take, template)
            if j % 10 == 9:
                done = (j + 1) * template
                print(f"  {done:,} operations in {time.perf_counter() - started:.0f} s", flush=True)
        await conn.execute("DROP TABLE stage_ops; DROP TABLE stage_events")
        print(f"  rows in: {time.perf_counter() - started:.0f} s; indexes...", flush=True)
        for table, name, definition in constraints:
            await conn.execute(f'ALTER TABLE {table} ADD CONSTRAINT "{name}" {definition}')
        for definition in indexes:
            await conn.execute(definition)
        if await _definitions(conn) != (constraints, indexes):
            raise RuntimeError("the indexes and constraints made again differ from the schema's")
        await conn.execute("ALTER TABLE pa_operations ENABLE TRIGGER USER")
        # A ledger before migration 0011 (bench/heartbeat_plans.py builds one at 0009) has no
        # counted groups to fill.
        if await conn.fetchval("SELECT to_regclass('pa_operation_counts') IS NOT NULL"):
            await conn.execute("TRUNCATE pa_operation_counts, pa_operation_deltas")
            await conn.execute(BACKFILL)
            print(f"  groups counted: {time.perf_counter() - started:.0f} s", flush=True)
        print(f"  indexes made: {time.perf_counter() - started:.0f} s; vacuum...", flush=True)
        await conn.execute("VACUUM ANALYZE pa_operations")
        await conn.execute("VACUUM ANALYZE pa_operation_events")
        print(f"  vacuumed: {time.perf_counter() - started:.0f} s", flush=True)
        events = await conn.fetchval("SELECT count(*) FROM pa_operation_events")
        size = await conn.fetchval("SELECT pg_size_pretty(pg_database_size(current_database()))")
    finally:
        await conn.close()
    return events, size


async def _check_disk(rows: int) -> None:
    conn = await asyncpg.connect(PG_ADMIN_URL)
    try:
        directory = await conn.fetchval("SHOW data_directory")
    finally:
        await conn.close()
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        return  # the server is elsewhere: its disk is not this machine's to check
    needed = rows * BYTES_PER_OPERATION * 1.3  # and the WAL its load writes meanwhile
    if free < needed:
        raise SystemExit(
            f"{rows:,} operations need about {needed / 1e9:.0f} GB on the server's disk "
            f"({directory}); {free / 1e9:.0f} GB are free: try a smaller --rows"
        )


# --- the run ---------------------------------------------------------------------------------


async def _measure_full(url: str, name: str, full: State, args: argparse.Namespace) -> None:
    # A reused ledger already holds the proposes of earlier runs: a prefix of this run's own
    # keeps them from joining those.
    prefix = f"r{int(time.time())}-" if args.reuse else ""
    full.admit = await measure_admit(url, name, args.proposes, 4 * args.proposes, prefix)
    full.operations += args.proposes * 4
    await measure_reads(url, full, args.rows, args.stats_times)
    conn = await asyncpg.connect(url)
    try:
        full.stale = await conn.fetchval(
            "SELECT count(*) FROM pa_operations WHERE status = ANY($1::text[])",
            [s.value for s in S if s not in TERMINAL_STATUSES],
        )
    finally:
        await conn.close()
    full.recovery_secs = await measure_recovery(url)


async def _named_database(name: str, create: bool) -> str:
    if not name.startswith("pa_"):
        raise SystemExit(f"--keep and --reuse take a database named pa_...: not {name!r}")
    conn = await asyncpg.connect(PG_ADMIN_URL)
    try:
        if create:
            await conn.execute(f'CREATE DATABASE "{name}"')
        elif not await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", name):
            raise SystemExit(f"no database {name!r} to reuse: build it with --keep {name}")
    finally:
        await conn.close()
    return PG_ADMIN_URL.rpartition("/")[0] + "/" + name


async def _measure_empty(url: str, name: str, args: argparse.Namespace) -> State:
    """The ledger's figures on ``url``'s database, freshly made and empty."""
    await (await SqlLedger.create(url)).close()
    empty = State(operations=0)
    empty.admit = await measure_admit(url, name, args.proposes, 0)
    empty.operations = args.proposes * 4
    await measure_reads(url, empty, args.rows, args.stats_times)
    return empty


async def measure(args: argparse.Namespace) -> tuple[State, State, dict[str, Any]]:
    if args.reuse:
        return await measure_reused(args)
    await _check_disk(args.rows)
    if args.keep:
        name, url = args.keep, await _named_database(args.keep, create=True)
    else:
        name, url = await fresh_pg()
    try:
        empty = await _measure_empty(url, name, args)
        started = time.perf_counter()
        events, size = await build(url, args.rows, args.template)
        built = {"secs": time.perf_counter() - started, "events": events, "size": size}
        full = State(operations=args.rows + empty.operations)
        await _measure_full(url, name, full, args)
    finally:
        if not args.keep:
            await drop_pg(name)
    return empty, full, built


async def measure_reused(args: argparse.Namespace) -> tuple[State, State, dict[str, Any]]:
    """The empty ledger on a database of its own, the full one on ``--reuse``'s (upgraded to
    this code's schema by opening it, as a runtime would)."""
    name, url = await fresh_pg()
    try:
        empty = await _measure_empty(url, name, args)
    finally:
        await drop_pg(name)
    url = await _named_database(args.reuse, create=False)
    started = time.perf_counter()
    await (await SqlLedger.create(url)).close()
    upgraded = time.perf_counter() - started
    conn = await asyncpg.connect(url)
    try:
        operations = await conn.fetchval("SELECT count(*) FROM pa_operations")
        events = await conn.fetchval("SELECT count(*) FROM pa_operation_events")
        size = await conn.fetchval("SELECT pg_size_pretty(pg_database_size(current_database()))")
    finally:
        await conn.close()
    full = State(operations=operations)
    await _measure_full(url, args.reuse, full, args)
    print(f"reused {args.reuse}: opening it (and any upgrade) took {upgraded:.0f} s")
    return empty, full, {"secs": 0.0, "events": events, "size": size}


def report(empty: State, full: State, built: dict[str, Any], args: argparse.Namespace) -> None:
    print(
        f"PostgreSQL ledger of {full.operations:,} operations ({built['events']:,} events, "
        f"{built['size']} on disk, built in {built['secs']:.0f} s) beside the same database "
        f"empty, in one run"
    )
    print(f"{'':<40}{'empty':>12}{'full':>12}{'full/empty':>12}  goal")
    assert empty.admit is not None
    assert full.admit is not None

    def line(what: str, before: float, after: float, unit: str, goal: str) -> None:
        ratio = f"{after / before:.2f}x" if before else "-"
        print(f"{what:<40}{before:>10.2f}{unit:>2}{after:>10.2f}{unit:>2}{ratio:>12}  {goal}")

    line("propose p50", empty.admit.p50_ms, full.admit.p50_ms, "ms", "unchanged")
    line("propose p99", empty.admit.p99_ms, full.admit.p99_ms, "ms", "")
    for counter in COUNTERS:
        line(f"  per propose: {counter}", empty.admit.per_propose[counter],
             full.admit.per_propose[counter], "", "unchanged")  # fmt: skip
    line("stats (median)", empty.stats_secs, full.stats_secs, " s",
         f"<= {STATS_GOAL_SECS:.0f} s (first call {full.stats_first:.2f} s)")  # fmt: skip
    for what, ms in full.pages_ms.items():
        mark = "" if ms <= PAGE_GOAL_MS else "  OVER"
        line(f"list: {what}", empty.pages_ms[what], ms, "ms", f"<= {PAGE_GOAL_MS:.0f} ms{mark}")
    print(f"\nrecovery at full size: {full.stale:,} operations not terminal (claimable)")
    for what, secs in full.recovery_secs.items():
        print(f"  {what:<38}{secs * 1000:10.1f} ms")
    if full.plans:
        print("\nplans of what is over its goal at full size")
        print("\n".join(full.plans))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=10_000_000)
    parser.add_argument("--template", type=int, default=100_000)
    parser.add_argument("--proposes", type=int, default=200, help="P of the P / 2P runs")
    parser.add_argument("--stats-times", type=int, default=3)
    keep = parser.add_mutually_exclusive_group()
    keep.add_argument(
        "--keep", metavar="DBNAME", help="build the full ledger in this database and keep it"
    )
    keep.add_argument(
        "--reuse", metavar="DBNAME", help="measure the ledger a run with --keep left (no build)"
    )
    args = parser.parse_args()
    if args.rows < 1 or args.template < 1 or args.proposes < 1:
        parser.error("--rows, --template and --proposes take a whole number above 0")
    logger.remove()
    report(*asyncio.run(measure(args)), args)


if __name__ == "__main__":
    main()
