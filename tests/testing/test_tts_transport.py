"""`FakeTTS` and `FakeTransport` in real Pipecat pipelines: frames, paced playback, barge-in.

Each test runs a real Pipecat pipeline (no mocks) around the real `TTSService` machinery, the
real `BaseOutputTransport` and the real user aggregator. Nothing here races the wall clock:
the output transport plays on a `ManualClock`, so the test decides how much audio has played
when the next frame arrives, and each next frame is sent once what it must follow has
happened (a frame came out, the clock has a sleeper), never after a sleep.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

import pytest
from pipecat.frames.frames import (
    AggregatedTextFrame,
    BotStartedSpeakingFrame,
    BotStoppedSpeakingFrame,
    EndFrame,
    Frame,
    InterruptionFrame,
    LLMContextFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
    StartFrame,
    TTSAudioRawFrame,
    TTSSpeakFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
    TTSTextFrame,
    UserStartedSpeakingFrame,
    UserStoppedSpeakingFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.workers.runner import WorkerRunner

from pipecat_actions.clock import ManualClock
from pipecat_actions.testing.transport import (
    FakeOutputTransport,
    FakeTransport,
    HeardUtterance,
    PlaybackEvent,
    offline_user_params,
    user_says,
    user_starts_speaking,
    user_stops_speaking,
)
from pipecat_actions.testing.tts import FakeTTS
from tests._waiting import HANG_GUARD_SECS, eventually

RATE = 16_000
PARAMS = PipelineParams(audio_in_sample_rate=RATE, audio_out_sample_rate=RATE)
CHUNK_SECS = 0.04
"""What the output transport plays at a time: Pipecat's default of four 10 ms chunks."""
"""Bound on any wait for a condition: only a hang gets there, however busy the machine."""

pytestmark = pytest.mark.timeout(120)


def _llm_says(text: str) -> list[Frame]:
    return [LLMFullResponseStartFrame(), LLMTextFrame(text), LLMFullResponseEndFrame()]


def _audio_secs(frames: Sequence[Frame]) -> float:
    return sum(
        len(f.audio) / (2 * f.sample_rate * f.num_channels)
        for f in frames
        if isinstance(f, TTSAudioRawFrame)
    )


def _chunks_for(secs: float) -> int:
    """How many chunks the transport plays for ``secs`` of audio (the last one padded)."""
    samples = math.ceil(secs * RATE)
    return math.ceil(samples / round(CHUNK_SECS * RATE))


def _played(output: FakeOutputTransport, text: str | None = None) -> list[PlaybackEvent]:
    return [e for e in output.playback if e.kind == "played" and (text is None or e.text == text)]


async def _until(check: Callable[[], bool], what: str) -> None:
    """Poll until ``check()`` holds; only a hang reaches the bound."""
    await eventually(check, what=what)


class _Collect(FrameProcessor):
    """Records the frames that reach it going one way, then passes them on."""

    def __init__(self, direction: FrameDirection, into: list[Frame]) -> None:
        super().__init__(enable_direct_mode=True)
        self._direction = direction
        self._into = into

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if direction == self._direction and not isinstance(frame, StartFrame):
            self._into.append(frame)
        await self.push_frame(frame, direction)


@dataclass
class _Run:
    """A running pipeline: what came out of each end, and a way in."""

    worker: PipelineWorker
    task: asyncio.Task[None]
    down: list[Frame] = field(default_factory=list)
    up: list[Frame] = field(default_factory=list)
    end_sent: bool = False

    async def send(self, *frames: Frame) -> None:
        self.end_sent = self.end_sent or any(isinstance(f, EndFrame) for f in frames)
        await self.worker.queue_frames(frames)

    def saw(self, frame_type: type[Frame]) -> bool:
        return any(isinstance(f, frame_type) for f in self.down)

    @property
    def ended(self) -> bool:
        return self.task.done()


@asynccontextmanager
async def _running(processor: FrameProcessor) -> AsyncIterator[_Run]:
    """Run ``processor`` between two collectors; send an ``EndFrame`` and wait for the end."""
    down: list[Frame] = []
    up: list[Frame] = []
    pipeline = Pipeline(
        [
            _Collect(FrameDirection.UPSTREAM, up),
            processor,
            _Collect(FrameDirection.DOWNSTREAM, down),
        ]
    )
    worker = PipelineWorker(
        pipeline,
        params=PARAMS,
        cancel_on_idle_timeout=False,
        idle_timeout_secs=None,
        enable_rtvi=False,
    )
    started = asyncio.Event()

    async def on_started(worker: PipelineWorker, frame: StartFrame) -> None:
        started.set()

    worker.add_event_handler("on_pipeline_started", on_started)
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    run = _Run(worker, asyncio.create_task(runner.run()), down, up)
    try:
        async with asyncio.timeout(HANG_GUARD_SECS):
            await started.wait()
        yield run
        if not run.end_sent:
            await run.send(EndFrame())
        async with asyncio.timeout(HANG_GUARD_SECS):
            await asyncio.shield(run.task)
    finally:
        if not run.task.done():
            await worker.cancel(reason="test failed")
            await run.task


async def _play_to_the_end(clock: ManualClock, run: _Run) -> None:
    """End the pipeline, letting the transport's clock run until it has ended."""
    if not run.end_sent:
        await run.send(EndFrame())
    async with asyncio.timeout(HANG_GUARD_SECS):
        while not run.ended:
            if clock.sleepers:
                clock.advance(CHUNK_SECS)
            await asyncio.sleep(0.005)


async def test_fake_tts_frames_a_sentence_like_an_http_tts_service() -> None:
    tts = FakeTTS(secs_per_char=0.01, chunk_secs=0.1)

    async with _running(tts) as run:
        await run.send(*_llm_says("Hello there, how are you?"), EndFrame())

    down = run.down
    kinds = [type(f) for f in down if not isinstance(f, TTSAudioRawFrame)]
    assert kinds == [
        LLMFullResponseStartFrame,
        AggregatedTextFrame,
        TTSStartedFrame,
        TTSTextFrame,
        TTSStoppedFrame,
        LLMFullResponseEndFrame,
        EndFrame,
    ]
    text_frame = next(f for f in down if isinstance(f, TTSTextFrame))
    assert text_frame.text == "Hello there, how are you?"
    assert text_frame.append_to_context
    audio = [f for f in down if isinstance(f, TTSAudioRawFrame)]
    assert len(audio) == 3  # 0.25 s in chunks of 0.1 s
    assert {f.sample_rate for f in audio} == {16_000}
    assert _audio_secs(down) == pytest.approx(tts.duration_secs("Hello there, how are you?"))
    # All of it between the start and the stop of the audio context.
    started, stopped = kinds.index(TTSStartedFrame), kinds.index(TTSStoppedFrame)
    audio_at = [i for i, f in enumerate(down) if isinstance(f, TTSAudioRawFrame)]
    non_audio_at = [i for i, f in enumerate(down) if not isinstance(f, TTSAudioRawFrame)]
    assert non_audio_at[started] < min(audio_at) and max(audio_at) < non_audio_at[stopped]
    assert tts.spoken == ["Hello there, how are you?"]


def test_fake_tts_length_is_proportional_with_a_minimum() -> None:
    tts = FakeTTS(secs_per_char=0.05, min_secs=0.3)

    assert tts.duration_secs("Hi.") == pytest.approx(0.3)
    assert tts.duration_secs("Twenty characters!!!") == pytest.approx(1.0)
    with pytest.raises(ValueError, match="chunk_secs"):
        FakeTTS(chunk_secs=0)


async def test_fake_tts_speaks_each_sentence_separately() -> None:
    tts = FakeTTS(secs_per_char=0.005)

    async with _running(tts) as run:
        await run.send(*_llm_says("One. Two three. Four!"), EndFrame())

    assert tts.spoken == ["One.", "Two three.", "Four!"]
    assert [f.text for f in run.down if isinstance(f, TTSTextFrame)] == tts.spoken


async def test_a_chunk_plays_for_its_length_of_the_transport_clock() -> None:
    clock = ManualClock(start=0.0)
    tts = FakeTTS(secs_per_char=0.02)
    transport = FakeTransport(clock=clock)
    output = transport.output()

    async with _running(Pipeline([tts, output])) as run:
        await run.send(*_llm_says("Half a second of speech, or so."))
        await _until(lambda: clock.sleepers == 1, "the first chunk is being played")
        clock.advance(CHUNK_SECS / 2)
        await asyncio.sleep(0)
        # Half its length: the chunk is still playing (its write has not returned).
        assert clock.sleepers == 1 and _played(output) == []
        clock.advance(CHUNK_SECS / 2)
        await _until(lambda: len(_played(output)) == 1, "the first chunk has played")
        await _until(lambda: clock.sleepers == 1, "the second chunk is being played")
        assert len(_played(output)) == 1  # one chunk per chunk length, no faster
        await _play_to_the_end(clock, run)

    assert [e.secs for e in _played(output)] == pytest.approx([CHUNK_SECS] * len(_played(output)))


async def test_the_end_frame_waits_for_the_queued_audio_to_be_played() -> None:
    clock = ManualClock(start=0.0)
    tts = FakeTTS(secs_per_char=0.02)
    transport = FakeTransport(clock=clock)
    output = transport.output()
    text = "This takes about half a second."  # 31 chars -> 0.62 s
    queued = _chunks_for(tts.duration_secs(text))

    async with _running(Pipeline([tts, output])) as run:
        # The EndFrame comes right behind the answer, while all of its audio is queued.
        await run.send(*_llm_says(text), EndFrame())
        for played in range(3):
            await _until(lambda: clock.sleepers == 1, "a chunk is being played")
            await _until(lambda: run.saw(BotStartedSpeakingFrame), "the bot speaks")
            assert len(_played(output)) == played
            # Audio is still queued, so the EndFrame has not got through the transport.
            assert [e.kind for e in output.playback].count("ended") == 0
            assert not run.saw(EndFrame) and not run.ended
            clock.advance(CHUNK_SECS)
            await _until(lambda n=played + 1: len(_played(output)) == n, "the chunk has played")
        await _play_to_the_end(clock, run)

    kinds = [e.kind for e in output.playback]
    assert kinds == ["played"] * queued + ["ended"]
    [heard] = transport.heard
    assert heard.text == text
    assert not heard.interrupted
    assert heard.played_secs == pytest.approx(queued * CHUNK_SECS)
    assert transport.output().heard_texts == [text]
    # Each chunk is pushed on once played; the EndFrame comes after the last of them.
    down = run.down
    assert [type(f) for f in down].count(TTSAudioRawFrame) == queued
    assert isinstance(down[-1], EndFrame)
    assert [type(f) for f in down if isinstance(f, BotStartedSpeakingFrame)] == [
        BotStartedSpeakingFrame
    ]
    started = next(i for i, f in enumerate(down) if isinstance(f, BotStartedSpeakingFrame))
    stopped = next(i for i, f in enumerate(down) if isinstance(f, BotStoppedSpeakingFrame))
    audio_at = [i for i, f in enumerate(down) if isinstance(f, TTSAudioRawFrame)]
    assert started < min(audio_at) and max(audio_at) < stopped
    assert any(isinstance(f, BotStartedSpeakingFrame) for f in run.up)
    # The sentence's text leaves the transport once its audio has played: every chunk but
    # the partial last one, which the transport holds until the TTSStoppedFrame.
    text_index = next(i for i, f in enumerate(down) if isinstance(f, TTSTextFrame))
    assert [type(f) for f in down[:text_index]].count(TTSAudioRawFrame) == queued - 1


async def test_interruption_cuts_the_utterance_and_drops_unplayed_audio() -> None:
    clock = ManualClock(start=0.0)
    tts = FakeTTS(secs_per_char=0.05)
    transport = FakeTransport(clock=clock)
    output = transport.output()
    text = "A long sentence that would take more than two seconds to say."
    queued = _chunks_for(tts.duration_secs(text))
    before = 5

    async with _running(Pipeline([tts, output])) as run:
        await run.send(*_llm_says(text))
        for played in range(before):
            await _until(lambda: clock.sleepers == 1, "a chunk is being played")
            clock.advance(CHUNK_SECS)
            await _until(lambda n=played + 1: len(_played(output)) == n, "the chunk has played")
        # The sixth chunk is being written when the interruption arrives.
        await _until(lambda: clock.sleepers == 1, "the next chunk is being played")
        await run.send(InterruptionFrame())
        await _until(lambda: output.heard != [], "the cut utterance is recorded")
        await _until(lambda: run.saw(BotStoppedSpeakingFrame), "the bot stops speaking")
        await _play_to_the_end(clock, run)

    kinds = [e.kind for e in output.playback]
    # The chunk being written when the interruption came still plays; nothing after it.
    assert kinds == ["played"] * before + ["interrupted", "played", "ended"]
    assert before + 1 < queued
    assert {e.text for e in _played(output)} == {text}
    [heard] = transport.heard
    assert heard.interrupted
    assert heard.text == text
    assert heard.played_secs == pytest.approx((before + 1) * CHUNK_SECS)
    assert transport.output().heard_texts == [f"{text} [interrupted]"]
    # Nothing of the sentence reaches the assistant side: its TTSTextFrame was dropped.
    down = run.down
    assert not any(isinstance(f, TTSTextFrame) for f in down)
    interruption = next(i for i, f in enumerate(down) if isinstance(f, InterruptionFrame))
    after = down[interruption:]
    assert any(isinstance(f, BotStoppedSpeakingFrame) for f in after)
    assert [type(f) for f in after].count(TTSAudioRawFrame) <= 1  # the chunk being written


async def test_heard_texts_saved_before_the_conversation_sees_what_was_heard_since() -> None:
    clock = ManualClock(start=0.0)
    tts = FakeTTS(secs_per_char=0.02)
    transport = FakeTransport(clock=clock)
    output = transport.output()
    saved = transport.heard_texts  # taken before anything was said, and kept
    assert saved == [] and len(saved) == 0
    text = "Ready."

    async with _running(Pipeline([tts, output])) as run:
        await run.send(*_llm_says(text))
        await _play_to_the_end(clock, run)

    assert saved == [text] and saved == (text,) and list(saved) == [text]
    assert saved[0] == text and saved[-1:] == [text] and text in saved
    assert saved is output.heard_texts  # one view, read each time it is used
    # A cut utterance reads as cut, in the saved view as in a new one.
    output.heard[0] = HeardUtterance(text, True, 0.0, 0.1, 0.1)
    assert saved == [f"{text} [interrupted]"] == transport.heard_texts
    assert saved != [text]
    assert repr(saved) == repr([f"{text} [interrupted]"])


async def test_uninterruptible_speech_survives_an_interruption() -> None:
    clock = ManualClock(start=0.0)
    tts = FakeTTS(secs_per_char=0.02)
    transport = FakeTransport(clock=clock)
    output = transport.output()
    text = "Please hold while I check that."
    queued = _chunks_for(tts.duration_secs(text))
    speak = TTSSpeakFrame(text)
    speak.interruptible = False

    async with _running(Pipeline([tts, output])) as run:
        await run.send(speak)
        for played in range(3):
            await _until(lambda: clock.sleepers == 1, "a chunk is being played")
            clock.advance(CHUNK_SECS)
            await _until(lambda n=played + 1: len(_played(output)) == n, "the chunk has played")
        await _until(lambda: clock.sleepers == 1, "the next chunk is being played")
        await run.send(InterruptionFrame())
        await _until(lambda: "interrupted" in [e.kind for e in output.playback], "interrupted")
        await _play_to_the_end(clock, run)

    kinds = [e.kind for e in output.playback]
    assert kinds == ["played"] * 3 + ["interrupted"] + ["played"] * (queued - 3) + ["ended"]
    assert not any(e.interruptible for e in _played(output))
    [heard] = transport.heard
    assert heard.text == text
    assert not heard.interrupted
    assert heard.played_secs == pytest.approx(queued * CHUNK_SECS)


async def test_user_says_frames_drive_a_real_user_turn() -> None:
    context = LLMContext()
    pair = LLMContextAggregatorPair(context, user_params=offline_user_params())

    async with _running(pair.user()) as run:
        await run.send(*user_says("Is there a table for two?"))
        # The turn ends once the stop strategy agrees, and the LLM is asked to answer.
        await _until(lambda: run.saw(LLMContextFrame), "the user turn ends")

    kinds = [type(f) for f in run.down]
    assert kinds.index(UserStartedSpeakingFrame) < kinds.index(InterruptionFrame)
    assert kinds.index(InterruptionFrame) < kinds.index(LLMContextFrame)
    assert UserStoppedSpeakingFrame in kinds
    assert context.get_messages() == [{"role": "user", "content": "Is there a table for two?"}]


async def test_a_barge_in_starts_at_vad_start_before_any_transcript() -> None:
    context = LLMContext()
    pair = LLMContextAggregatorPair(context, user_params=offline_user_params())

    async with _running(pair.user()) as run:
        await run.send(*user_starts_speaking())
        # The interruption comes with the start of speech: nothing else has been sent yet.
        await _until(lambda: run.saw(InterruptionFrame), "the start of speech interrupts")
        assert not run.saw(VADUserStoppedSpeakingFrame) and not run.saw(LLMContextFrame)
        await run.send(*user_stops_speaking("stop"))
        await _until(lambda: run.saw(LLMContextFrame), "the user turn ends")

    kinds = [type(f) for f in run.down]
    assert kinds.index(InterruptionFrame) < kinds.index(VADUserStoppedSpeakingFrame)
    assert kinds.index(VADUserStoppedSpeakingFrame) < kinds.index(UserStoppedSpeakingFrame)
    assert context.get_messages() == [{"role": "user", "content": "stop"}]
