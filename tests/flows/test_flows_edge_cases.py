"""Edges of the Flows adapter (and the instrument path) a review found: each test is one.

Parallel calls whose transition waits for a call a barge-in closes; a transition decided when
a late telling began and the flow moved meanwhile; what is kept per call, and for how long;
one callable serving two names of a config.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pipecat.flows import TRANSITION_IN_YAML, FlowConfig, FlowManager
from pipecat.frames.frames import LLMRunFrame
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.services.llm_service import FunctionCallParams

from pipecat_actions import instrument
from pipecat_actions.adapters import routed
from pipecat_actions.admission.authorization import AllowAll
from pipecat_actions.approvals import Approver
from pipecat_actions.policy import load_policy_text
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.session import SessionState
from pipecat_actions.status import ActionStatus
from pipecat_actions.testing import ScriptedLLM
from pipecat_actions.testing.conversation import BargeIn, Call, UserSays, WaitUntilIdle
from pipecat_actions.testing.llm import Say, ToolCalls
from tests.flows._support import DETAILS, POLICY, booking_policy, flow_agent
from tests.processors._clocked import run_script, until

S = ActionStatus
KINDS = ["configured", "python"]


@pytest.mark.parametrize("kind", KINDS)
async def test_a_transition_held_for_a_parallel_call_runs_when_a_barge_in_closes_that_call(
    tmp_path: Path, kind: str
) -> None:
    """Two calls in one response: ask_elsewhere's edge waits for book_table (blocking).

    README: "A transition another call asked for meanwhile ... runs once the calls it waits
    for are done." The barge-in closes book_table (the gate's truthful close); Flows'
    pending transition to ``elsewhere`` must then run. It never does: the close's
    ``then`` is `_after`, whose `_leads_on` returns None while ``_pending_transition`` is set,
    and nothing else re-checks the pending transition.
    """
    script = [
        Say("Hello, what can I book for you?"),
        ToolCalls(
            [("ask_elsewhere", {}), ("book_table", DETAILS)],
            say="One moment while I book that for you.",
        ),
        Say("Still here."),
        Say("Parking is round the back."),
        Say("By the way, your table is booked."),
    ]
    async with flow_agent(
        tmp_path, script, kind=kind, policy_text=booking_policy("mode: blocking")
    ) as a:

        async def commit() -> None:
            await a.at_the_restaurant()
            a.commit()

        await a.converse(
            [
                WaitUntilIdle(),
                UserSays("Two at nine. And where do I park?"),
                BargeIn("Are you still there?", after_secs=0.1),
                WaitUntilIdle(),
                Call(commit),
                Call(a.told(S.COMMITTED)),
                WaitUntilIdle(),
            ]
        )
        assert a.manager is not None
        pending = a.manager._pending_transition

    assert "elsewhere" in a.nodes, (a.nodes, pending)


@pytest.mark.parametrize("kind", KINDS)
async def test_a_call_whose_outcome_a_repeat_told_in_place_is_not_kept(
    tmp_path: Path, kind: str
) -> None:
    """FlowActions._calls: the barged-in call_1 is never forgotten once call_2 joined it.

    `_after` (the only place besides `_propose` that pops) is never asked about the
    operation, since the repeat told the outcome in place (``answered_in``): call_1 stays in
    ``_calls`` until LIMIT evicts it.
    """
    script = [
        Say("Hello, what can I book for you?"),
        ToolCalls([("book_table", DETAILS)], say="One moment while I book that for you."),
        ToolCalls([("book_table", DETAILS)], say="I'm still on it."),
        Say("You're booked."),
    ]
    async with flow_agent(
        tmp_path, script, kind=kind, policy_text=booking_policy("mode: blocking")
    ) as a:

        async def commit() -> None:
            await until(
                lambda: a.runtime.operation_for_call("call_2") is not None,
                what="the repeat to join the booking",
            )
            await a.at_the_restaurant()
            a.commit()

        await a.converse(
            [
                WaitUntilIdle(),
                UserSays("Two at nine."),
                BargeIn("Are you still there?", after_secs=0.1),
                Call(commit),
                Call(a.entered("confirm")),
                WaitUntilIdle(),
            ]
        )
        await a.settled(S.COMMITTED)
        kept = [call.tool_call_id for call in a.actions._calls.calls()]

    assert kept == [], kept


async def test_a_late_outcomes_transition_is_decided_again_when_it_runs(tmp_path: Path) -> None:
    """`_after` decides at `SessionDelivery._push` time; the step runs after the telling and
    its ledger record (awaits). If the flow left the call's node meanwhile (another
    transition, an application's set_node), the step still moves the flow to the
    outcome's node: from a node the call was not made in, against the docstring ("when the
    conversation is still in the node the call was made in")."""
    script = [
        Say("Hello, what can I book for you?"),
        ToolCalls([("book_table", DETAILS)], say="One moment while I book that for you."),
        Say("Still working on it."),
        Say("Parking is round the back."),
        Say("You're booked."),
    ]
    async with flow_agent(tmp_path, script, policy_text=booking_policy("mode: blocking")) as a:
        delivery = a.gate.delivery
        record = delivery._record
        moved: list[str] = []

        async def recording(op: Any, *, late: bool) -> None:
            if late and not moved and a.manager is not None:
                # Meanwhile (while the record is written), the flow moves on elsewhere.
                assert a.actions._flow is not None
                await a.manager.set_node_from_config(a.actions._flow.node("elsewhere"))
                moved.append(str(a.node))
            await record(op, late=late)

        delivery._record = recording  # type: ignore[method-assign]

        async def commit() -> None:
            await a.settled(S.RUNNING)
            await a.at_the_restaurant()
            a.commit()

        await a.converse(
            [
                WaitUntilIdle(),
                UserSays("Two at nine."),
                BargeIn("Are you still there?", after_secs=0.1),
                WaitUntilIdle(),
                Call(commit),
                Call(a.told(S.COMMITTED)),
                WaitUntilIdle(),
            ]
        )

    assert moved == ["elsewhere"]
    assert a.nodes == ["greet", "elsewhere"]  # the outcome was told in elsewhere; no move


INSTRUMENT_POLICY = """
version: 1
tools:
  refund:
    kind: mutation
    risk: high
    confirmation: {mode: approval, approvers: [maria]}
    deadline_secs: 600
"""


async def test_an_instrumented_call_is_forgotten_once_its_effect_ran(tmp_path: Path) -> None:
    """routed._Calls keeps a call answered ``awaiting_approval`` (right: it may still run),
    but nothing removes it once its effect ran: `_effect` sets ``call.ran`` and only
    `_Calls.close` (at answer time) pops. Each such call keeps its FunctionCallParams
    (context, worker) until LIMIT evicts it."""
    runtime = await ActionRuntime.create(
        load_policy_text(INSTRUMENT_POLICY),
        authorizer=AllowAll(),
        routed=load_policy_text(INSTRUMENT_POLICY).names(),
        ledger_url=f"sqlite:///{tmp_path}/l.db",
    )
    try:

        async def refund(params: FunctionCallParams) -> None:
            await params.result_callback({"refunded": params.arguments["amount"]})

        llm = ScriptedLLM([ToolCalls([("refund", {"amount": 40})]), Say("A manager decides.")])
        instrument(runtime, llm, SessionState(session_id="s1", principal="alice"))
        llm.register_function("refund", refund)
        context = LLMContext(messages=[{"role": "user", "content": "Refund me."}])
        pair = LLMContextAggregatorPair(context)

        def answered() -> bool:
            tools = [m for m in context.get_messages() if m.get("role") == "tool"]
            return len(tools) == 1 and tools[0]["content"] != "IN_PROGRESS"

        await run_script(
            [pair.user(), llm, pair.assistant()],
            [LLMRunFrame(), lambda: until(answered, what="the tool result")],
        )
        (waiting,) = await runtime.pending_approvals()
        await runtime.approve(
            waiting.operation_id,
            approver=Approver("maria", tenants={"default"}),
            reason="ok",
            args_hash=waiting.args_hash,
        )
        done = await runtime.wait(waiting.operation_id)
        calls = _calls_of(llm)
    finally:
        await runtime.close()

    assert done.status is S.COMMITTED
    assert list(calls._calls) == []


def _calls_of(llm: Any) -> Any:
    for cell in llm.register_function.__closure__ or ():
        if isinstance(cell.cell_contents, routed._Calls):
            return cell.cell_contents
    raise AssertionError("no _Calls in instrument's closure")


async def test_one_callable_under_two_config_names_runs_as_the_name_called(
    tmp_path: Path,
) -> None:
    """Flow allows one callable under several config names. `_admit_direct` caches the
    admitted wrapper by ``id(function)`` only, so the second name gets a wrapper bound to
    the first name: `_current(first)` sees a call of the second and raises
    ConfigurationError, which Flows turns into an ``error`` result (nothing is booked)."""
    both = POLICY + "      reserve_table:\n        kind: mutation\n"
    script = [
        Say("Hello, what can I book for you?"),
        ToolCalls([("reserve_table", DETAILS)]),
        Say("Reserved."),
    ]
    async with flow_agent(tmp_path, script, policy_text=both) as a:

        async def book(flow_manager: FlowManager, date: str, time: str, party_size: int) -> Any:
            """Book a table.

            Args:
                date: The day.
                time: The time.
                party_size: How many.
            """
            return {"booked": True}, TRANSITION_IN_YAML

        config = {
            "initial_node": "greet",
            "nodes": {
                "greet": {
                    "task_messages": [{"role": "developer", "content": "Ask."}],
                    "functions": [
                        {"name": "book_table", "transition_to": "confirm"},
                        {"name": "reserve_table", "transition_to": "confirm"},
                    ],
                },
                "confirm": {"task_messages": [{"role": "developer", "content": "Node confirm."}]},
            },
        }
        flow = a.actions.flow(
            FlowConfig.from_yaml(json.dumps(config)),
            handlers={"book_table": book, "reserve_table": book},
        )

        async def start(manager: FlowManager) -> None:
            await manager.initialize(flow.initial_node)

        a.start = start
        result = await a.converse([WaitUntilIdle(), UserSays("Two at nine."), WaitUntilIdle()])

    told = [json.loads(m["content"]) for m in result.context_messages if m.get("role") == "tool"]
    assert told and told[0].get("status") == "committed", told
    assert a.nodes == ["greet", "confirm"]


MISFITS = {
    "text for a whole number": {**DETAILS, "party_size": "2"},
    "unknown key": {**DETAILS, "table": 4},
    "missing key": {"date": DETAILS["date"], "party_size": 2},
}


@pytest.mark.parametrize("details", list(MISFITS.values()), ids=list(MISFITS))
async def test_a_configured_direct_function_call_that_misfits_its_signature_is_refused_unrun(
    tmp_path: Path, details: dict[str, Any]
) -> None:
    """A Flows direct function is called ``function(flow_manager=..., **arguments)``.

    A key it does not take, a missing one or a wrong type is refused at admission: the handler
    never runs, so its outcome is never unknown. (A key named ``flow_manager`` fails Flows' own
    call, before any handler of ours is reached.)
    """
    script = [
        Say("Hello, what can I book for you?"),
        ToolCalls([("book_table", details)]),
        Say("I could not book that."),
    ]
    async with flow_agent(tmp_path, script, kind="configured") as a:
        result = await a.converse([WaitUntilIdle(), UserSays("Two at nine."), WaitUntilIdle()])
        (op,) = await a.operations()

    assert a.nodes == ["greet"]
    assert a.handled == [] and a.bookings() == 0
    (told,) = [json.loads(m["content"]) for m in result.context_messages if m["role"] == "tool"]
    assert (told["status"], told["reason"]) == ("refused", "invalid_arguments")
    assert op.status is S.REJECTED and op.escalated_at is None
