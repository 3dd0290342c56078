"""Speech-to-speech services get their layout and adapter, and their misplacements are refused.

Every service here is built offline (pointed at a closed port, never started): construction
opens no connection, and no pipeline here runs a real service. The tracker is driven through a
small pipeline with a stand-in where the service would be.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from pipecat.frames.frames import (
    EndFrame,
    Frame,
    InterruptionFrame,
    LLMContextFrame,
    LLMServiceMetadataFrame,
    UserStartedSpeakingFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.azure.realtime.llm import AzureRealtimeLLMService
from pipecat.services.google.gemini_live.llm import GeminiLiveLLMService
from pipecat.services.llm_service import LLMService
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
from pipecat.workers.runner import WorkerRunner

from pipecat_actions import ActionContext, ActionRuntime, AllowAll, SessionState, action, attach
from pipecat_actions.adapters import ActionResultGate, ActionStatusReporter, ActionTurnTracker
from pipecat_actions.adapters.pipeline import build_pipeline, check_placement
from pipecat_actions.adapters.realtime import adapt_realtime, adapter_of, is_realtime_service
from pipecat_actions.errors import ConfigurationError
from pipecat_actions.policy import load_policy_text
from pipecat_actions.testing import ScriptedLLM
from tests._waiting import eventually, guarded

CLOSED_PORT = "ws://127.0.0.1:9"
"""Nothing listens there: a service that tried to connect would fail, not reach a provider."""


def openai_service() -> LLMService:
    return OpenAIRealtimeLLMService(api_key="x", base_url=CLOSED_PORT)


def azure_service() -> LLMService:
    return AzureRealtimeLLMService(api_key="x", base_url=CLOSED_PORT)


def gemini_service() -> LLMService:
    return GeminiLiveLLMService(
        api_key="x",
        settings=GeminiLiveLLMService.Settings(
            model="models/gemini-2.5-flash-native-audio-preview-09-2025"
        ),
    )


REALTIME_SERVICES = pytest.mark.parametrize(
    "make_service",
    [openai_service, azure_service, gemini_service],
    ids=["openai", "azure", "gemini"],
)


@action
async def noop(ctx: ActionContext) -> dict[str, Any]:
    """Do nothing."""
    return {}


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[ActionRuntime]:
    opened = await ActionRuntime.create(
        load_policy_text("version: 1\ntools:\n  noop:\n    kind: read\n"),
        authorizer=AllowAll(),
        actions=[noop],
        ledger_url=f"sqlite:///{tmp_path}/l.db",
    )
    yield opened
    await opened.close()


class FakeTransport:
    """A transport whose input and output are plain processors, the same ones each time."""

    def __init__(self) -> None:
        self.input_processor = FrameProcessor(name="transport-input")
        self.output_processor = FrameProcessor(name="transport-output")

    def input(self) -> FrameProcessor:
        return self.input_processor

    def output(self) -> FrameProcessor:
        return self.output_processor


def _session() -> SessionState:
    return SessionState(session_id="s", principal="p")


# --- build_pipeline with a speech-to-speech service ------------------------------------------


@REALTIME_SERVICES
async def test_a_realtime_service_gets_the_speech_to_speech_layout_without_stt_or_tts(
    runtime: ActionRuntime, make_service: Callable[[], LLMService]
) -> None:
    llm = make_service()
    assert is_realtime_service(llm)
    pipeline, gate = build_pipeline(
        runtime=runtime, session=_session(), llm=llm, context=LLMContext(messages=[])
    )
    inner = pipeline.processors[1:-1]  # without Pipecat's source and sink
    assert [type(p).__name__ for p in inner] == [
        "LLMUserAggregator",
        "ActionTurnTracker",
        type(llm).__name__,
        "ActionStatusReporter",
        "ActionResultGate",
        "LLMAssistantAggregator",
    ]
    assert inner[2] is llm
    assert inner[4] is gate
    check_placement(pipeline.processors)
    check_placement(inner)


@REALTIME_SERVICES
async def test_build_pipeline_installs_the_adapter_and_the_gate_speaks_through_it(
    runtime: ActionRuntime, make_service: Callable[[], LLMService]
) -> None:
    llm = make_service()
    session = _session()
    assert adapter_of(llm) is None
    _, gate = build_pipeline(runtime=runtime, session=session, llm=llm, context=LLMContext([]))
    adapter = adapter_of(llm)
    assert adapter is not None
    assert gate.speaker is adapter
    assert adapter.gate is gate
    assert adapter.llm is llm
    assert adapter.session is session
    assert not adapter.connected()  # built offline: the service never connected


@REALTIME_SERVICES
async def test_a_transport_brackets_the_realtime_layout_input_first_output_before_the_gate(
    runtime: ActionRuntime, make_service: Callable[[], LLMService]
) -> None:
    llm = make_service()
    transport = FakeTransport()
    pipeline, gate = build_pipeline(
        runtime=runtime,
        session=_session(),
        llm=llm,
        context=LLMContext(messages=[]),
        transport=transport,
    )
    inner = pipeline.processors[1:-1]
    assert inner[0] is transport.input_processor
    assert inner[inner.index(gate) - 1] is transport.output_processor
    assert [type(p).__name__ for p in inner] == [
        "FrameProcessor",
        "LLMUserAggregator",
        "ActionTurnTracker",
        type(llm).__name__,
        "ActionStatusReporter",
        "FrameProcessor",
        "ActionResultGate",
        "LLMAssistantAggregator",
    ]
    check_placement(pipeline.processors)


# --- build_pipeline with a cascade service ---------------------------------------------------


async def test_a_cascade_service_keeps_the_cascade_layout_and_gets_no_adapter(
    runtime: ActionRuntime,
) -> None:
    llm = ScriptedLLM([])
    transport = FakeTransport()
    stt, tts = FrameProcessor(name="stt"), FrameProcessor(name="tts")
    pipeline, gate = build_pipeline(
        runtime=runtime,
        session=_session(),
        llm=llm,
        context=LLMContext(messages=[]),
        stt=stt,
        tts=tts,
        transport=transport,
    )
    inner = pipeline.processors[1:-1]
    assert [p.name for p in inner[:2]] == ["transport-input", "stt"]
    assert [type(p).__name__ for p in inner[2:6]] == [
        "LLMUserAggregator",
        "ActionTurnTracker",
        "ScriptedLLM",
        "ActionStatusReporter",
    ]
    assert inner[6] is tts
    assert inner[7] is transport.output_processor
    assert inner[8] is gate
    assert type(inner[9]).__name__ == "LLMAssistantAggregator"
    assert not is_realtime_service(llm)
    assert adapter_of(llm) is None
    assert gate.speaker is None


# --- check_placement and adapt_realtime refuse what cannot work --------------------------------


def _parts(
    runtime: ActionRuntime, session: SessionState, llm: LLMService, gate: ActionResultGate
) -> dict[str, FrameProcessor]:
    pair = LLMContextAggregatorPair(LLMContext(messages=[]))
    return {
        "user": pair.user(),
        "tracker": ActionTurnTracker(session),
        "llm": llm,
        "reporter": ActionStatusReporter(runtime, session),
        "output": FrameProcessor(name="transport-output"),
        "gate": gate,
        "assistant": pair.assistant(),
    }


REALTIME_LAYOUT = "user tracker llm reporter output gate assistant"


@REALTIME_SERVICES
async def test_a_realtime_service_without_its_adapter_is_refused(
    runtime: ActionRuntime, make_service: Callable[[], LLMService]
) -> None:
    session, llm = _session(), make_service()
    attach(runtime, llm, session)
    parts = _parts(runtime, session, llm, ActionResultGate(runtime, session))
    with pytest.raises(ConfigurationError) as refused:
        check_placement([parts[name] for name in REALTIME_LAYOUT.split()])
    message = str(refused.value)
    assert type(llm).__name__ in message
    assert "speech-to-speech service with no realtime adapter" in message
    assert "CANCELLED" in message
    assert "adapt_realtime" in message


@REALTIME_SERVICES
async def test_the_same_layout_with_the_adapter_installed_passes(
    runtime: ActionRuntime, make_service: Callable[[], LLMService]
) -> None:
    # The control for the refusals around it: only the fault each one adds is refused.
    session, llm = _session(), make_service()
    gate = ActionResultGate(runtime, session)
    attach(runtime, llm, session)
    adapt_realtime(runtime, llm, session, gate)
    parts = _parts(runtime, session, llm, gate)
    check_placement([parts[name] for name in REALTIME_LAYOUT.split()])


@REALTIME_SERVICES
async def test_a_realtime_layout_without_a_turn_tracker_or_without_attach_is_refused(
    runtime: ActionRuntime, make_service: Callable[[], LLMService]
) -> None:
    session, llm = _session(), make_service()
    gate = ActionResultGate(runtime, session)
    adapt_realtime(runtime, llm, session, gate)  # attach(runtime, llm, session) forgotten
    parts = _parts(runtime, session, llm, gate)
    with pytest.raises(ConfigurationError) as unattached:
        check_placement([parts[name] for name in REALTIME_LAYOUT.split()])
    assert f"{type(llm).__name__} has no handler of this runtime for noop" in str(unattached.value)
    attach(runtime, llm, session)
    without_tracker = [parts[name] for name in REALTIME_LAYOUT.split() if name != "tracker"]
    with pytest.raises(ConfigurationError, match="no ActionTurnTracker"):
        check_placement(without_tracker)


@REALTIME_SERVICES
async def test_an_adapter_speaking_through_another_pipelines_gate_is_refused(
    runtime: ActionRuntime, make_service: Callable[[], LLMService]
) -> None:
    session, llm = _session(), make_service()
    gate_a, gate_b = ActionResultGate(runtime, session), ActionResultGate(runtime, session)
    attach(runtime, llm, session)
    adapter = adapt_realtime(runtime, llm, session, gate_a)
    assert gate_a.speaker is adapter
    assert gate_b.speaker is None
    parts = _parts(runtime, session, llm, gate_b)
    with pytest.raises(ConfigurationError) as refused:
        check_placement([parts[name] for name in REALTIME_LAYOUT.split()])
    message = str(refused.value)
    assert type(llm).__name__ in message
    assert "speaks through another pipeline's ActionResultGate" in message
    assert "wrong conversation" in message


@pytest.mark.parametrize(
    ("order", "reason"),
    [
        ("user tracker gate assistant llm reporter", "ActionResultGate must come after the LLM"),
        (
            "user tracker gate llm reporter assistant",
            "ActionResultGate must come right before the assistant aggregator",
        ),
        (
            "user llm tracker reporter output gate assistant",
            "ActionTurnTracker must come before the LLM service",
        ),
        (
            "user tracker llm reporter gate output assistant",
            "ActionResultGate must come right before the assistant aggregator (it must see "
            "what the aggregator sees, in the same order); it is followed by FrameProcessor",
        ),
    ],
    ids=[
        "gate-before-the-service",
        "gate-before-the-service-and-away-from-the-aggregator",
        "tracker-after-the-service",
        "gate-not-right-before-the-assistant-aggregator",
    ],
)
async def test_misplaced_processors_around_a_realtime_service_are_refused_with_the_reason(
    runtime: ActionRuntime, order: str, reason: str
) -> None:
    session, llm = _session(), openai_service()
    gate = ActionResultGate(runtime, session)
    attach(runtime, llm, session)
    adapt_realtime(runtime, llm, session, gate)
    parts = _parts(runtime, session, llm, gate)
    with pytest.raises(ConfigurationError) as refused:
        check_placement([parts[name] for name in order.split()])
    assert reason in str(refused.value)


@REALTIME_SERVICES
async def test_adapting_a_service_twice_is_refused_and_leaves_the_first_adapter(
    runtime: ActionRuntime, make_service: Callable[[], LLMService]
) -> None:
    session, llm = _session(), make_service()
    gate_a, gate_b = ActionResultGate(runtime, session), ActionResultGate(runtime, session)
    first = adapt_realtime(runtime, llm, session, gate_a)
    with pytest.raises(ConfigurationError, match="already has a realtime adapter") as refused:
        adapt_realtime(runtime, llm, session, gate_b)
    assert type(llm).__name__ in str(refused.value)
    assert adapter_of(llm) is first
    assert gate_a.speaker is first
    assert gate_b.speaker is None


@REALTIME_SERVICES
async def test_building_a_second_pipeline_on_an_adapted_service_is_refused_before_it_rebinds(
    tmp_path: Path, make_service: Callable[[], LLMService]
) -> None:
    @action
    async def note(ctx: ActionContext, text: str) -> dict[str, Any]:
        """Write a note."""
        return {"noted": text}

    runtime = await ActionRuntime.create(
        load_policy_text("version: 1\ntools:\n  note:\n    kind: mutation\n"),
        authorizer=AllowAll(),
        actions=[note],
        ledger_url=f"sqlite:///{tmp_path}/notes.db",
    )
    try:
        await _second_build_is_refused(runtime, make_service())
    finally:
        await runtime.close()


async def _second_build_is_refused(runtime: ActionRuntime, llm: LLMService) -> None:
    first = SessionState(session_id="s1", principal="p")
    build_pipeline(runtime=runtime, session=first, llm=llm, context=LLMContext())
    handlers = {name: item.handler for name, item in llm._functions.items()}
    assert "note" in handlers
    with pytest.raises(ConfigurationError, match="already has a realtime adapter"):
        build_pipeline(
            runtime=runtime,
            session=SessionState(session_id="s2", principal="p"),
            llm=llm,
            context=LLMContext(),
        )
    # Nothing was registered again: the service's handlers still serve the first session.
    assert {name: item.handler for name, item in llm._functions.items()} == handlers
    adapter = adapter_of(llm)
    assert adapter is not None and adapter.session is first


async def test_adapting_a_cascade_service_is_refused_as_not_speech_to_speech(
    runtime: ActionRuntime,
) -> None:
    session, llm = _session(), ScriptedLLM([])
    gate = ActionResultGate(runtime, session)
    with pytest.raises(ConfigurationError) as refused:
        adapt_realtime(runtime, llm, session, gate)
    message = str(refused.value)
    assert "ScriptedLLM is not a speech-to-speech service" in message
    assert "cascade layout" in message
    assert adapter_of(llm) is None
    assert gate.speaker is None


# --- ActionTurnTracker with a speech-to-speech service -----------------------------------------


class ServiceStandIn(FrameProcessor):
    """Stands where the LLM service is: records what reaches it, sends frames upstream."""

    def __init__(self) -> None:
        super().__init__(name="service-stand-in")
        self.received: list[Frame] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if direction is FrameDirection.DOWNSTREAM:
            self.received.append(frame)
        await self.push_frame(frame, direction)


class TrackerBench:
    """A running pipeline ``tracker → stand-in``; each frame sent is awaited at the stand-in."""

    def __init__(self, session: SessionState) -> None:
        self.session = session
        self.tracker = ActionTurnTracker(session)
        self.service = ServiceStandIn()
        self.worker = PipelineWorker(
            Pipeline([self.tracker, self.service]), cancel_on_idle_timeout=False
        )
        self._started = asyncio.Event()
        self.worker.event_handler("on_pipeline_started")(self._on_started)

    async def _on_started(self, worker: Any, frame: Any) -> None:
        self._started.set()

    async def announce(self, metadata: LLMServiceMetadataFrame) -> None:
        """The service's metadata, upstream from where the service is (as it broadcasts it)."""
        await self.service.push_frame(metadata, FrameDirection.UPSTREAM)
        await eventually(
            lambda: self.tracker.realtime == metadata.is_realtime_service,
            what="the tracker to read the service's metadata",
        )

    async def send(self, frame: Frame) -> None:
        """Send ``frame`` downstream into the tracker and wait until it passed it on."""
        await self.worker.queue_frame(frame)
        await eventually(
            lambda: any(seen is frame for seen in self.service.received),
            what=f"{type(frame).__name__} to pass the tracker",
        )

    async def __aenter__(self) -> TrackerBench:
        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(self.worker)
        self._run = asyncio.create_task(runner.run())
        await guarded(self._started.wait(), what="the pipeline to start")
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.worker.queue_frame(EndFrame())
        await guarded(self._run, what="the pipeline to end")


def _realtime_metadata() -> LLMServiceMetadataFrame:
    return LLMServiceMetadataFrame(service_name="x", is_realtime_service=True)


def _context_frame() -> LLMContextFrame:
    return LLMContextFrame(context=LLMContext(messages=[]))


async def test_after_realtime_metadata_a_context_frame_starts_no_generation() -> None:
    session = _session()
    async with TrackerBench(session) as bench:
        await bench.announce(_realtime_metadata())
        await bench.send(_context_frame())
        await bench.send(_context_frame())
    assert bench.tracker.realtime is True
    assert session.generation == 0


@pytest.mark.parametrize(
    "metadata",
    [None, LLMServiceMetadataFrame(service_name="x")],
    ids=["no-metadata", "cascade-metadata"],
)
async def test_for_a_cascade_service_each_context_frame_starts_a_generation(
    metadata: LLMServiceMetadataFrame | None,
) -> None:
    session = _session()
    async with TrackerBench(session) as bench:
        if metadata is not None:
            await bench.announce(metadata)
        await bench.send(_context_frame())
        assert session.generation == 1
        await bench.send(_context_frame())
    assert bench.tracker.realtime is False
    assert session.generation == 2


async def test_in_realtime_mode_the_tracker_still_records_user_turns_and_interruptions() -> None:
    session = _session()
    async with TrackerBench(session) as bench:
        await bench.announce(_realtime_metadata())
        await bench.send(UserStartedSpeakingFrame())
        assert session.user_turn == 1
        assert session.user_speaking is True
        # The adapter counts the provider's responses; here one has started.
        generation = session.start_generation()
        await bench.send(_context_frame())
        assert session.generation == generation  # the context frame added none
        assert not session.is_interrupted(generation)
        await bench.send(InterruptionFrame())
        assert session.is_interrupted(generation)
        await bench.send(UserStartedSpeakingFrame())
        assert session.user_turn == 2
    assert session.generation == generation


async def test_a_speech_to_speech_service_without_an_adapter_of_its_own_is_refused_by_name(
    runtime: ActionRuntime,
) -> None:
    from pipecat.services.xai.realtime.llm import GrokRealtimeLLMService

    llm = GrokRealtimeLLMService(api_key="x")
    assert is_realtime_service(llm)
    with pytest.raises(ConfigurationError, match="GrokRealtimeLLMService is not a speech-to-spe"):
        build_pipeline(runtime=runtime, session=_session(), llm=llm, context=LLMContext())
