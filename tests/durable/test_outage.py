"""The database stopped mid-run (as a crash would stop it) for 15 s, then started again.

A private PostgreSQL cluster holds the ledger, DBOS's tables and the provider's table; two
workers are running operations when it stops, and a bot has callers in live calls waiting for
outcomes, and new callers proposing while it is down. Nothing may be lost (every operation
ends settled, every workflow ends), nothing doubled (one effect at most per key, exactly one
for each committed operation), the ledger, DBOS and the provider agree, and every caller is
answered: refused (the ledger unavailable, nothing done) or started, or told the outcome.
The outage is held for `OUTAGE_SECS` of real time (the issue's figure); nothing is asserted of
any duration.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipecat_actions.durable.handoff import workflow_state
from pipecat_actions.ledger import SqlLedger
from pipecat_actions.status import ActionStatus
from tests._waiting import eventually, guarded
from tests.durable._support import Workers, bot, prepare_database, rows, session
from tests.runtime._private_postgres import PrivateCluster

pytestmark = pytest.mark.postgres
S = ActionStatus
OPERATIONS = 16
OUTAGE_SECS = 15.0
CALLERS_IN_OUTAGE = 6
"""Callers proposing while the database is down, one every ``OUTAGE_SECS / 6``."""
LIVE_CALLERS = 3
"""Callers whose live call waits for its outcome across the outage."""
ANSWERS = {"refused", "admitted", "committed", "failed"}


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
            live = [
                asyncio.ensure_future(guarded(runtime.propose(
                    "transfer", {"account": f"live{n}", "amount_cents": n}, session(f"live-{n}")
                ), what=f"live caller {n}'s answer"))
                for n in range(LIVE_CALLERS)
            ]  # fmt: skip
            # The database stops, every connection cut, with operations in flight, and stays
            # down while callers call; then it is back.
            await asyncio.to_thread(cluster.stop, "immediate")
            during = []
            for n in range(CALLERS_IN_OUTAGE):
                during.append(asyncio.ensure_future(guarded(runtime.propose(
                    "transfer", {"account": f"down{n}", "amount_cents": n},
                    session(f"down-{n}"), wait=False,
                ), what=f"the answer to caller {n} in the outage")))  # fmt: skip
                await asyncio.sleep(OUTAGE_SECS / CALLERS_IN_OUTAGE)  # the outage, held
            down_answers = [t.result() for t in during if t.done()]
            await asyncio.to_thread(cluster.start)
            answers = [await t for t in [*live, *during]]
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
            ids += [a["operation_id"] for a in answers if a["status"] != "refused"]
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
    # Every caller was answered, none left hanging: a caller in the outage was refused with
    # the ledger unavailable (nothing done, safe to ask again), or started once it was back.
    assert len(answers) == LIVE_CALLERS + CALLERS_IN_OUTAGE
    assert {a["status"] for a in answers} <= ANSWERS, answers
    for answer in answers:
        if answer["status"] == "refused":
            assert answer["reason"] == "ledger_unavailable", answer
    # Some callers were answered while the database was still down (refused, not held).
    assert any(a["status"] == "refused" for a in down_answers), down_answers
