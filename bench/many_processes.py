"""Many sessions in many processes on one PostgreSQL ledger, against bare handlers (issue 34).

    .venv/bin/python bench/many_processes.py [--sessions S] [--calls K] [--processes 4,8]
                                             [--rounds R] [--pool-size N]

For each process count P (default 4, then 8), on a PostgreSQL database created for the run
(dropped after it): P worker processes are started and each opens an `ActionRuntime` on the
same ledger. Then, in interleaved rounds (the order alternates; the median round is kept),
every worker runs S / P sessions at once, each in its own Pipecat pipeline driven by a
`ScriptedLLM` that makes K chained tool calls (each result makes the next inference):

* **bare**: ``[user aggregator, LLM, result tap, assistant aggregator]``, the tool registered
  bare on the LLM (a handler that answers at once), in the same worker processes;
* **template**: the template's stages (turn tracker, LLM, status reporter, result tap, result
  gate, aggregators), the tool a non-idempotent mutation through the worker's runtime.

The workers start a round together (the parent says "go" once all are ready); a round lasts
from "go" to the last worker's answer. Printed per P and mode: calls per second over all
processes, p50 and p99 of one call (proposal to its result frame), errors (a session that
failed or timed out, or a result that is not the call's own success), the most PostgreSQL
connections one worker held (sampled from ``/proc/self/fd`` every `CONNECTIONS_EVERY_SECS`
and at the round's end), client CPU per call, the server's CPU per call (the database's
backends, from ``/proc/<pid>/stat``: the server must run on this machine), and the most
server backends waiting on a lock at once (``pg_stat_activity``, sampled every 50 ms). After
the rounds the workers flush and close their runtimes, and the ledger is read: operations not
in a terminal status (must be 0), and operations written against calls made.
``--pool-size N`` opens each worker's ledger with ``LedgerSettings(pool_size=N)``, its
connection budget (default: the ledger's, 5): a worker then holds at most N + 2 connections.

Issue 34's goal: 1,000 sessions of 5 calls over 4 processes, template >= 0.8x bare throughput,
0 errors, 0 unsettled (``--sessions 1000``). The default of 200 sessions finishes in a few
minutes on a small shared machine; ``make bench BENCH_MANY=1`` runs it from bench/work.py, as
rows of its table (``BENCH_MANY_SESSIONS=1000`` for issue 34's figure).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import asyncpg
from loguru import logger
from pipecat.frames.frames import Frame, FunctionCallResultFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.processors.frame_processor import FrameDirection
from pipecat.services.llm_service import FunctionCallParams

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _measure import PG_ADMIN_URL, ServerCpu, drop_pg, fresh_pg
from runtime import Marks, ResultTap, TimedLLM, run_until

from pipecat_actions import (
    ActionContext,
    ActionRuntime,
    AllowAll,
    SessionState,
    action,
    attach,
    tools_schema,
)
from pipecat_actions.adapters import ActionResultGate, ActionStatusReporter, ActionTurnTracker
from pipecat_actions.adapters.pipeline import check_placement
from pipecat_actions.ledger import LedgerSettings, SqlLedger
from pipecat_actions.policy import load_policy_text
from pipecat_actions.status import TERMINAL_STATUSES
from pipecat_actions.testing import Say, ToolCalls

POLICY = """
version: 1
tools:
  book:
    kind: mutation
    on_duplicate: allow
"""

SESSION_TIMEOUT_SECS = 600
"""A session still unfinished after this long counts as an error (a benchmark, not a test)."""
CONNECTIONS_EVERY_SECS = 1.0
"""How often a worker counts its connections. Each count reads the machine's TCP table
(``/proc/self/net/tcp``: about 10 ms of CPU with 600 sockets here); every 50 ms, as it once
did, that took a fifth of a core per worker, half the machine with 8 workers, counted as the
calls' client CPU and taken from them. The pools open their connections early and keep them:
a count a second, and one at the end, sees the most."""


# --- a worker process ------------------------------------------------------------------------


class CheckedTap(ResultTap):
    """`ResultTap` that also keeps each result, to check it is the call's own success."""

    def __init__(self, marks: Marks, done: asyncio.Event, calls: int) -> None:
        super().__init__(marks, done, calls)
        self.results: list[Any] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        if isinstance(frame, FunctionCallResultFrame) and direction is FrameDirection.DOWNSTREAM:
            self.results.append(frame.result)
        await super().process_frame(frame, direction)


def _succeeded(result: Any, bare: bool) -> bool:
    if not isinstance(result, dict):
        return False
    return result.get("status") == ("ok" if bare else "committed")


async def _session(name: str, calls: int, runtime: ActionRuntime | None) -> tuple[list[float], int]:
    """One session's call latencies (ms) and its errors."""
    marks = Marks()
    done = asyncio.Event()
    script = [ToolCalls([("book", {"n": i})]) for i in range(calls)] + [Say("done")]
    llm = TimedLLM(marks, script)
    context = LLMContext(messages=[{"role": "user", "content": "go"}])
    tap = CheckedTap(marks, done, calls)
    pair = LLMContextAggregatorPair(context)
    if runtime is None:

        async def bare(params: FunctionCallParams) -> None:
            await params.result_callback({"status": "ok"})

        llm.register_function("book", bare)
        pipeline = Pipeline([pair.user(), llm, tap, pair.assistant()])
    else:
        context.set_tools(tools_schema(runtime))
        session = SessionState(session_id=name, principal=f"p-{name}")
        attach(runtime, llm, session)
        stages = [
            pair.user(),
            ActionTurnTracker(session),
            llm,
            ActionStatusReporter(runtime, session),
            tap,
            ActionResultGate(runtime, session),
            pair.assistant(),
        ]
        check_placement(stages)
        pipeline = Pipeline(stages)
    try:
        await run_until(pipeline, done, timeout=SESSION_TIMEOUT_SECS)
    except Exception:
        return [], calls
    errors = sum(not _succeeded(r, runtime is None) for r in tap.results)
    errors += max(0, calls - len(tap.results))
    return [(r - p) * 1000 for p, r in zip(marks.proposed, marks.result, strict=False)], errors


def _pg_connections(port: int) -> int:
    """TCP connections of this process to ``port`` (its PostgreSQL connections)."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    count = 0
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            remote_port = int(fields[2].rpartition(":")[2], 16)
            if remote_port == port and fields[9] in inodes:
                count += 1
    return count


async def _worker_round(
    mode: str, index: int, round_no: int, sessions: int, calls: int, runtime: ActionRuntime
) -> dict[str, Any]:
    port = urlparse(PG_ADMIN_URL).port or 5432
    peak = 0
    stop = asyncio.Event()

    async def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, _pg_connections(port))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), CONNECTIONS_EVERY_SECS)

    sampler = asyncio.create_task(sample())
    cpu = time.process_time()
    tag = uuid.uuid4().hex[:6]
    done = await asyncio.gather(
        *(
            _session(f"w{index}-r{round_no}-s{n}-{tag}", calls, None if mode == "bare" else runtime)
            for n in range(sessions)
        )
    )
    cpu = time.process_time() - cpu
    stop.set()
    await sampler
    peak = max(peak, _pg_connections(port))
    return {
        "latencies": [ms for latencies, _ in done for ms in latencies],
        "errors": sum(errors for _, errors in done),
        "peak_connections": peak,
        "cpu": cpu,
    }


async def worker(args: argparse.Namespace) -> None:
    """Open a runtime on ``args.url``; run a round per "bare"/"template" line read; "quit"."""

    @action
    async def book(ctx: ActionContext, n: int) -> dict[str, Any]:
        """Book."""
        return {"booking_id": f"bk_{n}"}

    settings = (
        LedgerSettings() if args.pool_size is None else LedgerSettings(pool_size=args.pool_size)
    )
    ledger = await SqlLedger.create(args.url, settings=settings)
    runtime = await ActionRuntime.create(
        load_policy_text(POLICY), authorizer=AllowAll(), actions=[book], ledger=ledger
    )
    try:
        print("ready", flush=True)
        round_no = 0
        while True:
            command = (await asyncio.to_thread(sys.stdin.readline)).strip()
            if command not in ("bare", "template"):
                break
            result = await _worker_round(
                command, args.index, round_no, args.sessions, args.calls, runtime
            )
            print(json.dumps(result), flush=True)
            round_no += 1
        await runtime.flush()
    finally:
        await runtime.close()
        await ledger.close()


# --- the parent ------------------------------------------------------------------------------


class Workers:
    """P worker processes on one ledger, told what to run through their stdin."""

    def __init__(self, procs: list[asyncio.subprocess.Process]) -> None:
        self.procs = procs

    @classmethod
    async def start(
        cls, count: int, url: str, sessions: int, calls: int, pool_size: int | None
    ) -> Workers:
        procs = []
        for index in range(count):
            share = sessions // count + (1 if index < sessions % count else 0)
            command = [
                __file__, "--worker", "--url", url, "--index", str(index),
                "--sessions", str(share), "--calls", str(calls),
            ] + ([] if pool_size is None else ["--pool-size", str(pool_size)])  # fmt: skip
            procs.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    *command,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                )
            )
        workers = cls(procs)
        for line in await workers.answers():
            if line != "ready":
                raise RuntimeError(f"a worker did not start: {line!r}")
        return workers

    async def answers(self) -> list[str]:
        async def one(proc: asyncio.subprocess.Process) -> str:
            assert proc.stdout is not None
            return (await proc.stdout.readline()).decode().strip()

        return list(await asyncio.gather(*(one(p) for p in self.procs)))

    async def tell(self, command: str) -> None:
        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write(f"{command}\n".encode())
            await proc.stdin.drain()

    async def stop(self) -> None:
        await self.tell("quit")
        for proc in self.procs:
            await proc.wait()


async def _lock_waits(admin: asyncpg.Connection, database: str, stop: asyncio.Event) -> str:
    """The most backends of ``database`` seen waiting on a lock at once, and on what.

    PostgreSQL names the lock: ``object`` is the one a transaction that sends a notice takes
    at its commit (one at a time across the server), ``transactionid``/``tuple`` a row lock.
    """
    most: dict[str, int] = {}
    while not stop.is_set():
        waiting = await admin.fetch(
            "SELECT wait_event, count(*) FROM pg_stat_activity"
            " WHERE datname = $1 AND wait_event_type = 'Lock' GROUP BY wait_event",
            database,
        )
        for event, count in waiting:
            most[event] = max(most.get(event, 0), count)
        await asyncio.sleep(0.05)
    return " ".join(f"{count} {event}" for event, count in sorted(most.items())) or "0"


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else float("nan")


async def run_processes(count: int, args: argparse.Namespace) -> dict[str, Any]:
    """Every round on ``count`` processes; the median round of each mode and the ledger after."""
    name, url = await fresh_pg()
    admin = await asyncpg.connect(PG_ADMIN_URL)
    rounds: dict[str, list[dict[str, Any]]] = {"bare": [], "template": []}
    try:
        await (await SqlLedger.create(url)).close()  # the schema, before the workers race to it
        pool_size = getattr(args, "pool_size", None)  # a caller's Namespace may not name it
        workers = await Workers.start(count, url, args.sessions, args.calls, pool_size)
        try:
            for round_no in range(args.rounds):
                order = ["bare", "template"] if round_no % 2 == 0 else ["template", "bare"]
                for mode in order:
                    stop = asyncio.Event()
                    server = ServerCpu(admin, name)  # on the admin connection, as the lock waits:
                    ticks = await server.ticks()  # read before they start and after they end
                    locks = asyncio.create_task(_lock_waits(admin, name, stop))
                    start = time.perf_counter()
                    await workers.tell(mode)
                    answers = [json.loads(line) for line in await workers.answers()]
                    seconds = time.perf_counter() - start
                    stop.set()
                    lock_waits = await locks
                    server_cpu = server.spent(ticks, await server.ticks())
                    latencies = [ms for a in answers for ms in a["latencies"]]
                    calls = args.sessions * args.calls
                    rounds[mode].append(
                        {
                            "per_sec": calls / seconds,
                            "p50": statistics.median(latencies) if latencies else float("nan"),
                            "p99": _p(latencies, 0.99),
                            "errors": sum(a["errors"] for a in answers),
                            "connections": max(a["peak_connections"] for a in answers),
                            "cpu_us": sum(a["cpu"] for a in answers) / calls * 1e6,
                            "server_cpu_us": server_cpu / calls * 1e6,
                            "lock_waits": lock_waits,
                        }
                    )
        finally:
            await workers.stop()
        ledger = await asyncpg.connect(url)
        try:
            by_status = dict(
                await ledger.fetch("SELECT status, count(*) FROM pa_operations GROUP BY status")
            )
        finally:
            await ledger.close()
    finally:
        await admin.close()
        await drop_pg(name)
    terminal = {s.value for s in TERMINAL_STATUSES}
    chosen = {
        mode: sorted(samples, key=lambda s: s["per_sec"])[len(samples) // 2]
        for mode, samples in rounds.items()
    }
    return {
        "chosen": chosen,
        "errors": {mode: sum(s["errors"] for s in samples) for mode, samples in rounds.items()},
        "unsettled": sum(n for status, n in by_status.items() if status not in terminal),
        "operations": sum(by_status.values()),
        "expected": args.sessions * args.calls * args.rounds,
    }


def report(results: dict[int, dict[str, Any]], args: argparse.Namespace) -> None:
    print(
        f"{args.sessions} sessions x {args.calls} chained calls, spread over the processes; "
        f"{args.rounds} rounds (median round); one PostgreSQL ledger"
    )
    print(
        f"{'procs':<6}{'pipelines':<10}{'calls/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'errors':>8}"
        f"{'conns/proc':>11}{'CPU us':>8}{'srv us':>8}  lock waits (most at once)"
    )
    for count, found in results.items():
        for mode, s in found["chosen"].items():
            print(
                f"{count:<6}{mode:<10}{s['per_sec']:>9.0f}{s['p50']:>9.1f}{s['p99']:>9.1f}"
                f"{found['errors'][mode]:>8}{s['connections']:>11}{s['cpu_us']:>8.0f}"
                f"{s['server_cpu_us']:>8.0f}"
                f"  {s['lock_waits']}"
            )
    print()
    for count, found in results.items():
        ratio = found["chosen"]["template"]["per_sec"] / found["chosen"]["bare"]["per_sec"]
        print(
            f"{count} processes: template {ratio:.2f}x bare throughput (goal >= 0.8x); "
            f"errors {sum(found['errors'].values())} over all rounds (goal 0); operations "
            f"unsettled {found['unsettled']} (goal 0); {found['operations']} operations for "
            f"{found['expected']} calls"
        )


async def measure(args: argparse.Namespace) -> dict[int, dict[str, Any]]:
    return {count: await run_processes(count, args) for count in args.processes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=200)
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--processes", type=lambda s: [int(p) for p in s.split(",")], default=[4, 8]
    )
    parser.add_argument(
        "--pool-size",
        type=int,
        default=None,
        help="each worker's ledger connection budget (LedgerSettings.pool_size; default 5)",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--url", help=argparse.SUPPRESS)
    parser.add_argument("--index", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args()
    logger.remove()
    if args.worker:
        asyncio.run(worker(args))
        return
    report(asyncio.run(measure(args)), args)


if __name__ == "__main__":
    main()
