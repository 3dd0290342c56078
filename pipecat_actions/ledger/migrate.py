"""Schema versions of the ledger: upgrade a database, and refuse one this code does not match.

The migrations are Alembic scripts shipped in the package (``migrations/versions``). Their
version is kept in the table ``pa_schema_version``, apart from any Alembic table of the
application sharing the database.
"""

from __future__ import annotations

__all__ = ["SchemaState", "head_revision", "read_schema_state", "upgrade_connection"]

from dataclasses import dataclass
from functools import cache
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, inspect

VERSION_TABLE = "pa_schema_version"
_MIGRATIONS = Path(__file__).with_name("migrations")


def _config() -> Config:
    config = Config()
    config.set_main_option("script_location", str(_MIGRATIONS))
    return config


@cache
def _script() -> ScriptDirectory:
    return ScriptDirectory.from_config(_config())


def head_revision() -> str:
    """Return the schema revision this code is written for."""
    head = _script().get_current_head()
    if head is None:  # pragma: no cover - the package always ships migrations
        raise RuntimeError(f"no ledger migrations found in {_MIGRATIONS}")
    return head


@dataclass(frozen=True, slots=True)
class SchemaState:
    """Where a database stands against this code's schema.

    Attributes:
        current: The revision recorded in the database, or None.
        head: The revision this code needs.
        empty: True when the database holds no ledger tables at all.
        known: True when ``current`` is a revision this code ships (an older or the head one).
    """

    current: str | None
    head: str
    empty: bool
    known: bool

    @property
    def up_to_date(self) -> bool:
        """True when the database is exactly at the head revision."""
        return self.current == self.head


def read_schema_state(connection: Connection) -> SchemaState:
    """Read the schema revision of the database behind ``connection`` (a sync connection)."""
    context = MigrationContext.configure(connection, opts={"version_table": VERSION_TABLE})
    current = context.get_current_revision()
    empty = current is None and not inspect(connection).has_table("pa_operations")
    known = current is None or _is_known(current)
    return SchemaState(current=current, head=head_revision(), empty=empty, known=known)


def _is_known(revision: str) -> bool:
    try:
        return _script().get_revision(revision) is not None
    except Exception:  # alembic raises several types for an unknown id
        return False


def upgrade_connection(connection: Connection) -> None:
    """Upgrade the database behind ``connection`` to the head revision.

    The caller holds the transaction and the lock that keeps two processes from migrating
    at once (``BEGIN IMMEDIATE`` on SQLite, an advisory lock on PostgreSQL).
    """
    config = _config()
    config.attributes["connection"] = connection
    command.upgrade(config, "head")
