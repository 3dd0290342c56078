"""DBOS workers run what the bots hand off; the ledger stays what the conversation reads.

Workers are real ``pipecat-actions worker --dbos`` processes on the test's database; the bots
are runtimes of this process that only enqueue (DBOS clients). The fake provider is a table
that keeps every effect, so that a double effect would show.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from pipecat_actions.durable.handoff import workflow_state
from pipecat_actions.ledger import SqlLedger
from pipecat_actions.status import ActionStatus
from tests._waiting import eventually, guarded
from tests.durable._support import Workers, bot, rows, session
from tests.runtime.test_deliveries import Recorder

pytestmark = pytest.mark.postgres
S = ActionStatus


def _transfer(n: int) -> dict[str, object]:
    return {"account": f"acc-{n}", "amount_cents": 100 + n}


async def _effects(url: str) -> dict[str, int]:
    found = await rows(
        url, "SELECT idem_key, count(*) AS n FROM provider_effects GROUP BY idem_key"
    )
    return {r["idem_key"]: r["n"] for r in found}


async def test_a_live_call_hears_the_outcome_its_worker_wrote(
    durable_url: str, tmp_path: Path
) -> None:
    workers = Workers(durable_url, tmp_path)
    await workers.start("w1")
    try:
        async with bot(durable_url) as runtime:
            result = await guarded(
                runtime.propose("transfer", _transfer(1), session(), tool_call_id="c1"),
                what="the worker's outcome",
            )
            op = await runtime.ledger.get(result["operation_id"])

            # The step writes the outcome to the ledger, then DBOS records the workflow's end:
            # the ledger can say COMMITTED a moment before DBOS says SUCCESS.
            async def workflow_ended() -> bool:
                state = await workflow_state(runtime.ledger.client, op.operation_id)
                return state[0] not in ("PENDING", "ENQUEUED")

            await eventually(workflow_ended, what="DBOS to record the workflow's end")
            state = await workflow_state(runtime.ledger.client, op.operation_id)
    finally:
        await workers.stop()
    assert result["status"] == "committed"
    assert op.status is S.COMMITTED and op.result == {"done": op.operation_id}
    assert await _effects(durable_url) == {op.idempotency_key: 1}
    # DBOS's account agrees with the ledger's: the workflow succeeded with its final status.
    assert state == ("SUCCESS", "COMMITTED")
    assert f"{op.operation_id} transfer: COMMITTED" in workers.output("w1")


async def test_a_bot_that_ends_after_admission_leaves_it_to_a_worker_and_the_next_call_is_told_once(
    durable_url: str, tmp_path: Path
) -> None:
    async with bot(durable_url) as first:
        started = await first.propose("transfer", _transfer(2), session(), wait=False)
    assert started["status"] == "admitted"  # the bot process ends here
    workers = Workers(durable_url, tmp_path)
    await workers.start("w1")
    try:
        async with await SqlLedger.create(durable_url) as ledger:

            async def committed() -> bool:
                return (await ledger.get(started["operation_id"])).status is S.COMMITTED

            await eventually(committed, what="the worker to commit the transfer")
    finally:
        await workers.stop()
    # The user calls back: the session's next conversation is told, once.
    async with bot(durable_url) as second:
        outlet = Recorder()
        delivery = second.deliveries.open(session(), outlet)
        delivery.start()
        await outlet.settled()
        assert outlet.statuses() == ["committed"]
        assert started["operation_id"] in outlet.told[0].text
        delivery.session.bot_speaking = True
        delivery.session.bot_speaking = False
        delivery.bot_stopped()
        await outlet.settled()
        delivery.close()
        again = Recorder()
        later = second.deliveries.open(session(), again)
        later.start()
        await again.settled()
        later.close()
        outlet.stop()
        again.stop()
    assert again.told == []


async def test_a_queue_with_shared_limits_is_declared_to_dbos_as_the_policy_says(
    durable_url: str, tmp_path: Path
) -> None:
    workers = Workers(durable_url, tmp_path)
    await workers.start("w1")
    await workers.stop()
    (queue,) = await rows(
        durable_url,
        "SELECT concurrency, rate_limit_max, rate_limit_period_sec FROM dbos.queues "
        "WHERE name = 'pipecat_actions:settle_invoice'",
    )
    assert tuple(queue) == (2, 6000, 60.0)
