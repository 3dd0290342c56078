"""`pipecat-actions stats` reads the same story from the ledger alone, on both backends.

A real runtime writes the ledger (a duplicate, a timeout, a retry, a refusal, a cancel), then
the command, which never ran the bot, counts it: per tool, filtered by --tool and --since,
as JSON or text. The in-process metrics of the same run agree with it.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from pipecat_actions.cli import main
from pipecat_actions.clock import ManualClock
from tests.observability.test_metrics import POLICY, actions, fake
from tests.runtime._execution_support import (
    Bookings,
    RecordingClock,
    booking,
    eventually,
    new_session,
    policy,
    reaches,
    running,
)
from tests.runtime._execution_support import S as Status

HOURS_AGO = 2 * 3600.0


async def _story(ledger_url: str) -> dict[str, Any]:
    """Run the story two hours ago (by the clock); return the in-process snapshot."""
    clock = RecordingClock(start=time.time() - HOURS_AGO)
    sor = fake(clock)
    async with running(
        POLICY, actions(Bookings(sor)), ledger_url=ledger_url, clock=clock, lease_secs=3600.0
    ) as rt:
        session = new_session()
        await rt.propose("book_table", booking("20:00"), session, tool_call_id="a")
        await rt.propose("book_table", booking("20:00"), session, tool_call_id="b")
        await rt.propose("book_table", {"restaurant_id": "r1"}, session)  # refused

        sor.faults.hang("book")
        hung = await rt.propose("book_table", booking("21:00"), session, wait=False)
        await reaches(rt, hung["operation_id"], Status.RUNNING)
        clock.advance(30)
        await reaches(rt, hung["operation_id"], Status.FAILED_FINAL)
        sor.faults.clear()

        sor.faults.error_before_send("book", times=1)
        call = asyncio.ensure_future(rt.propose("book_retrying", booking("22:00"), session))
        await eventually(lambda: 1.0 in clock.requested, what="the backoff")
        clock.advance(1.0)
        await asyncio.wait_for(call, 60)  # a hang guard

        waiting = await rt.propose("book_later", booking("23:00"), session, wait=False)
        await rt.cancel(waiting["operation_id"], reason="changed their mind")
        snapshot: dict[str, Any] = rt.metrics.snapshot()
    return snapshot


async def _recent_refusal(ledger_url: str) -> None:
    # Every tool declared routed, and no handler registered for any: an unknown tool.
    async with running(
        POLICY,
        [],
        ledger_url=ledger_url,
        clock=ManualClock(time.time()),
        routed=policy(POLICY).names(),
    ) as rt:
        await rt.propose("book_table", booking(), new_session())  # no such action: refused


def _stats(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(["stats", *argv])
    return code, capsys.readouterr().out


async def test_stats_from_the_ledger_match_the_run_per_tool_with_json(
    ledger_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    snapshot = await _story(ledger_url)

    code, out = await asyncio.to_thread(_stats, capsys, "--ledger", ledger_url, "--json")
    tools = json.loads(out)["tools"]
    book, retrying, later = tools["book_table"], tools["book_retrying"], tools["book_later"]

    assert code == 0
    assert book["by_status"] == {"COMMITTED": 1, "FAILED_FINAL": 1, "REJECTED": 1}
    assert book["proposals"] == 4
    assert (book["duplicates_joined"], book["duplicates_suppressed"]) == (1, 1)
    assert book["duplicate_rate"] == 0.25
    assert book["refused_by_reason"] == {"invalid_arguments": 1}
    assert (book["timeouts"], book["ever_unknown"], book["reconciled"]) == (1, 1, 1)
    assert book["timeout_rate"] == 0.5
    assert book["execution_to_commit"]["count"] == 1
    assert (retrying["retries"], retrying["retry_rate"], retrying["retried"]) == (1, 1.0, 1)
    assert later["cancelled_before_send"] == 1
    # What the bot's own process counted says the same.
    live = snapshot["tools"]
    assert live["book_table"]["duplicates_suppressed"] == {"joined": 1}
    assert live["book_table"]["timeouts"] == book["timeouts"]
    assert live["book_retrying"]["retries"] == retrying["retries"]
    assert live["book_later"]["cancelled_before_send"] == later["cancelled_before_send"]


async def test_stats_filter_by_tool_and_by_age(
    ledger_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    await _story(ledger_url)
    await _recent_refusal(ledger_url)

    _, only = await asyncio.to_thread(
        _stats, capsys, "--ledger", ledger_url, "--tool", "book_retrying", "--json"
    )
    _, recent = await asyncio.to_thread(
        _stats, capsys, "--ledger", ledger_url, "--since", "3600", "--json"
    )
    _, everything = await asyncio.to_thread(_stats, capsys, "--ledger", ledger_url, "--json")

    assert list(json.loads(only)["tools"]) == ["book_retrying"]
    last_hour = json.loads(recent)
    assert last_hour["operations"] == 1
    assert last_hour["tools"]["book_table"]["refused_by_reason"] == {"unknown_tool": 1}
    assert json.loads(everything)["operations"] == 6


async def test_stats_print_a_text_block_per_tool_without_json(
    ledger_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    await _story(ledger_url)

    code, out = await asyncio.to_thread(_stats, capsys, "--ledger", ledger_url)

    assert code == 0
    named, _, out = out.partition("\n")
    assert named.startswith("ledger: ")  # which ledger was read comes first
    assert out.startswith("book_later: 1 operations")
    assert "book_table: 3 operations, 4 proposals" in out
    assert "  timeout rate" in out and "50.0%" in out
    assert "  execution to commit" in out and "(n=1)" in out
    with pytest.raises(json.JSONDecodeError):
        json.loads(out)
