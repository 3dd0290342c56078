"""DBOS's system tables in the ledger's database (schema ``dbos``), created without an executor."""

from __future__ import annotations

__all__ = ["install_dbos_schema"]

import asyncio

from pipecat_actions.durable.handoff import psycopg_url


def _install(url: str) -> None:
    from dbos._serialization import DefaultSerializer
    from dbos._sys_db import SystemDatabase

    sys_db = SystemDatabase.create(
        system_database_url=psycopg_url(url),
        engine_kwargs={"pool_size": 2, "max_overflow": 2},
        engine=None,
        schema="dbos",
        serializer=DefaultSerializer(),
        executor_id=None,
        use_listen_notify=False,
    )
    try:
        sys_db.run_migrations()
    finally:
        sys_db.destroy()


async def install_dbos_schema(url: str) -> None:
    """Create or upgrade DBOS's tables in the PostgreSQL database at ``url`` (idempotent).

    What a DBOS worker does when it launches, for a deployment whose bots start first (and
    for ``pipecat-actions db upgrade --dbos``).
    """
    await asyncio.to_thread(_install, url)
