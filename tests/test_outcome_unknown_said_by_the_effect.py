"""An effect's own "sent, but I don't know what came of it" is never recorded as committed.

Observed in Flows: a handler that caught its provider's timeout and returned
``{"status": "unknown"}`` was recorded COMMITTED. The one documented way to say it is
`EffectOutcomeUnknown`: raised, or given as the answer (a bare Pipecat handler's
``result_callback``, a Flows handler's result). Either way, on every path (an ``@action``, a
handler routed by ``instrument``, a direct function, a Flows handler), the operation is UNKNOWN,
reconciled when a hook can look, and the model hears "not yet known", never "done".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pipecat.flows import FlowManager, FlowsFunctionSchema
from pipecat.frames.frames import LLMRunFrame
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.services.llm_service import FunctionCallParams

from pipecat_actions import EffectOutcomeUnknown, instrument
from pipecat_actions.actions import ActionContext, Reconciliation, action
from pipecat_actions.admission.authorization import AllowAll
from pipecat_actions.policy import load_policy_text
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.session import SessionState
from pipecat_actions.status import ActionStatus
from pipecat_actions.testing import Say, ScriptedLLM, ToolCalls
from pipecat_actions.testing.conversation import UserSays, WaitUntilIdle
from tests.flows._support import POLICY as POLICY_FLOWS
from tests.flows._support import flow_agent, python_node, tool_messages
from tests.processors._clocked import run_script, until

S = ActionStatus
POLICY = """
version: 1
tools:
  add_note:
    kind: mutation
"""


def _session() -> SessionState:
    return SessionState(session_id="s1", principal="alice")


async def _runtime(tmp_path: Path, **options: Any) -> ActionRuntime:
    return await ActionRuntime.create(
        load_policy_text(POLICY),
        authorizer=AllowAll(),
        ledger_url=f"sqlite:///{tmp_path}/l.db",
        **options,
    )


@pytest.mark.parametrize("how", ["raised", "returned"])
async def test_an_action_that_says_it_does_not_know_is_unknown_and_reconciled(
    tmp_path: Path, how: str
) -> None:
    found: list[str] = []

    async def look(ctx: ActionContext) -> Reconciliation:
        found.append(ctx.operation_id)
        return Reconciliation.committed({"note": "found at the provider"})

    @action(reconcile=look)
    async def add_note(ctx: ActionContext, text: str) -> Any:
        """Add a note."""
        said = EffectOutcomeUnknown("the provider timed out after the request was sent")
        if how == "raised":
            raise said
        return said

    runtime = await _runtime(tmp_path, actions=[add_note])
    try:
        told = await runtime.propose("add_note", {"text": "window"}, _session())
        op = await runtime.ledger.get(told["operation_id"])
        trail = await runtime.ledger.events(op.operation_id)
    finally:
        await runtime.close()

    assert told["status"] == "committed"  # what the reconcile hook found, not the effect's say
    assert [e.to_status for e in trail if e.kind.value == "transition"] == [S.UNKNOWN, S.COMMITTED]
    assert trail[-1].detail == {"reason": "reconciled"}
    assert found == [op.operation_id]


async def _converse(llm: ScriptedLLM, context: LLMContext) -> None:
    pair = LLMContextAggregatorPair(context)

    def answered() -> bool:
        tools = [m for m in context.get_messages() if m.get("role") == "tool"]
        return len(tools) >= 1 and all(m["content"] != "IN_PROGRESS" for m in tools)

    await run_script(
        [pair.user(), llm, pair.assistant()],
        [LLMRunFrame(), lambda: until(answered, what="the tool result in the context")],
    )


@pytest.mark.parametrize("how", ["raised", "answered"])
@pytest.mark.parametrize("kind", ["handler", "direct"])
async def test_an_instrumented_handler_that_says_it_does_not_know_is_never_committed(
    tmp_path: Path, how: str, kind: str
) -> None:
    async def answer(params: FunctionCallParams) -> None:
        said = EffectOutcomeUnknown("the provider timed out after the request was sent")
        if how == "raised":
            raise said
        await params.result_callback(said)

    async def add_note(params: FunctionCallParams) -> None:
        await answer(params)

    async def add_note_direct(params: FunctionCallParams, text: str) -> None:
        """Add a note.

        Args:
            text: The note.
        """
        await answer(params)

    add_note_direct.__name__ = "add_note"
    runtime = await _runtime(tmp_path, routed=["add_note"])
    try:
        llm = ScriptedLLM([ToolCalls([("add_note", {"text": "window"})]), Say("Checking.")])
        instrument(runtime, llm, _session())
        if kind == "handler":
            llm.register_function("add_note", add_note)
        else:
            llm.register_direct_function(add_note_direct)
        context = LLMContext(
            messages=[{"role": "user", "content": "A window seat, please."}],
            tools=_tools(kind, add_note_direct),
        )
        await _converse(llm, context)
        (op,) = await runtime.ledger.list()
    finally:
        await runtime.close()

    (message,) = [m for m in context.get_messages() if m.get("role") == "tool"]
    told = json.loads(message["content"])
    assert op.status is S.UNKNOWN  # no reconcile hook: a person checks it (escalated)
    assert op.escalated_at is not None
    assert told["status"] == "unknown"
    assert "succeeded" not in told["message"].replace("Do not say it succeeded", "")


def _tools(kind: str, direct: Any) -> Any:
    from pipecat.adapters.schemas.tools_schema import ToolsSchema
    from pipecat.processors.aggregators.llm_context import NOT_GIVEN

    return ToolsSchema(standard_tools=[direct]) if kind == "direct" else NOT_GIVEN


@pytest.mark.parametrize("how", ["raised", "returned"])
async def test_a_flows_handler_that_says_it_does_not_know_keeps_the_node_and_is_unknown(
    tmp_path: Path, how: str
) -> None:
    async def note(args: dict[str, Any], flow_manager: FlowManager) -> tuple[Any, Any]:
        said = EffectOutcomeUnknown("the provider timed out after the request was sent")
        if how == "raised":
            raise said
        return said, python_node("noted")

    schema = FlowsFunctionSchema(
        name="note_details",
        description="Note what the caller said.",
        properties={"text": {"type": "string"}},
        required=["text"],
        handler=note,
    )
    script = [
        Say("Hello."),
        ToolCalls([("note_details", {"text": "window"})]),
        Say("I am not sure it was noted; I am checking."),
    ]
    # A mutation: a read's "not known" is only a failed attempt, tried again.
    mutation = POLICY_FLOWS.replace(
        "note_details:\n        kind: read", "note_details:\n        kind: mutation"
    )
    async with flow_agent(tmp_path, script, kind="python", policy_text=mutation) as a:

        async def start(manager: FlowManager) -> None:
            await manager.initialize(python_node("greet", [schema]))

        a.start = start
        result = await a.converse([WaitUntilIdle(), UserSays("A window seat."), WaitUntilIdle()])
        (op,) = await a.operations("note_details")

    assert op.status is S.UNKNOWN
    assert [m["status"] for m in tool_messages(result)] == ["unknown"]
    assert a.nodes == ["greet"]  # an unconditional next node is followed only on a commit
