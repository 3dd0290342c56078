"""The heartbeat's and recovery's plans on PostgreSQL before and after migration 0010.

    .venv/bin/python bench/heartbeat_plans.py [--rows N] [--held H] [--pass] [--leave-claimed]

On a database created for the run (dropped after it, whatever happens): a ledger at migration
0009 filled with ``--rows`` operations (default 1,000,000) by ``bench/ten_million.py``'s build
(1 % of them UNKNOWN: open, never reconciled, held by nobody), then ``--held`` of those
(default 100) given to one runtime, ``runtime-held``, with a live lease. Then, at 0009 and
again after ``alembic upgrade`` to 0010 on the same rows (``ANALYZE`` after each),
``EXPLAIN (ANALYZE, BUFFERS)`` of each statement the ledger sends for:

* `renew_lease` (the heartbeat, every ``lease_secs / 3``) of an owner that holds nothing and
  of ``runtime-held``;
* `claim_stale`'s select of a batch of 50 (recovery, the watchdog), leaving out no operation
  and 5,000.

Each statement is recorded as the ledger sends it and stopped before it runs (so none of them
changes the rows between the two plans), then explained inside a transaction rolled back.

With ``--pass``, then a recovery pass at 0010: `claim_stale` in batches of 50 until one comes
back empty, over every stale operation (the UNKNOWN ones but ``--held``), as
`Recovery.recover` makes it. Before each batch its select is recorded and explained (rolled
back) as above; then the batch runs. It prints, for the first, middle and last batches, the
pages (shared buffers) and rows the select read, its execution time and its bound parameters,
and the time of the whole pass. ``--leave-claimed`` passes every operation claimed so far as
``except_ids``, as recovery did before it relied on a claim taking a row out of reach (run
it with that version's package first on the path to see that version).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncpg
from _measure import drop_pg, fresh_pg
from loguru import logger
from sqlalchemy import event
from ten_million import build

from pipecat_actions.ledger import SqlLedger, migrate

HELD_BY = "runtime-held"


class _Stop(Exception):
    """Raised by the recorder once it has the statement: the ledger never runs it."""


async def _statement(url: str, call: Callable[[SqlLedger], Awaitable[object]]) -> tuple[str, Any]:
    """The first statement on ``pa_operations`` that ``call`` makes the ledger send."""
    # At 0009 too: the statements are this code's, sent to the older index.
    ledger = await SqlLedger.create(url, create_schema=False, check_schema=False)
    issued: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        words = statement.lstrip().split(None, 1)
        if words and words[0].upper() in ("SELECT", "UPDATE") and "pa_operations" in statement:
            issued.append((statement, parameters))
            raise _Stop

    event.listen(ledger._engine.sync_engine, "before_cursor_execute", record)
    try:
        await call(ledger)
    except Exception:  # the ledger wraps _Stop; the statement is what was wanted
        if not issued:
            raise
    finally:
        await ledger.close()
    return issued[0]


CALLS: list[tuple[str, Callable[[SqlLedger], Awaitable[object]]]] = [
    ("renew_lease, an owner holding nothing",
     lambda d: d.renew_lease("runtime-idle", lease_secs=30)),
    (f"renew_lease, {HELD_BY}",
     lambda d: d.renew_lease(HELD_BY, lease_secs=30)),
    ("claim_stale, 50, leaving out none",
     lambda d: d.claim_stale("bench-recovery", lease_secs=30, limit=50)),
    ("claim_stale, 50, leaving out 5,000",
     lambda d: d.claim_stale("bench-recovery", lease_secs=30, limit=50,
                             except_ids=[f"op_not_here_{n}" for n in range(5_000)])),
]  # fmt: skip


async def explain(url: str) -> list[str]:
    """``EXPLAIN (ANALYZE, BUFFERS)`` of each of `CALLS`' statements, each rolled back."""
    out = []
    raw = await asyncpg.connect(url)
    try:
        await raw.execute("ANALYZE pa_operations")
        for what, call in CALLS:
            sql, params = await _statement(url, call)
            out.append(f"-- {what}")
            out.append(f"   {' '.join(sql.split())[:300]}")
            # An UPDATE explained with ANALYZE runs: its transaction is rolled back.
            transaction = raw.transaction()
            await transaction.start()
            try:
                rows = await raw.fetch(f"EXPLAIN (ANALYZE, BUFFERS) {sql}", *(params or ()))
            finally:
                await transaction.rollback()
            # A long list left out is printed by its start (the plan shows it whole).
            out += [f"     {_cut(row[0])}" for row in rows]
    finally:
        await raw.close()
    return out


async def recovery_pass(url: str, *, leave_claimed: bool) -> list[str]:
    """Claim every stale operation in batches of 50; the work of each batch's select."""
    ledger = await SqlLedger.create(url, create_schema=False, check_schema=False)
    raw = await asyncpg.connect(url)
    await raw.execute("ANALYZE pa_operations")
    stop = [True]
    issued: list[tuple[str, Any]] = []

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        words = statement.lstrip().split(None, 1)
        if stop[0] and words and words[0].upper() == "SELECT" and "pa_operations" in statement:
            issued.append((statement, parameters))
            raise _Stop

    event.listen(ledger._engine.sync_engine, "before_cursor_execute", record)
    claimed: list[str] = []
    batches: list[dict[str, float]] = []
    started = time.perf_counter()
    spent_explaining = 0.0
    try:
        while True:
            left = list(claimed) if leave_claimed else []

            async def claim(left: list[str] = left) -> list[Any]:
                return await ledger.claim_stale(
                    "bench-recovery", lease_secs=3600, limit=50, except_ids=left
                )

            explained = time.perf_counter()
            stop[0], issued[:] = True, []
            try:
                await claim()
            except Exception:
                if not issued:
                    raise
            sql, params = issued[0]
            transaction = raw.transaction()
            await transaction.start()
            try:
                [[plan]] = await raw.fetch(
                    f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {sql}", *(params or ())
                )
            finally:
                await transaction.rollback()
            top = json.loads(plan)[0]
            spent_explaining += time.perf_counter() - explained
            stop[0] = False
            took = time.perf_counter()
            batch = await claim()
            took = time.perf_counter() - took
            if not batch:
                break
            claimed.extend(op.operation_id for op in batch)
            batches.append(
                {
                    "pages": top["Plan"]["Shared Hit Blocks"] + top["Plan"]["Shared Read Blocks"],
                    "rows": _rows_read(top["Plan"]),
                    "ms": top["Execution Time"],
                    "params": len(params or ()),
                    "claim_ms": took * 1000,
                }
            )
    finally:
        await raw.close()
        await ledger.close()
    total = time.perf_counter() - started - spent_explaining
    how = "every claimed id left out" if leave_claimed else "nothing left out"
    out = [f"-- recovery pass ({how}): {len(claimed):,} claimed in {len(batches)} batches"]
    if not batches:
        return out  # nothing stale to claim (a ledger too small to hold any)
    out.append("   batch   pages   rows read   select ms   parameters   claim ms")
    for n in sorted({0, len(batches) // 2, len(batches) - 1}):
        b = batches[n]
        out.append(
            f"   {n + 1:5}   {b['pages']:5.0f}   {b['rows']:9.0f}   {b['ms']:9.2f}"
            f"   {b['params']:10.0f}   {b['claim_ms']:8.2f}"
        )
    pages = sum(b["pages"] for b in batches)
    out.append(f"   pass: {total:.2f} s of claims; {pages:,.0f} pages read by its selects")
    return out


def _rows_read(node: dict[str, Any]) -> float:
    """Rows the plan's scans produced or filtered out (what they read), over its nodes."""
    own = 0.0
    if "Scan" in node["Node Type"]:
        # EXPLAIN gives each count per loop.
        per_loop = (
            node.get("Actual Rows", 0)
            + node.get("Rows Removed by Filter", 0)
            + node.get("Rows Removed by Index Recheck", 0)
        )
        own = per_loop * node.get("Actual Loops", 1)
    return own + sum(_rows_read(child) for child in node.get("Plans", []))


def _cut(line: str, width: int = 200) -> str:
    return line if len(line) <= width else f"{line[:width]}... ({len(line):,} characters)"


async def main(args: argparse.Namespace) -> None:
    name, url = await fresh_pg(args.db_prefix)
    try:
        await migrate.to_revision(url, "0009")
        print(f"building {args.rows:,} operations at 0009...", flush=True)
        await build(url, args.rows, min(args.rows, 100_000))
        raw = await asyncpg.connect(url)
        try:
            held = await raw.execute(
                "UPDATE pa_operations SET lease_owner = $1, lease_expires_at = 1e12"
                " WHERE operation_id IN (SELECT operation_id FROM pa_operations"
                " WHERE status = 'UNKNOWN' ORDER BY operation_id LIMIT $2)",
                HELD_BY,
                args.held,
            )
            print(f"{held.split()[-1]} UNKNOWN operations given to {HELD_BY}", flush=True)
            print(f"open operations: {await raw.fetchval(_OPEN)}")
        finally:
            await raw.close()
        print("== at 0009: ix_pa_operations_status_lease (status, lease_expires_at)")
        print("\n".join(await explain(url)))
        await migrate.to_revision(url, "0010")
        print("== at 0010: ix_pa_operations_status_lease (status, lease_owner, lease_expires_at)")
        print("\n".join(await explain(url)))
        if args.recovery_pass:
            print("\n".join(await recovery_pass(url, leave_claimed=args.leave_claimed)))
    finally:
        await drop_pg(name)


_OPEN = (
    "SELECT count(*) FROM pa_operations WHERE status NOT IN"
    " ('COMMITTED', 'COMPENSATED', 'FAILED_FINAL', 'CANCELLED', 'REJECTED', 'EXPIRED')"
)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--held", type=int, default=100)
    parser.add_argument(
        "--pass",
        dest="recovery_pass",
        action="store_true",
        help="then a recovery pass at 0010 over every stale operation",
    )
    parser.add_argument(
        "--db-prefix",
        default="pa_bench",
        help="the name of the database made for the run starts so",
    )
    parser.add_argument(
        "--leave-claimed",
        action="store_true",
        help="the pass leaves out, by id, every operation claimed so far",
    )
    logger.remove()
    asyncio.run(main(parser.parse_args()))
