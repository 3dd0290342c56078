"""`run_conversation`: drive a realistic voice pipeline offline from a timed script.

It builds the standard cascade pipeline around the given LLM, with no network, keys or audio
device::

    transport.input() → user_agg → [after_user_aggregator…] → llm → tts
        → transport.output() → [before_assistant_aggregator…] → assistant_agg

`FakeTTS` (unless another TTS is given) turns the answers into silent audio,
`FakeOutputTransport` plays it in real time, and the user's turns are fed as the VAD and
transcript frames a voice pipeline makes (`UserSays`, `BargeIn`; see `offline_user_params`),
so every turn, interruption and tool call goes through Pipecat's own aggregators, turn
strategies and output transport::

    llm = ScriptedLLM([ToolCalls([("book_table", {...})]), Say("Booked.")])
    llm.register_function("book_table", book_table)
    result = await run_conversation(
        [UserSays("Book a table for two"), BargeIn("wait", after_secs=0.3)],
        llm=llm,
        before_assistant_aggregator=[gate],
    )
    assert result.heard[0].interrupted

After the script the conversation settles (the bot silent, no tool call open, nothing
happening for a moment), then ends with an ``EndFrame``.

The conversation runs in real time: the bot speaks for as long as its audio lasts (keep
utterances short, ``FakeTTS(secs_per_char=...)``, to keep tests fast) and Pipecat's own turn
timers are real. The script's own steps wait for causes where they can: a `BargeIn` starts
once the bot has played ``after_secs`` of audio (however long that took), `WaitUntilIdle` once
nothing is busy and nothing moves. `Wait` and `UserSays.at_secs` wait on the ``clock`` given
to `run_conversation` (real time by default; a `pipecat_actions.clock.ManualClock` lets a test
decide when they are over).
"""

from __future__ import annotations

__all__ = [
    "BargeIn",
    "Call",
    "ConversationResult",
    "ObservedFrame",
    "Push",
    "Step",
    "UserSays",
    "Wait",
    "WaitUntilIdle",
    "run_conversation",
]

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeAlias, TypeVar

from pipecat.frames.frames import (
    BotStartedSpeakingFrame,
    BotStoppedSpeakingFrame,
    EndFrame,
    Frame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    StartFrame,
    TTSStartedFrame,
    TTSStoppedFrame,
    UserStartedSpeakingFrame,
    UserStoppedSpeakingFrame,
)
from pipecat.observers.base_observer import BaseObserver, FramePushed
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext, LLMContextMessage
from pipecat.processors.aggregators.llm_response_universal import (
    LLMAssistantAggregator,
    LLMContextAggregatorPair,
    LLMUserAggregatorParams,
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.llm_service import LLMService
from pipecat.services.tts_service import TTSService
from pipecat.workers.runner import WorkerRunner

from pipecat_actions.clock import Clock
from pipecat_actions.testing.transport import (
    FakeOutputTransport,
    FakeTransport,
    HeardTexts,
    HeardUtterance,
    _MonotonicClock,
    offline_user_params,
    user_starts_speaking,
    user_stops_speaking,
)
from pipecat_actions.testing.tts import FakeTTS

_FrameT = TypeVar("_FrameT", bound=Frame)

_SAMPLE_RATE = 16_000
_SETTLE_TURNS = 20
"""Event-loop turns an idle conversation must stay idle for: the hops of a frame already on
its way (an observer's queue, the next push of the same processor) take a few turns, however
long a turn takes on a busy machine."""


@dataclass(frozen=True)
class UserSays:
    """A script step: the user speaks ``text``.

    The user starts speaking (VAD start, which opens the user turn and interrupts the bot if
    it is speaking), talks for ``speech_secs``, then the final transcript and VAD's stop
    arrive; the turn ends once the stop strategy agrees and the LLM runs.

    Attributes:
        text: What the user says.
        at_secs: If set, the step first waits until this many seconds after the pipeline
            started, on `run_conversation`'s ``clock``.
        speech_secs: How long the user talks (real time: the conversation's own).
    """

    text: str
    at_secs: float | None = None
    speech_secs: float = 0.3


@dataclass(frozen=True)
class BargeIn:
    """A script step: the user talks over the bot.

    It waits until the bot is speaking (at most ``timeout_secs``), lets it play ``after_secs``
    more of its audio (or finish, if it stops first), then the user speaks as in `UserSays`.
    The wait is for audio the output transport has played, not for the clock: on a busy
    machine the bot has still said as much when the user cuts in. ``text=None`` is speech with
    no words (a cough): it interrupts, the turn stays open until the user aggregator's
    ``user_turn_stop_timeout`` (see `offline_user_params`), and Pipecat's empty-turn handling
    decides what follows (by default it asks the LLM to have the user repeat).

    Attributes:
        text: What the user says, or ``None``.
        after_secs: Seconds of bot audio played before the user starts.
        speech_secs: How long the user talks.
        timeout_secs: How long to wait for the bot to speak before failing.
    """

    text: str | None = None
    after_secs: float = 0.3
    speech_secs: float = 0.3
    timeout_secs: float = 5.0


@dataclass(frozen=True)
class Wait:
    """A script step: let ``secs`` seconds of `run_conversation`'s ``clock`` pass."""

    secs: float


@dataclass(frozen=True)
class WaitUntilIdle:
    """A script step: wait until the conversation is idle.

    Idle means no user turn open, no LLM response or TTS context open, the bot not speaking,
    no function call in progress in the assistant aggregator, and no frame pushed for
    ``quiet_secs``; all of which then still holds after a few more turns of the event loop, so
    a frame already on its way is seen even if the process was starved meanwhile.

    Attributes:
        quiet_secs: How long nothing must happen.
        timeout_secs: How long to wait before failing with `TimeoutError`.
        function_calls: Whether a function call still in progress keeps the conversation
            busy (False: a background call may go on).
    """

    quiet_secs: float = 0.3
    timeout_secs: float = 10.0
    function_calls: bool = True


@dataclass(frozen=True)
class Push:
    """A script step: queue ``frames`` into the start of the pipeline (e.g. an ``LLMRunFrame``)."""

    frames: Sequence[Frame]


@dataclass(frozen=True)
class Call:
    """A script step: await ``fn()``, what the application or the world does meanwhile.

    Anything it raises ends the conversation at once (the pipeline is cancelled, as when a
    process dies) and propagates out of `run_conversation`.
    """

    fn: Callable[[], Awaitable[None]]


Step: TypeAlias = UserSays | BargeIn | Wait | WaitUntilIdle | Push | Call


@dataclass(frozen=True)
class ObservedFrame:
    """A frame as first pushed in the pipeline.

    Attributes:
        at_secs: Pipeline-clock time of the push.
        source: Name of the processor that pushed it.
        direction: Which way it was pushed.
        frame: The frame.
    """

    at_secs: float
    source: str
    direction: FrameDirection
    frame: Frame


@dataclass
class ConversationResult:
    """What happened in a conversation run by `run_conversation`.

    Attributes:
        heard: What the user heard, in order; utterances cut by an interruption are marked.
        context_messages: The LLM context's messages at the end.
        frames: Every frame pushed in the pipeline, once each, in push order.
        spoken: What the TTS was asked to say, if it is a `FakeTTS` (else empty).
    """

    heard: list[HeardUtterance]
    context_messages: list[LLMContextMessage]
    frames: list[ObservedFrame] = field(default_factory=list)
    spoken: list[str] = field(default_factory=list)

    @property
    def heard_texts(self) -> HeardTexts:
        """The text of each heard utterance (a `HeardTexts` view of `heard`)."""
        return HeardTexts(self.heard)

    def frames_of(
        self, frame_type: type[_FrameT], direction: FrameDirection | None = None
    ) -> list[_FrameT]:
        """The observed frames of a type, optionally only those pushed one way."""
        return [
            o.frame
            for o in self.frames
            if isinstance(o.frame, frame_type) and (direction is None or o.direction == direction)
        ]


# What each frame type opens (True) or closes (False). An interruption drops the response
# and its audio contexts without their end frames.
_BUSY_SWITCHES: tuple[tuple[type[Frame], str, bool], ...] = (
    (UserStartedSpeakingFrame, "user turn", True),
    (UserStoppedSpeakingFrame, "user turn", False),
    (LLMFullResponseStartFrame, "LLM response", True),
    (LLMFullResponseEndFrame, "LLM response", False),
    (TTSStartedFrame, "TTS context", True),
    (TTSStoppedFrame, "TTS context", False),
    (BotStartedSpeakingFrame, "bot speaking", True),
    (BotStoppedSpeakingFrame, "bot speaking", False),
    (InterruptionFrame, "LLM response", False),
    (InterruptionFrame, "TTS context", False),
)


class _Recorder(BaseObserver):
    """Records each frame once and tracks what the conversation is busy with."""

    def __init__(self, assistant: LLMAssistantAggregator) -> None:
        super().__init__(observe_every_push=False)
        self._assistant = assistant
        self._busy = dict.fromkeys((name for _, name, _ in _BUSY_SWITCHES), False)
        self.frames: list[ObservedFrame] = []
        self.last_push = time.monotonic()
        self.changed = asyncio.Event()
        self.bot_stopped = 0
        """How many times the bot stopped speaking."""

    @property
    def bot_speaking(self) -> bool:
        return self._busy["bot speaking"]

    async def on_push_frame(self, data: FramePushed) -> None:
        frame = data.frame
        self.frames.append(
            ObservedFrame(data.timestamp / 1e9, data.source.name, data.direction, frame)
        )
        self.last_push = time.monotonic()
        if (
            isinstance(frame, BotStoppedSpeakingFrame)
            and data.direction is FrameDirection.DOWNSTREAM
        ):
            self.bot_stopped += 1
        for frame_type, name, on in _BUSY_SWITCHES:
            if isinstance(frame, frame_type):
                self._busy[name] = on
        self.changed.set()

    def busy_with(self, *, function_calls: bool = True) -> list[str]:
        """What keeps the conversation from being idle."""
        busy = [name for name, on in self._busy.items() if on]
        if function_calls and self._assistant.has_function_calls_in_progress:
            busy.append("function call")
        return busy

    async def wait_for(
        self,
        condition: str,
        check: Callable[[], bool],
        timeout_secs: float,
        *,
        left: float | None = None,
    ) -> None:
        """Wait until ``check()`` is true, failing with `TimeoutError` after the timeout.

        ``left`` is what remains of ``timeout_secs`` when part of it was spent already.
        """
        try:
            async with asyncio.timeout(max(0.0, timeout_secs if left is None else left)):
                while not check():
                    self.changed.clear()
                    # Re-check at least every 50 ms: quietness is a matter of time passing.
                    try:
                        async with asyncio.timeout(0.05):
                            await self.changed.wait()
                    except TimeoutError:
                        pass
        except TimeoutError:
            raise TimeoutError(
                f"conversation: {condition} not reached in {timeout_secs}s "
                f"(busy with: {', '.join(self.busy_with()) or 'nothing'})"
            ) from None


class _Driver:
    """Runs the script steps against a started worker."""

    def __init__(
        self,
        worker: PipelineWorker,
        recorder: _Recorder,
        output: FakeOutputTransport,
        clock: Clock,
    ) -> None:
        self._worker = worker
        self._recorder = recorder
        self._output = output
        self._clock = clock
        self._started_at = clock.now()

    def started(self) -> None:
        """The pipeline has started: ``at_secs`` counts from now."""
        self._started_at = self._clock.now()

    async def run(self, step: Step) -> None:
        if isinstance(step, UserSays):
            if step.at_secs is not None:
                await self._clock.sleep(step.at_secs - (self._clock.now() - self._started_at))
            await self._speak(step.text, step.speech_secs)
        elif isinstance(step, BargeIn):
            await self._barge_in(step)
        elif isinstance(step, Wait):
            await self._clock.sleep(step.secs)
        elif isinstance(step, WaitUntilIdle):
            await self._wait_until_idle(step)
        elif isinstance(step, Call):
            await step.fn()
        else:
            await self._worker.queue_frames(step.frames)

    async def _barge_in(self, step: BargeIn) -> None:
        recorder, output = self._recorder, self._output
        await recorder.wait_for("bot speaking", lambda: recorder.bot_speaking, step.timeout_secs)
        played_until = output.audio_secs_played + step.after_secs
        stopped = recorder.bot_stopped

        def spoken() -> bool:
            # A hair short of the mark counts: chunk lengths need not add up to it exactly.
            played = output.audio_secs_played >= played_until - 1e-6
            return played or recorder.bot_stopped > stopped

        await recorder.wait_for(f"{step.after_secs}s of bot audio", spoken, step.timeout_secs)
        await self._speak(step.text, step.speech_secs)

    async def _speak(self, text: str | None, speech_secs: float) -> None:
        await self._worker.queue_frames(user_starts_speaking())
        await asyncio.sleep(speech_secs)
        await self._worker.queue_frames(user_stops_speaking(text))

    async def _wait_until_idle(self, step: WaitUntilIdle) -> None:
        recorder = self._recorder

        def idle() -> bool:
            quiet = time.monotonic() - recorder.last_push >= step.quiet_secs
            return quiet and not recorder.busy_with(function_calls=step.function_calls)

        deadline = time.monotonic() + step.timeout_secs
        while True:
            await recorder.wait_for(
                "idle", idle, step.timeout_secs, left=deadline - time.monotonic()
            )
            # Still idle, with not one frame more, after a few turns of the loop.
            pushed = len(recorder.frames)
            for _ in range(_SETTLE_TURNS):
                await asyncio.sleep(0)
            if len(recorder.frames) == pushed and idle():
                return


async def run_conversation(
    script: Sequence[Step],
    *,
    llm: LLMService,
    tts: TTSService | None = None,
    transport: FakeTransport | None = None,
    context: LLMContext | None = None,
    after_user_aggregator: Sequence[FrameProcessor] = (),
    before_assistant_aggregator: Sequence[FrameProcessor] = (),
    user_params: LLMUserAggregatorParams | None = None,
    observers: Sequence[BaseObserver] = (),
    params: PipelineParams | None = None,
    app_resources: Any = None,
    settle: WaitUntilIdle | None = WaitUntilIdle(),
    timeout_secs: float = 30.0,
    enable_tracing: bool = False,
    clock: Clock | None = None,
    context_aggregator: LLMContextAggregatorPair | None = None,
    on_started: Callable[[PipelineWorker], Awaitable[None]] | None = None,
) -> ConversationResult:
    """Run ``script`` against a voice pipeline built around ``llm`` and return what happened.

    Args:
        script: The steps, run in order.
        llm: The LLM service (e.g. `ScriptedLLM`, with its tool handlers registered).
        tts: The TTS service; a new `FakeTTS` if omitted.
        transport: The transport; a new `FakeTransport` if omitted.
        context: The LLM context; a new empty one if omitted. It holds the final messages.
        after_user_aggregator: Processors placed between the user aggregator and the LLM.
        before_assistant_aggregator: Processors placed between the output transport and
            the assistant aggregator.
        user_params: User aggregator parameters; `offline_user_params` if omitted.
        observers: Extra observers for the pipeline worker.
        params: Pipeline parameters; 16 kHz in and out if omitted.
        app_resources: Passed to the worker (handlers see it as ``params.app_resources``).
        settle: The wait after the last step, before the ``EndFrame``; ``None`` ends at once.
        timeout_secs: Bound on the whole run; the pipeline is cancelled if it is exceeded.
        enable_tracing: Run with Pipecat's OpenTelemetry tracing (conversation and turn
            spans, on the global tracer provider).
        clock: What `Wait` and `UserSays.at_secs` wait on; real (monotonic) time if
            omitted. Everything else in the conversation runs in real time.
        context_aggregator: The aggregator pair to use (a `FlowManager` needs it); one
            around ``context`` with ``user_params`` if omitted (then ``context`` and
            ``user_params`` must be left out).
        on_started: Awaited with the worker once the pipeline started, before the first
            step (e.g. ``FlowManager.initialize``).

    Returns:
        What was heard, the final context messages and every frame pushed.

    Raises:
        TimeoutError: A step or the whole run took too long.
    """
    tts = tts if tts is not None else FakeTTS()
    transport = transport if transport is not None else FakeTransport()
    if context_aggregator is not None:
        if context is not None or user_params is not None:
            raise ValueError("give context_aggregator, or context and user_params, not both")
        pair = context_aggregator
        context = pair.user().context
    else:
        context = context if context is not None else LLMContext()
        pair = LLMContextAggregatorPair(context, user_params=user_params or offline_user_params())
    output = transport.output()
    pipeline = Pipeline(
        [
            transport.input(),
            pair.user(),
            *after_user_aggregator,
            llm,
            tts,
            output,
            *before_assistant_aggregator,
            pair.assistant(),
        ]
    )
    recorder = _Recorder(pair.assistant())
    worker = PipelineWorker(
        pipeline,
        params=params
        or PipelineParams(audio_in_sample_rate=_SAMPLE_RATE, audio_out_sample_rate=_SAMPLE_RATE),
        app_resources=app_resources,
        cancel_on_idle_timeout=False,
        idle_timeout_secs=None,
        enable_rtvi=False,
        enable_tracing=enable_tracing,
        observers=[recorder, *observers],
    )
    started = asyncio.Event()

    driver = _Driver(
        worker,
        recorder,
        output,
        clock if clock is not None else _MonotonicClock(),
    )

    async def _on_pipeline_started(worker: PipelineWorker, frame: StartFrame) -> None:
        driver.started()
        started.set()

    worker.add_event_handler("on_pipeline_started", _on_pipeline_started)

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    run_task = asyncio.create_task(runner.run())
    try:
        async with asyncio.timeout(timeout_secs):
            await started.wait()
            if on_started is not None:
                await on_started(worker)
            for step in script:
                await driver.run(step)
            if settle is not None:
                await driver.run(settle)
            await worker.queue_frame(EndFrame())
            await asyncio.shield(run_task)
    finally:
        if not run_task.done():
            await worker.cancel(reason="run_conversation failed")
            await run_task

    return ConversationResult(
        heard=list(output.heard),
        context_messages=list(context.get_messages()),
        frames=list(recorder.frames),
        spoken=list(tts.spoken) if isinstance(tts, FakeTTS) else [],
    )
