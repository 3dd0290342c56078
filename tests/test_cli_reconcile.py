"""`pipecat-actions reconcile`, and the command line's promises: `--json` on every command,
one-line errors and a non-zero exit for bad arguments and unreachable databases."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pipecat_actions.cli import main
from pipecat_actions.clock import ManualClock
from pipecat_actions.ledger import NewOperation, SqlLedger
from pipecat_actions.status import ActionStatus
from tests import _operator_app as app_module

S = ActionStatus
APP = "tests._operator_app:app"
ROOT = Path(__file__).resolve().parents[1]
UNREACHABLE = "postgresql://postgres@127.0.0.1:1/none"


@pytest.fixture
def ledger(tmp_path: Path) -> tuple[str, dict[str, str]]:
    """A ledger with three UNKNOWN operations (found, not found, no hook) and a committed one."""
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    ids: dict[str, str] = {}

    async def fill() -> None:
        # An hour ago: the tools' commit horizon (60 s) has passed, so "no trace" is final.
        opened = await SqlLedger.create(url, clock=ManualClock(time.time() - 3600))
        try:
            for name, tool, args, final in (
                ("found", "book_table", {"time": "21:00"}, S.UNKNOWN),
                ("lost", "book_table", {"time": "21:30"}, S.UNKNOWN),
                ("no_hook", "charge", {"amount_cents": 100}, S.UNKNOWN),
                ("done", "book_table", {"time": "22:00"}, S.COMMITTED),
            ):
                op = (
                    await opened.admit(
                        NewOperation(
                            tool=tool,
                            kind="mutation",
                            args=args,
                            idempotency_key=f"key-{name}",
                            session_id="call-1",
                            principal="alice",
                            status=S.RUNNING,
                            lease_owner="bot-1",
                        )
                    )
                ).operation
                await opened.transition(
                    op.operation_id, expected=S.RUNNING, to=final, fence=op.fence, actor="bot-1"
                )
                ids[name] = op.operation_id
        finally:
            await opened.close()

    asyncio.run(fill())
    app_module.COMMITTED.clear()
    app_module.PENDING.clear()
    app_module.ASKED.clear()
    app_module.COMMITTED["key-found"] = {"booking_id": "bk_9"}
    return url, ids


def _read(url: str, operation_id: str) -> tuple[ActionStatus, list[tuple[str, str]]]:
    async def read() -> tuple[ActionStatus, list[tuple[str, str]]]:
        opened = await SqlLedger.create(url)
        try:
            op = await opened.get(operation_id)
            events = await opened.events(operation_id)
        finally:
            await opened.close()
        return op.status, [(e.to_status.value, e.actor) for e in events]

    return asyncio.run(read())


def test_reconcile_all_writes_what_the_hooks_find_as_the_operator(
    ledger: tuple[str, dict[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, ids = ledger
    argv = ["reconcile", "--all", "--app", APP, "--ledger", url, "--actor", "ops:ada", "--json"]
    code = main(argv)
    rows = {row["operation_id"]: row for row in json.loads(capsys.readouterr().out)}

    assert code == 0
    assert rows[ids["found"]]["after"] == "COMMITTED"
    assert rows[ids["found"]]["changed"] is True
    assert rows[ids["lost"]]["after"] == "FAILED_FINAL"
    assert rows[ids["no_hook"]]["after"] == "UNKNOWN"
    assert "no reconcile hook" in rows[ids["no_hook"]]["note"]
    assert ids["done"] not in rows
    status, trail = _read(url, ids["found"])
    assert status is S.COMMITTED
    assert trail[-1] == ("COMMITTED", "ops:ada")  # through the audited transition
    assert _read(url, ids["lost"])[1][-1] == ("FAILED_FINAL", "ops:ada")


def test_reconcile_prints_what_changed_as_a_table(
    ledger: tuple[str, dict[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, ids = ledger
    assert main(["reconcile", "--all", "--app", APP, "--ledger", url]) == 0
    lines = capsys.readouterr().out.splitlines()

    assert lines[0] == f"ledger: {url}"
    assert lines[1].split() == ["operation", "tool", "before", "after", "changed", "note"]
    found = next(line for line in lines if ids["found"] in line)
    assert found.split()[1:5] == ["book_table", "UNKNOWN", "COMMITTED", "yes"]
    skipped = next(line for line in lines if ids["no_hook"] in line)
    assert "skipped" in skipped
    # Nothing is left to find: a second run changes nothing.
    assert main(["reconcile", "--all", "--app", APP, "--ledger", url, "--json"]) == 0
    assert [row["changed"] for row in json.loads(capsys.readouterr().out)] == [False]


def test_reconcile_one_operation_prints_json_and_a_pending_answer_escalates_it(
    ledger: tuple[str, dict[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, ids = ledger
    app_module.PENDING.add("key-lost")
    app = "tests._operator_app:async_app"
    code = main(
        ["reconcile", ids["lost"], "--app", app, "--ledger", url, "--json", "--probes", "2"]
    )
    (row,) = json.loads(capsys.readouterr().out)

    assert code == 0
    assert row == {
        "operation_id": ids["lost"],
        "tool": "book_table",
        "before": "UNKNOWN",
        "after": "UNKNOWN",
        "changed": False,
        "escalated": True,
        "note": None,
    }
    assert [ids["lost"], ids["lost"]] == app_module.ASKED


def test_reconcile_of_an_operation_that_is_not_unknown_is_an_error(
    ledger: tuple[str, dict[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, ids = ledger
    code = main(["reconcile", ids["done"], "--app", APP, "--ledger", url])
    err = capsys.readouterr().err
    assert code == 1
    assert "COMMITTED, not UNKNOWN" in err
    assert _read(url, ids["done"])[0] is S.COMMITTED


@pytest.mark.parametrize(
    ("app", "says"),
    [
        (None, "needs the application's actions"),
        ("tests._operator_app", "write module:attribute"),
        ("tests._no_such_module:app", "cannot import"),
        ("tests._operator_app:nothing", "has no nothing"),
        ("tests._operator_app:NOT_AN_APP", "not an OperatorApp"),
    ],
)
def test_reconcile_without_a_usable_app_says_so_in_one_line(
    ledger: tuple[str, dict[str, str]],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    app: str | None,
    says: str,
) -> None:
    url, ids = ledger
    monkeypatch.delenv("PIPECAT_ACTIONS_APP", raising=False)
    argv = ["reconcile", "--all", "--ledger", url] + (["--app", app] if app else [])
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 1
    assert says in err
    assert err.count("\n") == 1
    assert _read(url, ids["found"])[0] is S.UNKNOWN


def _installed(argv: list[str]) -> subprocess.CompletedProcess[str]:
    command = [str(Path(sys.executable).with_name("pipecat-actions")), *argv]
    return subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT)


@pytest.mark.parametrize(
    "argv",
    [
        ["reconcile", "--all", "--app", APP, "--ledger", UNREACHABLE],
        ["approvals", "list", "--ledger", UNREACHABLE],
        ["ledger", "list", "--ledger", UNREACHABLE],
        ["undelivered", "--ledger", UNREACHABLE, "--json"],
        ["db", "status", "--ledger", UNREACHABLE],
    ],
    ids=lambda argv: " ".join(argv[:2]),
)
def test_an_unreachable_database_is_one_line_and_exit_1(argv: list[str]) -> None:
    done = _installed(argv)
    assert done.returncode == 1, done
    assert done.stderr.count("\n") == 1, done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["reconcile"],  # neither OP nor --all
        ["reconcile", "op_1", "--all"],
        ["reconcile", "--all", "--probes", "many"],
        ["ledger", "list", "--status", "DONE"],
        ["nonsense"],
    ],
    ids=" ".join,
)
def test_bad_arguments_are_one_line_and_exit_2(argv: list[str]) -> None:
    done = _installed(argv)
    assert done.returncode == 2, done
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("pipecat-actions")


def test_every_command_prints_json(
    ledger: tuple[str, dict[str, str]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, ids = ledger
    policy = str(ROOT / "configs" / "restaurant.yaml")
    for argv in (
        ["policy", "check", policy],
        ["db", "status", "--ledger", url],
        ["db", "upgrade", "--ledger", url],
        ["approvals", "list", "--ledger", url],
        ["approvals", "show", ids["done"], "--ledger", url],
        ["ledger", "list", "--ledger", url],
        ["ledger", "show", ids["done"], "--ledger", url],
        ["undelivered", "--ledger", url],
        ["stats", "--ledger", url],
        ["reconcile", "--all", "--app", APP, "--ledger", url],
    ):
        assert main([*argv, "--json"]) == 0, argv
        json.loads(capsys.readouterr().out)
