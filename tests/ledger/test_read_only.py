"""The operator's read commands write nothing: not to a ledger, and not to a file that is none.

Every read command (and the console, before it serves) is pointed at a SQLite database that is
not a ledger, at random bytes, at an empty file, at a directory, at a ledger of a newer schema
and at a real ledger a runtime made and closed. The folder holding it is the same afterwards,
to the byte: the same names, sizes, modes, modification times and contents (no ``.lock``,
``-wal`` or ``-shm`` appears, and the database is not switched to WAL). What is not a ledger
is refused in one line.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import random
import shutil
import sqlite3
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from pipecat_actions.admission.authorization import AllowAll
from pipecat_actions.cli import main
from pipecat_actions.errors import LedgerConfigurationError
from pipecat_actions.ledger import SqlLedger
from pipecat_actions.ledger.migrate import VERSION_TABLE
from pipecat_actions.policy import load_policy_text
from pipecat_actions.runtime import ActionRuntime
from tests.ledger._support import new_op

REPOSITORY = Path(__file__).resolve().parents[2]
POLICY = "version: 1\ntools:\n  book_table:\n    kind: mutation\n"

READ_COMMANDS = [
    ["ledger", "list"],
    ["ledger", "show", "op_x"],
    ["stats"],
    ["undelivered"],
    ["approvals", "list"],
    ["approvals", "show", "op_x"],
    ["db", "status"],
]
"""Each with ``--ledger PATH``."""


def _argv(command: list[str], path: Path) -> list[str]:
    return [*command, "--ledger", f"sqlite:///{path}"]


def _snapshot(root: Path) -> dict[str, tuple[object, ...]]:
    """Every entry under ``root`` (and ``root`` itself): name, size, mode, mtime, content."""
    found: dict[str, tuple[object, ...]] = {}
    for entry in [root, *sorted(root.rglob("*"))]:
        info = entry.lstat()
        content = (
            hashlib.sha256(entry.read_bytes()).hexdigest()
            if stat.S_ISREG(info.st_mode) and info.st_mode & stat.S_IRUSR
            else None
        )
        found[str(entry.relative_to(root))] = (
            info.st_size if stat.S_ISREG(info.st_mode) else None,
            stat.S_IMODE(info.st_mode),
            info.st_mtime_ns,
            content,
        )
    return found


def _notes(path: Path) -> None:
    """Someone's own SQLite database, in the default rollback-journal mode."""
    with sqlite3.connect(path) as raw:
        raw.execute("CREATE TABLE notes (body TEXT)")
        raw.execute("INSERT INTO notes VALUES ('buy milk')")
    raw.close()
    with sqlite3.connect(path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    raw.close()


def _random(path: Path) -> None:
    path.write_bytes(random.Random(7).randbytes(8192))


def _empty(path: Path) -> None:
    path.touch()


def _directory(path: Path) -> None:
    path.mkdir()


async def _runtime_ledger(path: Path) -> None:
    """A ledger as an agent leaves it: made by a runtime, one operation in it, closed."""
    runtime = await ActionRuntime.create(
        load_policy_text(POLICY),
        authorizer=AllowAll(),
        routed=["book_table"],  # no action runs here: the runtime only makes the ledger
        ledger_url=f"sqlite:///{path}",
    )
    await runtime.close()
    async with await SqlLedger.create(f"sqlite:///{path}") as ledger:
        await ledger.admit(new_op("k-1"))


def _ledger(path: Path) -> None:
    asyncio.run(_runtime_ledger(path))


def _newer_ledger(path: Path) -> None:
    _ledger(path)
    with sqlite3.connect(path) as raw:
        raw.execute(f"UPDATE {VERSION_TABLE} SET version_num = '9999_from_the_future'")
    raw.close()


def _refusal(
    path: Path, why: str, check: str = "check that the ledger URL names the ledger's file"
) -> str:
    return f"pipecat-actions: {path} is not a pipecat_actions ledger ({why}): {check}\n"


SUBJECTS: dict[str, Callable[[Path], None]] = {
    "notes": _notes,
    "random-bytes": _random,
    "empty-file": _empty,
    "directory": _directory,
    "ledger": _ledger,
    "newer-ledger": _newer_ledger,
}


@pytest.fixture(params=sorted(SUBJECTS))
def subject(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """A folder holding one thing at ``folder/it.db``, made by ``SUBJECTS[param]``."""
    folder = tmp_path / "folder"
    folder.mkdir()
    SUBJECTS[request.param](folder / "it.db")
    return folder / "it.db"


def _expected(kind: str, command: list[str], path: Path) -> tuple[int, Callable[[str], bool]]:
    """The exit status of ``command`` on ``kind`` and a check of its stderr."""
    db_status = command[0] == "db"
    if kind == "notes":
        # Someone's own database: said so, and never a hint to make a ledger of it.
        return 1, lambda err: err == _refusal(path, "a SQLite database with other tables: notes")
    if kind == "random-bytes":
        return 1, lambda err: err == _refusal(path, "not a SQLite database")
    if kind == "directory":
        return (
            1,
            lambda err: (
                err
                == _refusal(
                    path,
                    "it is a directory",
                    f"name the ledger's file, not its folder (e.g. {path}/ledger.db)",
                )
            ),
        )
    if kind == "empty-file":
        # An empty file is an empty SQLite database: `db upgrade` is what makes it a ledger.
        if db_status:
            return 1, lambda err: err == ""
        return 1, lambda err: err.count("\n") == 1 and "pipecat-actions db upgrade" in err
    if kind == "newer-ledger":
        if db_status:
            return 1, lambda err: err == ""
        return 1, lambda err: err.count("\n") == 1 and "newer pipecat_actions" in err
    if command[-1] == "op_x":
        return 1, lambda err: err == "pipecat-actions: operation op_x not found\n"
    return 0, lambda err: err == ""


@pytest.mark.parametrize("command", READ_COMMANDS, ids=" ".join)
def test_a_read_command_changes_nothing_on_disk_and_refuses_what_is_not_a_ledger(
    subject: Path,
    command: list[str],
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
) -> None:
    kind = request.node.callspec.params["subject"]
    before = _snapshot(subject.parent)
    code = main(_argv(command, subject))
    captured = capsys.readouterr()
    assert _snapshot(subject.parent) == before
    status, err_ok = _expected(kind, command, subject)
    assert code == status, captured
    assert err_ok(captured.err), captured.err
    assert "Traceback" not in captured.err


def test_the_console_refuses_what_is_not_a_ledger_before_writing_anything(
    subject: Path, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    kind = request.node.callspec.params["subject"]
    if kind == "ledger":
        pytest.skip("the console serves a ledger (and decides approvals in it): a writer")
    before = _snapshot(subject.parent)
    code = main(["console", "--ledger", str(subject), "--user-header", "X-User", "--port", "0"])
    captured = capsys.readouterr()
    assert _snapshot(subject.parent) == before
    assert code == 1
    assert _expected(kind, ["ledger", "list"], subject)[1](captured.err), captured.err


def test_a_file_the_reader_cannot_read_is_one_line_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    _ledger(path)
    os.chmod(path, 0)
    command = [sys.executable, "-m", "pipecat_actions.cli", "ledger", "list", "--ledger", str(path)]
    if os.geteuid() == 0:  # root reads any file: run it without the capabilities that let it
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("run as root, and no setpriv to drop CAP_DAC_OVERRIDE")
        command = [setpriv, "--bounding-set=-dac_override,-dac_read_search", *command]
    before = _snapshot(tmp_path)
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPOSITORY)},  # this checkout's code
        check=False,
    )
    assert done.returncode == 1, done
    assert done.stderr == (
        f"pipecat-actions: cannot read the ledger file {path} (Permission denied): check the "
        "owner and mode of the file and its folder (ls -l), or run as a user who may read it\n"
    )
    assert _snapshot(tmp_path) == before


async def test_a_reader_opened_on_a_closed_ledger_sees_what_a_writer_starting_later_commits(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.db"
    await _runtime_ledger(path)
    names = sorted(p.name for p in tmp_path.iterdir())
    reader = await SqlLedger.create(str(path), read_only=True)
    try:
        assert [op.idempotency_key for op in await reader.list()] == ["k-1"]
        assert sorted(p.name for p in tmp_path.iterdir()) == names  # no -wal, no -shm
        async with await SqlLedger.create(str(path)) as writer:
            await writer.admit(new_op("k-2"))
            assert [op.idempotency_key for op in await reader.list()] == ["k-1", "k-2"]
        await writer.close()
        # The writer has gone; what it committed is still read, through its WAL.
        assert [op.idempotency_key for op in await reader.list()] == ["k-1", "k-2"]
    finally:
        await reader.close()
    async with await SqlLedger.create(str(path)) as writer:
        assert len(await writer.list()) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == names  # the last writer tidied up


async def test_read_commands_read_a_ledger_while_its_agent_writes_and_add_no_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "ledger.db"
    await _runtime_ledger(path)
    async with await SqlLedger.create(str(path)) as agent:
        await agent.admit(new_op("k-2"))
        names = sorted(p.name for p in tmp_path.iterdir())
        assert f"{path.name}-wal" in names  # the agent's, while it runs
        for key in ("k-3", "k-4"):
            await agent.admit(new_op(key))
            argv = ["ledger", "list", "--ledger", str(path), "--json"]
            assert await asyncio.to_thread(main, argv) == 0
            listed = json.loads(capsys.readouterr().out)
            assert [row["idempotency_key"] for row in listed][-1] == key
            assert sorted(p.name for p in tmp_path.iterdir()) == names


async def test_a_read_only_ledger_records_nothing(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    await _runtime_ledger(path)
    before = _snapshot(tmp_path)
    async with await SqlLedger.create(str(path), read_only=True) as reader:
        with pytest.raises(LedgerConfigurationError, match="read-only"):
            await reader.admit(new_op("k-2"))
    assert _snapshot(tmp_path) == before
