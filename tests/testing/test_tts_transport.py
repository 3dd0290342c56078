"""`FakeTTS` and `FakeTransport` in real Pipecat pipelines: frames, real-time playback, barge-in.

Each test runs Pipecat's own `run_test` harness (frames in, frames out, no mocks) around the
real `TTSService` machinery, the real `BaseOutputTransport` and the real user aggregator.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import pytest
from pipecat.frames.frames import (
    AggregatedTextFrame,
    BotStartedSpeakingFrame,
    BotStoppedSpeakingFrame,
    Frame,
    InterruptionFrame,
    LLMContextFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
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
from pipecat.pipeline.worker import PipelineParams
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.tests.utils import SleepFrame, run_test

from pipecat_actions.testing.transport import (
    FakeTransport,
    offline_user_params,
    user_says,
    user_starts_speaking,
    user_stops_speaking,
)
from pipecat_actions.testing.tts import FakeTTS

PARAMS = PipelineParams(audio_in_sample_rate=16_000, audio_out_sample_rate=16_000)


def _llm_says(text: str) -> list[Frame]:
    return [LLMFullResponseStartFrame(), LLMTextFrame(text), LLMFullResponseEndFrame()]


def _audio_secs(frames: Sequence[Frame]) -> float:
    return sum(
        len(f.audio) / (2 * f.sample_rate * f.num_channels)
        for f in frames
        if isinstance(f, TTSAudioRawFrame)
    )


async def test_fake_tts_frames_a_sentence_like_an_http_tts_service() -> None:
    tts = FakeTTS(secs_per_char=0.01, chunk_secs=0.1)

    down, _ = await run_test(
        tts,
        frames_to_send=[*_llm_says("Hello there, how are you?"), SleepFrame(sleep=0.2)],
        pipeline_params=PARAMS,
    )

    kinds = [type(f) for f in down if not isinstance(f, TTSAudioRawFrame)]
    assert kinds == [
        LLMFullResponseStartFrame,
        AggregatedTextFrame,
        TTSStartedFrame,
        TTSTextFrame,
        TTSStoppedFrame,
        LLMFullResponseEndFrame,
    ]
    text_frame = next(f for f in down if isinstance(f, TTSTextFrame))
    assert text_frame.text == "Hello there, how are you?"
    assert text_frame.append_to_context
    audio = [f for f in down if isinstance(f, TTSAudioRawFrame)]
    assert len(audio) == 3  # 0.25 s in chunks of 0.1 s
    assert {f.sample_rate for f in audio} == {16_000}
    assert _audio_secs(down) == pytest.approx(tts.duration_secs("Hello there, how are you?"))
    assert tts.spoken == ["Hello there, how are you?"]


def test_fake_tts_length_is_proportional_with_a_minimum() -> None:
    tts = FakeTTS(secs_per_char=0.05, min_secs=0.3)

    assert tts.duration_secs("Hi.") == pytest.approx(0.3)
    assert tts.duration_secs("Twenty characters!!!") == pytest.approx(1.0)
    with pytest.raises(ValueError, match="chunk_secs"):
        FakeTTS(chunk_secs=0)


async def test_fake_tts_speaks_each_sentence_separately() -> None:
    tts = FakeTTS(secs_per_char=0.005)

    down, _ = await run_test(
        tts,
        frames_to_send=[*_llm_says("One. Two three. Four!"), SleepFrame(sleep=0.2)],
        pipeline_params=PARAMS,
    )

    assert tts.spoken == ["One.", "Two three.", "Four!"]
    assert [f.text for f in down if isinstance(f, TTSTextFrame)] == tts.spoken


async def test_output_transport_plays_in_real_time_and_reports_bot_speaking() -> None:
    tts = FakeTTS(secs_per_char=0.02)
    transport = FakeTransport()
    text = "This takes about half a second."  # 31 chars -> 0.62 s

    started = time.monotonic()
    down, up = await run_test(
        Pipeline([tts, transport.output()]),
        frames_to_send=[*_llm_says(text), SleepFrame(sleep=0.1)],
        pipeline_params=PARAMS,
    )
    elapsed = time.monotonic() - started

    duration = tts.duration_secs(text)
    assert elapsed >= duration  # EndFrame waits for the queued audio to be played
    assert [type(f) for f in down if isinstance(f, BotStartedSpeakingFrame)] == [
        BotStartedSpeakingFrame
    ]
    assert any(isinstance(f, BotStoppedSpeakingFrame) for f in down)
    assert any(isinstance(f, BotStartedSpeakingFrame) for f in up)
    # The sentence's text leaves the transport once its audio has played (all but the
    # partial last chunk, which the transport holds until the TTSStoppedFrame).
    text_index = next(i for i, f in enumerate(down) if isinstance(f, TTSTextFrame))
    assert _audio_secs(down[:text_index]) >= duration - 0.04
    [heard] = transport.heard
    assert heard.text == text
    assert not heard.interrupted
    assert heard.played_secs == pytest.approx(duration, abs=0.05)
    assert heard.ended_at_secs - heard.started_at_secs == pytest.approx(duration, abs=0.1)
    assert transport.output().heard_texts == [text]


async def test_interruption_cuts_the_utterance_and_drops_unplayed_audio() -> None:
    tts = FakeTTS(secs_per_char=0.05)
    transport = FakeTransport()
    text = "A long sentence that would take more than two seconds to say."

    started = time.monotonic()
    down, _ = await run_test(
        Pipeline([tts, transport.output()]),
        frames_to_send=[*_llm_says(text), SleepFrame(sleep=0.5), InterruptionFrame()],
        pipeline_params=PARAMS,
    )
    elapsed = time.monotonic() - started

    assert elapsed < tts.duration_secs(text)  # the rest of the audio was never played
    [heard] = transport.heard
    assert heard.interrupted
    assert heard.text == text
    assert 0.2 < heard.played_secs < 0.8
    assert transport.output().heard_texts == [f"{text} [interrupted]"]
    # Nothing of the sentence reaches the assistant side: its TTSTextFrame was dropped.
    assert not any(isinstance(f, TTSTextFrame) for f in down)
    interruption = next(i for i, f in enumerate(down) if isinstance(f, InterruptionFrame))
    after = down[interruption:]
    assert any(isinstance(f, BotStoppedSpeakingFrame) for f in after)
    assert _audio_secs(after) <= 0.05  # at most the chunk being written


async def test_uninterruptible_speech_survives_an_interruption() -> None:
    tts = FakeTTS(secs_per_char=0.02)
    transport = FakeTransport()
    text = "Please hold while I check that."
    speak = TTSSpeakFrame(text)
    speak.interruptible = False

    await run_test(
        Pipeline([tts, transport.output()]),
        frames_to_send=[
            speak,
            SleepFrame(sleep=0.2),
            InterruptionFrame(),
        ],
        pipeline_params=PARAMS,
    )

    [heard] = transport.heard
    assert heard.text == text
    assert not heard.interrupted
    assert heard.played_secs == pytest.approx(tts.duration_secs(text), abs=0.05)


async def test_user_says_frames_drive_a_real_user_turn() -> None:
    context = LLMContext()
    pair = LLMContextAggregatorPair(context, user_params=offline_user_params())

    down, _ = await run_test(
        pair.user(),
        frames_to_send=[*user_says("Is there a table for two?"), SleepFrame(sleep=0.5)],
    )

    kinds = [type(f) for f in down]
    assert kinds.index(UserStartedSpeakingFrame) < kinds.index(InterruptionFrame)
    assert kinds.index(InterruptionFrame) < kinds.index(LLMContextFrame)
    assert UserStoppedSpeakingFrame in kinds
    assert context.get_messages() == [{"role": "user", "content": "Is there a table for two?"}]


async def test_a_barge_in_starts_at_vad_start_before_any_transcript() -> None:
    context = LLMContext()
    pair = LLMContextAggregatorPair(context, user_params=offline_user_params())

    down, _ = await run_test(
        pair.user(),
        frames_to_send=[
            *user_starts_speaking(),
            SleepFrame(sleep=0.5),
            *user_stops_speaking("stop"),
            SleepFrame(sleep=0.5),
        ],
    )

    kinds = [type(f) for f in down]
    # The interruption comes with the start of speech, before VAD hears the user stop.
    assert kinds.index(InterruptionFrame) < kinds.index(VADUserStoppedSpeakingFrame)
    assert kinds.index(VADUserStoppedSpeakingFrame) < kinds.index(UserStoppedSpeakingFrame)
    assert context.get_messages() == [{"role": "user", "content": "stop"}]
