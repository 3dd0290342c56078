"""A pipeline without an ActionTurnTracker says so in one line naming the fix, once.

Without the tracker the session never learns of turns and interruptions, so a call from a reply
the user interrupted would run: the gate notices when the pipeline starts, and the handlers
``attach`` registers notice at a call (a pipeline with no gate either).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pipecat.frames.frames import LLMRunFrame
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair

from pipecat_actions import (
    ActionContext,
    ActionResultGate,
    ActionRuntime,
    ActionTurnTracker,
    AllowAll,
    SessionState,
    action,
    attach,
    tools_schema,
)
from pipecat_actions.policy import load_policy_text
from pipecat_actions.testing import ScriptedLLM, ToolCalls
from pipecat_actions.testing.logs import capture_logs
from tests.processors._clocked import FLUSH, run_script, until


@action
async def get_weather(ctx: ActionContext, city: str) -> dict[str, Any]:
    """Read the weather in a city."""
    return {"city": city, "sky": "clear"}


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[ActionRuntime]:
    opened = await ActionRuntime.create(
        load_policy_text("version: 1\ntools:\n  get_weather:\n    kind: read\n"),
        authorizer=AllowAll(),
        actions=[get_weather],
        ledger_url=f"sqlite:///{tmp_path}/l.db",
    )
    yield opened
    await opened.close()


def _untracked(lines: list[str]) -> list[str]:
    return [line for line in lines if "no ActionTurnTracker keeps session" in line]


async def test_a_gate_without_a_tracker_warns_once_when_the_pipeline_starts(
    runtime: ActionRuntime,
) -> None:
    session = SessionState(session_id="s-untracked", principal="p")
    pair = LLMContextAggregatorPair(LLMContext(messages=[]))
    llm = ScriptedLLM([])
    attach(runtime, llm, session)
    with capture_logs("WARNING") as lines:
        await run_script(
            [pair.user(), llm, ActionResultGate(runtime, session), pair.assistant()], [FLUSH]
        )
    [line] = _untracked(lines)
    assert line.startswith("WARNING")
    assert "s-untracked" in line and "the ActionResultGate started" in line
    assert "put ActionTurnTracker(session) right after the user aggregator" in line
    assert "\n" not in line.rstrip("\n")  # one line
    assert not session.turns_tracked


async def test_a_pipeline_with_the_tracker_in_place_says_nothing_of_it(
    runtime: ActionRuntime,
) -> None:
    session = SessionState(session_id="s-tracked", principal="p")
    pair = LLMContextAggregatorPair(LLMContext(messages=[]))
    llm = ScriptedLLM([])
    attach(runtime, llm, session)
    processors = [
        pair.user(),
        ActionTurnTracker(session),
        llm,
        ActionResultGate(runtime, session),
        pair.assistant(),
    ]
    with capture_logs("WARNING") as lines:
        await run_script(processors, [FLUSH])
    assert _untracked(lines) == []
    assert session.turns_tracked


async def test_a_call_in_a_pipeline_with_neither_tracker_nor_gate_warns_at_the_call(
    runtime: ActionRuntime,
) -> None:
    session = SessionState(session_id="s-bare", principal="p")
    context = LLMContext(messages=[], tools=tools_schema(runtime))
    pair = LLMContextAggregatorPair(context)
    llm = ScriptedLLM([ToolCalls([("get_weather", {"city": "Lyon"})])])
    attach(runtime, llm, session)

    def answered() -> bool:
        return any(m.get("role") == "tool" for m in context.get_messages())

    with capture_logs("WARNING") as lines:
        await run_script(
            [pair.user(), llm, pair.assistant()],
            [LLMRunFrame(), lambda: until(answered, what="the tool result in the context")],
        )
    [line] = _untracked(lines)
    assert "a call of get_weather arrived" in line
    assert "ActionTurnTracker(session)" in line
    # The call still ran: a warning for this release (CHANGELOG.md), a refusal in the next.
    [tool] = [m for m in context.get_messages() if m.get("role") == "tool"]
    assert json.loads(tool["content"])["status"] == "committed"
