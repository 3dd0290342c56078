"""Schema versions of the ledger: upgrade a database, and refuse one this code does not match.

`SchemaAdmin` is what a ledger does with its schema when it opens, and what ``db upgrade``
asks of it: read where the schema stands, create it in an empty database, upgrade it, and
refuse what is not a ledger (a database of other tables) or is at another revision.

The migrations are Alembic scripts shipped in the package (``migrations/versions``). Their
version is kept in the table ``pa_schema_version``, apart from any Alembic table of the
application sharing the database.

Opening a ledger reads its revision and compares it with this code's without Alembic: the
revisions are read from the scripts' ``revision`` and ``down_revision`` lines (parsed, not
run), and the version table with one query. Alembic (with Mako) is imported to upgrade only;
`tests/test_schema_migrations.py` checks that both read the scripts alike.
"""

from __future__ import annotations

__all__ = [
    "VERSION_TABLE",
    "SchemaAdmin",
    "SchemaState",
    "head_revision",
    "known_revisions",
    "read_schema_state",
    "to_revision",
    "upgrade_connection",
]

import ast
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, column, inspect, select, table

from pipecat_actions.errors import LedgerConfigurationError, LedgerError, SchemaVersionMismatch
from pipecat_actions.ledger._opening import other_tables

if TYPE_CHECKING:
    from alembic.config import Config

VERSION_TABLE = "pa_schema_version"
_MIGRATIONS = Path(__file__).with_name("migrations")


def _config() -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    return config


@cache
def known_revisions() -> dict[str, str | None]:
    """Every revision the package ships, with the one it revises (None for the first)."""
    revisions: dict[str, str | None] = {}
    for script in sorted((_MIGRATIONS / "versions").glob("*.py")):
        found: dict[str, object] = {}
        for node in ast.parse(script.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                if isinstance(target, ast.Name) and target.id in ("revision", "down_revision"):
                    found[target.id] = ast.literal_eval(node.value)
        revision = found.get("revision")
        if isinstance(revision, str):
            down = found.get("down_revision")
            revisions[revision] = down if isinstance(down, str) else None
    return revisions


def head_revision() -> str:
    """Return the schema revision this code is written for: the one nothing revises."""
    revisions = known_revisions()
    heads = set(revisions) - set(revisions.values())
    if len(heads) != 1:  # pragma: no cover - the package ships one line of migrations
        raise RuntimeError(f"ledger migrations in {_MIGRATIONS} have heads {sorted(heads)}")
    return heads.pop()


@dataclass(frozen=True, slots=True)
class SchemaState:
    """Where a database stands against this code's schema.

    Attributes:
        current: The revision recorded in the database, or None.
        head: The revision this code needs.
        empty: True when the database holds no ledger tables at all.
        known: True when ``current`` is a revision this code ships (an older or the head one).
        other_tables: When ``empty``, the tables the database holds (none of them the
            ledger's): a database that has some is someone else's, not a ledger yet to create.
    """

    current: str | None
    head: str
    empty: bool
    known: bool
    other_tables: tuple[str, ...] = ()

    @property
    def up_to_date(self) -> bool:
        """True when the database is exactly at the head revision."""
        return self.current == self.head


def read_schema_state(connection: Connection) -> SchemaState:
    """Read the schema revision of the database behind ``connection`` (a sync connection)."""
    current = _current_revision(connection)
    empty = current is None and not inspect(connection).has_table("pa_operations")
    known = current is None or current in known_revisions()
    others = tuple(sorted(inspect(connection).get_table_names())) if empty else ()
    return SchemaState(
        current=current, head=head_revision(), empty=empty, known=known, other_tables=others
    )


def _current_revision(connection: Connection) -> str | None:
    """The revision the version table holds (as Alembic reads it), or None."""
    if not inspect(connection).has_table(VERSION_TABLE):
        return None
    versions = table(VERSION_TABLE, column("version_num"))
    found = [row[0] for row in connection.execute(select(versions.c.version_num))]
    if len(found) > 1:
        raise LedgerConfigurationError(
            f"the ledger's version table {VERSION_TABLE} holds several revisions ({found}): "
            "it was not written by pipecat_actions"
        )
    return str(found[0]) if found else None


def upgrade_connection(connection: Connection) -> None:
    """Upgrade the database behind ``connection`` to the head revision.

    The caller holds the transaction and the lock that keeps two processes from migrating
    at once (``BEGIN IMMEDIATE`` on SQLite, an advisory lock on PostgreSQL).
    """
    _alembic(connection, "head")


def _alembic(connection: Connection, revision: str, *, down: bool = False) -> None:
    """Run Alembic's upgrade (or downgrade) to ``revision`` on ``connection``."""
    from alembic import command

    config = _config()
    config.attributes["connection"] = connection
    (command.downgrade if down else command.upgrade)(config, revision)


async def to_revision(url: str, revision: str, *, down: bool = False) -> None:
    """Upgrade (or, with ``down``, downgrade) the ledger at ``url`` to ``revision``.

    For the tests and benchmarks of a migration, which need a ledger at an earlier revision
    (a ledger opens only at the head): nothing else holds the database meanwhile.
    """
    from sqlalchemy.ext.asyncio import create_async_engine

    from pipecat_actions.ledger.engine import normalize_url

    engine = create_async_engine(normalize_url(url))
    try:
        async with engine.begin() as connection:
            await connection.run_sync(_alembic, revision, down=down)
    finally:
        await engine.dispose()


_MIGRATION_LOCK = "SELECT pg_advisory_xact_lock(7243510931)"
"""Serialises the migrations of several processes that start at once, on PostgreSQL (a
SQLite writer's ``BEGIN IMMEDIATE`` does it there)."""


@dataclass(frozen=True, slots=True)
class SchemaAdmin:
    """The schema work of one ledger: each method returns a function of a sync connection.

    The ledger runs ``reading`` on its read path, the others in a write transaction of its own.

    Attributes:
        url: The ledger's URL, password hidden (as its refusals show it).
        sqlite: Whether the database is a SQLite file.
    """

    url: str
    sqlite: bool

    def reading(self, *, check_schema: bool) -> Callable[[Connection], SchemaState]:
        """Read the schema's state, refusing what a reader cannot use.

        A database with tables but none of the ledger's is not a ledger; with
        ``check_schema``, a database at another revision is refused.
        """

        def work(conn: Connection) -> SchemaState:
            state = read_schema_state(conn)
            if state.empty and state.other_tables:
                raise self.not_a_ledger(state)
            if check_schema and not state.up_to_date:
                raise self.mismatch(state)
            return state

        return work

    def checking(self, *, create_schema: bool) -> Callable[[Connection], SchemaState]:
        """Refuse a database at another revision; with ``create_schema``, create an empty one's."""

        def work(conn: Connection) -> SchemaState:
            self._lock(conn)
            state = read_schema_state(conn)
            if state.up_to_date:
                return state
            if state.empty and create_schema:
                # A database the application shares (PostgreSQL, often) gets the ledger's
                # tables beside its own: the application asked for this ledger there.
                upgrade_connection(conn)
                return read_schema_state(conn)
            if state.empty and state.other_tables:
                raise self.not_a_ledger(state)
            raise self.mismatch(state)

        return work

    def upgrading(self) -> Callable[[Connection], tuple[str | None, str]]:
        """Bring the schema to this code's revision: (revision before, revision after)."""

        def work(conn: Connection) -> tuple[str | None, str]:
            self._lock(conn)
            before = read_schema_state(conn)
            if not before.known:
                raise self.mismatch(before)
            if not before.up_to_date:
                upgrade_connection(conn)
            return before.current, read_schema_state(conn).head

        return work

    def _lock(self, conn: Connection) -> None:
        if not self.sqlite:
            conn.exec_driver_sql(_MIGRATION_LOCK)

    def not_a_ledger(self, state: SchemaState) -> LedgerError:
        """The refusal of a database with tables, none of them the ledger's: someone else's.

        Said without a hint to create the ledger there (`db upgrade` would, beside them).
        """
        if self.sqlite:
            where = self.url.partition(":///")[2]  # the file's path
        else:
            scheme, _, rest = self.url.partition("://")
            where = f"{scheme.partition('+')[0]}://{rest}"
        return other_tables(where, state.other_tables, sqlite=self.sqlite)

    def mismatch(self, state: SchemaState) -> SchemaVersionMismatch:
        """The refusal of a database at another revision, saying what to do about it."""
        # The command as a person types it: without the async driver, and saying where the
        # hidden password goes rather than printing *** as if it were one.
        scheme, _, rest = self.url.partition("://")
        command = f"run `pipecat-actions db upgrade --ledger {scheme.partition('+')[0]}://{rest}`"
        if ":***@" in rest:
            command += " (its password in place of ***)"
        if state.empty:
            hint = f"{command} to create it"
        elif not state.known:
            hint = "it was written by a newer pipecat_actions: upgrade the package"
        else:
            hint = command
        return SchemaVersionMismatch(
            url=self.url, found=state.current, expected=state.head, hint=hint
        )
