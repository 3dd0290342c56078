"""A command pointed at something that is not a ledger, or that cannot be reached: one line
that says what it found and what to check, and nothing written there.

Someone else's database (tables, none of the ledger's) is never given a hint to create a
ledger in it; an empty one is. PostgreSQL that does not listen, has no such database or no such
user is named by host and port, with the password hidden. A SQLite path that is a directory,
a file that is not a database, a file or folder this user may not read or write: each says so.
Every command that opens a ledger says the same, the writers (``approvals reject``, ``worker``,
``db upgrade``) as the readers.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest

from pipecat_actions.cli import main
from pipecat_actions.errors import LedgerNotFound
from pipecat_actions.ledger import SqlLedger
from pipecat_actions.ledger.migrate import head_revision

ROOT = Path(__file__).resolve().parents[1]

OPENERS = [
    ["ledger", "list"],
    ["stats", "--json"],
    ["approvals", "list"],
    ["db", "status"],
    ["approvals", "reject", "op_x", "--approver", "rosa", "--reason", "no"],
    ["reconcile", "--all", "--app", "tests._operator_app:app"],
    ["worker", "--app", "tests._worker_app:app", "--once"],
]
"""Every kind of command that opens an existing ledger: readers, writers, the worker."""


def _run(capsys: pytest.CaptureFixture[str], argv: list[str], ledger: str) -> tuple[int, str]:
    """Run ``argv --ledger LEDGER``; return its exit status and stderr (stdout must be empty)."""
    code = main([*argv, "--ledger", ledger])
    out, err = capsys.readouterr()
    assert out == ""
    return code, err


def _one_line(err: str) -> str:
    assert err.count("\n") == 1, err
    assert "Traceback" not in err
    assert err.startswith("pipecat-actions: ")
    return err.removeprefix("pipecat-actions: ").rstrip("\n")


# --- someone else's database ---------------------------------------------------------------


async def _pg(url: str, statement: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(url)
    try:
        return list(await conn.fetch(statement))
    finally:
        await conn.close()


def _pg_tables(url: str) -> list[str]:
    rows = asyncio.run(_pg(url, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"))
    return sorted(row["tablename"] for row in rows)


@pytest.fixture
def shop_database(pg_fresh_url: str) -> str:
    """A PostgreSQL database of an application: its tables, none of the ledger's."""
    for name in ("orders", "customers", "invoices", "refunds"):
        asyncio.run(_pg(pg_fresh_url, f"CREATE TABLE {name} (id int)"))
    return pg_fresh_url


@pytest.mark.postgres
@pytest.mark.parametrize("argv", OPENERS, ids=" ".join)
def test_a_postgres_database_of_other_tables_is_not_a_ledger_and_no_command_offers_to_make_one(
    argv: list[str], shop_database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = _run(capsys, argv, shop_database)
    assert code == 1
    assert _one_line(err) == (
        f"{shop_database} is not a pipecat_actions ledger (a database with other tables: "
        "customers, invoices, orders and 1 more): check that the ledger URL names the "
        "ledger's database"
    )
    assert "db upgrade" not in err
    assert _pg_tables(shop_database) == ["customers", "invoices", "orders", "refunds"]


@pytest.mark.postgres
async def test_opening_an_existing_ledger_in_a_database_of_other_tables_is_refused(
    shop_database: str,
) -> None:
    for options in ({"must_exist": True}, {"read_only": True}, {"create_schema": False}):
        with pytest.raises(LedgerNotFound, match="not a pipecat_actions ledger"):
            await SqlLedger.create(shop_database, **options)  # type: ignore[arg-type]


@pytest.mark.postgres
def test_db_upgrade_puts_a_ledger_beside_other_tables_when_asked_and_says_so(
    shop_database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["db", "upgrade", "--ledger", shop_database]) == 0
    said = capsys.readouterr().out.splitlines()
    assert said[-1] == (
        f"schema upgraded from empty to {head_revision()} (beside the database's own tables: "
        "customers, invoices, orders, refunds)"
    )
    assert main(["ledger", "list", "--ledger", shop_database]) == 0


@pytest.mark.postgres
@pytest.mark.parametrize("argv", OPENERS[:4], ids=" ".join)
def test_an_empty_postgres_database_still_gets_the_command_that_creates_a_ledger(
    argv: list[str], pg_fresh_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main([*argv, "--ledger", pg_fresh_url])
    captured = capsys.readouterr()
    assert code == 1
    said = captured.err if captured.err else captured.out
    assert f"pipecat-actions db upgrade --ledger {pg_fresh_url}" in said


def _notes(path: Path) -> None:
    with sqlite3.connect(path) as raw:
        raw.execute("CREATE TABLE notes (body TEXT)")
        raw.execute("CREATE TABLE tags (name TEXT)")
    raw.close()


@pytest.mark.parametrize("argv", OPENERS, ids=" ".join)
def test_a_sqlite_file_of_other_tables_is_not_a_ledger_for_any_command(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "notes.db"
    _notes(path)
    before = path.read_bytes()
    code, err = _run(capsys, argv, str(path))
    assert code == 1
    assert _one_line(err) == (
        f"{path} is not a pipecat_actions ledger (a SQLite database with other tables: notes, "
        "tags): check that the ledger URL names the ledger's file"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.db"]  # no .lock, -wal, -shm
    assert path.read_bytes() == before


# --- SQLite paths that are no database -----------------------------------------------------

WRITERS = [["db", "upgrade"], OPENERS[4], OPENERS[6]]


@pytest.mark.parametrize("argv", WRITERS, ids=" ".join)
def test_a_directory_is_named_as_one_and_nothing_is_made_beside_it(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "ledgers"
    folder.mkdir()
    code, err = _run(capsys, argv, str(folder))
    assert code == 1
    assert _one_line(err) == (
        f"{folder} is not a pipecat_actions ledger (it is a directory): name the ledger's "
        f"file, not its folder (e.g. {folder}/ledger.db)"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["ledgers"]
    assert list(folder.iterdir()) == []


@pytest.mark.parametrize("argv", WRITERS, ids=" ".join)
def test_a_file_that_is_not_a_database_is_named_and_not_called_a_damaged_ledger(
    argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("buy milk\n")
    code, err = _run(capsys, argv, str(path))
    assert code == 1
    assert _one_line(err) == (
        f"{path} is not a pipecat_actions ledger (not a SQLite database): check that the "
        "ledger URL names the ledger's file"
    )
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]  # no .lock beside it
    assert path.read_text() == "buy milk\n"


def _without_root_powers(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """Run the installed command as this user, or as root without its file powers."""
    command = [str(Path(sys.executable).with_name("pipecat-actions")), *argv]
    if os.geteuid() == 0:  # root reads and writes any file: drop the capabilities that let it
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("run as root, and no setpriv to drop CAP_DAC_OVERRIDE")
        command = [setpriv, "--bounding-set=-dac_override,-dac_read_search", *command]
    return subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT)


@pytest.mark.parametrize("argv", WRITERS, ids=" ".join)
def test_a_ledger_file_this_user_may_not_read_says_what_to_check(
    argv: list[str], tmp_path: Path
) -> None:
    path = tmp_path / "ledger.db"
    assert main(["db", "upgrade", "--ledger", str(path)]) == 0
    os.chmod(path, 0)
    done = _without_root_powers([*argv, "--ledger", str(path)])
    assert done.returncode == 1, done
    assert _one_line(done.stderr) == (
        f"cannot read the ledger file {path} (Permission denied): check the owner and mode of "
        "the file and its folder (ls -l), or run as a user who may read it"
    )


def test_a_new_ledger_in_a_folder_this_user_may_not_write_says_what_to_check(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "ro"
    folder.mkdir()
    os.chmod(folder, 0o555)
    path = folder / "ledger.db"
    done = _without_root_powers(["db", "upgrade", "--ledger", str(path)])
    assert done.returncode == 1, done
    assert _one_line(done.stderr) == (
        f"cannot open the ledger file {path} ({path}.lock: Permission denied): check the owner "
        "and mode of the file and its folder (ls -l), or run as a user who may open it"
    )
    assert list(folder.iterdir()) == []


# --- PostgreSQL that cannot be reached -----------------------------------------------------


@pytest.fixture
def free_port() -> int:
    """A port on 127.0.0.1 where nothing listens (bound for a moment to find it, then let go)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@pytest.mark.parametrize("argv", [*OPENERS, ["db", "upgrade"]], ids=" ".join)
def test_postgres_not_running_names_host_and_port_and_what_to_check_without_the_password(
    argv: list[str], free_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"postgresql://app:s3cret@127.0.0.1:{free_port}/ledger"
    code, err = _run(capsys, argv, url)
    assert code == 1
    assert _one_line(err) == (
        f"PostgreSQL at 127.0.0.1:{free_port} refused the connection: check that the server is "
        f"running and listens there, and that the ledger URL "
        f"postgresql://app:***@127.0.0.1:{free_port}/ledger is right"
    )
    assert "s3cret" not in err


@pytest.mark.postgres
@pytest.mark.parametrize("argv", [OPENERS[0], ["db", "upgrade"]], ids=" ".join)
def test_a_database_the_server_does_not_have_is_named_with_how_to_make_it(
    argv: list[str], pg_fresh_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    server, _, _ = pg_fresh_url.rpartition("/")
    url = f"{server}/no_such_ledger_db"
    code, err = _run(capsys, argv, url)
    assert code == 1
    where = server.rpartition("@")[2]
    assert _one_line(err) == (
        f"PostgreSQL at {where} has no database 'no_such_ledger_db': check the database name "
        f"in the ledger URL {url}; a new ledger needs its database created first (createdb "
        "no_such_ledger_db), then `pipecat-actions db upgrade --ledger URL`"
    )


@pytest.mark.postgres
def test_a_user_the_server_does_not_know_is_named_with_what_to_check(
    pg_fresh_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    scheme, _, rest = pg_fresh_url.partition("://")
    url = f"{scheme}://no_such_user:s3cret@{rest.partition('@')[2]}"
    code, err = _run(capsys, ["ledger", "list"], url)
    assert code == 1
    said = _one_line(err)
    assert "refused the user 'no_such_user'" in said
    assert "check the user and password in the ledger URL" in said
    assert "s3cret" not in said
