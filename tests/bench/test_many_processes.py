"""`bench/many_processes.py` and `bench/postgres.py` at tiny sizes, so that they do not rot.

No figure is compared with a target here: only that what they count is what they say.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from urllib.parse import urlparse

import asyncpg
import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.append(str(BENCH))  # the scripts import each other by bare name, as when run

import many_processes  # noqa: E402
from _measure import PG_ADMIN_URL, ServerCpu  # noqa: E402

pytestmark = pytest.mark.postgres
PORT = urlparse(PG_ADMIN_URL).port or 5432


async def test_connections_counted_are_this_process_s_own_to_the_server(
    pg_fresh_url: str,
) -> None:
    before = many_processes._pg_connections(PORT)
    conn = await asyncpg.connect(pg_fresh_url)
    try:
        assert many_processes._pg_connections(PORT) == before + 1
    finally:
        await conn.close()
    assert many_processes._pg_connections(PORT) == before


async def test_server_cpu_is_read_for_the_backends_of_the_database_only(
    pg_fresh_url: str,
) -> None:
    name = pg_fresh_url.rpartition("/")[2]
    admin = await asyncpg.connect(PG_ADMIN_URL)
    conn = await asyncpg.connect(pg_fresh_url)
    try:
        backend = await conn.fetchval("SELECT pg_backend_pid()")
        ticks = await ServerCpu(admin, name).ticks()
        assert backend in ticks
        assert admin.get_server_pid() not in ticks  # connected to another database
    finally:
        await conn.close()
        await admin.close()


async def test_two_sessions_in_one_worker_settle_every_operation_with_no_error() -> None:
    args = argparse.Namespace(sessions=2, calls=2, rounds=1)

    found = await many_processes.run_processes(1, args)

    assert found["errors"] == {"bare": 0, "template": 0}
    assert found["unsettled"] == 0
    assert found["operations"] == found["expected"] == 4
    assert found["chosen"]["template"]["connections"] >= 1
