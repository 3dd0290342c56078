"""`pipecat-actions ledger list|show`, `undelivered` and `stats` against a real ledger, and how
the commands open one: an existing ledger only, by URL or plain path, private to its owner."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pipecat_actions.cli import _build_parser, main
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
    for argv in (["db", "upgrade", "--ledger", url], ["ledger", "list", "--ledger", url]):
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


@pytest.mark.parametrize(
    "given",
    ["postgresql://u:s3cret@db:notaport/x", "sqlite://x:y/z.db", "postgresql://u:s3cret@[::1/x"],
)
def test_a_url_with_a_malformed_port_or_host_is_one_line_that_hides_the_password(
    given: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["ledger", "list", "--ledger", given])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith("pipecat-actions: not a database URL: ") and err.count("\n") == 1
    assert "sqlite:///PATH" in err
    assert "s3cret" not in err


# --- read commands never create a ledger ---------------------------------------------------

READERS = [
    ["approvals", "list"],
    ["approvals", "show", "op_x"],
    ["ledger", "list"],
    ["ledger", "show", "op_x"],
    ["undelivered"],
    ["stats"],
    ["reconcile", "--all", "--app", "tests._operator_app:app"],
]


@pytest.mark.parametrize("argv", [*READERS, ["db", "status"]], ids=" ".join)
def test_a_read_command_in_an_empty_folder_creates_nothing_and_says_where_it_looked(
    argv: list[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PIPECAT_ACTIONS_LEDGER_URL", raising=False)
    code, out, err = _cli(capsys, *argv)
    assert code == 1
    assert out == ""
    assert err.count("\n") == 1, err
    default = tmp_path / ".pipecat_actions" / "ledger.db"
    assert f"no ledger at {default}" in err
    assert f"pipecat-actions db upgrade --ledger sqlite:///{default}" in err
    assert ".pipecat_actions/demo.db" in err  # where `make demo` keeps its own
    assert _tree(tmp_path) == []


@pytest.mark.parametrize("argv", READERS, ids=" ".join)
def test_a_read_command_names_a_missing_ledger_and_creates_neither_it_nor_its_directory(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere" / "ledger.db"
    code, _, err = _cli(capsys, *argv, "--ledger", f"sqlite:///{missing}")
    assert code == 1
    assert err.strip() == (
        f"pipecat-actions: no ledger at {missing} (no directory {missing.parent}): create one "
        f"with `pipecat-actions db upgrade --ledger sqlite:///{missing}`"
    )
    assert _tree(tmp_path) == []


def test_db_status_of_a_missing_file_creates_nothing_and_db_upgrade_creates_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = f"sqlite:///{tmp_path / 'new' / 'ledger.db'}"
    code, _, err = _cli(capsys, "db", "status", "--ledger", missing)
    assert code == 1
    assert "no ledger at" in err
    assert _tree(tmp_path) == []
    assert _cli(capsys, "db", "upgrade", "--ledger", missing)[0] == 0
    code, out, _ = _cli(capsys, "db", "status", "--ledger", missing)
    assert code == 0
    assert out.splitlines()[0] == f"ledger: {missing}"
    assert out.splitlines()[1].endswith("up to date")


def test_approvals_list_of_an_empty_database_file_does_not_give_it_a_schema(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "ledger.db"
    empty.touch()
    code, _, err = _cli(capsys, "approvals", "list", "--ledger", f"sqlite:///{empty}")
    assert code == 1
    assert "pipecat-actions db upgrade" in err
    assert _cli(capsys, "db", "status", "--ledger", f"sqlite:///{empty}")[0] == 1  # still empty


def test_a_plain_path_works_as_ledger_and_in_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert _cli(capsys, "db", "upgrade", "--ledger", "./x/ledger.db")[0] == 0
    named = f"ledger: sqlite:///{tmp_path / 'x' / 'ledger.db'}"
    code, out, _ = _cli(capsys, "ledger", "list", "--ledger", "x/ledger.db")
    assert (code, out.splitlines()) == (0, [named, "no operation matches"])
    monkeypatch.setenv("PIPECAT_ACTIONS_LEDGER_URL", str(tmp_path / "x" / "ledger.db"))
    code, out, _ = _cli(capsys, "stats")
    assert (code, out.splitlines()[0]) == (0, named)


@pytest.mark.postgres
def test_an_empty_postgres_database_says_which_command_creates_it_and_where_its_password_goes(
    pg_fresh_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with_password = pg_fresh_url.replace("postgres@", "postgres:s3cret@", 1)
    assert with_password != pg_fresh_url
    assert main(["ledger", "list", "--ledger", with_password]) == 1
    err = capsys.readouterr().err
    shown = pg_fresh_url.replace("postgres@", "postgres:***@", 1).replace("+asyncpg", "")
    assert (
        f"run `pipecat-actions db upgrade --ledger {shown}` (its password in place of ***)" in err
    )
    assert "s3cret" not in err


@pytest.mark.parametrize(
    "argv",
    [
        ["ledger", "list", "--limit", "99999999999999999999"],
        ["ledger", "list", "--limit", "0"],
        ["undelivered", "--limit", "-3"],
        ["ledger", "list", "--since", "nan"],
        ["ledger", "list", "--since", "-5"],
        ["stats", "--since", "inf"],
    ],
    ids=" ".join,
)
def test_a_page_size_or_window_no_ledger_can_answer_is_a_usage_error(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    assert main(["db", "upgrade", "--ledger", url]) == 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        main([*argv, "--ledger", url])
    err = capsys.readouterr().err
    assert done.value.code == 2
    assert err.count("\n") == 1 and f"argument {argv[-2]}" in err


@pytest.mark.parametrize("cursor", ["nan/op_x", "1e400/op_x", "inf/op_x"])
def test_a_cursor_no_page_could_have_printed_is_a_usage_error(
    cursor: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    assert main(["db", "upgrade", "--ledger", url]) == 0
    with pytest.raises(SystemExit) as done:
        main(["ledger", "list", "--after", cursor, "--ledger", url])
    assert done.value.code == 2
    assert "is not a cursor" in capsys.readouterr().err


# --- every command names its ledger with --ledger URL --------------------------------------

OPENING_COMMANDS = {
    "approvals list", "approvals show", "approvals approve", "approvals reject", "console",
    "db status", "db upgrade", "durable check", "ledger list", "ledger rotate-keys", "ledger show",
    "reconcile", "scenario run", "stats", "undelivered", "worker",
}  # fmt: skip
"""The commands that open a ledger (or, for ``scenario run``, make their ledgers in one)."""


def _leaves(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, set[str]]:
    """Each command line's words (``db upgrade``) and the options its parser takes."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return {prefix.strip(): {o for a in parser._actions for o in a.option_strings}}
    found: dict[str, set[str]] = {}
    for name, sub in subs[0].choices.items():
        found.update(_leaves(sub, f"{prefix} {name}"))
    return found


def test_every_command_that_opens_a_ledger_takes_it_as_ledger_url_and_no_other_does() -> None:
    leaves = _leaves(_build_parser())
    taking = {command for command, options in leaves.items() if "--ledger" in options}
    assert taking == OPENING_COMMANDS


@pytest.mark.parametrize("command", [["db", "upgrade"], ["db", "status"]], ids=" ".join)
def test_the_ledger_as_the_db_commands_argument_still_works_with_a_one_line_warning(
    command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    assert main(["db", "upgrade", "--ledger", url]) == 0
    capsys.readouterr()
    code, out, err = _cli(capsys, *command, url)
    assert code == 0
    said = " ".join(command)
    assert err == (
        f"pipecat-actions: warning: `{said} URL` is deprecated; write `{said} --ledger URL`\n"
    )
    assert out.splitlines()[0] == f"ledger: {url}"


def test_the_ledger_given_both_ways_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    with pytest.raises(SystemExit) as done:
        main(["db", "upgrade", url, "--ledger", url])
    assert done.value.code == 2
    assert capsys.readouterr().err == (
        "pipecat-actions: db upgrade: give the ledger once, as --ledger URL (not also as URL) "
        "(see --help)\n"
    )
    assert list(tmp_path.iterdir()) == []


def test_scenario_runs_older_ledger_url_option_still_works_with_a_one_line_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "missing.yaml")
    code = main(["scenario", "run", missing, "--ledger-url", f"sqlite:///{tmp_path / 'x.db'}"])
    err = capsys.readouterr().err.splitlines()
    assert code == 2  # the file is not there: said after the warning
    assert err[0] == (
        "pipecat-actions: warning: `scenario run --ledger-url URL` is deprecated; "
        "write `scenario run --ledger URL`"
    )
