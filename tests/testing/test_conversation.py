"""`run_conversation`: whole voice conversations offline, through Pipecat's real pipeline.

A `ScriptedLLM` answers, `FakeTTS` speaks, `FakeTransport` plays in real time, and user turns
go through the real user aggregator. Each test keeps its utterances short so it runs in well
under 5 s of wall time (enforced with ``pytest.mark.timeout``).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from pipecat.frames.frames import (
    BotStartedSpeakingFrame,
    BotStoppedSpeakingFrame,
    Frame,
    FunctionCallResultFrame,
    InterruptionFrame,
    LLMContextFrame,
    TTSAudioRawFrame,
    TTSTextFrame,
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.llm_service import FunctionCallParams

from pipecat_actions.testing.conversation import (
    BargeIn,
    ConversationResult,
    UserSays,
    Wait,
    WaitUntilIdle,
    run_conversation,
)
from pipecat_actions.testing.llm import Say, ScriptedLLM, ToolCalls
from pipecat_actions.testing.transport import offline_user_params
from pipecat_actions.testing.tts import FakeTTS

pytestmark = pytest.mark.timeout(5)

DOWN = FrameDirection.DOWNSTREAM
UP = FrameDirection.UPSTREAM


class FrameLog(FrameProcessor):
    """A pass-through processor that remembers what it saw, and which way."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[FrameDirection, Frame]] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        self.seen.append((direction, frame))
        await self.push_frame(frame, direction)

    def saw(self, frame_type: type[Frame], direction: FrameDirection) -> bool:
        return any(isinstance(f, frame_type) and d == direction for d, f in self.seen)


def _played_by_transport(result: ConversationResult) -> list[tuple[float, Frame]]:
    """Audio chunks the output transport played (it pushes each one on once written)."""
    return [
        (o.at_secs, o.frame)
        for o in result.frames
        if isinstance(o.frame, TTSAudioRawFrame) and o.source.startswith("FakeOutputTransport")
    ]


async def test_the_user_hears_the_scripted_answer_while_the_bot_speaks() -> None:
    llm = ScriptedLLM([Say("Hello! How can I help?")])

    result = await run_conversation(
        [UserSays("Hi there")], llm=llm, tts=FakeTTS(secs_per_char=0.02)
    )

    assert result.heard_texts == ["Hello!", "How can I help?"]
    assert result.spoken == ["Hello!", "How can I help?"]
    assert len(result.frames_of(BotStartedSpeakingFrame, DOWN)) == 1
    assert len(result.frames_of(BotStoppedSpeakingFrame, DOWN)) == 1
    started = result.frames_of(BotStartedSpeakingFrame, DOWN)[0]
    stopped = result.frames_of(BotStoppedSpeakingFrame, DOWN)[0]
    times = {id(o.frame): o.at_secs for o in result.frames}
    spoken_secs = times[id(stopped)] - times[id(started)]
    assert spoken_secs >= sum(u.played_secs for u in result.heard) - 0.05
    assert result.context_messages == [
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello! How can I help?"},
    ]


async def test_barge_in_cuts_a_long_answer_and_its_audio_stops() -> None:
    tts = FakeTTS(secs_per_char=0.05)
    long_answer = "Let me tell you everything about our menu, starting with the starters"
    llm = ScriptedLLM([Say(long_answer), Say("Sure.")])

    result = await run_conversation(
        [UserSays("What is on the menu?"), BargeIn("Just the specials", after_secs=0.4)],
        llm=llm,
        tts=tts,
    )

    assert result.heard_texts == [f"{long_answer} [interrupted]", "Sure."]
    cut = result.heard[0]
    assert 0.3 <= cut.played_secs < tts.duration_secs(long_answer) / 2
    # No audio of the cut answer was played after the interruption.
    interrupted_at = next(
        o.at_secs
        for o in result.frames
        if isinstance(o.frame, InterruptionFrame) and o.at_secs > cut.started_at_secs
    )
    resumed_at = result.heard[1].started_at_secs
    played_at = [t for t, _ in _played_by_transport(result)]
    assert any(t < interrupted_at for t in played_at)
    assert [t for t in played_at if interrupted_at + 0.05 < t < resumed_at] == []
    assert len(result.frames_of(BotStoppedSpeakingFrame, DOWN)) == 2
    # The cut sentence never reached the context: only what was heard in full is written.
    assert result.context_messages == [
        {"role": "user", "content": "What is on the menu?"},
        {"role": "user", "content": "Just the specials"},
        {"role": "assistant", "content": "Sure."},
    ]


async def test_a_wordless_barge_in_cuts_the_bot_and_pipecat_asks_the_user_to_repeat() -> None:
    llm = ScriptedLLM([Say("Our specials today are many and varied"), Say("Sorry?")])

    result = await run_conversation(
        [UserSays("Specials?"), BargeIn(None, after_secs=0.2)],
        llm=llm,
        tts=FakeTTS(secs_per_char=0.05),
        user_params=offline_user_params(user_turn_stop_timeout_secs=0.5),
    )

    assert result.heard_texts == ["Our specials today are many and varied [interrupted]", "Sorry?"]
    roles = [m["role"] for m in result.context_messages]  # type: ignore[index]
    assert roles == ["user", "developer", "assistant"]


async def test_a_tool_result_leads_to_a_second_spoken_answer() -> None:
    calls: list[dict[str, Any]] = []

    async def book_table(params: FunctionCallParams) -> None:
        calls.append(dict(params.arguments))
        await asyncio.sleep(0.1)
        await params.result_callback({"status": "booked", "booking_id": "b1"})

    llm = ScriptedLLM(
        [ToolCalls([("book_table", {"party_size": 2})]), Say("Your table is booked.")]
    )
    llm.register_function("book_table", book_table)

    result = await run_conversation(
        [UserSays("A table for two, please")], llm=llm, tts=FakeTTS(secs_per_char=0.02)
    )

    assert calls == [{"party_size": 2}]
    assert llm.inferences == 2
    assert result.heard_texts == ["Your table is booked."]
    messages: list[Any] = result.context_messages
    assert messages[0] == {"role": "user", "content": "A table for two, please"}
    assert messages[1]["role"] == "assistant"
    assert messages[1]["tool_calls"][0]["function"]["name"] == "book_table"
    assert messages[2] == {
        "role": "tool",
        "content": '{"status": "booked", "booking_id": "b1"}',
        "tool_call_id": "call_1",
    }
    assert messages[3] == {"role": "assistant", "content": "Your table is booked."}


async def test_extra_processors_sit_after_the_user_aggregator_and_before_the_assistant_one() -> (
    None
):
    async def lookup(params: FunctionCallParams) -> None:
        await params.result_callback({"open": True})

    llm = ScriptedLLM([ToolCalls([("lookup", {})]), Say("We are open.")])
    llm.register_function("lookup", lookup)
    after_user, before_assistant = FrameLog(), FrameLog()

    result = await run_conversation(
        [UserSays("Are you open?")],
        llm=llm,
        tts=FakeTTS(secs_per_char=0.02),
        after_user_aggregator=[after_user],
        before_assistant_aggregator=[before_assistant],
    )

    assert result.heard_texts == ["We are open."]
    # Between the user aggregator and the LLM: context frames down, tool results up.
    assert after_user.saw(LLMContextFrame, DOWN)
    assert after_user.saw(FunctionCallResultFrame, UP)
    assert not after_user.saw(TTSTextFrame, DOWN)
    # Between the output transport and the assistant aggregator: what the aggregator sees.
    assert before_assistant.saw(FunctionCallResultFrame, DOWN)
    assert before_assistant.saw(TTSTextFrame, DOWN)
    assert before_assistant.saw(BotStartedSpeakingFrame, DOWN)
    assert before_assistant.saw(LLMContextFrame, UP)


async def test_user_says_at_a_given_time_and_wait_steps_pace_the_script() -> None:
    llm = ScriptedLLM([Say("One."), Say("Two.")])

    started = time.monotonic()
    result = await run_conversation(
        [UserSays("first"), Wait(0.2), UserSays("second", at_secs=1.8)],
        llm=llm,
        tts=FakeTTS(secs_per_char=0.02),
    )

    assert time.monotonic() - started >= 1.8
    assert result.heard_texts == ["One.", "Two."]
    assert result.heard[1].started_at_secs >= 1.8


async def test_waiting_for_idle_fails_naming_the_open_function_call() -> None:
    async def never_answers(params: FunctionCallParams) -> None:
        await asyncio.sleep(30)

    llm = ScriptedLLM([ToolCalls([("slow", {})])])
    llm.register_function("slow", never_answers)

    started = time.monotonic()
    with pytest.raises(TimeoutError, match=r"idle not reached.*function call"):
        await run_conversation(
            [UserSays("Do the slow thing"), WaitUntilIdle(timeout_secs=1.0)],
            llm=llm,
            settle=None,
        )
    assert time.monotonic() - started < 4  # the pipeline was cancelled, not left running
