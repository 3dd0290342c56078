"""PostgreSQL ledger writes against their floor: the same SQL on raw asyncpg, side by side.

    .venv/bin/python bench/postgres.py [--ops N] [--rounds R] [--callers C]

In one process, on a database created for the run and dropped after it, in interleaved rounds
(the machine is shared and noisy; the median round is kept):

* **floor**: the ledger's own one-statement admit and transition, sent on one raw asyncpg
  connection with their parameters built beforehand (nothing of ours but the SQL);
* **ledger**: `SqlLedger.admit` / `transition` (its asyncpg hot path);
* **propose**: `ActionRuntime.propose` of a non-idempotent mutation with a 0-ms effect, no
  pipeline (admit, RUNNING, COMMITTED), sequentially and with C concurrent callers.

* **agent-ledger** 0.2.1 ``EffectLedger.run()`` (the closest open-source competitor, on its
  own psycopg pool of the same size and its own table in the same database), the same way,
  when it is installed (``pip install -e '.[bench]'``).

Prints median and p99 latency, CPU per call (process time) and throughput, then the ratios the
targets are stated in: admit <= 1.3x the floor; propose <= 0.8x agent-ledger's ``run()``; C
concurrent callers >= 1.2x its throughput.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from functools import partial
from pathlib import Path
from typing import Any

import asyncpg
from loguru import logger

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _measure import PG_ADMIN_URL, LedgerCalls, Sample, concurrent, new_booking, sequential

from pipecat_actions import ActionContext, ActionRuntime, AllowAll, SessionState, action
from pipecat_actions.ledger import LedgerSettings, SqlLedger
from pipecat_actions.ledger._postgres import _ADMIT, _OPERATION_COLUMNS, _event_arrays, update_sql
from pipecat_actions.ledger._rows import EncodedOperation, creation_events, new_row
from pipecat_actions.policy import load_policy_text
from pipecat_actions.status import ActionStatus

POLICY = """
version: 1
tools:
  book_table:
    kind: mutation
    idempotency: {provider_dedupes: false}
    deadline_secs: 30
"""


class Floor:
    """The ledger's own statements on raw asyncpg connections, parameters built first.

    Sequential calls use the first connection; concurrent ones take turns on all of them (as
    many as the ledger's pool).
    """

    def __init__(self, conns: list[asyncpg.Connection], n: int) -> None:
        self.conn = conns[0]
        self.free: asyncio.Queue[asyncpg.Connection] = asyncio.Queue()
        for conn in conns:
            self.free.put_nowait(conn)
        self.admits = []
        for i in range(n):
            encoded = EncodedOperation.of(new_booking(i))
            now = time.time()
            row = new_row(encoded, now, key_slot=encoded.new.idempotency_key)
            params = [row[c] for c in _OPERATION_COLUMNS]
            params += _event_arrays(creation_events(encoded, now))
            self.admits.append(params)
        self.transition_sql = update_sql(
            ("sent_at", "status", "updated_at"),
            starts_attempt=True,
            match_status=True,
            match_fence=True,
            notify=False,
            marks=False,
        )

    async def admit(self, i: int) -> None:
        await self.conn.fetchval(_ADMIT, *self.admits[i])

    def admit_later(self, offset: int) -> Callable[[int], Awaitable[None]]:
        """``admit_on_a_turn`` of the calls from ``offset`` on."""
        return lambda i: self.admit_on_a_turn(offset + i)

    async def admit_on_a_turn(self, i: int) -> None:
        conn = await self.free.get()
        try:
            await conn.fetchval(_ADMIT, *self.admits[i])
        finally:
            self.free.put_nowait(conn)

    async def transition(self, i: int) -> None:
        op_id = self.admits[i][0]
        now = time.time()
        admitted, running = ActionStatus.ADMITTED.value, ActionStatus.RUNNING.value
        row = await self.conn.fetchrow(
            self.transition_sql,
            op_id, admitted, 1, now, "transition", "bench", None, now, running, now,
        )  # fmt: skip
        assert row is not None


async def _runtime(url: str) -> ActionRuntime:
    @action
    async def book_table(ctx: ActionContext, restaurant_id: str, n: int) -> dict[str, Any]:
        """Book a table."""
        return {"booking_id": f"bk_{n}"}

    return await ActionRuntime.create(
        load_policy_text(POLICY), authorizer=AllowAll(), actions=[book_table], ledger_url=url
    )


async def _propose(runtime: ActionRuntime, offset: int, i: int) -> None:
    session = SessionState(session_id=f"s{offset + i}", principal="p")
    args = {"restaurant_id": "r-17", "n": offset + i}
    told = await runtime.propose("book_table", args, session)
    assert told["status"] == "committed", told


_EFFECTS_TABLE = """
CREATE TABLE IF NOT EXISTS effects (
    id text PRIMARY KEY, idem_key text NOT NULL UNIQUE, workflow_id text, call_id text,
    tool text, status text NOT NULL, args_canonical text, resource_id_canonical text,
    result jsonb, error jsonb, dedup_count int NOT NULL DEFAULT 0,
    created_at timestamptz NOT NULL, updated_at timestamptz NOT NULL, completed_at timestamptz
)
"""
"""agent-ledger's table, as its PostgreSQL store reads and writes it (it ships no DDL)."""


class Competitor:
    """agent-ledger's ``run()`` of the same 0-ms effect, on a pool as large as ours."""

    def __init__(self, url: str, pool_size: int) -> None:
        from agent_ledger import EffectLedger, EffectLedgerOptions
        from agent_ledger.stores.postgres import PostgresStore
        from psycopg_pool import AsyncConnectionPool

        self.pool = AsyncConnectionPool(url, min_size=pool_size, max_size=pool_size, open=False)
        self.ledger = EffectLedger(EffectLedgerOptions(store=PostgresStore(self.pool)))

    async def __aenter__(self) -> Competitor:
        await self.pool.open()
        async with self.pool.connection() as conn:
            await conn.execute(_EFFECTS_TABLE)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.pool.close()

    async def run(self, offset: int, i: int) -> None:
        from agent_ledger import ToolCall

        async def handler(effect: Any) -> dict[str, Any]:
            return {"booking_id": f"bk_{offset + i}"}

        call = ToolCall(workflow_id=f"s{offset + i}", tool="book_table", args={"n": offset + i})
        await self.ledger.run(call, handler)


def _competitor_installed() -> bool:
    try:
        import agent_ledger  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError:
        return False
    return True


async def measure(args: argparse.Namespace) -> dict[str, list[Sample]]:
    results: dict[str, list[Sample]] = {}

    def keep(name: str, sample: Sample) -> None:
        results.setdefault(name, []).append(sample)

    name = f"pa_bench_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = await asyncpg.connect(PG_ADMIN_URL)
    await admin.execute(f'CREATE DATABASE "{name}"')
    url = PG_ADMIN_URL.rpartition("/")[0] + "/" + name
    try:
        for round_no in range(args.rounds):
            ledger = await SqlLedger.create(url)  # creates the schema the floor writes to
            pool_size = LedgerSettings().pool_size
            conns = [await asyncpg.connect(url) for _ in range(pool_size)]
            try:
                floor = Floor(conns, args.ops * 3)
                keep("floor admit", await sequential(args.ops, floor.admit))
                keep("floor transition", await sequential(args.ops, floor.transition))
                keep(
                    f"floor admit x{args.callers}",
                    await concurrent(args.ops * 2, args.callers, floor.admit_later(args.ops)),
                )
                ours = LedgerCalls(ledger)
                keep("ledger admit", await sequential(args.ops, ours.admit))
                keep("ledger transition", await sequential(args.ops, ours.transition))
                keep(
                    f"ledger admit x{args.callers}",
                    await concurrent(args.ops * 2, args.callers, ours.admit),
                )
            finally:
                for conn in conns:
                    await conn.close()
                await ledger.close()
            runtime = await _runtime(url)
            try:
                offset = (round_no + 1) * 10 * args.ops  # new intents every round
                keep("propose", await sequential(args.ops, partial(_propose, runtime, offset)))
                keep(
                    f"propose x{args.callers}",
                    await concurrent(
                        args.ops * 2, args.callers, partial(_propose, runtime, offset + args.ops)
                    ),
                )
            finally:
                await runtime.close()
            if _competitor_installed():
                async with Competitor(url, LedgerSettings().pool_size) as rival:
                    offset = (round_no + 1) * 10 * args.ops
                    keep("agent-ledger", await sequential(args.ops, partial(rival.run, offset)))
                    keep(
                        f"agent-ledger x{args.callers}",
                        await concurrent(
                            args.ops * 2, args.callers, partial(rival.run, offset + args.ops)
                        ),
                    )
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
    return results


def report(results: dict[str, list[Sample]], args: argparse.Namespace) -> None:
    print(f"ops per measurement: {args.ops}, rounds: {args.rounds}, callers: {args.callers}")
    print(f"{'measurement':<24}{'median ms':>10}{'p99 ms':>10}{'CPU us':>10}{'per s':>10}")
    chosen: dict[str, Sample] = {}
    for name, samples in results.items():
        concurrent = " x" in name
        s = sorted(samples, key=lambda x: -x.per_sec if concurrent else x.median_ms)[
            len(samples) // 2
        ]
        chosen[name] = s
        print(f"{name:<24}{s.median_ms:>10.3f}{s.p99_ms:>10.3f}{s.cpu_us:>10.0f}{s.per_sec:>10.0f}")
    print()
    print("ratios (target: admit <= 1.3x the floor, the same SQL on raw asyncpg)")
    x = f" x{args.callers}"
    ratio = chosen["ledger admit" + x].per_sec / chosen["floor admit" + x].per_sec
    print(f"  ledger admit{x:<12} throughput {ratio:5.2f}x the floor's on as many connections")
    for metric in ("admit", "transition"):
        floor = chosen[f"floor {metric}"]
        s = chosen[f"ledger {metric}"]
        print(
            f"  ledger {metric:<17} median {s.median_ms / floor.median_ms:5.2f}x, "
            f"CPU {s.cpu_us / floor.cpu_us:5.2f}x the floor"
        )
    ours, concurrent = chosen["propose"], chosen[f"propose x{args.callers}"]
    print(
        f"  propose p50 {ours.median_ms:.2f} ms; {args.callers} callers "
        f"{concurrent.per_sec:.0f} calls/s, p99 {concurrent.p99_ms:.0f} ms"
    )
    if "agent-ledger" not in chosen:
        print(
            "  agent-ledger is not installed (pip install -e '.[bench]'): issue #14 measured "
            "its run() at 1.73-1.80 ms p50, 1,004-1,099 calls/s with 50 callers"
        )
        return
    rival, rival_x = chosen["agent-ledger"], chosen[f"agent-ledger x{args.callers}"]
    print(
        f"  propose p50 {ours.median_ms / rival.median_ms:4.2f}x agent-ledger's run() "
        f"({rival.median_ms:.2f} ms; target <= 0.8x); {args.callers} callers "
        f"{concurrent.per_sec / rival_x.per_sec:4.2f}x its throughput ({rival_x.per_sec:.0f} "
        f"calls/s, p99 {rival_x.p99_ms:.0f} ms; target >= 1.2x)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--callers", type=int, default=50)
    args = parser.parse_args()
    logger.remove()
    report(asyncio.run(measure(args)), args)


if __name__ == "__main__":
    main()
