"""Admission hands a durable operation to DBOS: its row and its workflow commit together.

No worker runs here: what is checked is what the bot's process writes (the ledger's row and
DBOS's ``workflow_status`` row, in one PostgreSQL database) and what it refuses to do.
"""

from __future__ import annotations

import asyncio
from typing import Any

import asyncpg
import pytest

from pipecat_actions.admission.authorization import AllowAll
from pipecat_actions.durable import (
    DURABLE_OWNER,
    WORKFLOW_NAME,
    DurableLedger,
    operation_of_workflow,
    workflow_id_for,
)
from pipecat_actions.errors import ConfigurationError, LedgerConfigurationError, PolicyError
from pipecat_actions.ledger import NewOperation, SqlLedger
from pipecat_actions.policy import ConfirmationMode, load_policy_text
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.status import ActionStatus
from tests.conftest import create_pg_database, drop_pg_database
from tests.durable import _app
from tests.durable._support import bot, rows, session

pytestmark = pytest.mark.postgres
S = ActionStatus
TRANSFER = {"account": "acc-1", "amount_cents": 1200}


async def _workflows(url: str) -> list[asyncpg.Record]:
    return await rows(
        url,
        "SELECT workflow_uuid, status, name, queue_name, deduplication_id "
        "FROM dbos.workflow_status ORDER BY created_at",
    )


async def _operations(url: str) -> list[asyncpg.Record]:
    return await rows(url, "SELECT operation_id, status, lease_owner FROM pa_operations")


async def test_admission_writes_the_operation_admitted_and_enqueues_its_workflow(
    durable_url: str,
) -> None:
    async with bot(durable_url) as runtime:
        result = await runtime.propose(
            "transfer", TRANSFER, session(), tool_call_id="c1", wait=False
        )
    # Nothing was sent from the call's process: the answer says it was started, no more.
    assert result["status"] == "admitted"
    op_id = result["operation_id"]
    (op,) = await _operations(durable_url)
    assert (op["operation_id"], op["status"], op["lease_owner"]) == (
        op_id,
        "ADMITTED",
        DURABLE_OWNER,
    )
    (workflow,) = await _workflows(durable_url)
    assert workflow["workflow_uuid"] == workflow_id_for(op_id)
    assert operation_of_workflow(workflow["workflow_uuid"]) == op_id
    assert (workflow["status"], workflow["name"], workflow["queue_name"]) == (
        "ENQUEUED",
        WORKFLOW_NAME,
        "pipecat_actions",
    )
    async with await SqlLedger.create(durable_url) as ledger:
        (admitted,) = [e for e in await ledger.events(op_id) if e.to_status is S.ADMITTED]
    assert admitted.detail["workflow_id"] == workflow_id_for(op_id)


async def test_a_tool_with_shared_limits_is_enqueued_on_its_own_queue(durable_url: str) -> None:
    async with bot(durable_url) as runtime:
        await runtime.propose("settle_invoice", {"invoice": "inv-7"}, session(), wait=False)
    (workflow,) = await _workflows(durable_url)
    assert workflow["queue_name"] == "pipecat_actions:settle_invoice"


async def test_a_repeat_of_the_same_intent_joins_it_and_enqueues_nothing_new(
    durable_url: str,
) -> None:
    async with bot(durable_url) as runtime:
        first = await runtime.propose("transfer", TRANSFER, session(), wait=False)
        again = await runtime.propose("transfer", TRANSFER, session(), wait=False)
    assert again["operation_id"] == first["operation_id"]
    assert len(await _operations(durable_url)) == 1
    async with await SqlLedger.create(durable_url) as ledger:
        op = await ledger.get(first["operation_id"])
    # One workflow, deduplicated on the tenant and the intent's idempotency key.
    (workflow,) = await _workflows(durable_url)
    assert workflow["deduplication_id"] == f"default\x1f{op.idempotency_key}"


async def test_a_commit_that_fails_after_both_writes_leaves_neither_the_row_nor_the_workflow(
    durable_url: str,
) -> None:
    # A constraint checked at COMMIT refuses the transaction after the ledger's insert and
    # DBOS's enqueue both ran in it: the commit between them and the world fails.
    conn = await asyncpg.connect(durable_url)
    try:
        await conn.execute(
            """
            CREATE FUNCTION refuse_commit() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN RAISE EXCEPTION 'the commit fails'; END $$;
            CREATE CONSTRAINT TRIGGER refuse_at_commit AFTER INSERT ON dbos.workflow_status
            DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION refuse_commit();
            """
        )
    finally:
        await conn.close()
    async with bot(durable_url) as runtime:
        result = await runtime.propose("transfer", TRANSFER, session(), tool_call_id="c1")
    # The caller hears that nothing was done, never that something started.
    assert result["status"] == "refused"
    assert result["reason"] in {"ledger_error", "ledger_unavailable"}
    assert await _operations(durable_url) == []
    assert await _workflows(durable_url) == []


async def test_an_enqueue_that_fails_leaves_no_ledger_row(durable_url: str) -> None:
    # The other order: the ledger's row is written first; DBOS's insert fails in the same
    # transaction (here a workflow already holds the id the operation's derives).
    ledger = await DurableLedger.open(durable_url, _app.POLICY)
    try:
        new = NewOperation(
            tool="transfer",
            kind="mutation",
            args=TRANSFER,
            idempotency_key="k-1",
            session_id="call-1",
            principal="alice",
            status=S.RUNNING,
        )
        ledger.client.enqueue(
            {"workflow_name": "someone.else", "queue_name": "other", "workflow_id":
             workflow_id_for(new.operation_id)},
        )  # fmt: skip
        with pytest.raises(Exception, match="already"):
            await ledger.admit(new)
    finally:
        await ledger.close()
    assert await _operations(durable_url) == []
    assert [w["name"] for w in await _workflows(durable_url)] == ["someone.else"]


async def test_the_ledger_stays_a_plain_ledger_for_tools_that_run_in_the_call(
    durable_url: str,
) -> None:
    policy = load_policy_text(_app.POLICY_TEXT + "  note:\n    kind: mutation\n")
    ledger = await DurableLedger.open(durable_url, policy)
    try:
        new = NewOperation(
            tool="note", kind="mutation", args={}, idempotency_key="n", session_id="s",
            principal="p", status=S.RUNNING, lease_owner="bot", lease_secs=30.0,
        )  # fmt: skip
        admitted = (await ledger.admit(new)).operation
    finally:
        await ledger.close()
    assert (admitted.status, admitted.lease_owner) == (S.RUNNING, "bot")
    assert await _workflows(durable_url) == []


async def test_a_runtime_with_durable_tools_and_no_hand_off_is_refused(durable_url: str) -> None:
    async with await SqlLedger.create(durable_url) as ledger:
        refused = (
            r"^refund, refund_spoken, refund_spoken_now, refund_today, settle_invoice, transfer, "
            r"transfer_tracked: execution"
        )
        with pytest.raises(ConfigurationError, match=refused):
            await ActionRuntime.create(
                _app.POLICY, authorizer=AllowAll(), actions=_app.ACTIONS,
                ledger=ledger,
            )  # fmt: skip


async def test_a_durable_ledger_on_sqlite_is_refused_before_anything_opens(tmp_path: Any) -> None:
    with pytest.raises(LedgerConfigurationError, match="needs a PostgreSQL ledger"):
        await DurableLedger.open(f"sqlite:///{tmp_path / 'l.db'}", _app.POLICY)
    assert not (tmp_path / "l.db").exists()


async def test_a_database_without_dbos_tables_says_how_to_create_them() -> None:
    url = await asyncio.to_thread(create_pg_database, "pa_durable")
    try:
        async with await SqlLedger.create(url):
            pass
        with pytest.raises(LedgerConfigurationError, match="worker --dbos"):
            await DurableLedger.open(url, _app.POLICY)
    finally:
        await asyncio.to_thread(drop_pg_database, url)


@pytest.mark.parametrize(
    ("extra", "refused"),
    [
        ("    kind: read\n    execution: durable\n", "execution: durable is for mutations"),
        (
            "    kind: mutation\n    execution: durable\n    admit_when: turn_confirmed\n",
            "admit_when: turn_confirmed holds the operation",
        ),
        (
            "    kind: mutation\n    execution: durable\n    on_duplicate: replace\n",
            "on_duplicate: replace is not supported with execution: durable",
        ),
        (
            "    kind: mutation\n    durable: {global_concurrency: 2}\n",
            "durable: sets a DBOS queue, which only a durable tool has",
        ),
        (
            "    kind: mutation\n    execution: elsewhere\n",
            "execution",
        ),
    ],
)
def test_a_policy_that_cannot_run_durably_is_refused_when_it_loads(
    extra: str, refused: str
) -> None:
    with pytest.raises(PolicyError, match=refused.replace("(", r"\(")):
        load_policy_text("version: 1\ntools:\n  pay:\n" + extra)


def test_a_durable_tool_may_ask_for_the_users_spoken_yes() -> None:
    policy = load_policy_text(
        "version: 1\ntools:\n  pay:\n    kind: mutation\n    execution: durable\n"
        "    risk: high\n    confirmation: {mode: verbal, expires_after_secs: 30}\n"
    )
    assert policy["pay"].is_durable
    assert policy["pay"].confirmation.mode is ConfirmationMode.VERBAL
