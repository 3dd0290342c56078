"""PostgreSQL ledger writes against their floor: the same SQL on raw asyncpg, side by side.

    .venv/bin/python bench/postgres.py [--ops N] [--rounds R] [--callers C]

In one process, on a database created for the run and dropped after it, in interleaved rounds
(the machine is shared and noisy; the median round is kept):

* **floor**: the ledger's own one-statement admit and transition, sent on one raw asyncpg
  connection with their parameters built beforehand (nothing of ours but the SQL);
* **ledger**: `SqlLedger.admit` / `transition` (its asyncpg hot path);
* **ledger via SQLAlchemy**: the same calls on the SQLAlchemy path every write took before
  (``engine.connect()`` / ``begin()`` / ``run_sync``, four round trips), for the before/after;
* **propose**: `ActionRuntime.propose` of a non-idempotent mutation with a 0-ms effect, no
  pipeline (admit, RUNNING, COMMITTED), sequentially and with C concurrent callers.

Prints median and p99 latency, CPU per call (process time) and throughput, then the ratios the
targets are stated in: admit <= 1.3x the floor. The competitor figures of issue #14
(agent-ledger 0.2.1 ``run()``: 1.73-1.80 ms p50, 1,004-1,099 calls/s with 50 callers) were
measured on a quiet machine and are printed for reference, not re-measured here.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import asyncpg
from loguru import logger

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipecat_actions import ActionContext, ActionRuntime, AllowAll, SessionState, action
from pipecat_actions.ledger import NewOperation, SqlLedger
from pipecat_actions.ledger._postgres import _ADMIT, _OPERATION_COLUMNS, _event_arrays, update_sql
from pipecat_actions.ledger._rows import EncodedOperation, creation_events, new_row
from pipecat_actions.policy import load_policy_text
from pipecat_actions.status import ActionStatus

PG_ADMIN_URL = os.environ.get(
    "PIPECAT_ACTIONS_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
ARGS = {"restaurant_id": "r-17", "date": "2026-12-24", "time": "21:00", "party_size": 4}
POLICY = """
version: 1
tools:
  book_table:
    kind: mutation
    idempotency: {provider_dedupes: false}
    deadline_secs: 30
"""


@dataclass
class Sample:
    latencies: list[float]
    cpu: float
    seconds: float

    @property
    def median_ms(self) -> float:
        return statistics.median(self.latencies) * 1000

    @property
    def p99_ms(self) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000

    @property
    def cpu_us(self) -> float:
        return self.cpu / len(self.latencies) * 1e6

    @property
    def per_sec(self) -> float:
        return len(self.latencies) / self.seconds


async def _sequential(n: int, call: Callable[[int], Awaitable[object]]) -> Sample:
    latencies = []
    cpu, start = time.process_time(), time.perf_counter()
    for i in range(n):
        t = time.perf_counter()
        await call(i)
        latencies.append(time.perf_counter() - t)
    return Sample(latencies, time.process_time() - cpu, time.perf_counter() - start)


async def _concurrent(n: int, callers: int, call: Callable[[int], Awaitable[object]]) -> Sample:
    latencies: list[float] = []
    each = n // callers

    async def caller(c: int) -> None:
        for i in range(each):
            t = time.perf_counter()
            await call(c * each + i)
            latencies.append(time.perf_counter() - t)

    cpu, start = time.process_time(), time.perf_counter()
    await asyncio.gather(*(caller(c) for c in range(callers)))
    return Sample(latencies, time.process_time() - cpu, time.perf_counter() - start)


def _new(i: int) -> NewOperation:
    return NewOperation(
        tool="book_table",
        kind="mutation",
        args={**ARGS, "n": i},
        idempotency_key=uuid.uuid4().hex,
        session_id="bench",
        principal="user-1",
        lease_owner="bench",
    )


class Floor:
    """The ledger's own statements on one raw asyncpg connection, parameters built first."""

    def __init__(self, conn: asyncpg.Connection, n: int) -> None:
        self.conn = conn
        self.admits = []
        for i in range(n):
            encoded = EncodedOperation.of(_new(i))
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
        )

    async def admit(self, i: int) -> None:
        await self.conn.fetchval(_ADMIT, *self.admits[i])

    async def transition(self, i: int) -> None:
        op_id = self.admits[i][0]
        now = time.time()
        admitted, running = ActionStatus.ADMITTED.value, ActionStatus.RUNNING.value
        row = await self.conn.fetchrow(
            self.transition_sql,
            op_id, admitted, 1, now, "transition", "bench", None, admitted, now, running, now,
        )  # fmt: skip
        assert row is not None


class Ours:
    def __init__(self, ledger: SqlLedger) -> None:
        self.ledger = ledger
        self.admitted: list[str] = []

    async def admit(self, i: int) -> None:
        result = await self.ledger.admit(_new(i))
        self.admitted.append(result.operation.operation_id)

    async def transition(self, i: int) -> None:
        await self.ledger.transition(
            self.admitted[i],
            expected=ActionStatus.ADMITTED,
            to=ActionStatus.RUNNING,
            fence=1,
            actor="bench",
        )


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


async def measure(args: argparse.Namespace) -> dict[str, list[Sample]]:
    results: dict[str, list[Sample]] = {}

    def keep(name: str, sample: Sample) -> None:
        results.setdefault(name, []).append(sample)

    name = f"pa_bench_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    admin = await asyncpg.connect(PG_ADMIN_URL)
    await admin.execute(f'CREATE DATABASE "{name}"')
    url = PG_ADMIN_URL.rpartition("/")[0] + "/" + name
    try:
        for _ in range(args.rounds):
            ledger = await SqlLedger.create(url)  # creates the schema the floor writes to
            conn = await asyncpg.connect(url)
            try:
                floor = Floor(conn, args.ops)
                keep("floor admit", await _sequential(args.ops, floor.admit))
                keep("floor transition", await _sequential(args.ops, floor.transition))
                ours = Ours(ledger)
                keep("ledger admit", await _sequential(args.ops, ours.admit))
                keep("ledger transition", await _sequential(args.ops, ours.transition))
                fast, ledger._fast = ledger._fast, None  # the SQLAlchemy path, as before
                before = Ours(ledger)
                keep("SQLAlchemy admit", await _sequential(args.ops, before.admit))
                keep("SQLAlchemy transition", await _sequential(args.ops, before.transition))
                ledger._fast = fast
            finally:
                await conn.close()
                await ledger.close()
            runtime = await _runtime(url)
            try:
                keep("propose", await _sequential(args.ops, partial(_propose, runtime, 0)))
                keep(
                    f"propose x{args.callers}",
                    await _concurrent(
                        args.ops * 2, args.callers, partial(_propose, runtime, args.ops)
                    ),
                )
            finally:
                await runtime.close()
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
    for metric in ("admit", "transition"):
        floor = chosen[f"floor {metric}"]
        for config in ("ledger", "SQLAlchemy"):
            s = chosen[f"{config} {metric}"]
            print(
                f"  {config + ' ' + metric:<24} median {s.median_ms / floor.median_ms:5.2f}x, "
                f"CPU {s.cpu_us / floor.cpu_us:5.2f}x the floor"
            )
    concurrent = chosen[f"propose x{args.callers}"]
    print(
        f"  propose p50 {chosen['propose'].median_ms:.2f} ms; {args.callers} callers "
        f"{concurrent.per_sec:.0f} calls/s, p99 {concurrent.p99_ms:.0f} ms "
        "(issue #14's agent-ledger run(): 1.73-1.80 ms; 1,004-1,099 calls/s, p99 55-84 ms)"
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
