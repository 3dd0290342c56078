"""Scenario files with durable tools: played on PostgreSQL with a DBOS worker in the process.

The bot of the story is a DBOS client (`DurableLedger`), the worker runs the scenario's own
actions on its manual clock, and the expectations (told once, owed to the next conversation,
one effect) hold as for tools run in the call. DBOS is one instance per process: each run
launches it and destroys it, so the files run one after the other in this test process.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest

from pipecat_actions.errors import ScenarioError
from pipecat_actions.scenarios import load_scenario, render_reports, run_scenario
from pipecat_actions.scenarios.report import ScenarioReport
from pipecat_actions.status import ActionStatus
from tests.conftest import PG_ADMIN_URL, SKIP_PG
from tests.durable._support import rows

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(240)]
HERE = Path(__file__).parent
ROOT = HERE.parents[1]
SCENARIOS = sorted((HERE / "scenarios").glob("*.yaml"))


def _passed(report: ScenarioReport) -> None:
    text = io.StringIO()
    render_reports([report], text, verbose=True)
    assert report.passed, text.getvalue()


def _database_of(report: ScenarioReport) -> str:
    """The database the run's worker named on its first line (``worker: ledger: URL``)."""
    (line,) = [e.what for e in report.run.timeline if e.what.startswith("worker: ledger: ")]
    return line.rpartition("/")[2]


async def _exists(database: str) -> bool:
    conn = await asyncpg.connect(PG_ADMIN_URL)
    try:
        return bool(await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", database))
    finally:
        await conn.close()


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
async def test_a_durable_scenario_passes_on_a_database_of_its_own_dropped_after(
    path: Path,
) -> None:
    if SKIP_PG:
        pytest.skip("PIPECAT_ACTIONS_SKIP_PG=1")
    report = await run_scenario(path, ledger_url=PG_ADMIN_URL, fresh_database=True)
    _passed(report)
    timeline = [e.what for e in report.run.timeline]
    # The worker, not the bot, ran the effect and settled it.
    (op,) = report.run.operations
    assert f"worker: {op.operation_id} book_table: COMMITTED" in timeline
    (settled,) = [
        e
        for e in report.run.events[op.operation_id]
        if e.to_status is ActionStatus.COMMITTED and e.from_status is ActionStatus.RUNNING
    ]
    assert settled.actor.startswith("runtime:dbos-worker:scenario-"), settled.actor
    database = _database_of(report)
    assert database.startswith("pa_scenario_")
    assert not await _exists(database)


async def test_two_durable_scenarios_in_one_process_share_a_database_each_with_its_worker(
    pg_fresh_url: str,
) -> None:
    reports = [await run_scenario(path, ledger_url=pg_fresh_url) for path in SCENARIOS]
    for report in reports:
        _passed(report)
    # Two launches of DBOS in this process, under two executor ids; every workflow ended.
    workers = {
        e.what.split()[3] for r in reports for e in r.run.timeline if "runs durable" in e.what
    }
    assert len(workers) == len(SCENARIOS)
    found = await rows(pg_fresh_url, "SELECT status, executor_id FROM dbos.workflow_status")
    assert sorted(r["status"] for r in found) == ["SUCCESS"] * len(SCENARIOS)
    assert {r["executor_id"] for r in found} == workers


async def test_an_approval_left_waiting_has_its_workflow_cancelled_at_the_end(
    pg_fresh_url: str,
) -> None:
    text = (HERE / "scenarios" / SCENARIOS[0].name).read_text()
    from pipecat_actions.scenarios import load_scenario_text

    waiting = text.replace(
        "      execution: durable\n",
        "      execution: durable\n"
        "      confirmation: {mode: approval, approvers: [rosa], expires_after_secs: 3600}\n",
    )
    # Nobody decides: the story ends with the operation waiting for a person.
    story = waiting[: waiting.index("  - until:")] + (
        "  - until: {op: booking, status: [AWAITING_APPROVAL]}\n"
        "expect:\n"
        "  operations:\n"
        "    - {op: booking, status: AWAITING_APPROVAL}\n"
        "  side_effects: {}\n"
        "  settled: false\n"
    )
    loaded = load_scenario_text(story, source="waiting.yaml", base=HERE / "scenarios")
    report = await run_scenario(loaded, ledger_url=pg_fresh_url)
    _passed(report)
    # The ledger keeps what the story left; the workflow is not left for a later worker.
    (workflow,) = await rows(pg_fresh_url, "SELECT status FROM dbos.workflow_status")
    assert workflow["status"] == "CANCELLED"
    (op,) = await rows(pg_fresh_url, "SELECT status FROM pa_operations")
    assert op["status"] == "AWAITING_APPROVAL"


async def test_a_durable_scenario_on_sqlite_is_refused_before_anything_runs(
    tmp_path: Path,
) -> None:
    loaded = load_scenario(SCENARIOS[0])
    with pytest.raises(ScenarioError, match="needs PostgreSQL, not SQLite"):
        await run_scenario(loaded)
    with pytest.raises(ScenarioError, match="needs PostgreSQL, not sqlite"):
        await run_scenario(loaded, ledger_url=f"sqlite:///{tmp_path / 'l.db'}")


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        ([], "book_table run durably (execution: durable) on a DBOS worker, which needs"),
        (["--ledger", "sqlite:///x.db", "--fresh-database"], "needs PostgreSQL, not sqlite"),
    ],
)
def test_the_command_refuses_a_durable_scenario_on_sqlite_in_one_line(
    tmp_path: Path, extra: list[str], says: str
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PIPECAT_ACTIONS_LEDGER_URL"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "pipecat_actions.cli", "scenario", "run", str(SCENARIOS[0]), *extra],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert says in line and "Traceback" not in done.stderr
    assert line.startswith(f"pipecat-actions: {SCENARIOS[0]}: policy: ")
    assert "--fresh-database" in line
    assert not (tmp_path / "x.db").exists()


async def test_a_scenario_without_durable_tools_runs_on_a_database_of_its_own_too() -> None:
    if SKIP_PG:
        pytest.skip("PIPECAT_ACTIONS_SKIP_PG=1")
    path = ROOT / "tests" / "scenarios" / "reconnect_while_running.yaml"
    report = await run_scenario(path, ledger_url=PG_ADMIN_URL, fresh_database=True)
    _passed(report)
    assert not any(e.what.startswith("worker: ") for e in report.run.timeline)


def test_a_projects_durable_scenario_files_run_in_its_pytest_on_a_database_each(
    tmp_path: Path,
) -> None:
    if SKIP_PG:
        pytest.skip("PIPECAT_ACTIONS_SKIP_PG=1")
    from tests.scenario_format.test_scenario_pytest_plugin import _plugin_args

    (tmp_path / "scenarios").mkdir()
    for path in SCENARIOS:
        (tmp_path / "scenarios" / path.name).write_text(path.read_text())
    (tmp_path / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\nscenario_files = ["scenarios/*.yaml"]\n'
    )

    def pytest_run(*options: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *_plugin_args(),
             *options],
            cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
            capture_output=True, text=True, timeout=200, check=False,
        )  # fmt: skip

    done = pytest_run("--scenario-ledger", PG_ADMIN_URL, "--scenario-fresh-database")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"{len(SCENARIOS)} passed" in done.stdout
    refused = pytest_run()
    assert refused.returncode == 1
    assert f"{len(SCENARIOS)} failed" in refused.stdout
    assert "which needs PostgreSQL, not SQLite" in refused.stdout
    assert "Traceback" not in refused.stdout
