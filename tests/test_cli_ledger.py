"""`pipecat-actions ledger list|show`, `undelivered` and `stats` against a real ledger, and how
the commands open one: an existing ledger only, by URL or plain path, private to its owner."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipecat_actions.cli import main
from pipecat_actions.errors import LedgerConfigurationError, LedgerNotFound, SchemaVersionMismatch
from pipecat_actions.ledger import NewOperation, SqlLedger
from pipecat_actions.ledger.engine import normalize_url
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
    code, out, _ = _cli(capsys, "ledger", "show", first, "--ledger", url, "--json")
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


# --- opening a ledger: existing only on request, plain paths, private files ---------------


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


async def test_must_exist_opens_an_existing_ledger_only(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "ledger.db"
    with pytest.raises(LedgerNotFound) as refused:
        await SqlLedger.create(f"sqlite:///{path}", must_exist=True)
    assert refused.value.path == str(path)
    assert _tree(tmp_path) == []
    (tmp_path / "sub").mkdir()
    path.touch()
    with pytest.raises(SchemaVersionMismatch):  # never given a schema: create_schema is moot
        await SqlLedger.create(f"sqlite:///{path}", must_exist=True)
    made = tmp_path / "made.db"
    await (await SqlLedger.create(f"sqlite:///{made}")).close()
    opened = await SqlLedger.create(f"sqlite:///{made}", must_exist=True)
    await opened.close()


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_a_new_sqlite_ledger_is_readable_by_its_owner_only(tmp_path: Path) -> None:
    path = tmp_path / "state" / "ledger.db"
    umask = os.umask(0o022)  # the common default, which leaves new files world-readable
    try:
        ledger = await SqlLedger.create(f"sqlite:///{path}")
    finally:
        os.umask(umask)
    try:
        await ledger.admit(
            NewOperation(
                tool="refund",
                kind="mutation",
                args={"card": "4242424242424242"},
                idempotency_key="k",
                session_id="s",
                principal="alice",
            )
        )
        sidecars = [path.with_name(path.name + end) for end in ("-wal", "-shm", ".lock")]
        assert all(p.exists() for p in sidecars)  # SQLite's while the ledger is open
        assert _mode(path.parent) == 0o700
        assert {p.name: _mode(p) for p in [path, *sidecars]} == {
            "ledger.db": 0o600,
            "ledger.db-wal": 0o600,
            "ledger.db-shm": 0o600,
            "ledger.db.lock": 0o600,
        }
    finally:
        await ledger.close()


def test_files_that_exist_keep_the_mode_their_owner_gave_them(
    url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "ledger.db"
    lock = path.with_name("ledger.db.lock")
    os.chmod(tmp_path, 0o750)
    os.chmod(path, 0o640)  # a team's choice: a group reads the ledger
    os.chmod(lock, 0o660)
    for argv in (["db", "upgrade", url], ["ledger", "list", "--ledger", url]):
        assert _cli(capsys, *argv)[::2] == (0, "")  # and not a word about them
    assert (_mode(tmp_path), _mode(path), _mode(lock)) == (0o750, 0o640, 0o660)


@pytest.mark.parametrize("given", ["ledger.db", "./x/ledger.db", "x/../ledger.db"])
def test_a_plain_path_is_a_sqlite_file_from_the_working_directory(
    given: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    parsed = normalize_url(given)
    assert parsed.drivername == "sqlite+aiosqlite"
    assert parsed.database == os.path.abspath(tmp_path / given)
    assert normalize_url(str(tmp_path / "abs.db")).database == str(tmp_path / "abs.db")


@pytest.mark.parametrize(
    "given", ["sqlite:ledger.db", "postgresql:/db", "file:ledger.db", "runs/10:00/ledger.db"]
)
def test_an_unparseable_url_says_how_to_name_a_sqlite_file(given: str) -> None:
    with pytest.raises(LedgerConfigurationError, match="sqlite:///PATH"):
        normalize_url(given)
