"""What the benchmarks share: timed samples of calls, a PostgreSQL database of their own, and
the ledger calls they time.

Imported by the scripts of this folder as ``_measure`` (each runs with the folder on its path).
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from pipecat_actions.ledger import NewOperation, SqlLedger
from pipecat_actions.status import ActionStatus

PG_ADMIN_URL = os.environ.get(
    "PIPECAT_ACTIONS_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)


@dataclass
class Sample:
    """The latencies of a run of calls, its length and its process time."""

    latencies: list[float]
    seconds: float
    cpu: float
    """Process time over the run (every thread: a ledger's writer thread included)."""
    server_cpu: float = 0.0
    """CPU seconds of the database server's backends serving the run (0: not measured)."""

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
    def server_cpu_us(self) -> float:
        return self.server_cpu / len(self.latencies) * 1e6

    @property
    def per_sec(self) -> float:
        return len(self.latencies) / self.seconds


class ServerCpu:
    """CPU time of the server processes serving one database (its backends), from /proc."""

    def __init__(self, admin: asyncpg.Connection, database: str) -> None:
        self.admin = admin
        self.database = database

    async def ticks(self) -> dict[int, int]:
        pids = await self.admin.fetch(
            "SELECT pid FROM pg_stat_activity WHERE datname = $1", self.database
        )
        ticks = {}
        for (pid,) in pids:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
            except OSError:
                continue  # another machine's server, or a backend that just left
            ticks[pid] = int(fields[11]) + int(fields[12])  # utime + stime
        return ticks

    @staticmethod
    def spent(before: dict[int, int], after: dict[int, int]) -> float:
        """CPU seconds the backends spent between two `ticks` (a backend new since: all of its)."""
        return sum(t - before.get(pid, 0) for pid, t in after.items()) / os.sysconf("SC_CLK_TCK")

    async def timed(self, run: Awaitable[Sample]) -> Sample:
        before = await self.ticks()
        sample = await run
        sample.server_cpu = self.spent(before, await self.ticks())
        return sample


async def sequential(n: int, call: Callable[[int], Awaitable[object]]) -> Sample:
    """``call(0)`` ... ``call(n - 1)``, one after the other."""
    latencies = []
    cpu, start = time.process_time(), time.perf_counter()
    for i in range(n):
        t = time.perf_counter()
        await call(i)
        latencies.append(time.perf_counter() - t)
    return Sample(latencies, time.perf_counter() - start, time.process_time() - cpu)


async def concurrent(n: int, callers: int, call: Callable[[int], Awaitable[object]]) -> Sample:
    """``n`` calls by ``callers`` concurrent callers, each making its share in turn."""
    latencies: list[float] = []
    each = n // callers

    async def caller(c: int) -> None:
        for i in range(each):
            t = time.perf_counter()
            await call(c * each + i)
            latencies.append(time.perf_counter() - t)

    cpu, start = time.process_time(), time.perf_counter()
    await asyncio.gather(*(caller(c) for c in range(callers)))
    return Sample(latencies, time.perf_counter() - start, time.process_time() - cpu)


async def fresh_pg(prefix: str = "pa_bench") -> tuple[str, str]:
    """Create an empty database on the server of ``PG_ADMIN_URL``; return its name and URL.

    Named ``PREFIX_PID_HEX``; ``$PIPECAT_ACTIONS_BENCH_DB_PREFIX`` overrides ``prefix``.
    """
    prefix = os.environ.get("PIPECAT_ACTIONS_BENCH_DB_PREFIX", prefix)
    name = f"{prefix}_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    conn = await asyncpg.connect(PG_ADMIN_URL)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return name, PG_ADMIN_URL.rpartition("/")[0] + "/" + name


async def drop_pg(name: str) -> None:
    """Drop a database made by `fresh_pg`, closing its leftover connections."""
    conn = await asyncpg.connect(PG_ADMIN_URL)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


ARGS = {"restaurant_id": "r-17", "date": "2026-12-24", "time": "21:00", "party_size": 4}


def new_booking(i: int) -> NewOperation:
    """The ``i``-th booking a benchmark admits: a mutation with a key of its own."""
    return NewOperation(
        tool="book_table",
        kind="mutation",
        args={**ARGS, "n": i},
        idempotency_key=uuid.uuid4().hex,
        session_id="bench",
        principal="user-1",
        lease_owner="bench",
    )


class LedgerCalls:
    """`SqlLedger.admit` of the ``i``-th booking, and its move to RUNNING."""

    def __init__(self, ledger: SqlLedger) -> None:
        self.ledger = ledger
        self.admitted: list[str] = []

    async def admit(self, i: int) -> None:
        result = await self.ledger.admit(new_booking(i))
        self.admitted.append(result.operation.operation_id)

    async def transition(self, i: int) -> None:
        await self.ledger.transition(
            self.admitted[i],
            expected=ActionStatus.ADMITTED,
            to=ActionStatus.RUNNING,
            fence=1,
            actor="bench",
        )
