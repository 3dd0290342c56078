"""Scenarios whose policy runs tools durably: on PostgreSQL, with a DBOS worker in the process.

A tool with ``execution: durable`` is run by a DBOS worker, never by the call's process. A
scenario with such tools plays its story on a PostgreSQL ledger with the ledger's and DBOS's
tables, its bot a DBOS client (`DurableLedger`) and a worker (`pipecat_actions.dbos_worker`)
running in the same process, on the scenario's manual clock and its fake system of record. On
SQLite it is refused before anything runs: DBOS needs PostgreSQL.

With ``fresh_database`` the runner makes the scenario a database of its own on the server its
URL names (connecting to the URL's database to create and drop it), and drops it afterwards.
"""

from __future__ import annotations

__all__ = ["database_of_its_own", "prepare_database", "refuse_on_sqlite"]

import contextlib
import uuid
from collections.abc import AsyncIterator

from sqlalchemy.engine import make_url

from pipecat_actions.errors import PolicyProblem, ScenarioError
from pipecat_actions.scenarios.loader import LoadedScenario


def _is_postgres(url: str | None) -> bool:
    if url is None:
        return False
    try:
        return make_url(url).get_backend_name() == "postgresql"
    except Exception:  # not a URL at all: the ledger says so when it opens it
        return False


def refuse_on_sqlite(loaded: LoadedScenario, url: str | None, *, fresh_database: bool) -> None:
    """Refuse a durable scenario (or a database of its own) without a PostgreSQL URL.

    Raises:
        ScenarioError: One line naming the file, the durable tools and what to run instead.
    """
    if _is_postgres(url):
        return
    durable = sorted(loaded.policy.durable_names())
    if durable:
        raise ScenarioError(
            [
                PolicyProblem(
                    loaded.source,
                    "policy",
                    f"{', '.join(durable)} run durably (execution: durable) on a DBOS worker, "
                    "which needs PostgreSQL, not "
                    f"{'SQLite' if url is None else make_url(url).get_backend_name()}: run it "
                    "with --ledger postgresql://USER@HOST:PORT/DB --fresh-database",
                )
            ]
        )
    if fresh_database:
        raise ScenarioError(
            [
                PolicyProblem(
                    loaded.source,
                    "",
                    "a database of its own (--fresh-database) is made on a PostgreSQL server: "
                    "give --ledger postgresql://USER@HOST:PORT/DB",
                )
            ]
        )


@contextlib.asynccontextmanager
async def database_of_its_own(
    server_url: str, *, prefix: str = "pa_scenario"
) -> AsyncIterator[str]:
    """A new empty database on the server of ``server_url``; dropped when the block ends.

    The URL's own database is only where the ``CREATE DATABASE`` and ``DROP DATABASE`` run
    (``postgres``, say); its role needs the CREATEDB right.

    Yields:
        The new database's URL (same driver, host and role as ``server_url``).
    """
    import asyncpg

    from pipecat_actions.ledger._postgres import asyncpg_dsn

    server = make_url(server_url)
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    admin = await asyncpg.connect(asyncpg_dsn(server))
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    try:
        yield server.set(database=name).render_as_string(hide_password=False)
    finally:
        admin = await asyncpg.connect(asyncpg_dsn(server))
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


async def prepare_database(url: str) -> None:
    """Give the scenario's PostgreSQL database the ledger's and DBOS's tables (idempotent)."""
    from pipecat_actions.durable import install_dbos_schema
    from pipecat_actions.ledger import SqlLedger

    ledger = await SqlLedger.create(url)
    await ledger.close()
    await install_dbos_schema(url)
