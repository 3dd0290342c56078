"""`bench/work.py` counts work at tiny sizes, so that ``make bench`` does not rot.

No figure is compared with a target here (those are for ``make bench``): only that each
counter sees what it counts, on a real runtime, a real SQLite file and the real PostgreSQL.
"""

from __future__ import annotations

import asyncio
import pickle
import sys
from pathlib import Path

import asyncpg
import pytest

from tests.conftest import SKIP_PG

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.append(str(BENCH))  # the scripts import each other by bare name, as when run

import _per_propose  # noqa: E402
import work  # noqa: E402
from _counters import statement_label  # noqa: E402

WARMUP = 2
PROPOSES = 4


async def test_counting_proposes_on_sqlite_sees_tasks_statements_and_wal_frames(
    tmp_path: Path,
) -> None:
    counted = await _per_propose.count_proposes(
        f"sqlite:///{tmp_path / 'ledger.db'}", proposes=PROPOSES, warmup=WARMUP
    )

    assert counted.tasks >= 1
    assert counted.tasks == int(counted.tasks)  # the same tasks for every propose
    assert counted.statement_kinds["INSERT pa_operations"] == 1
    assert counted.statement_kinds["COMMIT"] >= 1
    assert counted.wal_frames is not None
    assert counted.wal_frames > 0
    # Every frame is owned by a table or an index of the ledger; together, all of them.
    assert sum(counted.wal_by_btree.values()) == pytest.approx(counted.wal_frames)
    assert counted.wal_by_btree["pa_operations"] >= 2  # inserted, then updated: two commits
    assert counted.wal_by_btree["pa_operation_events"] >= 2
    assert not any(name.startswith("page ") for name in counted.wal_by_btree)
    # Two commits a propose (admitted, then its outcome), each writing the row's table.
    assert sum(n for _, n in counted.wal_commits) == pytest.approx(2)
    assert all("pa_operations" in names for names, _ in counted.wal_commits)
    assert all(name and site.startswith("pipecat_actions/") for name, site, _ in counted.task_sites)
    assert counted.python_calls > 0
    assert any(area.startswith("pipecat_actions/") for area in counted.calls_by_area)
    assert len(counted.sent) == WARMUP + PROPOSES


async def test_a_propose_on_sqlite_makes_two_tasks_and_none_for_its_writes_or_a_takeover(
    tmp_path: Path,
) -> None:
    # Issue 34: 6 tasks per propose, 2 of them the writer's group commits and 1 a wait for
    # the takeover event. Left: one that admits and runs the operation, and the effect's own.
    counted = await _per_propose.count_proposes(
        f"sqlite:///{tmp_path / 'ledger.db'}", proposes=PROPOSES, warmup=WARMUP
    )

    made = {name for name, _, _ in counted.task_sites}
    assert made == {"Proposals._admit_and_run", "ActionDefinition.run"}, counted.task_sites
    assert counted.tasks == 2
    # The writes of the sheltered task wait for their commit unshielded.
    assert not [site for site, _ in counted.shield_sites if "_writer.py" in site and " run" in site]
    assert counted.statement_kinds["INSERT pa_operation_events"] == 2  # 2 + 1, one statement each


async def test_the_sqlite_floor_inserts_and_updates_each_row_in_two_commits(
    tmp_path: Path,
) -> None:
    counted = await _per_propose.count_proposes(
        f"sqlite:///{tmp_path / 'ledger.db'}", proposes=PROPOSES, warmup=WARMUP
    )

    floor = await _per_propose.sqlite_floor(tmp_path / "floor.db", counted.sent, warmup=WARMUP)
    bare = await _per_propose.sqlite_floor(
        tmp_path / "bare.db", counted.sent, warmup=WARMUP, indexes=False
    )

    assert floor.statement_kinds == {
        "BEGIN IMMEDIATE": 2,
        "COMMIT": 2,
        "INSERT pa_operations": 1,
        "UPDATE pa_operations": 1,
    }
    assert floor.wal_frames is not None
    assert bare.wal_frames is not None
    assert 0 < bare.wal_frames < floor.wal_frames  # each secondary index is pages written


@pytest.mark.postgres
async def test_counting_proposes_on_postgres_sees_the_statements_sent_and_the_floor_replays_them(
    pg_fresh_url: str, tmp_path: Path
) -> None:
    counted = await _per_propose.count_proposes(pg_fresh_url, proposes=PROPOSES, warmup=WARMUP)
    # The sheltered task writes on asyncpg itself: no task or shield of the ledger's per write.
    made = {name for name, _, _ in counted.task_sites}
    assert made == {"Proposals._admit_and_run", "ActionDefinition.run"}, counted.task_sites
    assert not [site for site, _ in counted.shield_sites if "ledger/" in site]
    assert counted.statements >= 1
    assert sum(counted.statement_kinds.values()) == counted.statements
    # Each propose's statements are its own: its first write is the insert of its operation.
    # The ledger's notifier sends a batch of notices after a commit, on its own task: the batch
    # of one propose's settle may be sent while the next propose runs, before its insert.
    measured = counted.sent[WARMUP:]
    assert sum(len(sent) for sent in measured) == counted.statements * PROPOSES
    firsts = {
        statement_label(next(s for s in sent if "pg_notify" not in s[0])[0]) for sent in measured
    }
    assert firsts == {"WITH INSERT pa_operations (+ events)"}

    # The CPU floor's child replays those statements into an emptied database of the schema.
    replay = tmp_path / "replay.pkl"
    replay.write_bytes(pickle.dumps(counted.sent))
    process = await asyncio.create_subprocess_exec(
        sys.executable, str(BENCH / "_raw_replay.py"), pg_fresh_url, str(replay),
        str(PROPOSES), str(WARMUP),
    )  # fmt: skip
    assert await process.wait() == 0
    conn = await asyncpg.connect(pg_fresh_url)
    try:
        rows = await conn.fetchval("SELECT count(*) FROM pa_operations")
    finally:
        await conn.close()
    assert rows == WARMUP + PROPOSES


def test_strace_windows_split_writes_and_fsyncs_by_marker() -> None:
    trace = "\n".join(
        [
            '7 pwrite64(5</t/ours.db-wal>, ""..., 4096, 0) = 4096',  # before the window
            '7 pwrite64(6</t/marker>, ""..., 1, 0) = 1',
            '8 pwrite64(5</t/ours.db-wal>, ""..., 24, 32) = 24',
            '8 pwrite64(5</t/ours.db-wal>, ""..., 4096, 56) = 4096',
            "8 fdatasync(5</t/ours.db-wal>) = 0",
            '7 pwrite64(6</t/marker>, ""..., 1, 1) = 1',
            '7 pwrite64(6</t/marker>, ""..., 1, 2) = 1',
            '7 pwrite64(9</t/floor.db>, ""..., 4096, 0) = 4096',
            '7 pwrite64(6</t/marker>, ""..., 1, 3) = 1',
        ]
    )

    counts = work.io_in_windows(trace, "/t/marker")

    assert counts["ours"] == {"pwrite64 WAL": 2, "bytes WAL": 4120, "fsync WAL": 1}
    assert counts["floor"] == {"pwrite64 database": 1, "bytes database": 4096}


async def test_the_work_report_has_every_row_at_tiny_sizes(
    capsys: pytest.CaptureFixture[str],
) -> None:
    options = ["--proposes", str(PROPOSES), "--warmup", str(WARMUP), "--rows", "60"]
    options += ["--no-cpu", "--no-latency"] + (["--no-postgres"] if SKIP_PG else [])
    args = work.parse_args(options)

    report = await work.measure(args)
    work.print_report(report, args)

    missing = [r for r in report.rows if r.now.startswith("not measured")]
    allowed = ("strace is not installed", "--no-postgres")
    assert [r.now for r in missing if not r.now.endswith(allowed)] == []
    titles = [r.what for r in report.rows]
    assert "SQLite WAL frames written" in titles
    assert "asyncio tasks created, SQLite" in titles
    assert any(t.startswith("stats, 60 operations, SQLite") for t in titles)
    if not SKIP_PG:
        assert "PostgreSQL statements" in titles
        assert any(t.startswith("stats, 60 operations, PostgreSQL") for t in titles)
    printed = capsys.readouterr().out
    assert "where the work goes" in printed
    assert "SqliteWriter" in printed or "tasks (coroutine, created at)" in printed


@pytest.mark.postgres
@pytest.mark.skipif(SKIP_PG, reason="no PostgreSQL server")
async def test_many_processes_and_the_ledger_at_scale_are_rows_of_the_table_when_asked(
    capsys: pytest.CaptureFixture[str],
) -> None:
    options = ["--proposes", str(PROPOSES), "--warmup", str(WARMUP), "--no-cpu", "--no-stats"]
    options += ["--no-latency", "--no-syscalls", "--many", "2", "--many-processes", "1"]
    options += ["--many-rounds", "1", "--scale-rows", "60", "--scale-proposes", "2"]
    args = work.parse_args(options)

    report = await work.measure(args)
    work.print_report(report, args)

    rows = {r.what: r for r in report.rows}
    many = rows["2 sessions x 5 calls, 1 processes, throughput / bare"]
    assert many.goal.startswith(">= 0.8x; errors 0, unsettled 0")
    assert report.figures["many 1"]["operations"] == 2 * 5  # every call made one operation
    scale = rows["stats at 60 operations, PostgreSQL"]
    assert scale.goal == "<= 2 s"
    assert "propose p50 at 60 operations, PostgreSQL" in rows
    assert "slowest ledger list page at 60 operations, PostgreSQL" in rows
    full = report.figures["scale"]["full"]
    # 60 built, and the 4 x 2 proposes of each of the two measurements (empty, then full)
    assert full["operations"] == 60 + 16
    assert full["admit"].per_propose["tup_inserted"] > 0  # the server counted their rows
    printed = capsys.readouterr().out
    assert "1 processes: template" in printed
    assert "beside the same database empty" in printed
