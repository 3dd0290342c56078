"""Barge-in and background tools through a real Pipecat pipeline.

`ScriptedLLM` makes the tool calls through Pipecat's real ``run_function_calls``; the real
aggregators build the context; `pipecat_actions.attach` registers the handlers. A barge-in is an
`InterruptionFrame` sent while the effect runs, which makes Pipecat cancel a blocking tool's
handler. The system of record and the runtime run on a manual clock: a request is answered
(and a slow cancel acts) only when the script advances it, after what must come first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pipecat.frames.frames import (
    BotStoppedSpeakingFrame,
    FunctionCallCancelFrame,
    InterruptionFrame,
    LLMRunFrame,
)
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair

from pipecat_actions import attach, tools_schema
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.session import SessionState
from pipecat_actions.testing import FakeSystemOfRecord, Say, ScriptedLLM, ToolCalls
from tests.processors._clocked import (
    FrameLog,
    ScriptClock,
    Step,
    operation,
    run_script,
    until,
)
from tests.runtime._execution_support import (
    Bookings,
    TurnTap,
    annotations,
    booking,
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


def fake(clock: ScriptClock, *, latency_secs: float = 0.5, **options: Any) -> FakeSystemOfRecord:
    sor = FakeSystemOfRecord(clock=clock, **options)
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


class Conversation:
    """One conversation through a real pipeline: user aggregator, turn tap, LLM, assistant."""

    def __init__(
        self, runtime: ActionRuntime, session: SessionState, script: Sequence[Say | ToolCalls]
    ) -> None:
        self.runtime = runtime
        self.session = session
        self.context = LLMContext(
            messages=[{"role": "user", "content": "A table for two at nine, please."}],
            tools=tools_schema(runtime),
        )
        self.llm = ScriptedLLM(script)
        attach(runtime, self.llm, session)
        self.log = FrameLog()

    def messages(self) -> list[dict[str, Any]]:
        return [dict(m) for m in self.context.get_messages()]

    async def run(self, steps: Sequence[Step]) -> list[dict[str, Any]]:
        """Run the steps; return the context's messages."""
        pair = LLMContextAggregatorPair(self.context)
        await run_script(
            [pair.user(), TurnTap(self.session), self.llm, pair.assistant()],
            steps,
            observers=[self.log],
        )
        return self.messages()

    def handler_cancelled(self) -> Step:
        """Wait until Pipecat has cancelled the blocking tool's handler (the barge-in's cause)."""
        return lambda: self.log.wait_pushed(FunctionCallCancelFrame, by=self.llm)

    def barge_in_passed(self) -> Step:
        """Wait until the interruption has passed the LLM (which cancels what it cancels)."""
        return lambda: self.log.wait_pushed(InterruptionFrame, by=self.llm)

    def told(self, tool_call_id: str, status: str) -> Step:
        """Wait until the context says the call ended with ``status``."""

        def check() -> bool:
            told = tool_results(self.messages()).get(tool_call_id)
            return isinstance(told, dict) and told.get("status") == status

        return lambda: until(check, what=f"{tool_call_id} told {status}")


def sent(clock: ScriptClock, latency_secs: float) -> Step:
    """Wait until the provider holds the request: it waits its latency on the clock."""
    return lambda: clock.asked(latency_secs)


def advance(clock: ScriptClock, secs: float) -> Step:
    async def step() -> None:
        clock.advance(secs)

    return step


def reaches(runtime: ActionRuntime, tool: str, *statuses: Status) -> Step:
    async def step() -> None:
        await operation(runtime, tool, *statuses)

    return step


def still(runtime: ActionRuntime, tool: str, status: Status) -> Step:
    """Check, at this point of the script, that the operation is in ``status``."""

    async def step() -> None:
        op = await operation(runtime, tool)
        assert op.status is status, f"{tool} is {op.status}, expected {status}"

    return step


async def test_a_barge_in_cancels_the_handler_but_the_booking_still_commits(
    ledger_url: str,
) -> None:
    clock = ScriptClock()
    sor = fake(clock)
    async with running(TOOLS, tools(Bookings(sor)), ledger_url=ledger_url, clock=clock) as rt:
        talk = Conversation(rt, new_session(), [BOOK, Say("Booked.")])
        messages = await talk.run(
            [
                LLMRunFrame(),
                sent(clock, 0.5),
                InterruptionFrame(),
                talk.handler_cancelled(),
                advance(clock, 0.5),  # the provider answers after the barge-in
                reaches(rt, "book_table", Status.COMMITTED),
            ]
        )
        op = await only_operation(rt)
        final = await rt.wait(op.operation_id)

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
    clock = ScriptClock()
    sor = fake(clock, latency_secs=0.1)
    async with running(
        TOOLS,
        tools(Bookings(sor)),
        ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
        clock=clock,
    ) as rt:
        talk = Conversation(
            rt, new_session(), [ToolCalls([("book_when_settled", booking())]), Say("unused")]
        )
        await talk.run(
            [
                LLMRunFrame(),
                reaches(rt, "book_when_settled", Status.ADMITTED),  # held for the turn
                InterruptionFrame(),
                reaches(rt, "book_when_settled", Status.CANCELLED),
                advance(clock, 0.1),  # a request sent anyway would now commit
            ]
        )
        op = await only_operation(rt, "book_when_settled")
        final = await rt.wait(op.operation_id)
        trail = await rt.ledger.events(op.operation_id)

    assert final.status is Status.CANCELLED
    assert transitions(trail) == [Status.CANCELLED]
    assert sor.calls["book"] == 0


async def test_a_settled_turn_lets_a_turn_confirmed_booking_run(tmp_path: Any) -> None:
    clock = ScriptClock()
    sor = fake(clock, latency_secs=0.1)
    async with running(
        TOOLS,
        tools(Bookings(sor)),
        ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
        clock=clock,
    ) as rt:
        script = [ToolCalls([("book_when_settled", booking())]), Say("Booked.")]
        talk = Conversation(rt, new_session(), script)
        messages = await talk.run(
            [
                LLMRunFrame(),
                reaches(rt, "book_when_settled", Status.ADMITTED),  # held for the turn
                BotStoppedSpeakingFrame(),  # the reply ended uninterrupted
                sent(clock, 0.1),
                advance(clock, 0.1),
                talk.told("call_1", "committed"),
            ]
        )
        op = await only_operation(rt, "book_when_settled")
        final = await rt.wait(op.operation_id)

    assert final.status is Status.COMMITTED
    assert sor.side_effects["book"] == 1
    assert tool_results(messages)["call_1"]["status"] == "committed"


async def test_a_barge_in_after_sending_does_not_stop_a_cancel_if_not_started_booking(
    tmp_path: Any,
) -> None:
    clock = ScriptClock()
    sor = fake(clock)
    async with running(
        TOOLS,
        tools(Bookings(sor)),
        ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
        clock=clock,
    ) as rt:
        talk = Conversation(
            rt, new_session(), [ToolCalls([("book_if_not_started", booking())]), Say("unused")]
        )
        await talk.run(
            [
                LLMRunFrame(),
                sent(clock, 0.5),
                InterruptionFrame(),
                talk.handler_cancelled(),
                still(rt, "book_if_not_started", Status.RUNNING),
                advance(clock, 0.5),
                reaches(rt, "book_if_not_started", Status.COMMITTED),
            ]
        )
        op = await only_operation(rt, "book_if_not_started")
        final = await rt.wait(op.operation_id)
        trail = await rt.ledger.events(op.operation_id)

    assert final.status is Status.COMMITTED
    assert transitions(trail) == [Status.COMMITTED]
    assert sor.side_effects["book"] == 1


async def test_a_barge_in_with_request_cancel_is_cancelled_when_the_provider_confirms(
    ledger_url: str,
) -> None:
    clock = ScriptClock()
    sor = fake(clock, latency_secs=1.0)
    async with running(TOOLS, tools(Bookings(sor)), ledger_url=ledger_url, clock=clock) as rt:
        talk = Conversation(
            rt, new_session(), [ToolCalls([("book_or_cancel", booking())]), Say("unused")]
        )
        await talk.run(
            [
                LLMRunFrame(),
                sent(clock, 1.0),
                InterruptionFrame(),  # the provider has not answered: it can still abort
                reaches(rt, "book_or_cancel", Status.CANCELLED),
                advance(clock, 1.0),  # an aborted request must not commit later
            ]
        )
        op = await only_operation(rt, "book_or_cancel")
        final = await rt.wait(op.operation_id)
        trail = await rt.ledger.events(op.operation_id)

    assert final.status is Status.CANCELLED
    assert transitions(trail) == [Status.CANCEL_REQUESTED, Status.CANCELLED]
    assert sor.calls["cancel_pending"] == 1
    assert sor.side_effects["book"] == 0


async def test_a_barge_in_with_request_cancel_after_the_commit_reports_committed(
    tmp_path: Any,
) -> None:
    # The provider is slow to cancel (0.6 s): the booking commits at 0.5 s, before it acts.
    clock = ScriptClock()
    sor = fake(clock, latency_secs=0.5, slow_cancel_secs=0.6)
    async with running(
        TOOLS,
        tools(Bookings(sor)),
        ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
        clock=clock,
    ) as rt:
        talk = Conversation(
            rt, new_session(), [ToolCalls([("book_or_cancel", booking())]), Say("unused")]
        )

        async def cancel_answered() -> None:
            async def check() -> bool:
                op = await only_operation(rt, "book_or_cancel")
                trail = await rt.ledger.events(op.operation_id)
                return any("cancel_answer" in a for a in annotations(trail))

            await until(check, what="the provider's answer to the cancel")

        await talk.run(
            [
                LLMRunFrame(),
                sent(clock, 0.5),
                InterruptionFrame(),
                reaches(rt, "book_or_cancel", Status.CANCEL_REQUESTED),
                sent(clock, 0.6),  # the provider is working on the cancel
                advance(clock, 0.5),  # the booking commits first
                reaches(rt, "book_or_cancel", Status.COMMITTED),
                advance(clock, 0.1),  # then the cancel acts: too late
                cancel_answered,
            ]
        )
        op = await only_operation(rt, "book_or_cancel")
        final = await rt.wait(op.operation_id)
        trail = await rt.ledger.events(op.operation_id)

    assert final.status is Status.COMMITTED
    assert transitions(trail) == [Status.CANCEL_REQUESTED, Status.COMMITTED]
    assert {"cancel_answer": "too_late"} in annotations(trail)
    assert sor.side_effects["book"] == 1


async def test_a_slow_cancel_stays_requested_until_the_provider_confirms(tmp_path: Any) -> None:
    clock = ScriptClock()
    sor = fake(clock, latency_secs=1.5, slow_cancel_secs=0.4)
    async with running(
        TOOLS,
        tools(Bookings(sor)),
        ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
        clock=clock,
    ) as rt:
        talk = Conversation(
            rt, new_session(), [ToolCalls([("book_or_cancel", booking())]), Say("unused")]
        )
        await talk.run(
            [
                LLMRunFrame(),
                sent(clock, 1.5),
                InterruptionFrame(),
                reaches(rt, "book_or_cancel", Status.CANCEL_REQUESTED),
                sent(clock, 0.4),  # the provider is working on the cancel
                still(rt, "book_or_cancel", Status.CANCEL_REQUESTED),
                advance(clock, 0.4),  # it confirms
                reaches(rt, "book_or_cancel", Status.CANCELLED),
                advance(clock, 1.1),  # an aborted request must not commit later
            ]
        )
        op = await only_operation(rt, "book_or_cancel")
        final = await rt.wait(op.operation_id)
        trail = await rt.ledger.events(op.operation_id)

    assert final.status is Status.CANCELLED
    requested = next(e for e in trail if e.to_status is Status.CANCEL_REQUESTED)
    cancelled = next(e for e in trail if e.to_status is Status.CANCELLED)
    assert cancelled.at == requested.at + 0.4, "CANCELLED was written before the provider said so"
    assert sor.side_effects["book"] == 0


async def test_a_background_booking_delivers_its_committed_result_after_a_barge_in(
    ledger_url: str,
) -> None:
    clock = ScriptClock()
    sor = fake(clock)
    async with running(TOOLS, tools(Bookings(sor)), ledger_url=ledger_url, clock=clock) as rt:
        script = [ToolCalls([("book_in_background", booking())]), Say("It is booked.")]
        talk = Conversation(rt, new_session(), script)
        messages = await talk.run(
            [
                LLMRunFrame(),
                sent(clock, 0.5),
                InterruptionFrame(),
                talk.barge_in_passed(),
                advance(clock, 0.5),  # the provider answers after the barge-in
                talk.told("call_1", "committed"),
            ]
        )
        op = await only_operation(rt, "book_in_background")
        final = await rt.wait(op.operation_id)

    told = tool_results(messages)["call_1"]
    assert final.status is Status.COMMITTED
    assert told["status"] == "committed"
    assert told["operation_id"] == op.operation_id
    assert told["result"] == {"booking_id": "bk_0001", "time": "21:00"}
    assert sor.side_effects["book"] == 1


async def test_a_background_booking_with_a_lost_answer_tells_the_model_it_is_unknown(
    tmp_path: Any,
) -> None:
    clock = ScriptClock()
    sor = fake(clock, latency_secs=0.3, honours_idempotency_keys=False)
    sor.faults.lose_response_after_commit("book")
    async with running(
        TOOLS,
        tools(Bookings(sor), reconcile=None),
        ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
        clock=clock,
    ) as rt:
        script = [ToolCalls([("book_in_background", booking())]), Say("I am checking.")]
        talk = Conversation(rt, new_session(), script)
        messages = await talk.run(
            [
                LLMRunFrame(),
                sent(clock, 0.3),
                InterruptionFrame(),
                talk.barge_in_passed(),
                advance(clock, 0.3),  # the provider commits, and its answer is lost
                talk.told("call_1", "unknown"),
            ]
        )
        op = await only_operation(rt, "book_in_background")
        [final] = await gather_all(rt.wait(op.operation_id))

    told = tool_results(messages)["call_1"]
    assert final.status is Status.UNKNOWN
    assert final.escalated_at is not None
    assert told["status"] == "unknown"
    assert "not yet known" in told["message"]
    assert "result" not in told
    assert sor.side_effects["book"] == 1
