"""An instrumented handler keeps what Pipecat gives it and what it gives back to Pipecat.

Its call runs as an admitted operation's effect, outside Pipecat's call: it still gets the
call's ``llm``, ``context`` and ``pipeline_worker``; its result properties (``run_llm``,
``on_context_updated``) reach Pipecat when the operation committed in that call; a handler
registered again under the same name serves the calls made after it; an operation run with no
call (in another runtime, after the first one ended) gets a clear error for what it cannot
have.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pipecat.frames.frames import FunctionCallResultProperties, LLMRunFrame
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.services.llm_service import FunctionCallParams

from pipecat_actions import instrument
from pipecat_actions.actions import action_context
from pipecat_actions.admission.authorization import AllowAll, Decision
from pipecat_actions.approvals import Approver
from pipecat_actions.clock import ManualClock
from pipecat_actions.policy import load_policy_text
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.session import SessionState
from pipecat_actions.status import ActionStatus
from pipecat_actions.testing import Say, ScriptedLLM, ToolCalls
from tests.processors._clocked import run_script, until

S = ActionStatus
POLICY = """
version: 1
tools:
  add_note:
    kind: mutation
  refund:
    kind: mutation
    risk: high
    confirmation: {mode: approval, approvers: [maria]}
    deadline_secs: 600
"""


async def _runtime(
    tmp_path: Path, authorizer: Any = None, clock: ManualClock | None = None
) -> ActionRuntime:
    return await ActionRuntime.create(
        load_policy_text(POLICY),
        authorizer=authorizer or AllowAll(),
        routed=["add_note", "refund"],  # handlers the tests register on the LLM
        ledger_url=f"sqlite:///{tmp_path}/l.db",
        clock=clock,
    )


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[ActionRuntime]:
    opened = await _runtime(tmp_path)
    yield opened
    await opened.close()


def _session() -> SessionState:
    return SessionState(session_id="s1", principal="alice")


async def _converse(llm: ScriptedLLM, context: LLMContext, calls: int = 1) -> None:
    """Run inferences until ``calls`` tool results are in the context and the model is done."""
    pair = LLMContextAggregatorPair(context)

    def answered() -> bool:
        tools = [m for m in context.get_messages() if m.get("role") == "tool"]
        return len(tools) >= calls and all(m["content"] != "IN_PROGRESS" for m in tools)

    await run_script(
        [pair.user(), llm, pair.assistant()],
        [LLMRunFrame(), lambda: until(answered, what="the tool results in the context")],
    )


def _tool_results(context: LLMContext) -> list[dict[str, Any]]:
    return [json.loads(m["content"]) for m in context.get_messages() if m.get("role") == "tool"]


async def test_a_committed_handlers_result_properties_reach_pipecat(runtime: ActionRuntime) -> None:
    updated: list[str] = []

    async def after_the_context_has_it() -> None:
        updated.append("context updated")

    async def add_note(params: FunctionCallParams) -> None:
        await params.result_callback(
            {"noted": True},
            properties=FunctionCallResultProperties(
                run_llm=False, on_context_updated=after_the_context_has_it
            ),
        )

    llm = ScriptedLLM([ToolCalls([("add_note", {"text": "window seat"})]), Say("Noted.")])
    instrument(runtime, llm, _session())
    llm.register_function("add_note", add_note)
    context = LLMContext(messages=[{"role": "user", "content": "A window seat, please."}])
    await _converse(llm, context)
    await until(lambda: updated, what="on_context_updated to run")

    assert updated == ["context updated"]
    assert llm.inferences == 1  # run_llm=False: no inference after the result
    (result,) = _tool_results(context)
    assert result["status"] == "committed" and result["result"] == {"noted": True}


async def test_a_refused_call_is_answered_without_the_handlers_properties(
    tmp_path: Path,
) -> None:
    class Deny:
        async def authorize(self, request: Any) -> Decision:
            return Decision.deny("not yours")

    ran: list[bool] = []

    async def add_note(params: FunctionCallParams) -> None:
        ran.append(True)
        await params.result_callback({}, properties=FunctionCallResultProperties(run_llm=False))

    runtime = await _runtime(tmp_path, authorizer=Deny())
    try:
        llm = ScriptedLLM([ToolCalls([("add_note", {"text": "x"})]), Say("I can't do that.")])
        instrument(runtime, llm, _session())
        llm.register_function("add_note", add_note)
        context = LLMContext(messages=[{"role": "user", "content": "Note it."}])
        await _converse(llm, context)
        await until(lambda: llm.inferences == 2, what="the model to tell the refusal")
    finally:
        await runtime.close()

    assert ran == []
    assert _tool_results(context)[0]["status"] == "refused"


async def test_a_handler_gets_its_calls_llm_context_and_worker(runtime: ActionRuntime) -> None:
    seen: dict[str, Any] = {}

    async def add_note(params: FunctionCallParams) -> None:
        seen.update(
            operation_id=action_context().operation_id,
            llm=params.llm,
            context=params.context,
            worker=params.pipeline_worker,
            tool_call_id=params.tool_call_id,
        )
        await params.result_callback({"noted": True})

    llm = ScriptedLLM([ToolCalls([("add_note", {"text": "x"})], ids=["call_9"]), Say("Noted.")])
    instrument(runtime, llm, _session())
    llm.register_function("add_note", add_note)
    context = LLMContext(messages=[{"role": "user", "content": "Note it."}])
    await _converse(llm, context)

    assert seen["llm"] is llm
    assert seen["context"] is context
    assert seen["worker"] is not None and seen["worker"] is llm.pipeline_worker
    assert seen["tool_call_id"] == "call_9"
    (op,) = await runtime.ledger.list()
    assert seen["operation_id"] == op.operation_id  # action_context() inside the handler


async def test_a_handler_registered_again_serves_the_calls_made_after_it(
    runtime: ActionRuntime,
) -> None:
    ran: list[str] = []

    def handler(label: str) -> Any:
        async def add_note(params: FunctionCallParams) -> None:
            ran.append(f"{label}:{params.arguments['text']}")
            await params.result_callback({"by": label})

        return add_note

    llm = ScriptedLLM(
        [
            ToolCalls([("add_note", {"text": "one"})]),
            Say("Noted."),
            ToolCalls([("add_note", {"text": "two"})]),
            Say("Noted."),
        ]
    )
    instrument(runtime, llm, _session())
    llm.register_function("add_note", handler("first"))
    context = LLMContext(messages=[{"role": "user", "content": "Note one."}])
    await _converse(llm, context)
    llm.register_function("add_note", handler("second"))
    context.add_message({"role": "user", "content": "Note two."})
    await _converse(llm, context, calls=2)

    assert ran == ["first:one", "second:two"]
    assert [r["result"] for r in _tool_results(context)] == [{"by": "first"}, {"by": "second"}]


async def test_an_approved_call_runs_with_its_calls_params_after_the_call_returned(
    runtime: ActionRuntime,
) -> None:
    seen: list[Any] = []

    async def refund(params: FunctionCallParams) -> None:
        seen.append(params.context)
        await params.result_callback({"refunded": params.arguments["amount"]})

    llm = ScriptedLLM([ToolCalls([("refund", {"amount": 40})]), Say("A manager will decide.")])
    instrument(runtime, llm, _session())
    llm.register_function("refund", refund)
    context = LLMContext(messages=[{"role": "user", "content": "Refund me."}])
    await _converse(llm, context)
    (waiting,) = await runtime.pending_approvals()
    assert _tool_results(context)[0]["status"] == "awaiting_approval" and seen == []

    await runtime.approve(
        waiting.operation_id,
        approver=Approver("maria", tenants={"default"}),
        reason="regular guest",
        args_hash=waiting.args_hash,
    )
    done = await runtime.wait(waiting.operation_id)

    assert done.status is S.COMMITTED
    assert seen == [context]


async def test_an_operation_run_without_its_call_gets_a_clear_error_for_what_it_lacks(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    first = await _runtime(tmp_path, clock=clock)
    try:

        async def refund(params: FunctionCallParams) -> None:
            await params.result_callback({"messages": len(params.context.get_messages())})

        llm = ScriptedLLM([ToolCalls([("refund", {"amount": 40})]), Say("A manager will decide.")])
        instrument(first, llm, _session())
        llm.register_function("refund", refund)
        await _converse(llm, LLMContext(messages=[{"role": "user", "content": "Refund me."}]))
        (waiting,) = await first.pending_approvals()
    finally:
        await first.close()

    second = await _runtime(tmp_path, clock=clock)  # the first process is gone
    try:
        later = ScriptedLLM([])
        instrument(second, later, _session())
        later.register_function("refund", refund)
        await second.approve(
            waiting.operation_id,
            approver=Approver("maria", tenants={"default"}),
            reason="regular guest",
            args_hash=waiting.args_hash,
        )
        # The first runtime is gone. This one took its waiting request over when it started,
        # before its handler was registered (so it could not run it then); once the lease it
        # let run out has, it claims it again, now with the handler, and runs it without the
        # call that proposed it.
        clock.advance(60)
        await second.recover()

        async def ran() -> bool:
            op = await second.ledger.get(waiting.operation_id)
            return op.status not in (S.AWAITING_APPROVAL, S.ADMITTED, S.RUNNING)

        await until(ran, what="the approved refund to run")
        done = await second.ledger.get(waiting.operation_id)
    finally:
        await second.close()

    assert done.lease_owner == second.owner
    assert done.status is not S.COMMITTED
    assert "params.context is not available to refund" in (done.error or "")


# --- direct functions: their signature is their argument model ------------------------------

MISFITS = {
    "unknown key": {"text": "x", "colour": "red"},
    "missing key": {"pinned": True},
    "a key named params": {"text": "x", "params": {"llm": None}},
    "wrong type": {"text": 5},
    "bool for a whole number": {"text": "x", "priority": True},
}


@pytest.mark.parametrize("arguments", list(MISFITS.values()), ids=list(MISFITS))
async def test_a_direct_function_call_that_does_not_fit_its_signature_is_refused_unrun(
    runtime: ActionRuntime, arguments: dict[str, Any]
) -> None:
    ran: list[str] = []

    async def add_note(
        params: FunctionCallParams, text: str, pinned: bool = False, priority: int = 0
    ) -> None:
        """Add a note to the booking."""
        ran.append(text)
        await params.result_callback({"noted": True})

    llm = ScriptedLLM([ToolCalls([("add_note", arguments)]), Say("That did not work.")])
    instrument(runtime, llm, _session())
    context = LLMContext(messages=[{"role": "user", "content": "Note it."}], tools=[add_note])
    await _converse(llm, context)

    (result,) = _tool_results(context)
    assert (result["status"], result["reason"]) == ("refused", "invalid_arguments"), result
    assert "not yet known" not in result["message"]
    assert ran == []
    await runtime.flush()
    (op,) = await runtime.ledger.list()
    assert op.status is S.REJECTED
    assert op.escalated_at is None
    trail = await runtime.ledger.events(op.operation_id)
    assert trail[-1].detail["reason"] == "invalid_arguments"


async def test_a_direct_function_gets_what_the_model_sent_checked_against_its_types(
    runtime: ActionRuntime,
) -> None:
    seen: list[dict[str, Any]] = []

    async def add_note(
        params: FunctionCallParams, text: str, pinned: bool = False, **tags: Any
    ) -> None:
        """Add a note."""
        seen.append({"text": text, "pinned": pinned, **tags})
        await params.result_callback({"noted": True})

    llm = ScriptedLLM(
        [
            ToolCalls([("add_note", {"text": "window seat", "colour": "red"})]),
            Say("Noted."),
            ToolCalls([("add_note", {"text": "x", "params": 1})]),
            Say("That did not work."),
        ]
    )
    instrument(runtime, llm, _session())
    context = LLMContext(messages=[{"role": "user", "content": "Note it."}], tools=[add_note])
    await _converse(llm, context)
    context.add_message({"role": "user", "content": "And that."})
    await _converse(llm, context, calls=2)

    # **tags takes an unknown key; never the name of the params Pipecat passes.
    assert seen == [{"text": "window seat", "pinned": False, "colour": "red"}]
    assert [r["status"] for r in _tool_results(context)] == ["committed", "refused"]


async def test_a_direct_function_registered_again_is_checked_against_its_new_signature(
    runtime: ActionRuntime,
) -> None:
    ran: list[Any] = []

    async def first(params: FunctionCallParams, text: str) -> None:
        ran.append(("first", text))
        await params.result_callback({"noted": True})

    async def second(params: FunctionCallParams, text: str, count: int) -> None:
        ran.append(("second", text, count))
        await params.result_callback({"noted": True})

    first.__name__ = second.__name__ = "add_note"
    llm = ScriptedLLM(
        [
            ToolCalls([("add_note", {"text": "a"})]),
            Say("Noted."),
            ToolCalls([("add_note", {"text": "b"})]),
            Say("That did not work."),
        ]
    )
    instrument(runtime, llm, _session())
    context = LLMContext(messages=[{"role": "user", "content": "Note a."}], tools=[first])
    await _converse(llm, context)
    context.set_tools([second])
    context.add_message({"role": "user", "content": "Note b."})
    await _converse(llm, context, calls=2)

    assert ran == [("first", "a")]
    assert [r["status"] for r in _tool_results(context)] == ["committed", "refused"]


async def test_a_direct_functions_parameters_of_any_name_are_checked_and_passed(
    runtime: ActionRuntime,
) -> None:
    seen: list[tuple[Any, ...]] = []

    # Names pydantic keeps for itself (_private, model_*, json) and an unannotated one.
    async def add_note(
        params: FunctionCallParams, _ref: int, json: str, model_kind: bool = False, units=None
    ) -> None:
        """Add a note."""
        seen.append((_ref, json, model_kind, units))
        await params.result_callback({"noted": True})

    llm = ScriptedLLM(
        [
            ToolCalls([("add_note", {"_ref": 7, "json": "Bergen", "units": ["C"]})]),
            Say("Noted."),
            ToolCalls([("add_note", {"_ref": "7", "json": "Bergen"})]),
            Say("Hm."),
        ]
    )
    instrument(runtime, llm, _session())
    context = LLMContext(messages=[{"role": "user", "content": "?"}], tools=[add_note])
    await _converse(llm, context)
    context.add_message({"role": "user", "content": "Again?"})
    await _converse(llm, context, calls=2)

    assert seen == [(7, "Bergen", False, ["C"])]
    assert [r["status"] for r in _tool_results(context)] == ["committed", "refused"]
