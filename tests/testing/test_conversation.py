"""`run_conversation`: whole voice conversations offline, through Pipecat's real pipeline.

A `ScriptedLLM` answers, `FakeTTS` speaks, `FakeTransport` plays in real time, and user turns
go through the real user aggregator. The tests check what happened and in which order (the
frames' push order, the transport's playback record), never how long anything took: the
script's timed steps run on a `ManualClock` where timing is the point, and the only limit on
real time is a hang guard.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest
from pipecat.frames.frames import (
    BotStartedSpeakingFrame,
    BotStoppedSpeakingFrame,
    Frame,
    FunctionCallResultFrame,
    LLMContextFrame,
    LLMFullResponseEndFrame,
    TTSAudioRawFrame,
    TTSTextFrame,
    VADUserStartedSpeakingFrame,
)
from pipecat.observers.base_observer import BaseObserver, FramePushed
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.llm_service import FunctionCallParams

from pipecat_actions.clock import ManualClock
from pipecat_actions.testing.conversation import (
    BargeIn,
    ConversationResult,
    UserSays,
    Wait,
    WaitUntilIdle,
    run_conversation,
)
from pipecat_actions.testing.llm import Say, ScriptedLLM, ToolCalls
from pipecat_actions.testing.transport import (
    FakeTransport,
    offline_user_params,
)
from pipecat_actions.testing.tts import FakeTTS
from tests._waiting import HANG_GUARD_SECS, eventually
from tests.testing.test_tts_transport import _chunks_for, _played

pytestmark = pytest.mark.timeout(120)  # a hang guard: a healthy run takes seconds

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


async def _until(check: Callable[[], bool], what: str) -> None:
    """Poll until ``check()`` holds; only a hang reaches the bound."""
    await eventually(check, what=what)


def _indices(result: ConversationResult, match: Callable[[Any], bool]) -> list[int]:
    return [i for i, o in enumerate(result.frames) if match(o)]


def _played_by_transport(o: Any) -> bool:
    """An audio chunk the output transport played (it pushes each one on once written)."""
    return isinstance(o.frame, TTSAudioRawFrame) and o.source.startswith("FakeOutputTransport")


async def test_the_user_hears_the_scripted_answer_while_the_bot_speaks() -> None:
    llm = ScriptedLLM([Say("Hello! How can I help?")])
    transport = FakeTransport()

    result = await run_conversation(
        [UserSays("Hi there")], llm=llm, tts=FakeTTS(secs_per_char=0.02), transport=transport
    )

    assert result.heard_texts == ["Hello!", "How can I help?"]
    assert result.spoken == ["Hello!", "How can I help?"]
    assert len(result.frames_of(BotStartedSpeakingFrame, DOWN)) == 1
    assert len(result.frames_of(BotStoppedSpeakingFrame, DOWN)) == 1
    # Every chunk the user heard was played while the bot was speaking, in push order.
    [started] = _indices(
        result, lambda o: isinstance(o.frame, BotStartedSpeakingFrame) and o.direction == DOWN
    )
    [stopped] = _indices(
        result, lambda o: isinstance(o.frame, BotStoppedSpeakingFrame) and o.direction == DOWN
    )
    chunks = _indices(result, _played_by_transport)
    assert started < min(chunks) and max(chunks) < stopped
    output = transport.output()
    assert len(chunks) == len(_played(output))
    assert list(dict.fromkeys(e.text for e in _played(output))) == ["Hello!", "How can I help?"]
    assert [e.kind for e in output.playback][-1] == "ended"
    assert result.context_messages == [
        {"role": "user", "content": "Hi there"},
        {"role": "assistant", "content": "Hello! How can I help?"},
    ]


async def test_barge_in_cuts_a_long_answer_and_its_audio_stops() -> None:
    tts = FakeTTS(secs_per_char=0.05)
    transport = FakeTransport()
    long_answer = "Let me tell you everything about our menu, starting with the starters"
    llm = ScriptedLLM([Say(long_answer), Say("Sure.")])
    after_secs = 0.4

    result = await run_conversation(
        [UserSays("What is on the menu?"), BargeIn("Just the specials", after_secs=after_secs)],
        llm=llm,
        tts=tts,
        transport=transport,
    )

    assert result.heard_texts == [f"{long_answer} [interrupted]", "Sure."]
    output = transport.output()
    events = output.playback
    first = events.index(_played(output, long_answer)[0])
    cut_at = next(i for i, e in enumerate(events) if i > first and e.kind == "interrupted")
    before = [e for e in events[:cut_at] if e.kind == "played" and e.text == long_answer]
    after = [e for e in events[cut_at:] if e.kind == "played" and e.text == long_answer]
    # The user cut in once the bot had played the audio the step waits for, and the rest
    # of the answer was dropped: past the interruption, only the chunk being written played.
    assert sum(e.secs for e in before) >= after_secs - 1e-6
    assert len(after) <= 1
    answer_chunks = _played(output, long_answer)
    assert len(answer_chunks) < _chunks_for(tts.duration_secs(long_answer))
    assert result.heard[0].played_secs == pytest.approx(sum(e.secs for e in answer_chunks))
    # What played next is the answer to the barge-in (audio of no text, silence the output
    # pads with on a busy machine, says nothing).
    later = [
        e.text
        for e in events[cut_at:]
        if e.kind == "played" and e.text is not None and e.text != long_answer
    ]
    assert later and set(later) == {"Sure."}
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
    before_assistant = FrameLog()

    async def book_table(params: FunctionCallParams) -> None:
        calls.append(dict(params.arguments))
        # The result comes once the response that made the call has ended, as from a
        # provider that takes a moment: the call is in progress across the end.
        await _until(
            lambda: before_assistant.saw(LLMFullResponseEndFrame, DOWN), "the response ends"
        )
        await params.result_callback({"status": "booked", "booking_id": "b1"})

    llm = ScriptedLLM(
        [ToolCalls([("book_table", {"party_size": 2})]), Say("Your table is booked.")]
    )
    llm.register_function("book_table", book_table)

    result = await run_conversation(
        [UserSays("A table for two, please")],
        llm=llm,
        tts=FakeTTS(secs_per_char=0.02),
        before_assistant_aggregator=[before_assistant],
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


class _UserTurnClock(BaseObserver):
    """Notes the script clock's reading when each user turn's VAD start enters the pipeline,
    and counts the times the bot stopped speaking."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__(observe_every_push=False)
        self._clock = clock
        self.turns_at: list[float] = []
        self.bot_stopped = 0

    async def on_push_frame(self, data: FramePushed) -> None:
        if isinstance(data.frame, VADUserStartedSpeakingFrame):
            self.turns_at.append(self._clock.now())
        elif isinstance(data.frame, BotStoppedSpeakingFrame) and data.direction == DOWN:
            self.bot_stopped += 1


async def test_user_says_at_a_given_time_and_wait_steps_pace_the_script() -> None:
    clock = ManualClock(start=0.0)
    llm = ScriptedLLM([Say("One."), Say("Two.")])
    turns = _UserTurnClock(clock)
    transport = FakeTransport()

    conversation = asyncio.create_task(
        run_conversation(
            [UserSays("first"), Wait(0.2), UserSays("second", at_secs=1.8)],
            llm=llm,
            tts=FakeTTS(secs_per_char=0.02),
            transport=transport,
            observers=[turns],
            clock=clock,
        )
    )
    try:
        # The first turn is spoken, then the script waits on the clock: Wait(0.2).
        await _until(lambda: clock.sleepers == 1, "the script waits 0.2 s")
        await _until(lambda: len(turns.turns_at) == 1, "the first user turn")
        clock.advance(0.1)
        assert clock.sleepers == 1  # half the wait: still waiting
        clock.advance(0.1)
        # Over; the second turn waits for 1.8 s after the start, 1.6 s more.
        await _until(lambda: clock.sleepers == 1, "the script waits for at_secs")
        clock.advance(1.5)
        assert clock.sleepers == 1  # 1.7 s: still waiting, nothing said
        # Meanwhile the first exchange ends (in real time, as a conversation does).
        await _until(lambda: turns.bot_stopped == 1, "the first answer is over")
        assert transport.output().heard_texts == ["One."]
        assert clock.sleepers == 1 and turns.turns_at == [0.0]
        clock.advance(0.1)
        assert clock.sleepers == 0
        result = await asyncio.wait_for(conversation, HANG_GUARD_SECS)
    finally:
        conversation.cancel()

    assert turns.turns_at == [0.0, pytest.approx(1.8)]
    assert result.heard_texts == ["One.", "Two."]
    assert llm.inferences == 2


async def test_waiting_for_idle_fails_naming_the_open_function_call() -> None:
    handler: list[str] = []

    async def never_answers(params: FunctionCallParams) -> None:
        handler.append("started")
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            handler.append("cancelled")
            raise

    llm = ScriptedLLM([ToolCalls([("slow", {})])])
    llm.register_function("slow", never_answers)
    transport = FakeTransport()

    with pytest.raises(TimeoutError, match=r"idle not reached.*function call"):
        await run_conversation(
            [UserSays("Do the slow thing"), WaitUntilIdle(timeout_secs=1.0)],
            llm=llm,
            transport=transport,
            settle=None,
        )

    # The pipeline was cancelled, not left running: the call's task with it.
    assert handler == ["started", "cancelled"]
    assert [e.kind for e in transport.output().playback][-1:] == ["cancelled"]
