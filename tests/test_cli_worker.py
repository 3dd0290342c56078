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
import json
import time
from pathlib import Path
from typing import Any

import pytest

from pipecat_actions._operator_text import shown_url, when
from pipecat_actions.admission.authorization import AllowAll
from pipecat_actions.approvals import Approver, approve_operation
from pipecat_actions.cli import main
from pipecat_actions.clock import ManualClock
from pipecat_actions.ledger import Operation, SqlLedger
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.session import SessionState
from pipecat_actions.status import ActionStatus
from pipecat_actions.worker import LEFT_UNFINISHED, run_worker
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
    lines = out.getvalue().splitlines()
    assert lines[0] == f"ledger: {shown_url(_redacted(url))}"
    assert lines[1] == "worker worker claims stale operations every 10 s (lease 30 s)"
    # Each operation as it ended; the refund that waited for a person twice: when it was
    # claimed, and when its window closed.
    assert _said(lines, ids["sent"]) == ["book_table in RUNNING: COMMITTED"]
    assert _said(lines, ids["turn"]) == [
        "book_later in ADMITTED: CANCELLED (not sent: the conversation ended before the "
        "user's turn was confirmed)"
    ]
    assert _said(lines, ids["approved"]) == ["refund in ADMITTED: COMMITTED"]
    waited = _said(lines, ids["waiting"])
    assert waited[0].startswith("refund in AWAITING_APPROVAL: waiting for a person until 20")
    assert waited[1:] == [
        "refund in AWAITING_APPROVAL: EXPIRED (deadline: not confirmed or approved in time)"
    ]
    assert lines[-1] == (
        "stopped: 4 claimed: 4 finished (1 CANCELLED, 2 COMMITTED, 1 EXPIRED), "
        "0 waiting for a person, 0 left unfinished"
    )


def _said(lines: list[str], operation_id: str) -> list[str]:
    """What the worker said of one operation: its lines, without ``claimed OP``."""
    head = f"claimed {operation_id} "
    return [line.removeprefix(head) for line in lines if line.startswith(head)]


def _redacted(url: str) -> str:
    from pipecat_actions.ledger.engine import normalize_url, redact_url

    return redact_url(normalize_url(url))


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


async def test_one_pass_says_what_it_claimed_in_which_status_and_how_each_ended(
    ledger_url: str,
) -> None:
    clock, ids = await after_the_bot_died(ledger_url)
    out = io.StringIO()
    code = await guarded(
        run_worker(
            shop.app(), ledger_url=ledger_url, stop=asyncio.Event(), out=out, owner="worker",
            clock=clock, once=True,
        ),
        what="one pass of the worker",
    )  # fmt: skip
    assert code == 0
    lines = out.getvalue().splitlines()
    assert lines[0] == f"ledger: {shown_url(_redacted(ledger_url))}"
    assert lines[1] == "worker worker claims stale operations once, then exits (lease 30 s)"
    assert _said(lines, ids["sent"]) == ["book_table in RUNNING: COMMITTED"]  # reconciled
    assert _said(lines, ids["turn"])[0].startswith("book_later in ADMITTED: CANCELLED (not sent")
    assert _said(lines, ids["approved"]) == ["refund in ADMITTED: COMMITTED"]  # sent once
    [waiting] = _said(lines, ids["waiting"])
    deadline = when((await _op(ledger_url, ids["waiting"])).deadline_at)
    assert waiting == f"refund in AWAITING_APPROVAL: waiting for a person until {deadline}"
    assert lines[-1] == (
        "one pass: 4 claimed: 3 finished (1 CANCELLED, 2 COMMITTED), 1 waiting for a person, "
        "0 left unfinished"
    )
    assert len(lines) == 7


async def _op(url: str, operation_id: str) -> Operation:
    async with await SqlLedger.create(url, read_only=True) as ledger:
        return await ledger.get(operation_id)


async def test_a_pass_that_leaves_work_someone_must_finish_says_why_and_exits_3(
    ledger_url: str,
) -> None:
    clock, ids = await after_the_bot_died(ledger_url)
    out = io.StringIO()
    code = await guarded(
        run_worker(
            shop.app_without_bookings(), ledger_url=ledger_url, stop=asyncio.Event(), out=out,
            clock=clock, once=True, as_json=True, err=io.StringIO(),
        ),
        what="one pass of the worker",
    )  # fmt: skip
    assert code == LEFT_UNFINISHED == 3
    said = [json.loads(line) for line in out.getvalue().splitlines()]
    by_id = {event["operation_id"]: event for event in said if event["event"] == "operation"}
    assert by_id[ids["sent"]] == {
        "event": "operation",
        "operation_id": ids["sent"],
        "tool": "book_table",
        "claimed_in": "RUNNING",
        "status": "RUNNING",  # a process with the booking action claims it
        "outcome": "left",
        "error": None,
        "escalated": False,
    }
    assert said[-1] == {
        "event": "summary",
        "claimed": 4,
        "finished": {"CANCELLED": 1, "COMMITTED": 1},
        "waiting": 1,
        "left": 1,
        "running": 0,
        "exit_status": 3,
    }


async def test_the_worker_command_says_each_operation_as_json_lines_and_the_ledger_on_stderr(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    # The bot ran an hour ago on the wall clock: its leases ran out long since.
    ids = await leave_work_behind(url, ManualClock(time.time() - 3600))
    argv = ["worker", "--app", "tests._worker_app:app", "--ledger", url, "--once", "--json"]
    code = await asyncio.to_thread(main, argv)
    out, err = capsys.readouterr()
    assert code == 0, err
    assert err == f"ledger: {url}\n"
    said = [json.loads(line) for line in out.splitlines()]
    assert said[0]["event"] == "started" and said[0]["once"] is True
    assert said[0]["ledger"] == url and said[0]["recover_unsent"] == "run"
    ended = {e["operation_id"]: (e["claimed_in"], e["status"], e["outcome"]) for e in said[1:-1]}
    assert ended == {
        ids["sent"]: ("RUNNING", "COMMITTED", "finished"),
        ids["turn"]: ("ADMITTED", "CANCELLED", "finished"),
        ids["approved"]: ("ADMITTED", "COMMITTED", "finished"),
        ids["waiting"]: ("AWAITING_APPROVAL", "AWAITING_APPROVAL", "waiting"),
    }
    assert said[-1]["event"] == "summary" and said[-1]["exit_status"] == 0
    async with await SqlLedger.create(url) as ledger:
        assert (await ledger.get(ids["sent"])).status is S.COMMITTED
        assert (await ledger.get(ids["turn"])).status is S.CANCELLED
        assert (await ledger.get(ids["approved"])).status is S.COMMITTED


async def test_a_pass_with_nothing_stale_says_so_and_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    assert await asyncio.to_thread(main, ["db", "upgrade", "--ledger", url]) == 0
    capsys.readouterr()
    argv = ["worker", "--app", "tests._worker_app:app", "--ledger", url, "--once"]
    code = await asyncio.to_thread(main, argv)
    out, err = capsys.readouterr()
    assert (code, err) == (0, "")
    assert out.splitlines()[-1] == "one pass: nothing was stale"


async def test_the_worker_command_opens_its_ledger_with_the_connection_budget_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    assert await asyncio.to_thread(main, ["db", "upgrade", "--ledger", url]) == 0
    capsys.readouterr()
    budgets: list[int | None] = []
    create = SqlLedger.create.__func__  # type: ignore[attr-defined]

    async def noted(cls: type[SqlLedger], *args: Any, **kwargs: Any) -> SqlLedger:
        settings = kwargs.get("settings")
        budgets.append(None if settings is None else settings.pool_size)
        return await create(cls, *args, **kwargs)

    monkeypatch.setattr(SqlLedger, "create", classmethod(noted))
    argv = ["worker", "--app", "tests._worker_app:app", "--ledger", url, "--once"]
    assert await asyncio.to_thread(main, [*argv, "--pool-size", "2"]) == 0
    assert await asyncio.to_thread(main, argv) == 0
    assert await asyncio.to_thread(main, [*argv, "--pool-size", "0"]) == 1
    _, err = capsys.readouterr()

    assert budgets == [2, None]  # the default budget when none is asked; none opened for 0
    assert err == "pipecat-actions: --pool-size must be at least 1\n"


async def test_the_worker_command_opens_an_existing_ledger_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "nowhere" / "ledger.db"
    argv = ["worker", "--app", "tests._worker_app:app", "--ledger", str(missing), "--once"]
    code = await asyncio.to_thread(main, argv)
    out, err = capsys.readouterr()
    assert (code, out) == (1, "")
    assert err.startswith(f"pipecat-actions: no ledger at {missing}") and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []


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
    await (await SqlLedger.create(url)).close()
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
    assert first == f"ledger: {url}\n".encode()
    second = await guarded(process.stdout.readline(), what="the worker to start")
    assert b"claims stale operations every 10 s" in second
    process.send_signal(signal.SIGTERM)
    assert await guarded(process.wait(), what="the worker to stop") == 0
    said = await process.stdout.read()
    assert said.decode().splitlines()[-1] == "stopped: nothing was stale"
    assert b"Traceback" not in await process.stderr.read()
