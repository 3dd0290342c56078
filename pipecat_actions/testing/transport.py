"""`FakeTransport`: an offline transport that plays audio to nobody and remembers what was heard.

Its output side is a real `BaseOutputTransport`, so Pipecat itself chunks the TTS audio, sends
``BotStartedSpeakingFrame`` / ``BotSpeakingFrame`` / ``BotStoppedSpeakingFrame``, holds every
non-system frame (``TTSTextFrame``, function-call results, ...) until the audio queued before
it has played, and drops unplayed audio on an interruption. `FakeOutputTransport` only writes
the audio nowhere, sleeping for its duration as a sound card would, and records each utterance
the user heard (`HeardUtterance`): finished, or cut by a barge-in after part of it played.
It also keeps an ordered record of what it did (`PlaybackEvent`: each chunk once played, each
interruption once handled, the end of the stream), so a test can check by causality, not by
the clock, that the audio queued before an ``EndFrame`` all played before it, or that no audio
of a cut utterance played after the interruption (but the chunk being written)::

    kinds = [e.kind for e in transport.output().playback]
    assert kinds[-1] == "ended" and kinds.count("played") == chunks_queued

Playback is paced by real time unless the transport is given a clock (``FakeTransport(
clock=ManualClock())``): each chunk then takes its length of that clock to play, so a test
decides exactly how much audio has played when the next frame arrives.

The input side carries no audio. A user turn is fed as the frames a voice pipeline produces
for it (`user_says`): VAD start, the final transcript, VAD stop. Queued into the pipeline
before the user aggregator (``worker.queue_frames(user_says("hi"))``), they drive Pipecat's
real user-turn strategies: the VAD start opens the user turn, which broadcasts
``UserStartedSpeakingFrame`` and, if the bot was speaking, the ``InterruptionFrame`` that
makes it a barge-in; the VAD stop and the transcript end the turn and run the LLM. In a live
1.14 pipeline the user aggregator's VAD controller makes the same VAD frames from the
microphone audio and feeds them through its own ``process_frame``; here they arrive from
upstream, which takes the same path. The aggregator needs a stop strategy that works without
audio (`offline_user_params`): the default Smart Turn analyzer judges the audio itself and,
given none, never finds the turn complete, so every turn would last the 5 s
``user_turn_stop_timeout``.
"""

from __future__ import annotations

__all__ = [
    "FakeInputTransport",
    "FakeOutputTransport",
    "FakeTransport",
    "HeardTexts",
    "HeardUtterance",
    "PlaybackEvent",
    "PlaybackKind",
    "default_transport_params",
    "offline_user_params",
    "user_says",
    "user_starts_speaking",
    "user_stops_speaking",
]

import asyncio
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal, TypeAlias, overload

from pipecat.audio.vad.vad_analyzer import VAD_START_SECS, VAD_STOP_SECS
from pipecat.frames.frames import (
    AggregatedTextFrame,
    CancelFrame,
    EndFrame,
    Frame,
    InterruptionFrame,
    OutputAudioRawFrame,
    StartFrame,
    TranscriptionFrame,
    TTSTextFrame,
    VADUserStartedSpeakingFrame,
    VADUserStoppedSpeakingFrame,
)
from pipecat.processors.aggregators.llm_response_universal import LLMUserAggregatorParams
from pipecat.processors.frame_processor import FrameDirection
from pipecat.transports.base_input import BaseInputTransport
from pipecat.transports.base_output import BaseOutputTransport
from pipecat.transports.base_transport import BaseTransport, TransportParams
from pipecat.turns.user_start import TranscriptionUserTurnStartStrategy, VADUserTurnStartStrategy
from pipecat.turns.user_stop import SpeechTimeoutUserTurnStopStrategy
from pipecat.turns.user_turn_strategies import UserTurnStrategies
from pipecat.utils.time import time_now_iso8601

from pipecat_actions.clock import Clock

_BYTES_PER_SAMPLE = 2  # 16-bit PCM


class _MonotonicClock:
    """Real time for playback: ``time.monotonic`` (never jumps) and ``asyncio.sleep``."""

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, secs: float) -> None:
        await asyncio.sleep(max(0.0, secs))


@dataclass(frozen=True)
class HeardUtterance:
    """One utterance as the user heard it.

    Attributes:
        text: The text the TTS spoke (one aggregated sentence).
        interrupted: True if an interruption cut it before all of its audio played.
        started_at_secs: Pipeline-clock time its first audio chunk was played.
        ended_at_secs: Pipeline-clock time its last chunk finished playing (for a cut one:
            the chunk being written when the interruption came, or the cut if none was).
        played_secs: Seconds of its audio that were played (a cut one's include the chunk
            being written when the interruption came: it still plays out).
        started_monotonic: ``time.monotonic()`` when its first audio played, to order it
            against other events of the process.
    """

    text: str
    interrupted: bool
    started_at_secs: float
    ended_at_secs: float
    played_secs: float
    started_monotonic: float = 0.0


class HeardTexts(Sequence[str]):
    """A live view of what the user heard, as text: each utterance's, in order.

    A cut utterance reads with ``" [interrupted]"`` after its text. The view reads the list of
    `HeardUtterance` it was made on each time it is used, so a reference saved before the
    conversation (``heard = transport.output().heard_texts``) sees every utterance heard
    since. It compares equal to a list or tuple of the same texts; ``list(view)`` is a copy.

    Args:
        heard: The utterances to read (kept, not copied).
    """

    def __init__(self, heard: list[HeardUtterance]) -> None:
        self._heard = heard

    @staticmethod
    def _text(utterance: HeardUtterance) -> str:
        return utterance.text + (" [interrupted]" if utterance.interrupted else "")

    @overload
    def __getitem__(self, index: int) -> str: ...

    @overload
    def __getitem__(self, index: slice) -> list[str]: ...

    def __getitem__(self, index: int | slice) -> str | list[str]:
        if isinstance(index, slice):
            return [self._text(u) for u in self._heard[index]]
        return self._text(self._heard[index])

    def __len__(self) -> int:
        return len(self._heard)

    def __iter__(self) -> Iterator[str]:
        return (self._text(u) for u in list(self._heard))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, HeardTexts | list | tuple):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # a live view: its value changes

    def __repr__(self) -> str:
        return repr(list(self))


PlaybackKind: TypeAlias = Literal["played", "interrupted", "ended", "cancelled"]
"""What a `PlaybackEvent` records."""


@dataclass(frozen=True)
class PlaybackEvent:
    """One thing the output transport did, in `FakeOutputTransport.playback` (in order).

    Attributes:
        kind: ``played``: an audio chunk finished playing. ``interrupted``: an
            ``InterruptionFrame`` was handled, so the interruptible audio still queued was
            dropped (the chunk being written, if any, still plays after it). ``ended``: the
            ``EndFrame`` was handled, which Pipecat does once every chunk queued before it
            has played. ``cancelled``: a ``CancelFrame`` stopped the transport at once.
        secs: For ``played``: the chunk's length in seconds; else 0.
        text: For ``played``: the sentence the chunk belongs to (the last one announced
            before it, as `HeardUtterance.text`), or ``None`` if no sentence was announced.
        interruptible: For ``played``: whether an interruption could drop the chunk.
    """

    kind: PlaybackKind
    secs: float = 0.0
    text: str | None = None
    interruptible: bool = True


def default_transport_params() -> TransportParams:
    """Audio out on, no trailing silence at the end (it would be played in real time)."""
    return TransportParams(audio_out_enabled=True, audio_out_end_silence_secs=0)


def user_starts_speaking() -> list[Frame]:
    """The frame VAD emits when the user starts speaking: a barge-in if the bot is speaking."""
    return [VADUserStartedSpeakingFrame(start_secs=VAD_START_SECS)]


def user_stops_speaking(text: str | None = None, *, user_id: str = "user") -> list[Frame]:
    """The final transcript of what the user said (if anything), then VAD's stop.

    Args:
        text: What the user said; ``None`` for speech without words (a cough, noise).
        user_id: The speaker, as an STT service would report it.
    """
    frames: list[Frame] = []
    if text:
        frames.append(
            TranscriptionFrame(
                text=text, user_id=user_id, timestamp=time_now_iso8601(), finalized=True
            )
        )
    frames.append(VADUserStoppedSpeakingFrame(stop_secs=VAD_STOP_SECS))
    return frames


def user_says(text: str, *, user_id: str = "user") -> list[Frame]:
    """A whole user turn, without a pause: `user_starts_speaking` + `user_stops_speaking`."""
    return [*user_starts_speaking(), *user_stops_speaking(text, user_id=user_id)]


def offline_user_params(
    *, user_speech_timeout_secs: float = 0.3, user_turn_stop_timeout_secs: float = 5.0
) -> LLMUserAggregatorParams:
    """User aggregator parameters for turns fed as VAD and transcript frames, without audio.

    The start strategies are Pipecat's defaults (VAD, then transcription). The stop strategy
    is `SpeechTimeoutUserTurnStopStrategy`: the default Smart Turn analyzer decides from the
    user's audio, and with none it never finds the turn complete (the turn then ends only at
    ``user_turn_stop_timeout``).

    Args:
        user_speech_timeout_secs: How long after VAD's stop (with a transcript) the turn ends.
        user_turn_stop_timeout_secs: How long a turn with no transcript stays open before
            Pipecat ends it anyway (Pipecat's default is 5 s).
    """
    strategies = UserTurnStrategies(
        start=[VADUserTurnStartStrategy(), TranscriptionUserTurnStartStrategy()],
        stop=[SpeechTimeoutUserTurnStopStrategy(user_speech_timeout=user_speech_timeout_secs)],
    )
    return LLMUserAggregatorParams(
        user_turn_strategies=strategies, user_turn_stop_timeout=user_turn_stop_timeout_secs
    )


@dataclass
class _Playing:
    """The audio played since the last utterance ended, and the sentence announced for it."""

    text: str | None = None
    interruptible: bool = True
    started_at_secs: float | None = None
    started_monotonic: float = 0.0
    played_secs: float = 0.0
    tail_of: int | None = None
    """Index in ``heard`` of the sentence that just ended, whose last chunk may still come."""
    cut: bool = False
    """An interruption cut it: only the chunk being written then may still finish."""
    cut_as: int | None = None
    """Index in ``heard`` of its record as cut, once some of it has been heard."""


class FakeOutputTransport(BaseOutputTransport):
    """A `BaseOutputTransport` that plays audio in real time to nobody and records it.

    Utterances are recognised from the sentence-level text frames a TTS without word
    timestamps sends in Pipecat's default sentence aggregation (as `FakeTTS` does). Word
    timestamps send ``TTSTextFrame``s with a presentation time, which the base class pushes
    from its clock queue without showing them to the transport, so they are not recorded.

    Args:
        params: Transport parameters; `default_transport_params` if omitted.
        clock: What playback waits on: a chunk takes its length of this clock to play. Real
            (monotonic) time if omitted; a `pipecat_actions.clock.ManualClock` lets a test
            play the audio chunk by chunk.
        **kwargs: Passed to `BaseOutputTransport` (``name``, ...).
    """

    def __init__(
        self, params: TransportParams | None = None, *, clock: Clock | None = None, **kwargs: Any
    ) -> None:
        super().__init__(params or default_transport_params(), **kwargs)
        self._playback_clock: Clock = clock if clock is not None else _MonotonicClock()
        self.heard: list[HeardUtterance] = []
        """What the user heard, in order; utterances an interruption cut are marked."""
        self._heard_texts = HeardTexts(self.heard)
        self.audio_secs_played = 0.0
        """Seconds of audio played in total."""
        self.playback: list[PlaybackEvent] = []
        """What the transport did, in order: chunks played, interruptions, the end."""
        self._playing = _Playing()
        self._next_write_time = 0.0

    @property
    def heard_texts(self) -> HeardTexts:
        """What the user heard as text, a live view (`HeardTexts`): save it and read it later."""
        return self._heard_texts

    async def start(self, frame: StartFrame) -> None:
        """Start the media senders, as a real transport does once connected."""
        await super().start(frame)
        await self.set_transport_ready(frame)

    async def stop(self, frame: EndFrame) -> None:
        """Stop once the audio queued before the ``EndFrame`` has played; record ``ended``."""
        await super().stop(frame)
        self.playback.append(PlaybackEvent("ended"))

    async def cancel(self, frame: CancelFrame) -> None:
        """Stop at once; an utterance being played counts as cut."""
        await super().cancel(frame)
        self._cut_playing()
        self.playback.append(PlaybackEvent("cancelled"))

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        """Let the base class handle the frame, then close an utterance an interruption cut."""
        await super().process_frame(frame, direction)
        if isinstance(frame, InterruptionFrame):
            # The base class has dropped the interruptible audio still queued; audio of an
            # uninterruptible utterance keeps playing, so that utterance stays open.
            if self._playing.interruptible:
                self._cut_playing()
            self._next_write_time = 0.0
            self.playback.append(PlaybackEvent("interrupted"))

    async def write_audio_frame(self, frame: OutputAudioRawFrame) -> bool:
        """Play a chunk: wait for its duration, as an audio device would block."""
        secs = len(frame.audio) / (frame.sample_rate * frame.num_channels * _BYTES_PER_SAMPLE)
        handed_over = time.monotonic()  # the chunk starts playing now (or after the last)
        # Taken before the wait: if an interruption cuts the utterance meanwhile, this chunk
        # still belongs to it, not to whatever plays next.
        playing = self._playing
        await self._sleep_until_played(secs)
        self.audio_secs_played += secs
        if playing.cut and playing.text is not None:
            # The chunk being written when the interruption came: the user heard it too.
            self._extend_cut(playing, playing.text, secs, handed_over)
            self._record_played(frame, secs, playing.text.strip())
            return True
        if playing.text is None and playing.tail_of is not None:
            # The transport holds a sentence's last partial chunk until the TTSStoppedFrame,
            # so it plays after the sentence's TTSTextFrame.
            ended = self.heard[playing.tail_of]
            self.heard[playing.tail_of] = replace(
                ended, played_secs=ended.played_secs + secs, ended_at_secs=self._now_secs()
            )
            self._record_played(frame, secs, ended.text)
            return True
        self._record_played(frame, secs, None if playing.text is None else playing.text.strip())
        if playing.started_at_secs is None:
            playing.started_at_secs = self._now_secs() - secs
            playing.started_monotonic = max(handed_over, time.monotonic() - secs)
        playing.played_secs += secs
        return True

    async def write_transport_frame(self, frame: Frame) -> None:
        """Track utterances from the text frames the base class releases in audio order.

        With sentence aggregation (Pipecat's default), a TTS service without word
        timestamps announces each sentence with an ``AggregatedTextFrame``
        (``will_be_spoken``) just before its audio and queues the sentence's
        ``TTSTextFrame`` just after it, so the ``TTSTextFrame`` comes out of the audio queue
        once the whole sentence has played: that is when it counts as heard.
        """
        if isinstance(frame, TTSTextFrame):
            self._finish_playing(frame.text)
        elif isinstance(frame, AggregatedTextFrame) and frame.will_be_spoken:
            # Audio played since the last sentence ended without an announcement of its own
            # is the tail of that sentence (the transport flushes it at TTSStoppedFrame).
            self._playing = _Playing(text=frame.text, interruptible=frame.interruptible)

    def _now_secs(self) -> float:
        return self.get_clock().get_time() / 1e9

    def _record_played(self, frame: OutputAudioRawFrame, secs: float, text: str | None) -> None:
        self.playback.append(
            PlaybackEvent("played", secs=secs, text=text, interruptible=frame.interruptible)
        )

    async def _sleep_until_played(self, secs: float) -> None:
        # A running deadline, so time spent outside the sleep does not slow playback down.
        now = self._playback_clock.now()
        if self._next_write_time <= now:
            self._next_write_time = now
        self._next_write_time += secs
        await self._playback_clock.sleep(self._next_write_time - now)

    def _finish_playing(self, text: str) -> None:
        playing, self._playing = self._playing, _Playing(tail_of=len(self.heard))
        now = self._now_secs()
        started_at = playing.started_at_secs
        self.heard.append(
            HeardUtterance(
                text=text.strip(),
                interrupted=False,
                started_at_secs=now if started_at is None else started_at,
                ended_at_secs=now,
                played_secs=playing.played_secs,
                started_monotonic=playing.started_monotonic or time.monotonic(),
            )
        )

    def _extend_cut(self, playing: _Playing, text: str, secs: float, handed_over: float) -> None:
        now = self._now_secs()
        if playing.cut_as is None:  # its first chunk, finished after the cut
            playing.cut_as = len(self.heard)
            self.heard.append(
                HeardUtterance(
                    text=text.strip(),
                    interrupted=True,
                    started_at_secs=now - secs,
                    ended_at_secs=now,
                    played_secs=secs,
                    started_monotonic=max(handed_over, time.monotonic() - secs),
                )
            )
            return
        cut = self.heard[playing.cut_as]
        self.heard[playing.cut_as] = replace(
            cut, played_secs=cut.played_secs + secs, ended_at_secs=now
        )

    def _cut_playing(self) -> None:
        playing, self._playing = self._playing, _Playing()
        playing.cut = True
        if playing.text is None or playing.started_at_secs is None:
            return  # nothing announced was heard
        playing.cut_as = len(self.heard)
        self.heard.append(
            HeardUtterance(
                text=playing.text.strip(),
                interrupted=True,
                started_at_secs=playing.started_at_secs,
                ended_at_secs=self._now_secs(),
                played_secs=playing.played_secs,
                started_monotonic=playing.started_monotonic,
            )
        )


class FakeInputTransport(BaseInputTransport):
    """A `BaseInputTransport` with no device: it passes on the frames queued into it.

    Args:
        params: Transport parameters; `default_transport_params` if omitted.
        **kwargs: Passed to `BaseInputTransport` (``name``, ...).
    """

    def __init__(self, params: TransportParams | None = None, **kwargs: Any) -> None:
        super().__init__(params or default_transport_params(), **kwargs)

    async def start(self, frame: StartFrame) -> None:
        """Start, as a real transport does once connected."""
        await super().start(frame)
        await self.set_transport_ready(frame)


class FakeTransport(BaseTransport):
    """An offline transport: `FakeInputTransport` in, `FakeOutputTransport` out.

    Args:
        params: Parameters of both sides; `default_transport_params` if omitted.
        clock: What the output's playback waits on (see `FakeOutputTransport`).
        **kwargs: Passed to `BaseTransport` (``name``, ``input_name``, ``output_name``).
    """

    def __init__(
        self, params: TransportParams | None = None, *, clock: Clock | None = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self._params = params or default_transport_params()
        self._clock = clock
        self._input: FakeInputTransport | None = None
        self._output: FakeOutputTransport | None = None

    def input(self) -> FakeInputTransport:
        """The input processor (created on first use)."""
        if self._input is None:
            self._input = FakeInputTransport(self._params, name=self._input_name)
        return self._input

    def output(self) -> FakeOutputTransport:
        """The output processor (created on first use)."""
        if self._output is None:
            self._output = FakeOutputTransport(
                self._params, clock=self._clock, name=self._output_name
            )
        return self._output

    @property
    def heard(self) -> list[HeardUtterance]:
        """What the user heard (see `FakeOutputTransport.heard`)."""
        return self.output().heard

    @property
    def heard_texts(self) -> HeardTexts:
        """What the user heard as text, a live view (see `FakeOutputTransport.heard_texts`)."""
        return self.output().heard_texts
