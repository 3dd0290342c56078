"""What the user hears while an action runs: its progress reports.

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

from pipecat_actions import ActionRuntime, SessionState
from pipecat_actions.actions import ActionContext, action
from pipecat_actions.processors import ActionResultGate, ActionTurnTracker
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
        runtime.attach(self.llm, self.session)
        self.context = LLMContext(messages=[], tools=runtime.tools_schema())
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
