"""The pipeline template puts the processors where they work and refuses misplacements."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair

from pipecat_actions import (
    ActionContext,
    ActionRuntime,
    AllowAll,
    ConfigurationError,
    SessionState,
    action,
)
from pipecat_actions.pipeline import build_pipeline, check_placement
from pipecat_actions.policy import load_policy_text
from pipecat_actions.processors import ActionResultGate, ActionStatusReporter, ActionTurnTracker
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

