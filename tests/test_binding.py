"""Every handler an LLMService runs goes through the runtime: attached, registered, or lazy."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pipecat.adapters.llm.schemas.direct_function import tool_options
from pipecat.frames.frames import LLMRunFrame
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.services.llm_service import FunctionCallParams

from pipecat_actions import instrument, tools_schema
from pipecat_actions.actions import ActionContext, action
from pipecat_actions.admission.authorization import AllowAll
from pipecat_actions.policy import load_policy_text
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.session import SessionState
from pipecat_actions.status import ActionStatus
from pipecat_actions.testing import Say, ScriptedLLM, ToolCalls
from tests.processors._clocked import run_script, until

POLICY = """
version: 1
tools:
  get_weather:
    kind: read
  book_table:
    kind: mutation
    mode: background
    idempotency: {key_fields: [time]}
"""


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[ActionRuntime]:
    # Every tool here is a handler the tests register on the LLM themselves (instrument).
    opened = await ActionRuntime.create(
        load_policy_text(POLICY),
        authorizer=AllowAll(),
        routed=["get_weather", "book_table"],
        ledger_url=f"sqlite:///{tmp_path}/l.db",
    )
    yield opened
    await opened.close()


async def _converse(llm: ScriptedLLM, context: LLMContext) -> list[dict[str, Any]]:
    """One inference with a tool call; ends once the call's result is in the context."""
    pair = LLMContextAggregatorPair(context)

    def answered() -> bool:
        tools = [m for m in context.get_messages() if m.get("role") == "tool"]
        return bool(tools) and all(m["content"] != "IN_PROGRESS" for m in tools)

    await run_script(
        [pair.user(), llm, pair.assistant()],
        [LLMRunFrame(), lambda: until(answered, what="the tool result in the context")],
    )
    return [dict(m) for m in context.get_messages()]


def _tool_results(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [json.loads(m["content"]) for m in messages if m.get("role") == "tool"]


async def test_attached_actions_are_advertised_with_their_argument_schema(
    tmp_path: Path,
) -> None:
    @action
    async def book_table(ctx: ActionContext, time: str, party_size: int = 2) -> dict[str, Any]:
        """Book a table at a time."""
        return {}

    runtime = await ActionRuntime.create(
        load_policy_text(POLICY),
        authorizer=AllowAll(),
        actions=[book_table],
        routed=["get_weather"],
        ledger_url=f"sqlite:///{tmp_path}/l.db",
    )
    try:
        (schema,) = tools_schema(runtime).standard_tools
    finally:
        await runtime.close()
    assert schema.name == "book_table"
    assert schema.description == "Book a table at a time."
    assert schema.required == ["time"]
    assert set(schema.properties) == {"time", "party_size"}


async def test_a_handler_registered_after_instrument_is_admitted_and_recorded(
    runtime: ActionRuntime,
) -> None:
    calls: list[dict[str, Any]] = []

    async def get_weather(params: FunctionCallParams) -> None:
        calls.append(dict(params.arguments))
        await params.result_callback({"temp_c": 21})

    llm = ScriptedLLM([ToolCalls([("get_weather", {"city": "Oslo"})]), Say("21 degrees.")])
    session = SessionState(session_id="s1", principal="alice")
    instrument(runtime, llm, session)
    llm.register_function("get_weather", get_weather)
    messages = await _converse(llm, LLMContext(messages=[{"role": "user", "content": "?"}]))
    assert calls == [{"city": "Oslo"}]
    (result,) = _tool_results(messages)
    assert result["status"] == "committed"
    assert result["result"] == {"temp_c": 21}
    await runtime.flush()
    (op,) = await runtime.ledger.list()
    assert (op.tool, op.status, op.principal) == ("get_weather", ActionStatus.COMMITTED, "alice")


async def test_wrapping_keeps_tool_options_and_a_handler_registered_before_instrument(
    runtime: ActionRuntime,
) -> None:
    @tool_options(cancel_on_interruption=False, timeout_secs=5)
    async def book_table(params: FunctionCallParams) -> None:
        await params.result_callback({"booked": params.arguments["time"]})

    llm = ScriptedLLM([])
    llm.register_function("book_table", book_table)
    instrument(runtime, llm, SessionState(session_id="s1", principal="alice"))
    item = llm._functions["book_table"]
    assert item.handler is not book_table
    assert item.handler.__wrapped__ is book_table
    assert item.cancel_on_interruption is False
    assert item.timeout_secs == 5


async def test_a_direct_function_listed_in_the_context_is_wrapped_when_pipecat_registers_it(
    runtime: ActionRuntime,
) -> None:
    seen: list[str] = []

    async def get_weather(params: FunctionCallParams, city: str) -> None:
        """Get the weather.

        Args:
            city: The city.
        """
        seen.append(city)
        await params.result_callback({"temp_c": 3})

    llm = ScriptedLLM([ToolCalls([("get_weather", {"city": "Bergen"})]), Say("Cold.")])
    instrument(runtime, llm, SessionState(session_id="s1", principal="alice"))
    context = LLMContext(messages=[{"role": "user", "content": "?"}], tools=[get_weather])
    messages = await _converse(llm, context)
    assert seen == ["Bergen"]
    assert _tool_results(messages)[0]["status"] == "committed"
    await runtime.flush()
    assert [op.tool for op in await runtime.ledger.list()] == ["get_weather"]


async def test_a_handler_for_a_tool_without_policy_is_refused_and_never_runs(
    runtime: ActionRuntime,
) -> None:
    ran: list[bool] = []

    async def transfer_money(params: FunctionCallParams) -> None:
        ran.append(True)
        await params.result_callback({"ok": True})

    llm = ScriptedLLM([ToolCalls([("transfer_money", {"amount": 10})]), Say("Hm.")])
    session = SessionState(session_id="s1", principal="alice")
    instrument(runtime, llm, session)
    with pytest.raises(Exception, match="no entry in the policy"):
        llm.register_function("transfer_money", transfer_money)
    assert ran == []


async def test_a_handler_cancellable_by_the_llm_gets_the_runtimes_cancel_tool_not_pipecats(
    runtime: ActionRuntime,
) -> None:
    # The application asks Pipecat for cancel_book_table (which would answer
    # {"cancelled": <call>} whatever became of the booking); routed through the runtime, the
    # tool's policy decides, and the model's cancel is the runtime's truthful one.
    @tool_options(cancel_on_interruption=False, cancellable_by_llm=True)
    async def book_table(params: FunctionCallParams) -> None:
        await params.result_callback({"booked": params.arguments["time"]})

    llm = ScriptedLLM([])
    llm.register_function("book_table", book_table)
    session = SessionState(session_id="s1", principal="alice")
    llm._sync_cancel_tools()  # what Pipecat does at each inference: its cancel tool is made
    assert "cancel_book_table" in llm._cancel_tool_names
    instrument(runtime, llm, session)
    llm._sync_cancel_tools()

    assert llm._functions["book_table"].cancellable_by_llm is False
    assert "cancel_book_table" not in llm._cancel_tool_names
    assert "cancel_book_table" not in llm._adapter.builtin_tools
    handler = llm._functions["cancel_book_table"].handler
    assert getattr(handler, "__name__", "") == "pipecat_actions_cancel_book_table"
    answer = await runtime.cancel_for_model("book_table", {}, session)
    # The policy (no cancellable_by_llm) does not let the model cancel it: refused in words.
    assert answer["status"] == "refused"
    assert answer["reason"] == "cancel_not_allowed"


async def test_the_runtimes_own_wiring_methods_still_work_for_a_release_and_say_what_replaces_them(
    tmp_path: Path,
) -> None:
    @action
    async def book_table(ctx: ActionContext, time: str) -> dict[str, Any]:
        """Book a table."""
        return {}

    runtime = await ActionRuntime.create(
        load_policy_text(POLICY),
        authorizer=AllowAll(),
        actions=[book_table],
        routed=["get_weather"],
        ledger_url=f"sqlite:///{tmp_path}/l.db",
    )
    llm, session = ScriptedLLM([]), SessionState(session_id="s1", principal="alice")
    try:
        with pytest.warns(DeprecationWarning, match=r"pipecat_actions\.attach\(runtime, llm"):
            runtime.attach(llm, session)
        with pytest.warns(DeprecationWarning, match=r"pipecat_actions\.tools_schema\(runtime\)"):
            schema = runtime.tools_schema()
        with pytest.warns(DeprecationWarning, match=r"pipecat_actions\.instrument\(runtime"):
            runtime.instrument(llm, session)
    finally:
        await runtime.close()
    assert llm.has_function("book_table")  # the forwarder did the adapter's work
    assert [t.name for t in schema.standard_tools] == ["book_table"]
