"""`pipecat-actions ledger list|show`, `undelivered` and `stats` against a real ledger."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipecat_actions.cli import main
from pipecat_actions.ledger import NewOperation, SqlLedger
from pipecat_actions.status import ActionStatus

S = ActionStatus


@pytest.fixture
def url(tmp_path: Path) -> str:
    """A ledger with a committed, a refused, a compensated and an undelivered operation."""
    location = f"sqlite:///{tmp_path / 'ledger.db'}"

    async def fill() -> None:
        ledger = await SqlLedger.create(location)
        try:

            def new(key: str, **extra: Any) -> NewOperation:
                fields: dict[str, Any] = {
                    "tool": "book_table",
                    "kind": "mutation",
                    "args": {"time": key},
                    "idempotency_key": key,
                    "session_id": "call-1",
                    "principal": "alice",
                    "status": S.RUNNING,
                }
                fields.update(extra)
                return NewOperation(**fields)

            told = (await ledger.admit(new("21:00"))).operation
            await ledger.transition(
                told.operation_id,
                expected=S.RUNNING,
                to=S.COMMITTED,
                fence=1,
                actor="t",
                changes={"result": {"b": 1}},
            )
            await ledger.annotate(
                told.operation_id,
                actor="gate",
                changes={
                    "delivered_at": told.created_at + 1,
                    "acknowledged_at": told.created_at + 2,
                },
            )
            quiet = (await ledger.admit(new("21:30"))).operation
            await ledger.transition(
                quiet.operation_id, expected=S.RUNNING, to=S.COMMITTED, fence=1, actor="t"
            )
            await ledger.record_refusal(
                new("22:00", idempotency_key="r1", detail={"reason": "not_authorized"})
            )
        finally:
            await ledger.close()

    asyncio.run(fill())
    return location


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_ledger_list_filters_by_status_and_prints_json(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _cli(
        capsys, "ledger", "list", "--ledger", url, "--status", "COMMITTED", "--json"
    )
    assert code == 0
    rows = json.loads(out)
    assert [r["args"]["time"] for r in rows] == ["21:00", "21:30"]
    assert all(r["status"] == "COMMITTED" for r in rows)


def test_ledger_show_prints_the_audit_timeline_with_who_and_why(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    _, out, _ = _cli(capsys, "ledger", "list", "--ledger", url, "--json")
    first = json.loads(out)[0]["operation_id"]
    code, out, _ = _cli(capsys, "ledger", "show", first, "--ledger", url)
    assert code == 0
    shown = json.loads(out)
    assert shown["operation"]["status"] == "COMMITTED"
    assert [(e["from"], e["to"], e["actor"]) for e in shown["events"]][:3] == [
        ("REQUESTED", "ADMITTED", "runtime"),
        ("ADMITTED", "RUNNING", "runtime"),
        ("RUNNING", "COMMITTED", "t"),
    ]


def test_undelivered_lists_only_committed_operations_nobody_was_told_about(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _cli(capsys, "undelivered", "--ledger", url, "--json")
    assert code == 0
    assert [r["args"]["time"] for r in json.loads(out)] == ["21:30"]


def test_stats_count_by_status_refusal_reason_and_delivery(
    url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _cli(capsys, "stats", "--ledger", url, "--json")
    assert code == 0
    tool = json.loads(out)["tools"]["book_table"]
    assert tool["by_status"] == {"COMMITTED": 2, "REJECTED": 1}
    assert tool["refused_by_reason"] == {"not_authorized": 1}
    assert tool["committed_undelivered"] == 1
    assert tool["commit_to_acknowledged"]["count"] == 1


def test_an_unknown_operation_or_database_is_one_line_from_the_installed_command(
    url: str, tmp_path: Path
) -> None:
    command = [str(Path(sys.executable).with_name("pipecat-actions"))]
    for argv in (
        ["ledger", "show", "op_nope", "--ledger", url],
        ["stats", "--ledger", "postgresql://postgres@127.0.0.1:1/none"],
        ["ledger", "list", "--ledger", f"sqlite:///{tmp_path / 'empty.db'}"],
    ):
        done = subprocess.run(command + argv, capture_output=True, text=True, check=False)
        assert done.returncode == 1, done
        assert done.stderr.count("\n") == 1, done.stderr
        assert "Traceback" not in done.stderr
