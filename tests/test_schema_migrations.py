"""Schema versions: Alembic creates exactly the tables the code uses; mismatches are refused."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, create_engine
from sqlalchemy.ext.asyncio import create_async_engine

from pipecat_actions.cli import main
from pipecat_actions.errors import SchemaVersionMismatch
from pipecat_actions.ledger import SqlLedger, migrate
from pipecat_actions.ledger.engine import normalize_url
from pipecat_actions.ledger.migrate import VERSION_TABLE, head_revision
from pipecat_actions.ledger.schema import metadata

from .conftest import BACKENDS


def _diff(connection: Connection) -> list[object]:
    dialect = connection.dialect.name

    def on_this_dialect(obj: Any, *_: Any) -> bool:
        only = getattr(obj, "_ddl_if", None)  # created on one dialect only (`Index.ddl_if`)
        return only is None or only.dialect in (None, dialect)

    context = MigrationContext.configure(
        connection, opts={"version_table": VERSION_TABLE, "include_object": on_this_dialect}
    )
    return [d for d in compare_metadata(context, metadata) if d[0] != "remove_table"]


@pytest.fixture(params=BACKENDS)
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'empty.db'}"
    url: str = request.getfixturevalue("pg_fresh_url")
    return url


async def test_migrated_schema_matches_the_tables_the_code_uses(empty_url: str) -> None:
    ledger = await SqlLedger.create(empty_url)
    await ledger.close()
    engine = create_async_engine(normalize_url(empty_url))
    try:
        async with engine.connect() as conn:
            assert await conn.run_sync(_diff) == []
    finally:
        await engine.dispose()


async def test_empty_database_without_create_schema_is_refused_with_the_command_to_run(
    empty_url: str,
) -> None:
    with pytest.raises(SchemaVersionMismatch) as info:
        await SqlLedger.create(empty_url, create_schema=False)
    assert "pipecat-actions db upgrade" in str(info.value)
    assert info.value.found is None and info.value.expected == head_revision()


async def test_database_written_by_a_newer_version_is_refused(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'newer.db'}"
    await (await SqlLedger.create(url)).close()
    with sqlite3.connect(tmp_path / "newer.db") as raw:
        raw.execute(f"UPDATE {VERSION_TABLE} SET version_num = '9999_from_the_future'")
    with pytest.raises(SchemaVersionMismatch, match="newer pipecat_actions"):
        await SqlLedger.create(url)


def test_db_upgrade_creates_then_reports_up_to_date(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'cli.db'}"
    assert main(["db", "status", "--ledger", url]) == 1
    assert "no ledger at" in capsys.readouterr().err  # and none made: status only looks
    assert not (tmp_path / "cli.db").exists()
    (tmp_path / "cli.db").touch()
    assert main(["db", "status", "--ledger", url]) == 1
    assert "empty" in capsys.readouterr().out
    assert main(["db", "upgrade", "--ledger", url]) == 0
    assert f"from empty to {head_revision()}" in capsys.readouterr().out
    assert main(["db", "upgrade", "--ledger", url]) == 0
    assert "already at revision" in capsys.readouterr().out
    assert main(["db", "status", "--ledger", url]) == 0
    assert "up to date" in capsys.readouterr().out


@pytest.mark.postgres
def test_db_upgrade_on_postgres(pg_fresh_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["db", "upgrade", "--ledger", pg_fresh_url]) == 0
    assert main(["db", "status", "--ledger", pg_fresh_url]) == 0
    assert "up to date" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://root@localhost/x", "unsupported ledger database 'mysql'"),
        ("sqlite://", "in-memory SQLite"),
        ("not a url: at all", "not a database URL"),
        ("postgresql://postgres@127.0.0.1:1/nothing", "PostgreSQL at 127.0.0.1:1 refused"),
    ],
)
def test_db_commands_fail_in_one_line_without_traceback(
    url: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["db", "upgrade", "--ledger", url]) == 1
    err = capsys.readouterr().err
    assert message in err
    assert "Traceback" not in err
    assert err.count("\n") == 1


async def test_several_ledgers_opening_an_empty_database_at_once_migrate_it_once(
    empty_url: str,
) -> None:
    ledgers = await asyncio.gather(*(SqlLedger.create(empty_url) for _ in range(4)))
    for ledger in ledgers:
        assert (await ledger.schema_state()).up_to_date
        await ledger.close()


def test_upgrading_a_0001_ledger_keeps_what_each_conversation_was_told(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # A ledger written before delivered_status existed: an operation told (delivered_at set)
    # and one never told. After the upgrade, the told one counts as told with its status, so a
    # new pipeline does not tell it again; the other is still owed.
    path = tmp_path / "old.db"
    engine = create_engine(f"sqlite:///{path}")
    with engine.begin() as conn:
        config = migrate._config()
        config.attributes["connection"] = conn
        command.upgrade(config, "0001")
    engine.dispose()
    with sqlite3.connect(path) as raw:
        for operation_id, delivered_at in (("op_told", 5.0), ("op_untold", None)):
            raw.execute(
                "INSERT INTO pa_operations (operation_id, tenant, session_id, principal, tool,"
                " kind, args_json, args_hash, idempotency_key, key_expires_at, status, attempt,"
                " fence, event_seq, created_at, updated_at, delivered_at)"
                " VALUES (?, 'default', 'call-1', 'alice', 'book_table', 'mutation', '{}', 'h',"
                " ?, 9e9, 'COMMITTED', 1, 1, 0, 1.0, 1.0, ?)",
                (operation_id, f"key-{operation_id}", delivered_at),
            )

    assert main(["db", "upgrade", "--ledger", f"sqlite:///{path}"]) == 0
    assert "from 0001 to" in capsys.readouterr().out
    with sqlite3.connect(path) as raw:
        told = dict(raw.execute("SELECT operation_id, delivered_status FROM pa_operations"))
    assert told == {"op_told": "COMMITTED", "op_untold": None}


def test_the_revisions_read_without_alembic_are_the_ones_alembic_reads() -> None:
    # Opening a ledger reads the shipped revisions from the scripts' text, not through Alembic.
    script = ScriptDirectory.from_config(migrate._config())
    assert migrate.head_revision() == script.get_current_head()
    assert migrate.known_revisions() == {
        revision.revision: revision.down_revision for revision in script.walk_revisions()
    }


@pytest.mark.parametrize("revision", [None, "0001", "0003", "head"])
def test_the_revision_a_database_holds_is_read_as_alembic_reads_it(
    revision: str | None, tmp_path: Path
) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        with engine.begin() as conn:
            if revision is not None:
                config = migrate._config()
                config.attributes["connection"] = conn
                command.upgrade(config, revision)
        with engine.connect() as conn:
            alembic = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
            state = migrate.read_schema_state(conn)
            assert state.current == alembic.get_current_revision()
            assert state.known and state.empty is (revision is None)
    finally:
        engine.dispose()
