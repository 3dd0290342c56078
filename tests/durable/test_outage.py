"""The database stopped mid-run (as a crash would stop it) and started again.

A private PostgreSQL cluster holds the ledger, DBOS's tables and the provider's table; two
workers are running operations when it stops. Nothing may be lost (every operation ends
settled, every workflow ends) and nothing doubled (one effect at most per key, exactly one for
each committed operation), and the ledger, DBOS and the provider agree.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipecat_actions.durable.handoff import workflow_state
from pipecat_actions.ledger import SqlLedger
from pipecat_actions.status import ActionStatus
from tests._waiting import eventually
from tests.durable._support import Workers, bot, prepare_database, rows, session
from tests.runtime._private_postgres import PrivateCluster

pytestmark = pytest.mark.postgres
S = ActionStatus
OPERATIONS = 16


@pytest.fixture
def cluster() -> Iterator[PrivateCluster]:
    private = PrivateCluster()
    private.create()
    private.start()
    try:
        yield private
    finally:
        private.remove()


async def test_a_database_stopped_mid_run_loses_nothing_and_doubles_nothing(
    cluster: PrivateCluster, tmp_path: Path
) -> None:
    url = cluster.url
    await prepare_database(url)
    workers = Workers(url, tmp_path, answer_delay=0.2)
    await workers.start("w1")
    await workers.start("w2")
    try:
        async with bot(url) as runtime:
            ids = [
                (await runtime.propose("transfer", {"account": f"a{n}", "amount_cents": n},
                                       session(f"call-{n}"), wait=False))["operation_id"]
                for n in range(OPERATIONS)
            ]  # fmt: skip

            async def under_way() -> bool:
                return bool(await rows(url, "SELECT 1 FROM provider_effects"))

            await eventually(under_way, what="the workers to be under way")
        # The database stops, every connection cut, with operations in flight; then it is back.
        await asyncio.to_thread(cluster.stop, "immediate")
        await asyncio.to_thread(cluster.start)
        async with await SqlLedger.create(url) as ledger:
            last: list[object] = []

            async def all_ended() -> bool:
                last[:] = await rows(
                    url,
                    "SELECT workflow_uuid, status FROM dbos.workflow_status "
                    "WHERE status NOT IN ('SUCCESS', 'ERROR', 'CANCELLED', "
                    "'MAX_RECOVERY_ATTEMPTS_EXCEEDED')",
                )
                return not last

            await eventually(all_ended, what=lambda: f"every workflow to end: {last}")
            ops = [await ledger.get(op_id) for op_id in ids]
    finally:
        await workers.stop()
    async with bot(url) as reader:
        states = [await workflow_state(reader.ledger.client, op_id) for op_id in ids]
    effects = {r["idem_key"]: r["n"] for r in await rows(
        url, "SELECT idem_key, count(*) AS n FROM provider_effects GROUP BY idem_key"
    )}  # fmt: skip
    assert all(n == 1 for n in effects.values()), effects
    assert {o.idempotency_key for o in ops if o.status is S.COMMITTED} == set(effects)
    assert [s for o, s in zip(ops, states, strict=True) if s != ("SUCCESS", o.status.value)] == []
    for op in ops:
        assert op.status in (S.COMMITTED, S.FAILED_FINAL), (op.operation_id, op.status, op.error)
