"""An approval decided after the call, in a bot or an operator's process, reaches the workflow.

A durable tool with ``confirmation: {mode: approval}`` is handed to its workflow while it waits
for a person: the workflow waits with DBOS's durable ``recv``. The decision is recorded once in
the ledger (a conditional transition); a bot's runtime also sends the workflow a message, and
an operator's process that has no DBOS client (the console, the CLI) is read at the workflow's
next look.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from pipecat_actions.approvals import ApprovalRefused, Approver, approve_operation, reject_operation
from pipecat_actions.clock import ManualClock
from pipecat_actions.durable.handoff import workflow_state
from pipecat_actions.ledger import SqlLedger
from pipecat_actions.status import ActionStatus
from tests._waiting import eventually, guarded
from tests.durable._support import Workers, bot, rows, session

pytestmark = pytest.mark.postgres
S = ActionStatus
MARIA = Approver("maria", tenants={"default"})
REFUND = {"order": "ord-1", "amount_cents": 2500}
LATER_SECS = 600.0
"""How long after the call ended an approver decides (on the injected clock)."""


async def _status_is(ledger: SqlLedger, operation_id: str, status: ActionStatus) -> bool:
    return (await ledger.get(operation_id)).status is status


async def test_an_approval_decided_after_the_call_ended_reaches_its_workflow_and_runs_once(
    durable_url: str, tmp_path: Path
) -> None:
    # The bot's and the operator's time is the test's clock, anchored at the real time (the
    # worker's): 10 minutes pass on it between the call's end and the decision, within the
    # hour the refund's approval window allows. The workflow's own wait (DBOS's recv, and
    # the worker's look at the window) runs on real time.
    clock = ManualClock(time.time())
    async with bot(durable_url, clock=clock) as call:
        asked = await call.propose("refund", REFUND, session(), wait=False)
    assert asked["status"] == "awaiting_approval"  # the call ends here
    call_ended_at = clock.now()
    op_id = asked["operation_id"]
    workers = Workers(durable_url, tmp_path)
    await workers.start("w1")
    try:
        async with await SqlLedger.create(durable_url, clock=clock) as ledger:
            await eventually(
                lambda: _workflow_is(ledger, durable_url, op_id, "PENDING"),
                what="the workflow to wait for the decision",
            )
            clock.advance(LATER_SECS)
            # An operator's process decides (as the console and the CLI do): the ledger only.
            waiting = await ledger.get(op_id)
            assert waiting.status is S.AWAITING_APPROVAL and waiting.deadline_at is not None
            assert clock.now() < waiting.deadline_at  # still open, 10 minutes on
            await approve_operation(
                ledger, op_id, approver=MARIA, reason="customer is right",
                now=clock.now(), args_hash=waiting.args_hash,
            )  # fmt: skip
            with pytest.raises(ApprovalRefused):  # decided once: a second decision is refused
                await approve_operation(
                    ledger, op_id, approver=MARIA, reason="again",
                    now=clock.now() + 1, args_hash=waiting.args_hash,
                )  # fmt: skip
            await eventually(
                lambda: _status_is(ledger, op_id, S.COMMITTED), what="the approved refund"
            )
            events = await ledger.events(op_id)
    finally:
        await workers.stop()
    trail = [(e.from_status, e.to_status) for e in events]
    assert trail.count((S.AWAITING_APPROVAL, S.ADMITTED)) == 1
    (approved,) = [e for e in events if e.from_status is S.AWAITING_APPROVAL]
    assert approved.at - call_ended_at >= LATER_SECS  # decided 10 minutes after the call
    effects = await rows(durable_url, "SELECT operation_id FROM provider_effects")
    assert [r["operation_id"] for r in effects] == [op_id]


async def test_an_approval_in_the_bot_wakes_the_workflow_and_the_live_call_hears_the_outcome(
    durable_url: str, tmp_path: Path
) -> None:
    workers = Workers(durable_url, tmp_path)
    await workers.start("w1")
    try:
        async with bot(durable_url) as runtime:
            asked = await runtime.propose("refund", REFUND, session(), wait=False)
            op_id = asked["operation_id"]
            waiting = await runtime.ledger.get(op_id)
            await runtime.approve(op_id, approver=MARIA, reason="fine", args_hash=waiting.args_hash)
            final = await guarded(runtime.wait(op_id), what="the refund's outcome in the call")
            # The step wrote the outcome; the workflow records its end right after.
            await eventually(
                lambda: _workflow_is(runtime.ledger, durable_url, op_id, "SUCCESS"),
                what="the workflow to end",
            )
            state = await workflow_state(runtime.ledger.client, op_id)
    finally:
        await workers.stop()
    assert final.status is S.COMMITTED
    (effect,) = await rows(durable_url, "SELECT operation_id, pid FROM provider_effects")
    assert effect["operation_id"] == op_id and effect["pid"] != os.getpid()  # a worker's
    assert state == ("SUCCESS", "COMMITTED")


async def test_a_rejected_request_ends_its_workflow_with_nothing_sent(
    durable_url: str, tmp_path: Path
) -> None:
    async with bot(durable_url) as call:
        op_id = (await call.propose("refund", REFUND, session(), wait=False))["operation_id"]
    workers = Workers(durable_url, tmp_path)
    await workers.start("w1")
    try:
        async with await SqlLedger.create(durable_url) as ledger:
            waiting = await ledger.get(op_id)
            await reject_operation(
                ledger, op_id, approver=MARIA, reason="no", now=waiting.created_at + 1
            )
            await eventually(
                lambda: _workflow_is(ledger, durable_url, op_id, "SUCCESS"),
                what="the workflow to end",
            )
    finally:
        await workers.stop()
    assert await rows(durable_url, "SELECT 1 FROM provider_effects") == []
    (workflow,) = await rows(durable_url, "SELECT status FROM dbos.workflow_status")
    assert workflow["status"] == "SUCCESS"


async def test_a_window_that_closes_with_nobody_deciding_expires_on_the_worker(
    durable_url: str, tmp_path: Path
) -> None:
    # The window is DBOS's and the worker's to enforce (real time rules there: a second); the
    # test waits for its cause, never for a duration.
    async with bot(durable_url) as call:
        op_id = (await call.propose("refund_today", REFUND, session(), wait=False))["operation_id"]
    workers = Workers(durable_url, tmp_path)
    await workers.start("w1")
    try:
        async with await SqlLedger.create(durable_url) as ledger:
            await eventually(
                lambda: _workflow_is(ledger, durable_url, op_id, "SUCCESS"),
                what="the workflow to end",
            )
            expired = await ledger.get(op_id)
    finally:
        await workers.stop()
    assert expired.status is S.EXPIRED
    assert expired.error == "deadline: not confirmed or approved in time"
    assert await rows(durable_url, "SELECT 1 FROM provider_effects") == []


async def _workflow_is(ledger: object, url: str, op_id: str, status: str) -> bool:
    found = await rows(
        url,
        "SELECT status FROM dbos.workflow_status WHERE workflow_uuid = $1",
        f"pa-op:{op_id}",
    )
    return bool(found) and found[0]["status"] == status
