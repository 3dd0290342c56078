"""What the user hears while an action runs: its progress reports, and a blocking tool's filler.

A real cascade (Pipecat's aggregators, `FakeTTS`, the offline output transport, the tracker and
the gate) around `ScriptedLLM`; the provider and the runtime run on a `ScriptClock`, so the
silence before a filler line and the provider's answer last exactly as long as the script
moves the clock. Only playback is real time, and no test measures it: each waits for a cause
(nobody speaking, a sleep asked of the clock, a line heard).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from pipecat.processors.aggregators.llm_context import LLMContext

from pipecat_actions import ActionRuntime, SessionState, attach, tools_schema
from pipecat_actions.actions import ActionContext, action
from pipecat_actions.adapters import ActionResultGate, ActionTurnTracker
from pipecat_actions.status import ActionStatus
from pipecat_actions.testing import (
    Call,
    ConversationResult,
    FakeSystemOfRecord,
    FakeTTS,
    Say,
    ScriptedLLM,
    ToolCalls,
    UserSays,
    WaitUntilIdle,
    run_conversation,
)
from tests.processors._clocked import ScriptClock, until
from tests.runtime._execution_support import annotations, booking, running

pytestmark = pytest.mark.timeout(60)

S = ActionStatus
FILLER = "Still working on it, one moment."


@asynccontextmanager
async def restaurant(
    tmp_path: Path, tool_policy: str, *, latency_secs: float
) -> AsyncIterator[tuple[ActionRuntime, FakeSystemOfRecord, ScriptClock]]:
    """``book_table`` under ``tool_policy``; its effect reports progress before it sends."""
    clock = ScriptClock()
    sor = FakeSystemOfRecord(clock=clock)
    sor.add_restaurant("r1", tables=3)
    sor.faults.set_latency(latency_secs)

    @action
    async def book_table(
        ctx: ActionContext, restaurant_id: str, date: str, time: str, party_size: int
    ) -> dict[str, Any]:
        """Book a table."""
        await ctx.report("The restaurant has a table; confirming it now.", step=1, of=2)
        made = await sor.book(
            restaurant_id,
            date,
            time,
            party_size,
            ctx.principal,
            idempotency_key=ctx.idempotency_key,
        )
        return {"booking_id": made.booking_id}

    text = "version: 1\ntools:\n  book_table:\n    kind: mutation\n" + tool_policy
    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    async with running(text, [book_table], ledger_url=ledger_url, clock=clock) as runtime:
        yield runtime, sor, clock


class Talk:
    """One conversation through the template's processors, around the booking runtime."""

    def __init__(self, runtime: ActionRuntime, script: Sequence[Any]) -> None:
        self.runtime = runtime
        self.session = SessionState(session_id="call-1", principal="alice")
        self.llm = ScriptedLLM(script)
        attach(runtime, self.llm, self.session)
        self.context = LLMContext(messages=[], tools=tools_schema(runtime))
        self.tts = FakeTTS(secs_per_char=0.01)
        self.idle = Call(self._idle)

    async def run(self, steps: Sequence[Any]) -> ConversationResult:
        return await run_conversation(
            steps,
            llm=self.llm,
            tts=self.tts,
            context=self.context,
            after_user_aggregator=[ActionTurnTracker(self.session)],
            before_assistant_aggregator=[ActionResultGate(self.runtime, self.session)],
        )

    async def _idle(self) -> None:
        """Nobody speaks, as the session knows it (what the filler counts silence by)."""
        await until(lambda: self.session.silent, what="silence")

    def spoken(self, text: str, times: int = 1) -> Call:
        """Wait until the TTS was asked to say ``text`` ``times`` times."""
        return Call(
            lambda: until(lambda: self.tts.spoken.count(text) >= times, what=f"{text!r} said")
        )


def advance(clock: ScriptClock, secs: float) -> Call:
    async def step() -> None:
        clock.advance(secs)

    return Call(step)


def outcome(runtime: ActionRuntime, status: S) -> Call:
    async def step() -> None:
        async def check() -> bool:
            ops = await runtime.ledger.list()
            return len(ops) == 1 and ops[0].status is status

        await until(check, what=f"the booking {status}")

    return Call(step)


BOOK = ToolCalls([("book_table", booking())])


# --- the filler line ---------------------------------------------------------------------


async def test_the_filler_is_said_once_after_the_silence_and_before_the_outcome(
    tmp_path: Path,
) -> None:
    filler = f"    delivery: {{filler: {{after_secs: 4, text: '{FILLER}'}}}}\n"
    async with restaurant(tmp_path, filler, latency_secs=10.0) as (rt, sor, clock):
        talk = Talk(rt, [BOOK, Say("Your table is booked.")])
        result = await talk.run(
            [
                UserSays("A table for two at nine, please."),
                Call(lambda: clock.asked(10.0)),  # at the provider
                WaitUntilIdle(function_calls=False),
                talk.idle,
                Call(lambda: clock.asked(4.0)),  # the filler counts the silence
                advance(clock, 3.5),
                WaitUntilIdle(function_calls=False),
                Call(lambda: _not_said(talk)),  # not yet: 3.5 s of silence
                advance(clock, 0.5),
                talk.spoken(FILLER),
                WaitUntilIdle(function_calls=False),  # the line was heard
                advance(clock, 4.0),  # silence again: at most once (times: 1)
                WaitUntilIdle(function_calls=False),
                advance(clock, 2.0),  # the provider answers
                outcome(rt, S.COMMITTED),
            ]
        )

    assert talk.tts.spoken.count(FILLER) == 1
    assert result.heard_texts == [FILLER, "Your table is booked."]  # neither cut off
    assert sor.side_effects["book"] == 1


async def _not_said(talk: Talk) -> None:
    assert FILLER not in talk.tts.spoken


async def test_the_filler_is_not_said_when_the_outcome_comes_first_and_at_most_as_often_as_set(
    tmp_path: Path,
) -> None:
    filler = f"    delivery: {{filler: {{after_secs: 4, text: '{FILLER}', times: 2}}}}\n"
    async with restaurant(tmp_path, filler, latency_secs=3.0) as (rt, sor, clock):
        later = ToolCalls([("book_table", booking("21:30"))])
        talk = Talk(rt, [BOOK, Say("Booked."), later, Say("Booked too.")])

        async def slower() -> None:
            sor.faults.set_latency(16.0)

        result = await talk.run(
            [
                # A quick booking: its outcome comes before 4 s of silence.
                UserSays("A table for two at nine, please."),
                Call(lambda: clock.asked(3.0)),
                WaitUntilIdle(function_calls=False),
                talk.idle,
                Call(lambda: clock.asked(4.0)),
                advance(clock, 3.0),
                outcomes(rt, 1),
                talk.spoken("Booked."),
                WaitUntilIdle(),
                advance(clock, 8.0),  # long after its outcome: no line for it, ever
                WaitUntilIdle(),
                Call(lambda: _not_said(talk)),
                # A slow one: the line after each 4 s of silence, twice at most.
                Call(slower),
                UserSays("And one at half past nine."),
                Call(lambda: clock.asked(16.0)),
                WaitUntilIdle(function_calls=False),
                talk.idle,
                advance(clock, 4.0),
                talk.spoken(FILLER),
                WaitUntilIdle(function_calls=False),
                talk.idle,
                advance(clock, 4.0),
                talk.spoken(FILLER, times=2),
                WaitUntilIdle(function_calls=False),
                talk.idle,
                advance(clock, 4.0),  # a third stretch of silence: nothing more is said
                WaitUntilIdle(function_calls=False),
                advance(clock, 4.0),  # the provider answers
                outcomes(rt, 2),
                talk.spoken("Booked too."),
            ]
        )

    assert talk.tts.spoken.count(FILLER) == 2
    assert result.heard_texts == ["Booked.", FILLER, FILLER, "Booked too."]
    assert sor.side_effects["book"] == 2


def outcomes(runtime: ActionRuntime, committed: int) -> Call:
    """Wait until ``committed`` bookings have committed."""

    async def step() -> None:
        async def check() -> bool:
            ops = await runtime.ledger.list()
            return sum(op.status is S.COMMITTED for op in ops) >= committed

        await until(check, what=f"{committed} bookings committed")

    return Call(step)


# --- progress reports --------------------------------------------------------------------


async def test_a_progress_report_reaches_the_user_when_idle_and_is_in_the_audit_trail(
    tmp_path: Path,
) -> None:
    policy = "    mode: background\n    delivery: {intermediate: when_idle}\n"
    async with restaurant(tmp_path, policy, latency_secs=5.0) as (rt, _sor, clock):
        talk = Talk(
            rt, [BOOK, Say("They have a table; I'm confirming it."), Say("Your table is booked.")]
        )
        result = await talk.run(
            [
                UserSays("A table for two at nine, please."),
                Call(lambda: clock.asked(5.0)),  # reported, then sent
                talk.spoken("They have a table; I'm confirming it."),
                WaitUntilIdle(function_calls=False),
                advance(clock, 5.0),
                outcome(rt, S.COMMITTED),
                talk.spoken("Your table is booked."),
            ]
        )
        [op] = await rt.ledger.list()
        trail = await rt.ledger.events(op.operation_id)

    progress = [m for m in result.context_messages if "Progress of the book_table" in str(m)]
    [told] = progress
    assert told["role"] == "developer"
    assert "The restaurant has a table; confirming it now." in told["content"]
    assert "not its outcome" in told["content"]
    assert result.heard_texts == [
        "They have a table; I'm confirming it.",
        "Your table is booked.",
    ]
    assert {
        "progress": "The restaurant has a table; confirming it now.",
        "attempt": 1,
        "details": {"step": 1, "of": 2},
    } in annotations(trail)
    assert op.status is S.COMMITTED


async def test_a_silent_progress_report_goes_into_the_context_without_making_the_bot_speak(
    tmp_path: Path,
) -> None:
    # delivery.intermediate defaults to silent.
    async with restaurant(tmp_path, "    mode: background\n", latency_secs=5.0) as (
        rt,
        _sor,
        clock,
    ):
        talk = Talk(rt, [BOOK, Say("Your table is booked.")])

        def told() -> bool:
            return any("Progress of the book_table" in str(m) for m in talk.context.get_messages())

        result = await talk.run(
            [
                UserSays("A table for two at nine, please."),
                Call(lambda: clock.asked(5.0)),
                Call(lambda: until(told, what="the progress in the context")),
                WaitUntilIdle(function_calls=False),
                advance(clock, 5.0),
                outcome(rt, S.COMMITTED),
                talk.spoken("Your table is booked."),
            ]
        )

    assert talk.llm.inferences == 2  # the user's turn, then the outcome: none for progress
    assert result.heard_texts == ["Your table is booked."]
    assert "confirming it now" in json.dumps(result.context_messages)
