"""The work of one ``propose``, counted beside its floor: figures that hold on a busy machine.

    .venv/bin/python bench/work.py [--proposes N] [--warmup W] [--cpu-proposes N] [--rows R]
                                   [--latency-ops N] [--latency-rounds R] [--no-postgres]
                                   [--no-syscalls] [--no-cpu] [--no-stats] [--no-latency]
                                   [--many S] [--many-processes 4,8] [--scale-rows N]

``make bench`` runs it. Each row of issue 34's table, for ``propose`` of a mutation whose effect
returns at once (0 ms), measured now and beside its floor in the same run:

* **SQLite WAL frames** per propose: the ``-wal`` file's growth with automatic checkpoints off
  (exactly the frames appended). Floor: the same operation rows (as the proposes wrote them)
  inserted then updated once with plain ``sqlite3`` in the ledger's schema, 2 commits; also in
  a table without the secondary indexes (issue 34's 4.3-frame floor).
* **SQLite I/O** per propose, from ``strace -f`` (when strace is installed) on a process that
  does not change SQLite: ``pwrite64`` calls and bytes, ``fdatasync``/``fsync`` calls, same floor.
* **SQL statements** per propose: every statement SQLite ran (BEGIN and COMMIT included); on
  PostgreSQL every statement sent (asyncpg's query logger, SQLAlchemy's cursor events).
* **asyncio tasks** per propose (a task factory), ``asyncio.shield`` calls and thread
  hand-offs (``run_in_executor``; ``call_soon_threadsafe`` back). Floor: the issue's 1-2.
* **client CPU instructions** per propose on PostgreSQL (``valgrind --tool=callgrind``, when
  installed): a process making W + N proposes and one making W + 2N, the difference over N, so
  that start-up cancels out. Floor: the same statements, parameters built beforehand, replayed
  on one raw asyncpg connection, measured the same way (``_raw_replay.py``).
* **stats** at ``--rows`` operations (default ``$BENCH_ROWS`` or 100,000; issue 34's goal is at
  1,000,000: ``BENCH_ROWS=1000000 make bench``): seconds, beside one indexed aggregate.
* **latency ratios** (durations, noisy on a shared machine): ``bench/postgres.py`` (propose
  against agent-ledger's ``run()``, 50 callers, each contender in a fresh process on a fresh
  database: the table's "50 callers" row, goal >= 1.5x) and ``bench/ledger.py`` (ledger writes
  against raw aiosqlite), their own reports printed after the table.
* with ``--many S`` (``make bench BENCH_MANY=1``; ``$BENCH_MANY_SESSIONS``, default 200; issue
  34's figure is 1,000): ``bench/many_processes.py``, S sessions of 5 chained calls over 4 and
  then 8 processes on one PostgreSQL ledger against bare handlers in the same processes: a row
  per process count (goal >= 0.8x bare, 0 errors, 0 unsettled), its report printed after.
* with ``--scale-rows N`` (``make bench BENCH_SCALE_ROWS=10000000``): ``bench/ten_million.py``,
  a PostgreSQL ledger of N operations beside the same one empty: propose p50 and buffers per
  propose (goal: unchanged), ``stats`` (goal <= 2 s) and the slowest ``ledger list`` page
  (goal <= 50 ms), its report (with the plans of what is over its goal) printed after.

A part that cannot run here (no PostgreSQL server, no valgrind, no strace, agent-ledger not
installed) prints its row as "not measured: ..." and the rest goes on. Figures, not pass/fail.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import io
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import asyncpg
from _measure import PG_ADMIN_URL, drop_pg, fresh_pg
from _per_propose import Work, count_proposes, create_schema, sqlite_floor
from loguru import logger

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TASKS_FLOOR = 2
"""Issue 34's floor for tasks per propose (1-2): one that outlives a cancelled caller."""


@dataclass
class Row:
    """One line of the table: what, now, its floor, now / floor, the goal."""

    what: str
    now: str = ""
    floor: str = ""
    ratio: str = ""
    goal: str = ""


@dataclass
class Report:
    """The table's rows, where the work goes, and the latency benchmarks' own reports."""

    rows: list[Row] = field(default_factory=list)
    where: list[str] = field(default_factory=list)
    latency: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    """Every figure by name, for tests and for comparing runs."""

    def skip(self, what: str, why: str) -> None:
        self.rows.append(Row(what, f"not measured: {why}"))


def _duration(secs: float) -> str:
    return f"{secs:.2f} s" if secs >= 1 else f"{secs * 1000:.1f} ms"


def _x(now: float, floor: float) -> str:
    return f"{now / floor:.2f}x" if floor else "-"


# --- per propose: statements, tasks, WAL -----------------------------------------------------


async def per_propose(args: argparse.Namespace, report: Report, tmp: Path, pg: str | None) -> None:
    """The counted rows, SQLite then PostgreSQL; the PostgreSQL replay file for the CPU rows."""
    ours = await count_proposes(
        f"sqlite:///{tmp / 'ours.db'}", proposes=args.proposes, warmup=args.warmup
    )
    floor = await sqlite_floor(tmp / "floor.db", ours.sent, warmup=args.warmup)
    bare = await sqlite_floor(tmp / "bare.db", ours.sent, warmup=args.warmup, indexes=False)
    assert ours.wal_frames is not None
    assert ours.wal_bytes is not None
    assert floor.wal_frames is not None
    assert bare.wal_frames is not None
    report.figures["sqlite"] = {"ours": _figures(ours), "floor": _figures(floor),
                                "bare": _figures(bare)}  # fmt: skip
    report.rows += [
        Row(
            "SQLite WAL frames written",
            f"{ours.wal_frames:.1f} ({ours.wal_bytes / 1024:.0f} KB)",
            f"{floor.wal_frames:.1f}; {bare.wal_frames:.1f} w/o 2nd-ary indexes",
            f"{_x(ours.wal_frames, floor.wal_frames)}; {_x(ours.wal_frames, bare.wal_frames)}",
            "<= 2x the floor",
        ),
        Row(
            "SQLite statements",
            f"{ours.statements:.1f}",
            f"{floor.statements:.1f}",
            _x(ours.statements, floor.statements),
            "-",
        ),
        _tasks_row("asyncio tasks created, SQLite", ours),
    ]
    _where(report, "SQLite", ours, floor)
    if pg is None:
        return
    ours_pg = await count_proposes(
        pg, proposes=max(args.proposes, 2 * args.cpu_proposes), warmup=args.warmup
    )
    report.figures["postgres"] = {"ours": _figures(ours_pg)}
    measured = ours_pg.sent[args.warmup :]
    replayed = sum(len(sent) for sent in measured) / len(measured)
    report.rows += [
        Row(
            "PostgreSQL statements",
            f"{ours_pg.statements:.1f}",
            f"{replayed:.1f}",
            _x(ours_pg.statements, replayed),
            "-",
        ),
        _tasks_row("asyncio tasks created, PostgreSQL", ours_pg),
    ]
    _where(report, "PostgreSQL", ours_pg, None)
    (tmp / "replay.pkl").write_bytes(pickle.dumps(ours_pg.sent))


def _figures(work: Work) -> dict[str, Any]:
    return {k: v for k, v in vars(work).items() if k != "sent"}


def _tasks_row(what: str, work: Work) -> Row:
    return Row(
        what,
        f"{work.tasks:.1f} + {work.shields:.1f} shields, "
        f"{work.call_soon_threadsafe:.1f} thread round trips",
        f"1-{TASKS_FLOOR} (issue 34)",
        _x(work.tasks, TASKS_FLOOR),
        f"<= {TASKS_FLOOR}",
    )


def _where(report: Report, backend: str, ours: Work, floor: Work | None) -> None:
    lines = [f"{backend}, per propose ({ours.calls} after a warm-up):"]
    lines.append("  statements:")
    for kind, n in ours.statement_kinds.items():
        lines.append(f"    {n:5.2f}  {kind}")
    if floor is not None:
        kinds = ", ".join(f"{n:.0f} {kind}" for kind, n in floor.statement_kinds.items())
        lines.append(f"    floor: {kinds}")
    if ours.wal_by_btree:
        lines.append("  WAL frames, by the table or index whose page each is:")
        for name, n in ours.wal_by_btree.items():
            lines.append(f"    {n:5.2f}  {name}")
        lines.append(
            "  commits, by the B-trees each wrote (a B-tree written is at least a page, so a"
            " commit's frames are at least its B-trees):"
        )
        for names, n in ours.wal_commits:
            lines.append(f"    {n:5.2f}  {len(names):2d} B-trees: {', '.join(names)}")
    lines.append("  tasks (coroutine, created at):")
    for name, site, n in ours.task_sites:
        lines.append(f"    {n:5.2f}  {name:<40} {site}")
    lines.append("  asyncio.shield calls, at:")
    for site, n in ours.shield_sites:
        lines.append(f"    {n:5.2f}  {site}")
    lines.append(f"  Python function calls: {ours.python_calls:,.0f} (sys.setprofile), by area:")
    for where, n in ours.calls_by_area.items():
        if n >= 1:
            lines.append(f"    {n:7.0f}  {where}")
    lines.append("  functions called most:")
    for function, n in ours.top_functions:
        lines.append(f"    {n:7.1f}  {function}")
    if ours.executor_sites:
        lines.append("  run_in_executor (loop -> thread), at:")
        for site, n in ours.executor_sites:
            lines.append(f"    {n:5.2f}  {site}")
    report.where += lines


# --- SQLite I/O under strace -----------------------------------------------------------------

_SYSCALL = re.compile(
    r'^\d+\s+(pwrite64|fdatasync|fsync)\((\d+)<([^>]*)>(?:, ""\.*, (\d+), (\d+))?'
)
"""A line of ``strace -f -y -s 0``: ``PID pwrite64(FD<PATH>, ""..., SIZE, OFFSET) = SIZE``."""


def io_in_windows(trace: str, marker: str) -> dict[str, Counter[str]]:
    """Per window of the trace (``ours``, ``floor``): calls and bytes by kind and file.

    The windows are delimited by 1-byte writes to ``marker`` at offsets 0-1 and 2-3.
    """
    windows = {0: "ours", 2: "floor"}
    counts: dict[str, Counter[str]] = {"ours": Counter(), "floor": Counter()}
    current: str | None = None
    for line in trace.splitlines():
        found = _SYSCALL.match(line)
        if found is None:
            continue
        call, _, path, size, offset = found.groups()
        if path == marker:
            current = windows.get(int(offset or 0))
            continue
        if current is None:
            continue
        file = "WAL" if path.endswith("-wal") else "database" if path.endswith(".db") else "other"
        name = "fsync" if call in ("fsync", "fdatasync") else "pwrite64"
        counts[current][f"{name} {file}"] += 1
        if size is not None:
            counts[current][f"bytes {file}"] += int(size)
    return counts


def syscalls(args: argparse.Namespace, report: Report, tmp: Path) -> None:
    what = "SQLite I/O (strace)"
    if shutil.which("strace") is None:
        report.skip(what, "strace is not installed (apt-get install strace)")
        return
    directory = tmp / "strace"
    directory.mkdir()
    marker, trace = directory / "marker", directory / "trace"
    child = [sys.executable, str(HERE / "_per_propose.py"), "syscalls-sqlite", str(directory),
             str(marker), str(args.proposes), str(args.warmup)]  # fmt: skip
    command = ["strace", "-f", "-qq", "-s", "0", "-y", "-o", str(trace),
               "-e", "trace=pwrite64,fsync,fdatasync", *child]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        report.skip(what, f"strace failed ({done.returncode}): {last[:120]}")
        return
    counts = io_in_windows(trace.read_text(), str(marker))
    n = args.proposes
    ours, floor = ({k: v / n for k, v in counts[w].items()} for w in ("ours", "floor"))
    report.figures["strace"] = {"ours": ours, "floor": floor}

    def said(c: dict[str, float]) -> str:
        writes = c.get("pwrite64 WAL", 0) + c.get("pwrite64 database", 0)
        kb = (c.get("bytes WAL", 0) + c.get("bytes database", 0)) / 1024
        return f"{writes:.1f} pwrite64 ({kb:.0f} KB), {c.get('fsync WAL', 0):.1f} fdatasync"

    def kb(c: dict[str, float]) -> float:
        return c.get("bytes WAL", 0) + c.get("bytes database", 0)

    report.rows.append(
        Row(
            "SQLite pwrite64 / fsync",
            said(ours),
            said(floor),
            _x(kb(ours), kb(floor)) + " (bytes)",
            "<= 2x the floor",
        )
    )


# --- client CPU on PostgreSQL under callgrind ------------------------------------------------


def _instructions(command: list[str], out: Path) -> int:
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    valgrind = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"]
    done = subprocess.run([*valgrind, *command], capture_output=True, text=True, cwd=ROOT,
                          env=env, check=False)  # fmt: skip
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        raise RuntimeError(f"{Path(command[1]).name} failed under callgrind: {last[:160]}")
    found = re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.MULTILINE)
    if found is None:
        raise RuntimeError(f"no instruction count in {out}")
    return int(found.group(1))


def cpu(args: argparse.Namespace, report: Report, tmp: Path, pg: str, floor_pg: str) -> None:
    what = "client CPU instructions, PostgreSQL"
    if shutil.which("valgrind") is None:
        report.skip(what, "valgrind is not installed (apt-get install valgrind)")
        return
    n, w = args.cpu_proposes, str(args.warmup)
    py = sys.executable
    per_call = {}
    for name, script in (
        ("ours", [str(HERE / "_per_propose.py"), "cpu-ours", pg]),
        ("floor", [str(HERE / "_raw_replay.py"), floor_pg, str(tmp / "replay.pkl")]),
    ):
        counts = [
            _instructions([py, *script, str(k), w], tmp / f"cg.{name}.{k}") for k in (n, 2 * n)
        ]
        per_call[name] = (counts[1] - counts[0]) / n
    report.figures["instructions"] = per_call
    ours, floor = per_call["ours"], per_call["floor"]
    report.rows.append(
        Row(what, f"{ours / 1e6:.2f} M", f"{floor / 1e6:.2f} M", _x(ours, floor), "<= 1.5x")
    )


# --- stats at scale --------------------------------------------------------------------------


async def stats(args: argparse.Namespace, report: Report, tmp: Path, pg: bool) -> None:
    from _stats_scale import measure_stats

    goal = "<= 2 s at 1M"
    backends: list[tuple[str, Callable[[], Awaitable[Any]]]] = [
        ("SQLite", lambda: measure_stats(f"sqlite:///{tmp / 'stats.db'}", args.rows))
    ]
    if pg:
        backends.append(("PostgreSQL", lambda: _on_fresh_pg(args.rows)))
    for backend, run in backends:
        what = f"stats, {args.rows:,} operations, {backend}"
        try:
            timing = await run()
        except Exception as exc:
            report.skip(what, f"{type(exc).__name__}: {exc}")
            continue
        report.figures[f"stats {backend}"] = vars(timing)
        report.rows.append(
            Row(what, f"{_duration(timing.stats_secs)} (first {_duration(timing.first_secs)})",
                _duration(timing.floor_secs), _x(timing.stats_secs, timing.floor_secs), goal)
        )  # fmt: skip
        report.where.append(
            f"stats, {backend}: built {timing.operations:,} operations and {timing.events:,} "
            f"events in {timing.build_secs:.0f} s; floor: one GROUP BY tool, status"
        )


async def _on_fresh_pg(rows: int) -> Any:
    from _stats_scale import measure_stats

    name, url = await fresh_pg()
    try:
        return await measure_stats(url, rows)
    finally:
        await drop_pg(name)


# --- the latency benchmarks, as they are -----------------------------------------------------


def _median_round(samples: list[Any], by_throughput: bool) -> Any:
    """The median round, chosen as the latency scripts choose it."""
    return sorted(samples, key=lambda s: -s.per_sec if by_throughput else s.median_ms)[
        len(samples) // 2
    ]


async def latency(args: argparse.Namespace, report: Report, pg: bool) -> None:
    import ledger as ledger_bench
    import postgres as postgres_bench

    what = "50 callers, PostgreSQL, throughput / agent-ledger"
    if not pg:
        report.skip(what, "no PostgreSQL server")
    else:
        options = argparse.Namespace(ops=args.latency_ops, rounds=args.latency_rounds, callers=50)
        results = await postgres_bench.measure(options)
        report.latency.append(_printed(lambda: postgres_bench.report(results, options)))
        chosen = {name: _median_round(s, " x" in name) for name, s in results.items()}
        if "agent-ledger" not in chosen:
            report.skip(what, "agent-ledger is not installed (pip install -e '.[bench]')")
        else:
            ours, rival = chosen["propose x50"], chosen["agent-ledger x50"]
            report.rows.append(
                Row(
                    what,
                    f"{ours.per_sec:.0f} calls/s",
                    f"agent-ledger {rival.per_sec:.0f}",
                    _x(ours.per_sec, rival.per_sec),
                    ">= 1.5x",
                )
            )
            p50, rival_p50 = chosen["propose"].median_ms, chosen["agent-ledger"].median_ms
            report.rows.append(
                Row("propose p50, PostgreSQL / agent-ledger", f"{p50:.2f} ms",
                    f"agent-ledger {rival_p50:.2f} ms", _x(p50, rival_p50), "<= 0.8x")
            )  # fmt: skip
    options = argparse.Namespace(
        ops=args.latency_ops, rounds=args.latency_rounds, writers=50, no_postgres=not pg
    )
    results = await ledger_bench.measure(options)
    report.latency.append(_printed(lambda: ledger_bench.report(results, options)))


# --- many processes, and the ledger at 10M operations (when asked) ----------------------------


async def many(args: argparse.Namespace, report: Report) -> None:
    """Rows of ``bench/many_processes.py``: sessions over P processes against bare handlers."""
    import many_processes

    options = argparse.Namespace(
        sessions=args.many, calls=5, rounds=args.many_rounds, processes=args.many_processes
    )
    results = await many_processes.measure(options)
    report.latency.append(_printed(lambda: many_processes.report(results, options)))
    load = os.getloadavg()[0]
    for count, found in results.items():
        ours, bare = found["chosen"]["template"], found["chosen"]["bare"]
        report.figures[f"many {count}"] = found
        errors = sum(found["errors"].values())
        report.rows.append(
            Row(f"{args.many} sessions x 5 calls, {count} processes, throughput / bare",
                f"{ours['per_sec']:.0f} calls/s (p99 {ours['p99']:.0f} ms)",
                f"bare {bare['per_sec']:.0f}", _x(ours["per_sec"], bare["per_sec"]),
                f">= 0.8x; errors {errors}, unsettled {found['unsettled']} (goal 0)"
                f" [load {load:.1f}]")
        )  # fmt: skip


async def scale(args: argparse.Namespace, report: Report) -> None:
    """Rows of ``bench/ten_million.py``: a PostgreSQL ledger of N operations beside empty."""
    import ten_million

    options = argparse.Namespace(
        rows=args.scale_rows, template=min(100_000, args.scale_rows), proposes=args.scale_proposes,
        stats_times=3, keep=None, reuse=None,
    )  # fmt: skip
    empty, full, built = await ten_million.measure(options)
    report.latency.append(_printed(lambda: ten_million.report(empty, full, built, options)))
    assert empty.admit is not None
    assert full.admit is not None
    report.figures["scale"] = {"empty": vars(empty), "full": vars(full), "built": built}
    n = f"{args.scale_rows:,} operations, PostgreSQL"
    hits = [
        a.per_propose["blks_hit"] + a.per_propose["blks_read"] for a in (empty.admit, full.admit)
    ]
    slowest = max(full.pages_ms, key=full.pages_ms.__getitem__)
    report.rows += [
        Row(f"propose p50 at {n}", f"{full.admit.p50_ms:.2f} ms ({hits[1]:.0f} pages)",
            f"empty {empty.admit.p50_ms:.2f} ms ({hits[0]:.0f} pages)",
            _x(full.admit.p50_ms, empty.admit.p50_ms), "unchanged"),
        Row(f"stats at {n}", f"{_duration(full.stats_secs)} (first {_duration(full.stats_first)})",
            f"empty {_duration(empty.stats_secs)}", "-", "<= 2 s"),
        Row(f"slowest ledger list page at {n}", f"{full.pages_ms[slowest]:.1f} ms ({slowest})",
            f"empty {empty.pages_ms[slowest]:.1f} ms", "-", "<= 50 ms"),
    ]  # fmt: skip


def _printed(call: Callable[[], None]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        call()
    return out.getvalue()


# --- the whole -------------------------------------------------------------------------------


async def _pg_reachable() -> str | None:
    """Why the PostgreSQL server cannot be used, or None."""
    try:
        conn = await asyncpg.connect(PG_ADMIN_URL, timeout=5)
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        return f"PostgreSQL at {PG_ADMIN_URL} not reachable ({type(exc).__name__}: {exc})"
    await conn.close()
    return None


async def measure(args: argparse.Namespace) -> Report:
    """Every part `args` asks for; a part that fails becomes a "not measured" row."""
    report = Report()
    no_pg = "--no-postgres" if args.no_postgres else await _pg_reachable()
    # What asyncio would print as "Task exception was never retrieved", once per kind, after
    # the table rather than a traceback each (bench/postgres.py's 50 callers leave some).
    unretrieved: Counter[str] = Counter()

    def on_error(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
        error = context.get("exception")
        unretrieved[f"{context.get('message')}: {type(error).__name__}: {error}"] += 1

    asyncio.get_running_loop().set_exception_handler(on_error)

    async def part(what: str, run: Callable[[], Awaitable[None]]) -> None:
        try:
            await run()
        except Exception as exc:
            report.skip(what, f"{type(exc).__name__}: {str(exc)[:200]}")

    made: list[str] = []
    with tempfile.TemporaryDirectory(prefix="pa-bench-work-") as directory:
        tmp = Path(directory)
        try:
            pg = floor_pg = None
            if no_pg is None:
                # One database for the proposes, one for the floor's replay of their statements.
                (ours_name, pg), (floor_name, floor_pg) = await fresh_pg(), await fresh_pg()
                made += [ours_name, floor_name]
            await part("statements, tasks, WAL", lambda: per_propose(args, report, tmp, pg))
            if no_pg is not None:
                report.skip("PostgreSQL statements and tasks", no_pg)
            if not args.no_syscalls:
                await part("SQLite I/O (strace)", lambda: _in_thread(syscalls, args, report, tmp))
            if args.no_cpu:
                pass
            elif pg is None or floor_pg is None:
                report.skip("client CPU instructions, PostgreSQL", no_pg or "-")
            elif not (tmp / "replay.pkl").exists():
                report.skip("client CPU instructions, PostgreSQL", "no statements to replay")
            else:
                await create_schema(floor_pg)
                await part("client CPU instructions, PostgreSQL",
                           lambda: _in_thread(cpu, args, report, tmp, pg, floor_pg))  # fmt: skip
        finally:
            for name in made:
                await drop_pg(name)
        if not args.no_stats:
            await part("stats", lambda: stats(args, report, tmp, no_pg is None))
            if no_pg is not None:
                report.skip("stats, PostgreSQL", no_pg)
    if not args.no_latency:
        await part("latency ratios", lambda: latency(args, report, no_pg is None))
    for asked, what, run in (
        (args.many, "many processes", lambda: many(args, report)),
        (args.scale_rows, "ledger at scale", lambda: scale(args, report)),
    ):
        if asked and no_pg is not None:
            report.skip(what, no_pg)
        elif asked:
            await part(what, run)
    gc.collect()  # tasks whose exception nobody retrieved say so when collected
    for message, times in unretrieved.items():
        report.where.append(f"asyncio reported {times} time(s): {message}")
    return report


async def _in_thread(call: Callable[..., None], *args: Any) -> None:
    await asyncio.to_thread(call, *args)


def print_report(report: Report, args: argparse.Namespace) -> None:
    print(f"work per propose of a mutation with a 0-ms effect ({args.proposes} proposes after "
          f"{args.warmup}; CPU: {args.cpu_proposes} and {2 * args.cpu_proposes})")  # fmt: skip
    header = Row("per propose", "now", "floor (same run)", "now/floor", "goal")
    measured = [r for r in report.rows if not r.now.startswith("not measured")]
    cells = [[r.what, r.now, r.floor, r.ratio, r.goal] for r in [header, *measured]]
    widths = [max(len(row[i]) for row in cells) + 2 for i in range(5)]
    widths[0] = max(len(r.what) + 2 for r in [header, *report.rows])
    for row in [header, *report.rows]:
        if row.now.startswith("not measured"):
            print(f"{row.what:<{widths[0]}}{row.now}")
            continue
        line = [row.what, row.now, row.floor, row.ratio, row.goal]
        print("".join(f"{c:<{w}}" for c, w in zip(line, widths, strict=True)).rstrip())
    if report.where:
        print("\nwhere the work goes")
        print("\n".join(report.where))
    for text in report.latency:
        print("\nlatency (durations; the machine is shared)")
        print(text.rstrip())


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proposes", type=int, default=200, help="proposes counted")
    parser.add_argument("--warmup", type=int, default=20, help="proposes before counting")
    parser.add_argument("--cpu-proposes", type=int, default=100, help="N of the N/2N runs")
    parser.add_argument("--rows", type=int, default=int(os.environ.get("BENCH_ROWS", 100_000)))
    parser.add_argument("--latency-ops", type=int, default=500)
    parser.add_argument("--latency-rounds", type=int, default=3)
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--no-syscalls", action="store_true")
    parser.add_argument("--no-cpu", action="store_true")
    parser.add_argument("--no-stats", action="store_true")
    parser.add_argument("--no-latency", action="store_true")
    many_default = (
        int(os.environ.get("BENCH_MANY_SESSIONS", 200)) if os.environ.get("BENCH_MANY") else 0
    )
    parser.add_argument(
        "--many",
        type=int,
        default=many_default,
        metavar="SESSIONS",
        help="bench/many_processes.py with SESSIONS sessions (0: not run)",
    )
    parser.add_argument(
        "--many-processes", type=lambda s: [int(p) for p in s.split(",")], default=[4, 8]
    )
    parser.add_argument("--many-rounds", type=int, default=3)
    parser.add_argument(
        "--scale-rows",
        type=int,
        default=int(os.environ.get("BENCH_SCALE_ROWS", 0)),
        help="bench/ten_million.py at this many operations (0: not run)",
    )
    parser.add_argument("--scale-proposes", type=int, default=200)
    return parser.parse_args(argv)


def main() -> None:
    args = parse_args()
    logger.remove()
    print_report(asyncio.run(measure(args)), args)


if __name__ == "__main__":
    main()
