"""``pipecat-actions worker``: the operations of a bot process that is gone get an owner (B13).

A "bot" runtime leaves work behind and stops without settling it (as a process per call does
when the call ends or the process is killed): a booking sent whose answer never came, a booking
still waiting for the user's turn to end, a refund approved by an operator after the bot was
gone, and a refund still waiting for approval. A worker on the same ledger, with no pipeline,
takes each over once the bot's lease has run out.
"""

from __future__ import annotations

import asyncio
import io
import time
from pathlib import Path
from typing import Any

import pytest

from pipecat_actions.admission.authorization import AllowAll
from pipecat_actions.approvals import Approver, approve_operation
from pipecat_actions.cli import main
from pipecat_actions.clock import ManualClock
from pipecat_actions.ledger import SqlLedger
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.session import SessionState
from pipecat_actions.status import ActionStatus
from pipecat_actions.worker import run_worker
from tests import _worker_app as shop
from tests._waiting import eventually, guarded

S = ActionStatus
LEASE_SECS = 30.0


@pytest.fixture(autouse=True)
def _fresh_system_of_record() -> None:
    shop.BOOKED.clear()
    shop.SENT.clear()


async def leave_work_behind(url: str, clock: ManualClock) -> dict[str, str]:
    """Run a bot that leaves four operations unsettled, and stop it; return them by name."""
    lost = asyncio.Event()

    @shop.action(name="book_table", reconcile=shop.find_by_key)
    async def book_table(ctx: Any, time: str) -> dict[str, Any]:
        await shop._book(ctx, time)  # booked at the provider ...
        await lost.wait()  # ... and the answer never comes back before the bot is gone
        raise AssertionError("not reached")

    bot = await ActionRuntime.create(
        shop.POLICY,
        authorizer=AllowAll(),
        actions=[book_table, shop.book_later, shop.refund],
        ledger_url=url,
        clock=clock,
        owner="bot-1",
        lease_secs=LEASE_SECS,
    )
    session = SessionState(session_id="call-1", principal="alice")
    ids = {}
    ids["sent"] = (await bot.propose("book_table", {"time": "19:00"}, session, wait=False))[
        "operation_id"
    ]
    await eventually(lambda: len(shop.SENT) == 1, what="the booking to reach the provider")
    session.start_generation()  # the reply that proposes the next one never ends
    ids["turn"] = (await bot.propose("book_later", {"time": "20:00"}, session, wait=False))[
        "operation_id"
    ]
    ids["approved"] = (await bot.propose("refund", {"amount_cents": 500}, session))["operation_id"]
    ids["waiting"] = (await bot.propose("refund", {"amount_cents": 900}, session))["operation_id"]
    await bot.close(grace_secs=0)
    async with await SqlLedger.create(url, clock=clock) as ledger:
        waiting = await ledger.get(ids["approved"])
        await approve_operation(
            ledger,
            ids["approved"],
            approver=Approver("ops", tenants={"default"}),
            reason="ok",
            now=clock.now(),
            args_hash=waiting.args_hash,
        )
    return {name: str(op_id) for name, op_id in ids.items()}


async def after_the_bot_died(url: str) -> tuple[ManualClock, dict[str, str]]:
    """Leave the bot's work behind and let its lease run out; return the clock and the work."""
    clock = ManualClock()
    ids = await leave_work_behind(url, clock)
    clock.advance(LEASE_SECS + 1)
    return clock, ids


async def test_a_worker_finishes_what_a_dead_bot_left_and_leaves_it_untold(
    ledger_url: str,
) -> None:
    url = ledger_url
    clock, ids = await after_the_bot_died(url)
    stop = asyncio.Event()
    out = io.StringIO()
    working = asyncio.ensure_future(
        run_worker(shop.app(), ledger_url=url, stop=stop, out=out, owner="worker", clock=clock)
    )
    try:
        async with await SqlLedger.create(url, clock=clock) as ledger:

            async def settled() -> bool:
                ops = {name: await ledger.get(op_id) for name, op_id in ids.items()}
                return (
                    ops["sent"].status is S.COMMITTED
                    and ops["turn"].status is S.CANCELLED
                    and ops["approved"].status is S.COMMITTED
                )

            await eventually(settled, what="the worker to finish the bot's operations")
            sent = await ledger.get(ids["sent"])
            assert sent.result == shop.BOOKED[sent.idempotency_key]  # reconciled, not resent
            assert shop.SENT.count(ids["sent"]) == 1
            assert ids["turn"] not in shop.SENT  # the user never let it go
            assert shop.SENT.count(ids["approved"]) == 1
            # The approval window of the other refund runs out in the worker's hands.
            assert (await ledger.get(ids["waiting"])).lease_owner == "worker"
            clock.advance(300)
            await eventually(
                lambda: _status(ledger, ids["waiting"], S.EXPIRED),
                what="the approval window to close",
            )
            # Nobody heard any of it: the session's next pipeline tells it.
            for op_id in ids.values():
                op = await ledger.get(op_id)
                assert op.delivered_at is None and op.acknowledged_at is None
    finally:
        stop.set()
        assert await guarded(working, what="the worker to stop") == 0
    assert "worker worker on" in out.getvalue()


async def _status(ledger: SqlLedger, operation_id: str, status: ActionStatus) -> bool:
    return (await ledger.get(operation_id)).status is status


async def test_without_an_authorizer_a_worker_fails_unsent_work_instead_of_sending_it(
    ledger_url: str,
) -> None:
    url = ledger_url
    clock, ids = await after_the_bot_died(url)
    out = io.StringIO()
    code = await guarded(
        run_worker(
            shop.app_without_authorizer(),
            ledger_url=url,
            stop=asyncio.Event(),
            out=out,
            clock=clock,
            once=True,
        ),
        what="one pass of the worker",
    )
    assert code == 0
    assert "recover_unsent: fail" in out.getvalue()
    async with await SqlLedger.create(url, clock=clock) as ledger:
        approved = await ledger.get(ids["approved"])
        assert approved.status is S.FAILED_FINAL
        assert approved.error == "its owner stopped before sending it; not retried by policy"
        assert (await ledger.get(ids["sent"])).status is S.COMMITTED  # reconciling needs no say
    assert ids["approved"] not in shop.SENT


async def test_the_worker_command_runs_one_pass_and_exits(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    # The bot ran an hour ago on the wall clock: its leases ran out long since.
    ids = await leave_work_behind(url, ManualClock(time.time() - 3600))
    code = await asyncio.to_thread(
        main, ["worker", "--app", "tests._worker_app:app", "--ledger", url, "--once"]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "claims stale operations" in out
    async with await SqlLedger.create(url) as ledger:
        assert (await ledger.get(ids["sent"])).status is S.COMMITTED
        assert (await ledger.get(ids["turn"])).status is S.CANCELLED
        assert (await ledger.get(ids["approved"])).status is S.COMMITTED


async def test_the_worker_command_without_an_app_says_what_it_needs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    code = await asyncio.to_thread(main, ["worker", "--ledger", "sqlite:///x.db"])
    _, err = capsys.readouterr()
    assert code == 1
    assert "worker needs the application's actions" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("lease", ["nan", "inf", "0"])
async def test_the_worker_command_refuses_a_lease_that_is_not_a_positive_number(
    lease: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    argv = ["worker", "--app", "tests._worker_app:app", "--ledger", url, "--once"]
    code = await asyncio.to_thread(main, [*argv, "--lease-secs", lease])
    _, err = capsys.readouterr()
    assert code == 1
    assert err == "pipecat-actions: --lease-secs must be a positive number of seconds\n"
    assert not (tmp_path / "ledger.db").exists()


async def test_the_worker_process_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    import signal
    import sys

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    process = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "from pipecat_actions.cli import run; run()",
        "worker",
        "--app",
        "tests._worker_app:app",
        "--ledger",
        url,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert process.stdout is not None and process.stderr is not None
    first = await guarded(process.stdout.readline(), what="the worker to start")
    assert b"claims stale operations" in first
    process.send_signal(signal.SIGTERM)
    assert await guarded(process.wait(), what="the worker to stop") == 0
    assert b"Traceback" not in await process.stderr.read()
