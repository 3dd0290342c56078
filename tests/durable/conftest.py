"""A PostgreSQL database per test, ready for durable operations (see `_support`)."""

from __future__ import annotations

import asyncio

import pytest

from tests.durable._support import prepare_database

pytestmark = pytest.mark.postgres


@pytest.fixture
def durable_url(pg_fresh_url: str) -> str:
    """A database of its own with the ledger, DBOS's tables and the provider's table."""
    asyncio.run(prepare_database(pg_fresh_url))
    return pg_fresh_url
