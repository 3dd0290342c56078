"""PostgreSQL ledger writes against their floor, and ``propose`` against agent-ledger's ``run()``.

    .venv/bin/python bench/postgres.py [--ops N] [--rounds R] [--callers C] [--warmup W]
                                       [--rival-pool P] [--without-notices]

Two parts, each in interleaved rounds (the machine is shared and noisy; the median round is
kept, by median latency for one caller and by throughput for C callers):

1. **The ledger beside its floor**, in this process, on a database of its own:

   * **floor**: the ledger's own one-statement admit and transition, sent on raw asyncpg
     connections (as many as the ledger's pool) with their parameters built beforehand;
   * **ledger**: `SqlLedger.admit` / `transition` (its asyncpg hot path).

2. **``propose`` beside agent-ledger 0.2.1** (the closest open-source competitor, installed by
   ``pip install -e '.[bench]'``): each round runs each contender in a **fresh process on a
   fresh database** (created for it, dropped after it), the order alternating between rounds:

   * **propose**: `ActionRuntime.propose` of a non-idempotent mutation whose effect returns at
     once (0 ms), no pipeline: admit, RUNNING, COMMITTED (2 round trips, 2 commits);
   * **agent-ledger**: ``EffectLedger.run()`` of the same 0-ms effect on its own psycopg pool
     of ``--rival-pool`` connections (default: as many as the ledger's pool, 5), its own table.

   Each process first makes W proposes (runs) one by one and W by C callers, untimed (the pools
   fill, the statements are prepared, the code is warm), then times N one by one and 2N by C
   concurrent callers, each caller making its share in turn. The calls' inputs (session,
   arguments; agent-ledger's ``ToolCall``) are built before the timed region; what is timed is
   the call alone. Besides latency and throughput it measures CPU per call in the client
   process (process time) **and in the server** (the database's backends, from
   ``/proc/<pid>/stat``): on a machine of few cores shared with the server, throughput with
   many callers is bounded by the two together, and they hold when the machine is busy.

What bounds the 50-caller figure (docs/performance.md has the runs): on a machine of few cores
shared with the server, throughput follows client + server CPU per call. PostgreSQL (15 here)
commits transactions that sent a notice one at a time, under a cluster-wide lock held through
the commit's WAL flush (no group commit); the ledger's settling write (COMMITTED) used to call
``pg_notify`` in its own statement, and with ``--without-notices`` (an experiment) 50 callers
then ran 1.6-2.4x faster when the server was busy. The write now commits without it and the
ledger's notifier sends the notices afterwards, in batches on a connection of its own
(`_notices.PostgresNotifier`): about 1.6 settles per notifying commit with 50 writers on a quiet
machine, none on a caller's path. ``--without-notices`` now drops them in the notifier, to show
what the batches still cost. agent-ledger sends no notice. The earlier version of this script ran
both contenders in one process and one database, agent-ledger last, after the floor's and the
ledger's runs, with no warm-up but the sequential run; this one isolates each contender. On a
busy machine the throughput ratio still spreads widely between runs: the ratio of CPU per call
(client + server) is the steadier figure, and is printed beside it.

Prints median and p99 latency, client and server CPU per call and throughput, then the ratios
the targets are stated in: admit <= 1.3x the floor; propose p50 <= 0.8x agent-ledger's; C
concurrent callers >= 1.5x its throughput (issue 34).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
from loguru import logger

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _measure import (
    PG_ADMIN_URL,
    LedgerCalls,
    Sample,
    ServerCpu,
    concurrent,
    drop_pg,
    fresh_pg,
    new_booking,
    sequential,
)

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
    """agent-ledger's ``run()`` of the same 0-ms effect, on a pool of its own."""

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


def _competitor_installed() -> bool:
    try:
        import agent_ledger  # noqa: F401
        import psycopg_pool  # noqa: F401
    except ImportError:
        return False
    return True


async def _contender(args: argparse.Namespace) -> dict[str, Sample]:
    """One contender (``args.child``) in this process on a database of its own."""
    name, url = await fresh_pg()
    admin = await asyncpg.connect(PG_ADMIN_URL)
    n = args.warmup * 2 + args.ops * 3
    try:
        if args.child == "propose":
            runtime = await _runtime(url)
            sessions = [SessionState(session_id=f"s{i}", principal="p") for i in range(n)]
            arguments = [{"restaurant_id": "r-17", "n": i} for i in range(n)]

            async def call(i: int) -> None:
                told = await runtime.propose("book_table", arguments[i], sessions[i])
                assert told["status"] == "committed", told

            close: Callable[[], Awaitable[None]] = runtime.close
        else:
            from agent_ledger import ToolCall

            rival = await Competitor(url, args.rival_pool).__aenter__()
            tool_calls = [
                ToolCall(workflow_id=f"s{i}", tool="book_table", args={"n": i}) for i in range(n)
            ]

            async def handler(effect: Any) -> dict[str, Any]:
                return {"booking_id": f"bk_{effect.id}"}

            async def call(i: int) -> None:
                await rival.ledger.run(tool_calls[i], handler)

            close = rival.__aexit__
        try:
            await sequential(args.warmup, call)
            await concurrent(args.warmup, args.callers, lambda i: call(args.warmup + i))
            server = ServerCpu(admin, name)
            first = args.warmup * 2
            one = await server.timed(sequential(args.ops, lambda i: call(first + i)))
            many = await server.timed(
                concurrent(args.ops * 2, args.callers, lambda i: call(first + args.ops + i))
            )
        finally:
            await close()
    finally:
        await admin.close()
        await drop_pg(name)
    return {args.child: one, f"{args.child} x{args.callers}": many}


def _without_notices() -> None:
    """``--without-notices``: the ledger's notifier drops every notice (sends no ``pg_notify``)."""
    from pipecat_actions.ledger._notices import PostgresNotifier

    def send(self: PostgresNotifier, operation_id: str) -> None:
        return None

    PostgresNotifier.send = send  # type: ignore[method-assign]


def _run_child(contender: str, args: argparse.Namespace) -> dict[str, Sample]:
    command = [
        sys.executable, __file__, "--child", contender, "--ops", str(args.ops),
        "--callers", str(args.callers), "--warmup", str(args.warmup),
        "--rival-pool", str(args.rival_pool),
    ] + (["--without-notices"] if getattr(args, "without_notices", False) else [])  # fmt: skip
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    return {name: Sample(**fields) for name, fields in json.loads(out).items()}


async def measure(args: argparse.Namespace) -> dict[str, list[Sample]]:
    results: dict[str, list[Sample]] = {}
    for attr, default in (("warmup", 200), ("rival_pool", LedgerSettings().pool_size)):
        if getattr(args, attr, None) is None:
            setattr(args, attr, default)

    def keep(name: str, sample: Sample) -> None:
        results.setdefault(name, []).append(sample)

    name, url = await fresh_pg()
    try:
        for _ in range(args.rounds):
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
    finally:
        await drop_pg(name)
    contenders = ["propose"] + (["agent-ledger"] if _competitor_installed() else [])
    for round_no in range(args.rounds):
        order = contenders if round_no % 2 == 0 else contenders[::-1]
        for contender in order:
            samples = await asyncio.to_thread(_run_child, contender, args)
            for key, sample in samples.items():
                keep(key, sample)
    return results


def report(results: dict[str, list[Sample]], args: argparse.Namespace) -> None:
    print(f"ops per measurement: {args.ops}, rounds: {args.rounds}, callers: {args.callers}")
    print(
        f"{'measurement':<24}{'median ms':>10}{'p99 ms':>10}{'CPU us':>10}{'server us':>10}"
        f"{'per s':>10}"
    )
    chosen: dict[str, Sample] = {}
    for name, samples in results.items():
        concurrent = " x" in name
        s = sorted(samples, key=lambda x: -x.per_sec if concurrent else x.median_ms)[
            len(samples) // 2
        ]
        chosen[name] = s
        server = f"{s.server_cpu_us:>10.0f}" if s.server_cpu else f"{'-':>10}"
        print(
            f"{name:<24}{s.median_ms:>10.3f}{s.p99_ms:>10.3f}{s.cpu_us:>10.0f}{server}"
            f"{s.per_sec:>10.0f}"
        )
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
        f"calls/s, p99 {rival_x.p99_ms:.0f} ms; target >= 1.5x)"
    )
    paired = zip(
        results[f"propose x{args.callers}"], results[f"agent-ledger x{args.callers}"], strict=True
    )
    each = " ".join(f"{a.per_sec / b.per_sec:.2f}" for a, b in paired)
    print(f"  {args.callers} callers, throughput / agent-ledger's, round by round: {each}")
    ours_cpu = concurrent.cpu_us + concurrent.server_cpu_us
    rival_cpu = rival_x.cpu_us + rival_x.server_cpu_us
    if concurrent.server_cpu and rival_x.server_cpu:
        print(
            f"  {args.callers} callers, client + server CPU per call: {ours_cpu:.0f} us, "
            f"{ours_cpu / rival_cpu:4.2f}x agent-ledger's ({rival_cpu:.0f} us; pool "
            f"{args.rival_pool}): the throughput a CPU-bound machine allows, "
            f"{rival_cpu / ours_cpu:4.2f}x its"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--callers", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=200, help="untimed calls first, each way")
    parser.add_argument(
        "--rival-pool", type=int, default=LedgerSettings().pool_size,
        help="agent-ledger's pool size (default: as many as the ledger's pool)",
    )  # fmt: skip
    parser.add_argument(
        "--without-notices", action="store_true",
        help="an experiment, never a setting: the ledger's notifier sends no pg_notify "
        "(waiters in other processes then hear of it only on their re-read pause)",
    )  # fmt: skip
    parser.add_argument("--child", choices=("propose", "agent-ledger"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    logger.remove()
    if args.without_notices:
        _without_notices()
    if args.child:
        samples = asyncio.run(_contender(args))
        print(json.dumps({name: dataclasses.asdict(s) for name, s in samples.items()}))
        return
    report(asyncio.run(measure(args)), args)


if __name__ == "__main__":
    main()
