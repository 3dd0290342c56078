"""A PostgreSQL database per test, ready for durable operations (see `_support`)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from tests.conftest import SKIP_PG, create_pg_database, drop_pg_database
from tests.durable._support import prepare_database

pytestmark = pytest.mark.postgres


@pytest.fixture
def durable_url() -> Iterator[str]:
    """A database of its own with the ledger, DBOS's tables and the provider's table."""
    if SKIP_PG:
        pytest.skip("PIPECAT_ACTIONS_SKIP_PG=1")
    url = create_pg_database("pa_durable")
    try:
        asyncio.run(prepare_database(url))
        yield url
    finally:
        drop_pg_database(url)
