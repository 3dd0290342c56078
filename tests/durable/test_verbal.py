"""The user's spoken yes, heard in the call, releases a durable operation to its worker.

A durable tool with ``confirmation: {mode: verbal}`` is handed to its workflow as it is admitted
(AWAITING_CONFIRMATION), and the workflow waits with DBOS's durable ``recv``. The yes (or no)
comes through the call's ``confirm`` (``confirm_action``) or ``cancel``: it is recorded once in
the ledger (a conditional transition), and the bot's durable ledger sends the workflow a
message; a window that closes with nobody answering is expired by the worker, as an approval's.
Workers are real ``pipecat-actions worker --dbos`` processes; the bot is a runtime of this
process, a DBOS client only.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from pipecat_actions.durable import workflow_id_for
from pipecat_actions.durable._names import DECISION_TOPIC
from pipecat_actions.durable.handoff import workflow_state
from pipecat_actions.ledger import SqlLedger
from pipecat_actions.status import ActionStatus
from tests._waiting import eventually, guarded
from tests.durable._support import Workers, bot, rows, session

pytestmark = pytest.mark.postgres
S = ActionStatus
REFUND = {"order": "ord-7", "amount_cents": 1900}


async def _workflow_is(url: str, op_id: str, status: str) -> bool:
    found = await rows(
        url, "SELECT status FROM dbos.workflow_status WHERE workflow_uuid = $1", f"pa-op:{op_id}"
    )
    return bool(found) and found[0]["status"] == status


async def _waits_for_a_decision(url: str, op_id: str) -> bool:
    """Whether the workflow has looked at the operation and waits (its step said so)."""
    found = await rows(
        url,
        "SELECT count(*) AS n FROM dbos.operation_outputs WHERE workflow_uuid = $1",
        f"pa-op:{op_id}",
    )
    return bool(found) and found[0]["n"] > 0


async def _effects(url: str) -> list[tuple[str, int]]:
    return [
        (r["operation_id"], r["pid"])
        for r in await rows(url, "SELECT operation_id, pid FROM provider_effects ORDER BY seq")
    ]


async def test_the_users_yes_in_the_call_wakes_the_workflow_and_runs_it_once(
    durable_url: str, tmp_path: Path
) -> None:
    workers = Workers(durable_url, tmp_path)
    await workers.start("w1")
    try:
        async with bot(durable_url) as runtime:
            call = session()
            asked = await runtime.propose("refund_spoken", REFUND, call, tool_call_id="c1")
            op_id = asked["operation_id"]
            assert asked["status"] == "awaiting_confirmation", asked
            await eventually(
                lambda: _waits_for_a_decision(durable_url, op_id),
                what="the workflow to wait for the user's yes",
            )
            assert await _effects(durable_url) == []  # nothing sent before the yes
            call.start_user_turn()  # "yes, go ahead"
            answer = await runtime.confirm(op_id, asked["confirmation_token"], call)
            again = await runtime.confirm(op_id, asked["confirmation_token"], call)
            final = await guarded(runtime.wait(op_id), what="the refund's outcome in the call")
            await eventually(
                lambda: _workflow_is(durable_url, op_id, "SUCCESS"), what="the workflow to end"
            )
            state = await workflow_state(runtime.ledger.client, op_id)
            trail = await runtime.ledger.events(op_id)
            steps = await asyncio.to_thread(
                runtime.ledger.client.list_workflow_steps, workflow_id_for(op_id)
            )
    finally:
        await workers.stop()
    assert answer["status"] == "admitted", answer
    assert again["status"] == "refused" and again["reason"] == "confirmation_refused", again
    assert final.status is S.COMMITTED
    # Recorded once, as the user's; run once, by a worker.
    decided = [(e.to_status, e.actor) for e in trail if e.from_status is S.AWAITING_CONFIRMATION]
    assert decided == [(S.ADMITTED, "user:alice")]
    ((effect_op, pid),) = await _effects(durable_url)
    assert effect_op == op_id and pid != os.getpid()
    assert state == ("SUCCESS", "COMMITTED")
    # The bot sent the workflow the decision, once, and its recv got it (unless its wait had
    # just ended and it read the decision from the ledger first: the message is left unread).
    sent = await rows(
        durable_url,
        "SELECT topic, consumed FROM dbos.notifications WHERE destination_uuid = $1",
        workflow_id_for(op_id),
    )
    assert [r["topic"] for r in sent] == [DECISION_TOPIC]
    received = [s["output"] for s in steps if s["function_name"] == "DBOS.recv"]
    assert received.count("ADMITTED") == int(sent[0]["consumed"])
    assert [s["output"] for s in steps if s["function_name"] != "DBOS.recv"][-1] == "COMMITTED"


async def test_the_users_no_ends_the_workflow_with_nothing_sent(
    durable_url: str, tmp_path: Path
) -> None:
    workers = Workers(durable_url, tmp_path)
    await workers.start("w1")
    try:
        async with bot(durable_url) as runtime:
            call = session()
            asked = await runtime.propose("refund_spoken", REFUND, call)
            op_id = asked["operation_id"]
            await eventually(
                lambda: _waits_for_a_decision(durable_url, op_id),
                what="the workflow to wait for the user's yes",
            )
            call.start_user_turn()  # "no, leave it"
            said_no = await runtime.cancel(op_id, reason="the user said no")
            final = await guarded(runtime.wait(op_id), what="the outcome in the call")
            await eventually(
                lambda: _workflow_is(durable_url, op_id, "SUCCESS"), what="the workflow to end"
            )
            state = await workflow_state(runtime.ledger.client, op_id)
            late_yes = await runtime.confirm(op_id, asked["confirmation_token"], call)
    finally:
        await workers.stop()
    assert said_no.status is S.REJECTED and final.status is S.REJECTED
    assert state == ("SUCCESS", "REJECTED")
    assert late_yes["status"] == "refused", late_yes
    assert await _effects(durable_url) == []


async def test_a_window_that_closes_with_nobody_answering_expires_on_the_worker(
    durable_url: str, tmp_path: Path
) -> None:
    # The window is the worker's to enforce (real time rules there: a second); the test waits
    # for its cause, never for a duration.
    workers = Workers(durable_url, tmp_path)
    await workers.start("w1")
    try:
        async with bot(durable_url) as runtime:
            call = session()
            asked = await runtime.propose("refund_spoken_now", REFUND, call)
            op_id = asked["operation_id"]
            final = await guarded(runtime.wait(op_id), what="the expiry told in the call")
            call.start_user_turn()  # a yes that comes too late
            late_yes = await runtime.confirm(op_id, asked["confirmation_token"], call)
            await eventually(
                lambda: _workflow_is(durable_url, op_id, "SUCCESS"), what="the workflow to end"
            )
            state = await workflow_state(runtime.ledger.client, op_id)
            trail = await runtime.ledger.events(op_id)
    finally:
        await workers.stop()
    assert final.status is S.EXPIRED
    assert final.error == "deadline: not confirmed or approved in time"
    assert late_yes["status"] == "refused", late_yes
    assert state == ("SUCCESS", "EXPIRED")
    (expired,) = [e for e in trail if e.to_status is S.EXPIRED]
    assert expired.actor.startswith("runtime:dbos-worker:")  # the worker expired it
    assert await _effects(durable_url) == []


async def test_a_call_that_ends_before_the_yes_leaves_nothing_sent(
    durable_url: str, tmp_path: Path
) -> None:
    async with bot(durable_url) as first:
        call = session()
        asked = await first.propose("refund_spoken_now", REFUND, call)
    assert asked["status"] == "awaiting_confirmation"  # the call ends here, before any yes
    op_id = asked["operation_id"]
    workers = Workers(durable_url, tmp_path)
    await workers.start("w1")
    try:
        async with bot(durable_url) as second:
            # The user calls back and says yes: the question was another call's, and is gone.
            again = session()
            again.start_user_turn()
            late_yes = await second.confirm(op_id, asked["confirmation_token"], again)
            await eventually(
                lambda: _workflow_is(durable_url, op_id, "SUCCESS"), what="the workflow to end"
            )
        async with await SqlLedger.create(durable_url) as ledger:
            ended = await ledger.get(op_id)
    finally:
        await workers.stop()
    assert late_yes["status"] == "refused", late_yes
    assert ended.status is S.EXPIRED
    assert await _effects(durable_url) == []
