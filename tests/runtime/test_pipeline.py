"""Barge-in and background tools through a real Pipecat pipeline.

`ScriptedLLM` makes the tool calls through Pipecat's real ``run_function_calls``; the real
aggregators build the context; `ActionRuntime.attach` registers the handlers. A barge-in is an
`InterruptionFrame` sent while the effect runs, which makes Pipecat cancel a blocking tool's
handler. The system of record runs on the real clock here.
"""

from __future__ import annotations

from typing import Any

from pipecat.frames.frames import BotStoppedSpeakingFrame, InterruptionFrame, LLMRunFrame
from pipecat.tests.utils import SleepFrame

from pipecat_actions.testing import FakeSystemOfRecord, Say, ToolCalls
from tests.runtime._execution_support import (
    Bookings,
    annotations,
    booking,
    converse,
    gather_all,
    new_session,
    only_operation,
    running,
    tool_results,
    transitions,
)
from tests.runtime._execution_support import S as Status

TOOLS = """
    version: 1
    tools:
      book_table:
        kind: mutation
      book_when_settled:
        kind: mutation
        admit_when: turn_confirmed
        on_interruption: cancel_if_not_started
      book_if_not_started:
        kind: mutation
        on_interruption: cancel_if_not_started
      book_or_cancel:
        kind: mutation
        on_interruption: request_cancel
      book_in_background:
        kind: mutation
        mode: background
        announce: "One moment while I book that."
"""

BOOK = ToolCalls([("book_table", booking())])


def fake(*, latency_secs: float = 0.5, **options: Any) -> FakeSystemOfRecord:
    sor = FakeSystemOfRecord(**options)
    sor.add_restaurant("r1", tables=3)
    sor.faults.set_latency(latency_secs)
    return sor


def tools(bookings: Bookings, *, reconcile: str | None = "lookup") -> list:
    return [
        bookings.action(reconcile=reconcile),
        bookings.action(name="book_when_settled", reconcile=reconcile),
        bookings.action(name="book_if_not_started", reconcile=reconcile),
        bookings.action(name="book_or_cancel", reconcile=reconcile, cancel=True),
        bookings.action(name="book_in_background", reconcile=reconcile),
    ]


def barge_in_at(secs: float, then_secs: float = 0.8) -> list:
    return [LLMRunFrame(), SleepFrame(sleep=secs), InterruptionFrame(), SleepFrame(sleep=then_secs)]


async def test_a_barge_in_cancels_the_handler_but_the_booking_still_commits(
    ledger_url: str,
) -> None:
    sor = fake()
    async with running(TOOLS, tools(Bookings(sor)), ledger_url=ledger_url) as runtime:
        session = new_session()
        messages = await converse(runtime, session, [BOOK, Say("Booked.")], barge_in_at(0.2))
        op = await only_operation(runtime)
        final = await runtime.wait(op.operation_id)

    assert final.status is Status.COMMITTED
    assert final.provider_call_id == "call_1"
    assert final.result == {"booking_id": "bk_0001", "time": "21:00"}
    assert sor.side_effects["book"] == 1
    assert sor.calls["book"] == 1
    # Pipecat closed the cancelled call itself; nothing the runtime said claims more.
    assert "call_1" in tool_results(messages)


async def test_a_barge_in_before_the_turn_settles_cancels_a_turn_confirmed_booking(
    tmp_path: Any,
) -> None:
    sor = fake(latency_secs=0.1)
    async with running(
        TOOLS, tools(Bookings(sor)), ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}"
    ) as runtime:
        session = new_session()
        script = [ToolCalls([("book_when_settled", booking())]), Say("unused")]
        await converse(runtime, session, script, barge_in_at(0.2))
        op = await only_operation(runtime, "book_when_settled")
        final = await runtime.wait(op.operation_id)
        trail = await runtime.ledger.events(op.operation_id)

    assert final.status is Status.CANCELLED
    assert transitions(trail) == [Status.CANCELLED]
    assert sor.calls["book"] == 0


async def test_a_settled_turn_lets_a_turn_confirmed_booking_run(tmp_path: Any) -> None:
    sor = fake(latency_secs=0.1)
    async with running(
        TOOLS, tools(Bookings(sor)), ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}"
    ) as runtime:
        session = new_session()
        script = [ToolCalls([("book_when_settled", booking())]), Say("Booked.")]
        frames = [
            LLMRunFrame(),
            SleepFrame(sleep=0.2),
            BotStoppedSpeakingFrame(),
            SleepFrame(sleep=0.5),
        ]
        messages = await converse(runtime, session, script, frames)
        op = await only_operation(runtime, "book_when_settled")
        final = await runtime.wait(op.operation_id)

    assert final.status is Status.COMMITTED
    assert sor.side_effects["book"] == 1
    assert tool_results(messages)["call_1"]["status"] == "committed"


async def test_a_barge_in_after_sending_does_not_stop_a_cancel_if_not_started_booking(
    tmp_path: Any,
) -> None:
    sor = fake()
    async with running(
        TOOLS, tools(Bookings(sor)), ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}"
    ) as runtime:
        script = [ToolCalls([("book_if_not_started", booking())]), Say("unused")]
        await converse(runtime, new_session(), script, barge_in_at(0.2))
        op = await only_operation(runtime, "book_if_not_started")
        final = await runtime.wait(op.operation_id)

    assert final.status is Status.COMMITTED
    assert sor.side_effects["book"] == 1


async def test_a_barge_in_with_request_cancel_is_cancelled_when_the_provider_confirms(
    ledger_url: str,
) -> None:
    sor = fake(latency_secs=1.0)
    async with running(TOOLS, tools(Bookings(sor)), ledger_url=ledger_url) as runtime:
        script = [ToolCalls([("book_or_cancel", booking())]), Say("unused")]
        await converse(runtime, new_session(), script, barge_in_at(0.2, then_secs=0.3))
        op = await only_operation(runtime, "book_or_cancel")
        final = await runtime.wait(op.operation_id)
        trail = await runtime.ledger.events(op.operation_id)

    assert final.status is Status.CANCELLED
    assert transitions(trail) == [Status.CANCEL_REQUESTED, Status.CANCELLED]
    assert sor.calls["cancel_pending"] == 1
    assert sor.side_effects["book"] == 0


async def test_a_barge_in_with_request_cancel_after_the_commit_reports_committed(
    tmp_path: Any,
) -> None:
    # The provider is slow to cancel (0.6 s): the booking commits at 0.5 s, before it acts.
    sor = fake(latency_secs=0.5, slow_cancel_secs=0.6)
    async with running(
        TOOLS, tools(Bookings(sor)), ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}"
    ) as runtime:
        script = [ToolCalls([("book_or_cancel", booking())]), Say("unused")]
        await converse(runtime, new_session(), script, barge_in_at(0.2, then_secs=0.9))
        op = await only_operation(runtime, "book_or_cancel")
        final = await runtime.wait(op.operation_id)
        trail = await runtime.ledger.events(op.operation_id)

    assert final.status is Status.COMMITTED
    assert transitions(trail) == [Status.CANCEL_REQUESTED, Status.COMMITTED]
    assert {"cancel_answer": "too_late"} in annotations(trail)
    assert sor.side_effects["book"] == 1


async def test_a_slow_cancel_stays_requested_until_the_provider_confirms(tmp_path: Any) -> None:
    sor = fake(latency_secs=1.5, slow_cancel_secs=0.4)
    async with running(
        TOOLS, tools(Bookings(sor)), ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}"
    ) as runtime:
        script = [ToolCalls([("book_or_cancel", booking())]), Say("unused")]
        await converse(runtime, new_session(), script, barge_in_at(0.2, then_secs=0.6))
        op = await only_operation(runtime, "book_or_cancel")
        final = await runtime.wait(op.operation_id)
        trail = await runtime.ledger.events(op.operation_id)

    assert final.status is Status.CANCELLED
    requested = next(e for e in trail if e.to_status is Status.CANCEL_REQUESTED)
    cancelled = next(e for e in trail if e.to_status is Status.CANCELLED)
    assert cancelled.at - requested.at >= 0.4, "CANCELLED was written before the provider said so"
    assert sor.side_effects["book"] == 0


async def test_a_background_booking_delivers_its_committed_result_after_a_barge_in(
    ledger_url: str,
) -> None:
    sor = fake()
    async with running(TOOLS, tools(Bookings(sor)), ledger_url=ledger_url) as runtime:
        script = [ToolCalls([("book_in_background", booking())]), Say("It is booked.")]
        messages = await converse(runtime, new_session(), script, barge_in_at(0.2))
        op = await only_operation(runtime, "book_in_background")
        final = await runtime.wait(op.operation_id)

    told = tool_results(messages)["call_1"]
    assert final.status is Status.COMMITTED
    assert told["status"] == "committed"
    assert told["operation_id"] == op.operation_id
    assert told["result"] == {"booking_id": "bk_0001", "time": "21:00"}
    assert sor.side_effects["book"] == 1


async def test_a_background_booking_with_a_lost_answer_tells_the_model_it_is_unknown(
    tmp_path: Any,
) -> None:
    sor = fake(latency_secs=0.3, honours_idempotency_keys=False)
    sor.faults.lose_response_after_commit("book")
    async with running(
        TOOLS,
        tools(Bookings(sor), reconcile=None),
        ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
    ) as runtime:
        script = [ToolCalls([("book_in_background", booking())]), Say("I am checking.")]
        messages = await converse(runtime, new_session(), script, barge_in_at(0.1))
        op = await only_operation(runtime, "book_in_background")
        [final] = await gather_all(runtime.wait(op.operation_id))

    told = tool_results(messages)["call_1"]
    assert final.status is Status.UNKNOWN
    assert final.escalated_at is not None
    assert told["status"] == "unknown"
    assert "not yet known" in told["message"]
    assert "result" not in told
    assert sor.side_effects["book"] == 1
