"""The pipeline template puts the processors where they work and refuses misplacements."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.processors.frame_processor import FrameProcessor
from pipecat.services.llm_service import FunctionCallParams

from pipecat_actions import (
    ActionContext,
    ActionRuntime,
    AllowAll,
    ConfigurationError,
    SessionState,
    action,
    attach,
    instrument,
)
from pipecat_actions.adapters import ActionResultGate, ActionStatusReporter, ActionTurnTracker
from pipecat_actions.adapters.pipeline import build_pipeline, check_placement
from pipecat_actions.policy import load_policy_text
from pipecat_actions.testing import ScriptedLLM


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


async def test_the_template_orders_user_aggregator_tracker_llm_reporter_gate_assistant_aggregator(
    runtime: ActionRuntime,
) -> None:
    session = SessionState(session_id="s", principal="p")
    llm = ScriptedLLM([])
    pipeline, gate = build_pipeline(
        runtime=runtime, session=session, llm=llm, context=LLMContext(messages=[])
    )
    names = [type(p).__name__ for p in pipeline.processors][1:-1]  # without source and sink
    assert names == [
        "LLMUserAggregator",
        "ActionTurnTracker",
        "ScriptedLLM",
        "ActionStatusReporter",
        "ActionResultGate",
        "LLMAssistantAggregator",
    ]
    assert isinstance(gate, ActionResultGate)


async def test_the_template_places_the_aggregator_pair_it_is_given(
    runtime: ActionRuntime,
) -> None:
    # Pipecat Flows' FlowManager needs the pair the pipeline runs.
    context = LLMContext(messages=[])
    pair = LLMContextAggregatorPair(context)
    pipeline, _ = build_pipeline(
        runtime=runtime,
        session=SessionState(session_id="s", principal="p"),
        llm=ScriptedLLM([]),
        context=context,
        context_aggregator=pair,
    )
    processors = pipeline.processors
    assert pair.user() in processors and pair.assistant() in processors


async def test_a_pair_around_another_context_is_refused(runtime: ActionRuntime) -> None:
    with pytest.raises(ConfigurationError, match="another LLMContext"):
        build_pipeline(
            runtime=runtime,
            session=SessionState(session_id="s", principal="p"),
            llm=ScriptedLLM([]),
            context=LLMContext(messages=[]),
            context_aggregator=LLMContextAggregatorPair(LLMContext(messages=[])),
        )


@pytest.mark.parametrize(
    ("order", "message"),
    [
        ("user tracker llm assistant gate", "right before the assistant aggregator"),
        ("user tracker llm assistant", "no ActionResultGate"),
        ("tracker user llm gate assistant", "after the user aggregator"),
        ("user llm tracker gate assistant", "before the LLM service"),
        ("user tracker gate llm assistant", "right before the assistant aggregator"),
        ("user tracker reporter llm gate assistant", "ActionStatusReporter must come after"),
    ],
)
async def test_misplaced_processors_are_refused_with_the_reason(
    runtime: ActionRuntime, order: str, message: str
) -> None:
    session = SessionState(session_id="s", principal="p")
    pair = LLMContextAggregatorPair(LLMContext(messages=[]))
    parts = {
        "user": pair.user(),
        "tracker": ActionTurnTracker(session),
        "llm": ScriptedLLM([]),
        "gate": ActionResultGate(runtime, session),
        "reporter": ActionStatusReporter(runtime, session),
        "assistant": pair.assistant(),
    }
    with pytest.raises(ConfigurationError, match=message):
        check_placement([parts[name] for name in order.split()])


# --- what is missing: the tracker, or the runtime's handlers on the LLM ------------------------


def _cascade(
    runtime: ActionRuntime,
    session: SessionState,
    llm: ScriptedLLM,
    *,
    tracker_session: SessionState | None = None,
) -> dict[str, FrameProcessor]:
    pair = LLMContextAggregatorPair(LLMContext(messages=[]))
    return {
        "user": pair.user(),
        "tracker": ActionTurnTracker(tracker_session or session),
        "llm": llm,
        "reporter": ActionStatusReporter(runtime, session),
        "output": FrameProcessor(name="transport-output"),
        "gate": ActionResultGate(runtime, session),
        "assistant": pair.assistant(),
    }


CASCADE = "user tracker llm reporter output gate assistant"


async def test_the_cascade_layout_with_the_runtime_attached_passes(runtime: ActionRuntime) -> None:
    # The control for the refusals below: each adds one fault to this layout.
    session, llm = SessionState(session_id="s", principal="p"), ScriptedLLM([])
    attach(runtime, llm, session)
    parts = _cascade(runtime, session, llm)
    check_placement([parts[name] for name in CASCADE.split()])


async def test_a_pipeline_without_a_turn_tracker_is_refused(runtime: ActionRuntime) -> None:
    session, llm = SessionState(session_id="s", principal="p"), ScriptedLLM([])
    attach(runtime, llm, session)
    parts = _cascade(runtime, session, llm)
    with pytest.raises(ConfigurationError) as refused:
        check_placement([parts[name] for name in CASCADE.split() if name != "tracker"])
    message = str(refused.value)
    assert "no ActionTurnTracker" in message
    assert "right after the user aggregator" in message


async def test_a_pipeline_whose_llm_the_runtime_was_never_attached_to_is_refused(
    runtime: ActionRuntime,
) -> None:
    session, llm = SessionState(session_id="s", principal="p"), ScriptedLLM([])
    parts = _cascade(runtime, session, llm)  # attach(runtime, llm, session) forgotten
    with pytest.raises(ConfigurationError) as refused:
        check_placement([parts[name] for name in CASCADE.split()])
    message = str(refused.value)
    assert "ScriptedLLM has no handler of this runtime for noop" in message
    assert "not currently available" in message  # what Pipecat would tell the model
    assert "attach(runtime, llm, session)" in message


async def test_an_application_handler_in_place_of_the_runtimes_is_refused(
    runtime: ActionRuntime,
) -> None:
    async def own(params: FunctionCallParams) -> None:
        await params.result_callback({})

    session, llm = SessionState(session_id="s", principal="p"), ScriptedLLM([])
    llm.register_function("noop", own)  # not routed through the runtime at all
    parts = _cascade(runtime, session, llm)
    with pytest.raises(ConfigurationError, match="no handler of this runtime for noop"):
        check_placement([parts[name] for name in CASCADE.split()])


async def test_handlers_attached_for_another_session_are_refused(runtime: ActionRuntime) -> None:
    session, llm = SessionState(session_id="s", principal="p"), ScriptedLLM([])
    attach(runtime, llm, SessionState(session_id="other", principal="mallory"))
    parts = _cascade(runtime, session, llm)
    with pytest.raises(ConfigurationError, match="attached for another SessionState"):
        check_placement([parts[name] for name in CASCADE.split()])


async def test_a_tracker_of_another_session_is_refused(runtime: ActionRuntime) -> None:
    session, llm = SessionState(session_id="s", principal="p"), ScriptedLLM([])
    attach(runtime, llm, session)
    other = SessionState(session_id="s", principal="p")  # the same ids, another state
    parts = _cascade(runtime, session, llm, tracker_session=other)
    with pytest.raises(ConfigurationError, match="different SessionStates"):
        check_placement([parts[name] for name in CASCADE.split()])


async def test_handlers_the_runtime_routes_need_no_attach_and_attach_and_instrument_combine(
    tmp_path: Path,
) -> None:
    # A routed handler (instrument, Flows) is the application's to register: a
    # pipeline with only those passes without attach; with an action too, attach and
    # instrument on one service keep each other's handlers.
    policy = load_policy_text(
        "version: 1\ntools:\n  noop:\n    kind: read\n  lookup:\n    kind: read\n"
    )
    routed_only = await ActionRuntime.create(
        load_policy_text("version: 1\ntools:\n  lookup:\n    kind: read\n"),
        authorizer=AllowAll(),
        routed=["lookup"],
        ledger_url=f"sqlite:///{tmp_path}/a.db",
    )
    both = await ActionRuntime.create(
        policy,
        authorizer=AllowAll(),
        actions=[noop],
        routed=["lookup"],
        ledger_url=f"sqlite:///{tmp_path}/b.db",
    )
    try:

        async def lookup(params: FunctionCallParams) -> None:
            await params.result_callback({"found": True})

        session = SessionState(session_id="s", principal="p")
        llm = ScriptedLLM([])
        instrument(routed_only, llm, session)
        llm.register_function("lookup", lookup)
        parts = _cascade(routed_only, session, llm)
        check_placement([parts[name] for name in CASCADE.split()])

        llm = ScriptedLLM([])
        attach(both, llm, session)
        instrument(both, llm, session)
        llm.register_function("lookup", lookup)
        parts = _cascade(both, session, llm)
        check_placement([parts[name] for name in CASCADE.split()])
        assert both.bindings["lookup"].action.app_handler
    finally:
        await routed_only.close()
        await both.close()
