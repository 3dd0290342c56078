"""What an operator runs for durable operations: ``db upgrade --dbos``, ``durable check``."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from pipecat_actions.cli import main
from pipecat_actions.durable import DurableLedger, workflow_id_for
from pipecat_actions.ledger import SqlLedger
from pipecat_actions.status import ActionStatus
from tests.durable import _app
from tests.durable._support import bot, session

pytestmark = pytest.mark.postgres
S = ActionStatus


async def test_db_upgrade_with_dbos_readies_a_fresh_database_for_durable_bots(
    pg_fresh_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = await asyncio.to_thread(main, ["db", "upgrade", "--dbos", "--ledger", pg_fresh_url])
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    assert out.rstrip().endswith("; DBOS tables ready (schema dbos)")
    ledger = await DurableLedger.open(pg_fresh_url, _app.POLICY)
    await ledger.close()


async def test_durable_check_settles_what_an_ended_workflow_left_and_leaves_running_ones(
    durable_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    async with bot(durable_url) as runtime:
        ids = [
            (await runtime.propose("transfer", {"account": f"a{n}", "amount_cents": 1},
                                   session(f"call-{n}"), wait=False))["operation_id"]
            for n in range(3)
        ]  # fmt: skip
        ledger = runtime.ledger
        # An operator cancels two workflows in DBOS: one before its step sent anything, one
        # after (its operation RUNNING: the request may have left). The third still runs.
        sent = await ledger.get(ids[1])
        await ledger.transition(
            ids[1], expected=S.ADMITTED, to=S.RUNNING, fence=sent.fence, actor="test:worker"
        )
        for op_id in ids[:2]:
            await asyncio.to_thread(ledger.client.cancel_workflow, workflow_id_for(op_id))
    code = await asyncio.to_thread(main, ["durable", "check", "--ledger", durable_url])
    out, _ = capsys.readouterr()
    assert code == 0
    said = {line.split(" ")[0]: line.split(": ", 1)[1] for line in out.splitlines()}
    assert said == {
        ids[0]: "ledger FAILED_FINAL, workflow CANCELLED, moved to FAILED_FINAL",
        ids[1]: "ledger UNKNOWN, workflow CANCELLED, moved to UNKNOWN",
        ids[2]: "ledger ADMITTED, workflow ENQUEUED",
    }
    async with await SqlLedger.create(durable_url) as plain:
        unsent = await plain.get(ids[0])
        assert unsent.error == "its DBOS workflow ended CANCELLED before sending it"
    # Asked again: nothing moves twice.
    code = await asyncio.to_thread(main, ["durable", "check", "--ledger", durable_url, ids[0]])
    again, _ = capsys.readouterr()
    assert again.splitlines()[-1].endswith("ledger FAILED_FINAL, workflow CANCELLED")


async def test_the_dbos_worker_on_sqlite_says_it_needs_postgresql_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    argv = ["worker", "--dbos", "--app", "tests.durable._app:app", "--ledger", url]
    code = await asyncio.to_thread(main, argv)
    _, err = capsys.readouterr()
    assert code == 1
    assert err.startswith("pipecat-actions: durable execution needs a PostgreSQL ledger")
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "ledger.db").exists()


@pytest.mark.parametrize("secs", ["0", "nan", "-1"])
async def test_the_dbos_worker_refuses_a_polling_interval_that_is_not_positive(
    secs: str, durable_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["worker", "--dbos", "--app", "tests.durable._app:app", "--ledger", durable_url]
    code = await asyncio.to_thread(main, [*argv, "--polling-secs", secs])
    _, err = capsys.readouterr()
    assert code == 1
    assert err == "pipecat-actions: --polling-secs must be a positive number of seconds\n"


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--dbos", "--pool-size", "0"], "--pool-size must be at least 1"),
        (["--pool-size", "-1"], "--pool-size must be at least 1"),
    ],
)
async def test_the_worker_refuses_a_pool_size_below_one(
    argv: list[str], said: str, durable_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["worker", "--app", "tests.durable._app:app", "--ledger", durable_url]
    code = await asyncio.to_thread(main, [*base, *argv])
    _, err = capsys.readouterr()
    assert code == 1
    assert err == f"pipecat-actions: {said}\n"


async def test_the_lease_worker_and_reconcile_leave_a_durable_operation_to_dbos(
    durable_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # A bot admitted a transfer and died. The plain worker (lease recovery) and the operator's
    # reconcile run with the same application: they start, and claim nothing of it.
    async with bot(durable_url) as call:
        started = await call.propose("transfer", {"account": "a", "amount_cents": 1}, session(),
                                     wait=False)  # fmt: skip
    argv = ["worker", "--app", "tests.durable._app:app", "--ledger", durable_url, "--once"]
    code = await asyncio.to_thread(main, argv)
    out, _ = capsys.readouterr()
    assert code == 0
    assert out.splitlines()[-1] == "one pass: nothing was stale"
    argv = ["reconcile", started["operation_id"], "--app", "tests.durable._app:app",
            "--ledger", durable_url]  # fmt: skip
    code = await asyncio.to_thread(main, argv)
    out, err = capsys.readouterr()
    assert code == 1  # it ran, and says the operation is not its to settle
    assert err.endswith("is ADMITTED, not UNKNOWN or FAILED_FINAL: nothing to reconcile\n")
    async with await SqlLedger.create(durable_url) as ledger:
        op = await ledger.get(started["operation_id"])
    assert (op.status, op.lease_owner, op.fence) == (S.ADMITTED, "dbos", 1)
