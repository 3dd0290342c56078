"""`FakeTTS`: a real Pipecat `TTSService` that speaks silence, for offline voice pipelines.

It behaves like an HTTP TTS service (OpenAI's, say): Pipecat's `TTSService` aggregates the LLM
text into sentences, opens an audio context with a ``TTSStartedFrame``, calls `FakeTTS.run_tts`
for each sentence, queues a ``TTSTextFrame`` behind the sentence's audio (that frame, once the
output transport has played the audio before it, is what the assistant aggregator writes to
the context) and closes the turn with a ``TTSStoppedFrame``. The audio is silent 16-bit mono
PCM whose length is proportional to the text, so an output transport that plays it in real
time makes the bot speak for a realistic while, and a barge-in cuts it like a real one::

    tts = FakeTTS(secs_per_char=0.02)
    ...
    assert tts.spoken == ["Your table is booked."]

Interruptions are Pipecat's own: the base class drops the audio contexts still queued and the
output transport drops the audio it has not played yet.
"""

from __future__ import annotations

__all__ = ["FakeTTS"]

import asyncio
import math
from collections.abc import AsyncGenerator
from typing import Any

from pipecat.frames.frames import Frame, TTSAudioRawFrame
from pipecat.services.settings import TTSSettings
from pipecat.services.tts_service import TTSService

_BYTES_PER_SAMPLE = 2  # 16-bit PCM


class FakeTTS(TTSService):
    """A TTS service that turns each text into silent audio of a length proportional to it.

    Args:
        secs_per_char: Seconds of audio per character of text.
        min_secs: The shortest utterance, in seconds.
        chunk_secs: Seconds of audio per ``TTSAudioRawFrame`` it yields.
        latency_secs: How long each synthesis waits before its first chunk (time to first
            byte of a real service). The wait happens inside ``run_tts``, as a real HTTP
            request would.
        sample_rate: Output sample rate in Hz; ``None`` takes the pipeline's
            ``audio_out_sample_rate``, as real services do.
        **kwargs: Passed to `TTSService` (``text_aggregation_mode``, ...).
    """

    def __init__(
        self,
        *,
        secs_per_char: float = 0.06,
        min_secs: float = 0.2,
        chunk_secs: float = 0.5,
        latency_secs: float = 0.0,
        sample_rate: int | None = None,
        **kwargs: Any,
    ) -> None:
        if secs_per_char < 0 or min_secs < 0 or latency_secs < 0:
            raise ValueError("secs_per_char, min_secs and latency_secs must not be negative")
        if chunk_secs <= 0:
            raise ValueError("chunk_secs must be positive")
        settings = TTSSettings(model="fake-tts", voice="silence", language=None)
        super().__init__(
            sample_rate=sample_rate,
            push_start_frame=True,
            push_stop_frames=True,
            settings=settings,
            **kwargs,
        )
        self._secs_per_char = secs_per_char
        self._min_secs = min_secs
        self._chunk_secs = chunk_secs
        self._latency_secs = latency_secs
        self.spoken: list[str] = []
        """Each text sent to synthesis, in order (one entry per sentence, as aggregated)."""

    def duration_secs(self, text: str) -> float:
        """How many seconds of audio `FakeTTS` makes for ``text``."""
        return max(self._min_secs, len(text.strip()) * self._secs_per_char)

    def can_generate_metrics(self) -> bool:
        """Report TTFB and processing metrics, as real services do."""
        return True

    async def run_tts(self, text: str, context_id: str) -> AsyncGenerator[Frame | None, None]:
        """Yield silent PCM chunks for ``text``; the base class frames them with start/stop.

        Args:
            text: The sentence to synthesize.
            context_id: The audio context the chunks belong to.

        Yields:
            ``TTSAudioRawFrame`` chunks of ``chunk_secs`` each (the last one shorter).
        """
        self.spoken.append(text)
        if self._latency_secs:
            await asyncio.sleep(self._latency_secs)
        await self.start_tts_usage_metrics(text)
        rate = self.sample_rate
        remaining = math.ceil(self.duration_secs(text) * rate)
        chunk = max(1, int(self._chunk_secs * rate))
        while remaining > 0:
            samples = min(chunk, remaining)
            remaining -= samples
            yield TTSAudioRawFrame(
                bytes(samples * _BYTES_PER_SAMPLE), rate, 1, context_id=context_id
            )
