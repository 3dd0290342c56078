"""DBOS workers run what the bots hand off; the ledger stays what the conversation reads.

Workers are real ``pipecat-actions worker --dbos`` processes on the test's database; the bots
are runtimes of this process that only enqueue (DBOS clients). The fake provider is a table
that keeps every effect, so that a double effect would show.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from pipecat_actions.durable.handoff import DurableLedger, workflow_state
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


OPERATIONS = 40
WORKERS = ("w1", "w2", "w3")
KILLS = 5

_MID_STEP = """
SELECT w.executor_id, o.operation_id
FROM pa_operations o
JOIN dbos.workflow_status w ON w.workflow_uuid = 'pa-op:' || o.operation_id
WHERE o.status = 'RUNNING' AND w.status = 'PENDING'
  AND EXISTS (SELECT 1 FROM provider_effects p WHERE p.operation_id = o.operation_id)
ORDER BY o.operation_id
"""
"""Operations sent (the effect is at the provider), their answer not written, their workflow
running on a worker: a worker killed now dies mid-step."""


async def test_workers_killed_mid_step_never_double_an_effect_and_ledger_dbos_and_provider_agree(
    durable_url: str, tmp_path: Path
) -> None:
    # Each effect is done at the provider, then its answer takes a moment to come back: a
    # worker killed then leaves the operation RUNNING with the effect done and unrecorded.
    # Started again under its executor id, it recovers its workflows; their step finds the
    # operation maybe sent and asks the provider (reconcile), never sends again.
    rng = random.Random(33)
    workers = Workers(durable_url, tmp_path, answer_delay=0.2)
    for executor_id in WORKERS:
        await workers.start(executor_id)
    ids: list[str] = []
    killed: list[str] = []
    try:
        async with bot(durable_url) as runtime:
            for batch in range(KILLS):
                # A batch of calls, then a worker killed in the middle of one of its steps.
                for n in range(batch * 8, batch * 8 + 8):
                    call = session(f"call-{n}")
                    started = await runtime.propose("transfer", _transfer(n), call, wait=False)
                    ids.append(started["operation_id"])
                found = await _mid_step(durable_url, besides=killed)
                executor_id, operation_id = rng.choice(found)
                workers.kill(executor_id)
                killed.append(operation_id)
                await workers.start(executor_id)
            assert len(ids) == OPERATIONS
            ledger = runtime.ledger
            last: list[object] = []

            async def done() -> bool:
                last[:] = await rows(
                    durable_url,
                    "SELECT w.workflow_uuid, w.status, w.executor_id, w.queue_name, "
                    "w.recovery_attempts, o.status AS op FROM dbos.workflow_status w "
                    "JOIN pa_operations o ON w.workflow_uuid = 'pa-op:' || o.operation_id "
                    "WHERE w.status <> 'SUCCESS'",
                )
                return not last

            await eventually(done, what=lambda: f"every workflow to finish: {last}")
            ops = [await ledger.get(op_id) for op_id in ids]
            states = [await workflow_state(ledger.client, op_id) for op_id in ids]
            trails = {op_id: [e.to_status for e in await ledger.events(op_id)] for op_id in killed}
    finally:
        await workers.stop()
    # Every operation settled, and the provider, the ledger and DBOS tell the same story: an
    # operation committed has exactly one effect; one whose worker died before its request
    # left has none and says so (reconciled: it did not happen); never two effects.
    effects = await _effects(durable_url)
    assert max(effects.values()) == 1
    assert {o.idempotency_key for o in ops if o.status is S.COMMITTED} == set(effects)
    for op in ops:
        if op.status is not S.COMMITTED:
            assert op.status is S.FAILED_FINAL and "did not happen" in (op.error or ""), op
    assert states == [("SUCCESS", op.status.value) for op in ops]
    # Each operation whose worker died mid-step was settled by asking the provider.
    for op_id, trail in trails.items():
        assert S.UNKNOWN in trail and trail[-1] is S.COMMITTED, (op_id, trail)
    assert len(set(killed)) == KILLS


async def _mid_step(url: str, *, besides: list[str]) -> list[tuple[str, str]]:
    """Wait for operations in the middle of a step (`_MID_STEP`), none of ``besides``."""
    found: list[tuple[str, str]] = []

    async def look() -> bool:
        found[:] = [
            (r["executor_id"], r["operation_id"])
            for r in await rows(url, _MID_STEP)
            if r["operation_id"] not in besides
        ]
        return bool(found)

    await eventually(look, what="a worker in the middle of a step")
    return found


async def _all_workflows_done(ledger: DurableLedger, ids: list[str]) -> bool:
    for op_id in ids:
        state = await workflow_state(ledger.client, op_id)
        if state is None or state[0] not in {"SUCCESS", "ERROR", "CANCELLED"}:
            return False
    return True
