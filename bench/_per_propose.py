"""The work of one ``propose`` of a mutation with a 0-ms effect, counted, beside its floor.

Imported by ``bench/work.py`` (and ``tests/bench``); also run as a child process by it:

    python bench/_per_propose.py cpu-ours URL PROPOSES WARMUP
    python bench/_per_propose.py syscalls-sqlite DIRECTORY MARKER PROPOSES WARMUP

* `count_proposes`: in this process, on a ledger URL, the tasks, shields, thread hand-offs
  and SQL statements of each of N proposes after a warm-up (`_counters`), the SQLite WAL frames
  written (the ``-wal`` file's growth, automatic checkpoints off), and the statements each
  propose sent, kept so that a floor can replay the same rows.
* `sqlite_floor`: the same operation rows written with plain ``sqlite3`` into a ledger file of
  the same schema: each row inserted (one transaction), then updated once as the propose
  updated it (a second one): 2 commits, no audit events. Counted the same way.
* ``cpu-ours``: the child `work.py` runs under ``valgrind --tool=callgrind``: WARMUP then
  PROPOSES proposes on PostgreSQL (its floor is ``_raw_replay.py``).
* ``syscalls-sqlite``: the child `work.py` runs under ``strace``: proposes on a SQLite file,
  then the floor's replay, each between two 1-byte ``pwrite64`` to MARKER (offsets 0-1 for the
  proposes, 2-3 for the floor), so that the trace says which writes and fsyncs were whose.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import sys
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _counters import (
    AsyncioCounter,
    CallCounter,
    StatementCounter,
    page_size,
    statement_label,
    wal_bytes,
    wal_commits,
)

from pipecat_actions import ActionContext, ActionRuntime, AllowAll, SessionState, action
from pipecat_actions.actions import ActionDefinition
from pipecat_actions.ledger import SqlLedger
from pipecat_actions.policy import load_policy_text

POLICY = """
version: 1
tools:
  book_table:
    kind: mutation
    idempotency: {provider_dedupes: false}
    deadline_secs: 30
"""

Statement = tuple[str, tuple[Any, ...]]
PROFILED = 50
"""Proposes whose Python calls are counted (a profile hook slows them: not the others)."""
TOP_FUNCTIONS = 12


def booking_action() -> ActionDefinition:
    """The mutation every propose runs: its effect returns at once (a 0-ms effect)."""

    @action
    async def book_table(ctx: ActionContext, restaurant_id: str, n: int) -> dict[str, Any]:
        """Book a table."""
        return {"booking_id": f"bk_{n}"}

    return book_table


async def open_runtime(url: str) -> ActionRuntime:
    """A runtime on ``url`` with the booking action, as an application makes one."""
    return await ActionRuntime.create(
        load_policy_text(POLICY), authorizer=AllowAll(), actions=[booking_action()], ledger_url=url
    )


async def propose(runtime: ActionRuntime, i: int, prefix: str = "") -> None:
    """The ``i``-th booking: a new session, new arguments, committed.

    ``prefix`` makes the intent new too: the idempotency key is per principal (the policy's
    default scope), so a principal of its own keeps a run's proposes from joining operations
    an earlier run on the same database made (a join is not the path measured).
    """
    session = SessionState(session_id=f"{prefix}s{i}", principal=f"{prefix}p")
    told = await runtime.propose("book_table", {"restaurant_id": "r-17", "n": i}, session)
    if told.get("status") != "committed":
        raise RuntimeError(f"propose {i} was not committed: {told}")


@dataclass
class Work:
    """What N calls did, per call (see `count_proposes`)."""

    calls: int
    statements: float
    statement_kinds: dict[str, float]
    tasks: float = 0.0
    shields: float = 0.0
    run_in_executor: float = 0.0
    call_soon_threadsafe: float = 0.0
    task_sites: list[tuple[str, str, float]] = field(default_factory=list)
    """(coroutine, creation site, tasks per call)."""
    shield_sites: list[tuple[str, float]] = field(default_factory=list)
    executor_sites: list[tuple[str, float]] = field(default_factory=list)
    python_calls: float = 0.0
    """Python function calls per call (`CallCounter`, on calls of their own after the rest)."""
    calls_by_area: dict[str, float] = field(default_factory=dict)
    top_functions: list[tuple[str, float]] = field(default_factory=list)
    wal_frames: float | None = None
    wal_bytes: float | None = None
    wal_by_btree: dict[str, float] = field(default_factory=dict)
    """SQLite WAL frames per call by the table or index whose page each is."""
    wal_commits: list[tuple[list[str], float]] = field(default_factory=list)
    """The B-trees (tables, indexes) a commit wrote, each set seen, and such commits per call."""
    sent: list[list[Statement]] = field(default_factory=list, repr=False)
    """The statements of each call (warm-up included), in order: for a floor to replay."""


async def count_proposes(url: str, *, proposes: int, warmup: int) -> Work:
    """Count the work of ``proposes`` proposes after ``warmup`` on a ledger at ``url``.

    A SQLite URL names a file (``sqlite:///PATH``): its WAL frames are counted too.
    """
    database = Path(url.removeprefix("sqlite:///")) if url.startswith("sqlite") else None
    statements = StatementCounter()
    loop_counter = AsyncioCounter()
    per_call: list[list[Statement]] = []
    with statements.installed():
        runtime = await open_runtime(url)
        try:
            with loop_counter.installed(asyncio.get_running_loop()):
                with statements.counting():
                    for i in range(warmup):
                        await propose(runtime, i)
                        per_call.append(_taken(statements, database))
                statements.statements.clear()
                before = wal_bytes(database) if database else 0
                with loop_counter.counting(), statements.counting():
                    for i in range(warmup, warmup + proposes):
                        await propose(runtime, i)
                        per_call.append(_taken(statements, database))
                after = wal_bytes(database) if database else 0
                commits = wal_commits(database, before, after) if database else None
            profiled = min(proposes, PROFILED)
            python_calls = CallCounter()
            with python_calls.counting():
                for i in range(warmup + proposes, warmup + proposes + profiled):
                    await propose(runtime, i)
        finally:
            await runtime.close()
    work = Work(
        calls=proposes,
        statements=statements.total() / proposes,
        statement_kinds={k: v / proposes for k, v in statements.statements.most_common()},
        **{k: v / proposes for k, v in loop_counter.totals().items()},
        task_sites=[(n, s, c / proposes) for (n, s), c in loop_counter.tasks.most_common()],
        shield_sites=[(s, c / proposes) for s, c in loop_counter.shields.most_common()],
        executor_sites=[(s, c / proposes) for s, c in loop_counter.executor.most_common()],
        sent=per_call,
        python_calls=sum(python_calls.calls.values()) / profiled,
        calls_by_area={k: v / profiled for k, v in python_calls.by_area().most_common()},
        top_functions=[(k, v / profiled) for k, v in python_calls.top(TOP_FUNCTIONS)],
    )
    if database is not None:
        work.wal_bytes = (after - before) / proposes
        work.wal_frames = work.wal_bytes / (page_size(database) + 24)
        assert commits is not None
        by_btree = Counter(name for commit in commits for name in commit)
        work.wal_by_btree = {name: n / proposes for name, n in by_btree.most_common()}
        shapes = Counter(tuple(sorted(set(commit))) for commit in commits)
        work.wal_commits = [(list(names), n / proposes) for names, n in shapes.most_common()]
    return work


def _taken(statements: StatementCounter, database: Path | None) -> list[Statement]:
    taken = list(statements.executed if database is not None else statements.sent)
    statements.executed.clear()
    statements.sent.clear()
    return taken


def row_writes(calls: list[list[Statement]]) -> list[tuple[Statement, Statement]]:
    """Of each call's statements, the operation row's insert and its first update (SQLite)."""
    pairs = []
    for sent in calls:
        inserts = [s for s in sent if statement_label(s[0]) == "INSERT pa_operations"]
        updates = [s for s in sent if statement_label(s[0]) == "UPDATE pa_operations"]
        if len(inserts) != 1 or not updates:
            raise RuntimeError(f"a propose wrote no row and update: {[s[0][:40] for s in sent]}")
        pairs.append((inserts[0], updates[0]))
    return pairs


async def create_schema(url: str) -> None:
    """An empty ledger at ``url`` (the schema of the current migrations)."""
    await (await SqlLedger.create(url)).close()


def replay_sqlite(conn: sqlite3.Connection, pairs: list[tuple[Statement, Statement]]) -> None:
    """Each row inserted in a transaction of its own, then updated in another."""
    for insert, update in pairs:
        for sql, params in (insert, update):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(sql, params).fetchall()
            conn.execute("COMMIT")


def drop_secondary_indexes(database: Path) -> None:
    """Drop the operations table's indexes that are neither its primary key nor unique."""
    conn = sqlite3.connect(database)
    try:
        found = conn.execute(
            "SELECT name, sql FROM sqlite_master WHERE type = 'index' "
            "AND tbl_name = 'pa_operations' AND sql IS NOT NULL"
        ).fetchall()
        for name, sql in found:
            if not sql.upper().startswith("CREATE UNIQUE"):
                conn.execute(f'DROP INDEX "{name}"')
        conn.commit()
    finally:
        conn.close()


def open_floor_sqlite(database: Path) -> sqlite3.Connection:
    """A plain connection with the ledger's settings (WAL, synchronous FULL, foreign keys)."""
    conn = sqlite3.connect(database, isolation_level=None)
    for pragma in ("journal_mode=WAL", "synchronous=FULL", "foreign_keys=ON"):
        conn.execute(f"PRAGMA {pragma}")
    return conn


async def sqlite_floor(
    database: Path, calls: list[list[Statement]], *, warmup: int, indexes: bool = True
) -> Work:
    """`row_writes` of ``calls`` replayed on plain ``sqlite3`` into a new ledger file.

    ``indexes=False``: the operations table keeps only its primary key and unique constraints
    (each secondary index is a B-tree page more to write per row change).
    """
    await create_schema(f"sqlite:///{database}")
    if not indexes:
        drop_secondary_indexes(database)
    pairs = row_writes(calls)
    statements = StatementCounter()
    with statements.installed():
        conn = open_floor_sqlite(database)
    try:
        replay_sqlite(conn, pairs[:warmup])
        before = wal_bytes(database)
        with statements.counting():
            replay_sqlite(conn, pairs[warmup:])
        after = wal_bytes(database)
    finally:
        conn.close()
    n = len(pairs) - warmup
    frames = (after - before) / n / (page_size(database) + 24)
    return Work(
        calls=n,
        statements=statements.total() / n,
        statement_kinds={k: v / n for k, v in statements.statements.most_common()},
        wal_frames=frames,
        wal_bytes=(after - before) / n,
    )


# --- children --------------------------------------------------------------------------------


async def _cpu_ours(url: str, proposes: int, warmup: int) -> None:
    runtime = await open_runtime(url)
    prefix = uuid.uuid4().hex  # intents of their own, whatever ran on the database before
    try:
        for i in range(warmup + proposes):
            await propose(runtime, i, prefix)
    finally:
        await runtime.close()


def _mark(marker: int, offset: int) -> None:
    os.pwrite(marker, b"m", offset)


async def _syscalls_sqlite(directory: Path, marker_path: Path, proposes: int, warmup: int) -> None:
    # Statements are recorded (for the floor's rows) but SQLite is left as it is, automatic
    # checkpoints included: the trace sees what an application's process writes.
    marker = os.open(marker_path, os.O_WRONLY | os.O_CREAT)
    ours = directory / "ours.db"
    statements = StatementCounter()
    calls: list[list[Statement]] = []
    with statements.installed(autocheckpoint=True), statements.counting():
        runtime = await open_runtime(f"sqlite:///{ours}")
        try:
            for i in range(warmup + proposes):
                if i == warmup:
                    _mark(marker, 0)
                await propose(runtime, i)
                calls.append(_taken(statements, ours))
            _mark(marker, 1)
        finally:
            await runtime.close()
    floor = directory / "floor.db"
    await create_schema(f"sqlite:///{floor}")
    pairs = row_writes(calls)
    conn = open_floor_sqlite(floor)
    try:
        replay_sqlite(conn, pairs[:warmup])
        _mark(marker, 2)
        replay_sqlite(conn, pairs[warmup:])
        _mark(marker, 3)
    finally:
        conn.close()
        os.close(marker)


def main(argv: list[str]) -> None:
    from loguru import logger

    logger.remove()
    mode, *rest = argv
    if mode == "cpu-ours":
        url, n, warmup = rest
        asyncio.run(_cpu_ours(url, int(n), int(warmup)))
    elif mode == "syscalls-sqlite":
        directory, marker, n, warmup = rest
        asyncio.run(_syscalls_sqlite(Path(directory), Path(marker), int(n), int(warmup)))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
