"""The frame contract of the processors: what they do not act on passes unchanged, in order.

Pinned with Pipecat's own `run_test(..., expected_down_frames=...)` (issue 13, item 14): every
frame the gate, the tracker and the status reporter do not act on leaves them as the same
object, in the order it came, whichever direction it travels; the speaking and turn frames they
watch pass too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pipecat.frames.frames import (
    BotStartedSpeakingFrame,
    BotStoppedSpeakingFrame,
    Frame,
    InterimTranscriptionFrame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    OutputAudioRawFrame,
    SystemFrame,
    TextFrame,
    TranscriptionFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
    TTSTextFrame,
    UserStartedSpeakingFrame,
    UserStoppedSpeakingFrame,
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.tests.utils import run_test

from pipecat_actions import ActionContext, ActionRuntime, AllowAll, SessionState, action
from pipecat_actions.adapters import (
    ActionResultGate,
    ActionStatusReporter,
    ActionTurnTracker,
)
from pipecat_actions.policy import load_policy_text
from tests._waiting import HANG_GUARD_SECS

POLICY = 'version: 1\ntools:\n  book_table:\n    kind: mutation\n    resource: "table:{time}"\n'


def queued_frames() -> list[Frame]:
    """Data and control frames of an ordinary turn that neither processor acts on."""
    return [
        InterimTranscriptionFrame(text="book a", user_id="u", timestamp="t"),
        TranscriptionFrame(text="book a table", user_id="u", timestamp="t"),
        LLMFullResponseStartFrame(),
        LLMTextFrame(text="Sure"),
        TextFrame(text=", one moment."),
        TTSStartedFrame(),
        OutputAudioRawFrame(audio=b"\x00\x01" * 160, sample_rate=16000, num_channels=1),
        TTSTextFrame(text="Sure", text_type="word"),
        TTSStoppedFrame(),
        LLMFullResponseEndFrame(),
    ]


def system_frames() -> list[Frame]:
    """The speaking and interruption frames the processors watch and pass on."""
    return [
        UserStartedSpeakingFrame(),
        UserStoppedSpeakingFrame(),
        BotStartedSpeakingFrame(),
        BotStoppedSpeakingFrame(),
        InterruptionFrame(),
    ]


def passing_frames() -> list[Frame]:
    """A turn: system frames among the others, as a transport interleaves them."""
    queued, system = queued_frames(), system_frames()
    return [
        system[0], *queued[:2], system[1], *queued[2:5], system[2], *queued[5:8], system[3],
        *queued[8:], system[4],
    ]  # fmt: skip


@pytest.fixture
async def runtime(tmp_path: Path) -> Any:
    @action
    async def book_table(ctx: ActionContext, time: str) -> dict[str, Any]:
        """Book a table."""
        return {"time": time}

    made = await ActionRuntime.create(
        load_policy_text(POLICY),
        authorizer=AllowAll(),
        actions=[book_table],
        ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
    )
    yield made
    await made.close()


def _processors(runtime: ActionRuntime) -> list[FrameProcessor]:
    session = SessionState(session_id="call-1", principal="alice")
    return [
        ActionResultGate(runtime, session),
        ActionTurnTracker(session),
        ActionStatusReporter(runtime, session),
    ]


PROCESSORS = {"argvalues": [0, 1, 2], "ids": ["gate", "tracker", "reporter"]}


@pytest.mark.parametrize("which", **PROCESSORS)
@pytest.mark.parametrize("frames", [queued_frames, system_frames], ids=["queued", "system"])
async def test_frames_not_acted_on_pass_downstream_unchanged_and_in_order(
    runtime: ActionRuntime, which: int, frames: Any
) -> None:
    sent = frames()
    down, up = await run_test(
        _processors(runtime)[which],
        frames_to_send=sent,
        expected_down_frames=[type(f) for f in sent],
        start_timeout=HANG_GUARD_SECS,
    )
    assert [id(f) for f in down] == [id(f) for f in sent]  # the same objects
    assert up == []


@pytest.mark.parametrize("which", **PROCESSORS)
async def test_a_mixed_turn_keeps_the_order_within_each_kind_of_frame(
    runtime: ActionRuntime, which: int
) -> None:
    # Pipecat lets system frames overtake queued ones (they skip the input queue); the
    # processors add no reordering of their own: each kind keeps its order, nothing is lost.
    sent = passing_frames()
    down, _ = await run_test(
        _processors(runtime)[which], frames_to_send=sent, start_timeout=HANG_GUARD_SECS
    )
    assert sorted(map(id, down)) == sorted(map(id, sent))
    assert [id(f) for f in down if isinstance(f, SystemFrame)] == [
        id(f) for f in sent if isinstance(f, SystemFrame)
    ]
    assert [id(f) for f in down if not isinstance(f, SystemFrame)] == [
        id(f) for f in sent if not isinstance(f, SystemFrame)
    ]


@pytest.mark.parametrize("which", **PROCESSORS)
async def test_frames_travelling_upstream_pass_unchanged_and_in_order(
    runtime: ActionRuntime, which: int
) -> None:
    sent: list[Frame] = [TextFrame(text="a"), LLMTextFrame(text="b"), TextFrame(text="c")]
    _, up = await run_test(
        _processors(runtime)[which],
        frames_to_send=sent,
        frames_to_send_direction=FrameDirection.UPSTREAM,
        expected_up_frames=[type(f) for f in sent],
        start_timeout=HANG_GUARD_SECS,
    )
    assert [id(f) for f in up] == [id(f) for f in sent]


@pytest.mark.parametrize("which", [0, 2], ids=["gate", "reporter"])
async def test_results_of_a_tool_the_runtime_does_not_own_pass_as_they_are(
    runtime: ActionRuntime, which: int
) -> None:
    # An intermediate result asking for inference kept run_llm=False; a second final result
    # with a reused tool_call_id was dropped. Neither is the gate's business.
    from pipecat.frames.frames import FunctionCallResultFrame, FunctionCallResultProperties

    progress = FunctionCallResultFrame(
        function_name="weather",
        tool_call_id="w1",
        arguments={},
        result={"progress": "50%"},
        properties=FunctionCallResultProperties(run_llm=True, is_final=False),
    )
    first = FunctionCallResultFrame(
        function_name="weather", tool_call_id="w1", arguments={}, result={"temp": 20}
    )
    again = FunctionCallResultFrame(
        function_name="weather", tool_call_id="w1", arguments={}, result={"temp": 21}
    )
    sent: list[Frame] = [progress, first, again]
    down, _ = await run_test(
        _processors(runtime)[which],
        frames_to_send=sent,
        expected_down_frames=[FunctionCallResultFrame] * 3,
        start_timeout=HANG_GUARD_SECS,
    )
    assert [id(f) for f in down] == [id(f) for f in sent]
    assert progress.properties is not None and progress.properties.run_llm is True


@pytest.mark.parametrize("which", [0, 2], ids=["gate", "reporter"])
async def test_no_frame_waits_for_the_ledger(runtime: ActionRuntime, which: int) -> None:
    # The gate used to read the ledger inside process_frame (the supersession check of a
    # final result), holding every later frame of the pipeline behind a database round trip.
    # With the ledger's reads stalled, the result and the frames after it still pass.
    import asyncio

    from pipecat.frames.frames import FunctionCallResultFrame

    stalled = asyncio.Event()

    async def never(*_: Any, **__: Any) -> Any:
        await stalled.wait()

    ledger: Any = runtime.ledger
    ledger.get = never
    ledger.list = never
    ledger.annotate = never
    result = FunctionCallResultFrame(
        function_name="book_table",
        tool_call_id="c1",
        arguments={"time": "21:00"},
        result={"status": "committed", "operation_id": "op_x", "message": "Done."},
    )
    after = [TextFrame(text="Your table is booked."), LLMFullResponseEndFrame()]
    down, _ = await run_test(
        _processors(runtime)[which],
        frames_to_send=[result, *after],
        expected_down_frames=[FunctionCallResultFrame, TextFrame, LLMFullResponseEndFrame],
        start_timeout=HANG_GUARD_SECS,
    )
    assert [id(f) for f in down] == [id(result), *map(id, after)]
    stalled.set()
