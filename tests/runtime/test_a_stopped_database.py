"""A real PostgreSQL server stopped while bookings run, and started again (issue 12, B1).

Observed before: with PostgreSQL stopped while 4 bookings were RUNNING (their provider commit
fell inside the outage), all 4 callers were still unanswered 45 s after the database came back,
and the ledger said RUNNING until the process restarted. Here a private cluster (never the
shared server) is stopped the way a crash stops it, the provider commits meanwhile, and the
server is started again; the runtime is never restarted.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pipecat_actions.admission.authorization import AllowAll
from pipecat_actions.ledger import SqlLedger
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.testing import FakeSystemOfRecord
from tests._waiting import eventually, guarded
from tests.conftest import SKIP_PG
from tests.runtime._execution_support import Bookings, booking, new_session, policy
from tests.runtime._execution_support import S as Status
from tests.runtime._private_postgres import PrivateCluster

pytestmark = pytest.mark.postgres

POLICY = """
    version: 1
    tools:
      book_table:
        kind: mutation
        deadline_secs: 600
"""
BOOKINGS = 4


@pytest.fixture
def cluster() -> Iterator[PrivateCluster]:
    if SKIP_PG:
        pytest.skip("PIPECAT_ACTIONS_SKIP_PG=1")
    made = PrivateCluster()
    try:
        made.create()
        made.start()
        yield made
    finally:
        made.remove()


async def test_bookings_committed_while_postgres_is_down_are_told_and_recorded_once_it_is_up(
    cluster: PrivateCluster,
) -> None:
    sor = FakeSystemOfRecord()
    sor.add_restaurant("r1", tables=BOOKINGS)
    sor.faults.hang("book", times=BOOKINGS)
    runtime = await ActionRuntime.create(
        policy(POLICY),
        authorizer=AllowAll(),
        actions=[Bookings(sor).action()],
        ledger_url=cluster.url,
    )
    try:
        session = new_session()
        ids = []
        for i in range(BOOKINGS):
            told = await runtime.propose(
                "book_table", booking(time=f"{18 + i}:00"), session, wait=False
            )
            ids.append(str(told["operation_id"]))
        await eventually(lambda: sor.calls["book"] == BOOKINGS, what="the bookings to be sent")

        cluster.stop("immediate")  # every connection cut, as a crash does
        sor.release_hung()  # the provider commits all four during the outage

        # Every caller is answered during the outage, truthfully: the bookings were made.
        answers = [await guarded(runtime.wait(op_id), what="an answer") for op_id in ids]
        assert [a.status for a in answers] == [Status.COMMITTED] * BOOKINGS

        cluster.start()
        async with await SqlLedger.create(cluster.url) as reader:

            async def all_recorded() -> bool:
                ops = [await reader.get(op_id) for op_id in ids]
                return all(op.status is Status.COMMITTED for op in ops)

            await eventually(all_recorded, what="the four outcomes to be written")
            for op_id, answer in zip(ids, answers, strict=True):
                recorded = await reader.get(op_id)
                assert recorded.result == answer.result
                assert sor.effects_for_key(recorded.idempotency_key) == 1
    finally:
        await runtime.close(grace_secs=0)
