"""A configured flow's branch on ``status``: each status to its case, and no case keeps the node.

Also a failure told after a barge-in, a global function, a function name that three nodes
reuse (in a loop back to the first node), and a name the model made up.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pipecat.flows import TRANSITION_IN_YAML, FlowConfig, FlowManager, FlowsFunctionSchema

from pipecat_actions.approvals import Approver
from pipecat_actions.status import ActionStatus
from pipecat_actions.testing.conversation import BargeIn, Call, UserSays, WaitUntilIdle
from pipecat_actions.testing.llm import Say, ToolCalls
from tests.flows._support import (
    DETAILS,
    POLICY,
    booking_policy,
    contents,
    flow_agent,
    python_node,
    tool_messages,
)

S = ActionStatus

EVERY_STATUS = {
    "field": "status",
    "cases": {
        "committed": "confirm",
        "refused": "try_again",
        "awaiting_approval": "wait",
        "unknown": "checking",
    },
}

APPROVAL = booking_policy("confirmation: {mode: approval, approvers: [maria]}")


@pytest.mark.parametrize(
    ("own_case", "lands_in"), [(None, "try_again"), ("elsewhere", "elsewhere")]
)
async def test_an_approvers_rejection_follows_the_refused_case_from_the_wait_node(
    tmp_path: Path, own_case: str | None, lands_in: str
) -> None:
    """A rejection takes ``refused:``, unless the flow gave ``rejected:`` a case of its own."""
    branch = {
        "field": "status",
        "cases": {**EVERY_STATUS["cases"], **({"rejected": own_case} if own_case else {})},
    }
    script = [
        Say("Hello."),
        ToolCalls([("book_table", DETAILS)]),
        Say("A manager has to agree."),
        Say("The manager said no; shall we try another time?"),
    ]
    async with flow_agent(tmp_path, script, policy_text=APPROVAL, transition_to=branch) as a:

        async def reject() -> None:
            waiting = await a.settled(S.AWAITING_APPROVAL)
            await a.runtime.reject(
                waiting.operation_id, approver=Approver("maria", tenants={"default"}), reason="full"
            )

        result = await a.converse(
            [
                WaitUntilIdle(),
                UserSays("Two at nine."),
                WaitUntilIdle(),
                Call(reject),
                Call(a.entered(lands_in)),
                WaitUntilIdle(),
            ]
        )

    assert a.nodes == ["greet", "wait", lands_in]
    assert a.bookings() == 0
    assert result.context_messages[-1]["content"].startswith("The manager said no")


async def test_a_status_without_a_case_keeps_the_node_and_a_later_commit_follows_its_case(
    tmp_path: Path,
) -> None:
    branch = {"field": "status", "cases": {"committed": "confirm"}}
    script = [
        Say("Hello."),
        ToolCalls([("book_table", DETAILS)]),
        Say("A manager has to agree."),
        Say("Approved and booked."),
    ]
    async with flow_agent(tmp_path, script, policy_text=APPROVAL, transition_to=branch) as a:
        nodes_while_waiting: list[str] = []

        async def approve() -> None:
            nodes_while_waiting[:] = a.nodes
            waiting = await a.settled(S.AWAITING_APPROVAL)
            await a.runtime.approve(
                waiting.operation_id,
                approver=Approver("maria", tenants={"default"}),
                reason="ok",
                args_hash=waiting.args_hash,
            )
            await a.at_the_restaurant()
            a.commit()

        result = await a.converse(
            [
                WaitUntilIdle(),
                UserSays("Two at nine."),
                WaitUntilIdle(),
                Call(approve),
                Call(a.entered("confirm")),
                WaitUntilIdle(),
            ]
        )

    assert nodes_while_waiting == ["greet"]
    assert a.nodes == ["greet", "confirm"]
    assert [m["status"] for m in tool_messages(result)] == ["awaiting_approval"]
    assert result.context_messages[-1]["content"] == "Approved and booked."


async def test_arguments_that_misfit_the_signature_follow_the_refused_case_unrun(
    tmp_path: Path,
) -> None:
    bad = {**DETAILS, "party_size": "lots"}
    script = [Say("Hello."), ToolCalls([("book_table", bad)]), Say("How many of you?")]
    async with flow_agent(tmp_path, script, transition_to=EVERY_STATUS) as a:
        result = await a.converse([WaitUntilIdle(), UserSays("Lots."), WaitUntilIdle()])

    assert a.nodes == ["greet", "try_again"]
    assert [m["status"] for m in tool_messages(result)] == ["refused"]
    assert a.handled == [] and a.bookings() == 0
    assert result.context_messages[-1]["content"] == "How many of you?"


@pytest.mark.parametrize("direct", [False, True], ids=["schema", "direct"])
async def test_a_name_three_nodes_reuse_runs_each_nodes_handler_also_back_in_the_first(
    tmp_path: Path, direct: bool
) -> None:
    ran: list[str] = []
    nodes: dict[str, Any] = {}

    def node(name: str, then: str) -> dict[str, Any]:
        if direct:

            async def note_details(flow_manager: FlowManager, text: str) -> tuple[Any, Any]:
                """Note what the caller said.

                Args:
                    text: What they said.
                """
                ran.append(f"{name}:{text}")
                return {"noted": text}, nodes[then]

            return python_node(name, [note_details])

        async def note(args: dict[str, Any], flow_manager: FlowManager) -> tuple[Any, Any]:
            ran.append(f"{name}:{args['text']}")
            return {"noted": args["text"]}, nodes[then]

        schema = FlowsFunctionSchema(
            name="note_details",
            description="Note what the caller said.",
            properties={"text": {"type": "string"}},
            required=["text"],
            handler=note,
        )
        return python_node(name, [schema])

    nodes.update(a=node("a", "b"), b=node("b", "c"), c=node("c", "a"))
    script: list[Any] = [Say("Hello.")]
    steps: list[Any] = [WaitUntilIdle()]
    for turn in range(5):
        script += [ToolCalls([("note_details", {"text": f"t{turn}"})]), Say(f"Noted {turn}.")]
        steps += [UserSays(f"Detail {turn}."), WaitUntilIdle()]
    async with flow_agent(tmp_path, script, kind="python") as a:

        async def start(manager: FlowManager) -> None:
            await manager.initialize(nodes["a"])

        a.start = start
        result = await a.converse(steps)
        notes = await a.operations("note_details")

    assert ran == ["a:t0", "b:t1", "c:t2", "a:t3", "b:t4"]
    assert a.nodes == ["a", "b", "c", "a", "b", "c"]
    assert len(notes) == 5 and all(op.status is S.COMMITTED for op in notes)
    assert [m["status"] for m in tool_messages(result)] == ["committed"] * 5


async def test_a_function_name_the_model_made_up_runs_nothing_and_keeps_the_node(
    tmp_path: Path,
) -> None:
    script = [Say("Hello."), ToolCalls([("order_pizza", {})]), Say("I can only book tables.")]
    async with flow_agent(tmp_path, script) as a:
        result = await a.converse([WaitUntilIdle(), UserSays("A pizza."), WaitUntilIdle()])
        ops = await a.runtime.ledger.list()

    assert a.nodes == ["greet"]
    assert ops == [] and a.handled == []
    assert result.context_messages[-1]["content"] == "I can only book tables."


@pytest.mark.parametrize(
    ("kind", "transition_to"),
    [("configured", "confirm"), ("python", None)],
)
async def test_a_booking_left_uncommitted_after_a_barge_in_keeps_the_node_and_is_told(
    tmp_path: Path, kind: str, transition_to: Any
) -> None:
    script = [
        Say("Hello, what can I book for you?"),
        ToolCalls([("book_table", DETAILS)], say="One moment while I book that for you."),
        Say("Still working on it."),
        Say("I can't tell yet whether it went through; someone will check."),
    ]
    options: dict[str, Any] = {"transition_to": transition_to} if transition_to else {}
    blocking = booking_policy("mode: blocking")
    async with flow_agent(tmp_path, script, kind=kind, policy_text=blocking, **options) as a:
        a.sor.faults.fail_after_send("book")  # sent, then an error: the ledger says unknown
        result = await a.converse(
            [
                WaitUntilIdle(),
                UserSays("Two at nine."),
                BargeIn("Are you still there?", after_secs=0.1),
                WaitUntilIdle(),
                Call(a.answers()),
                Call(a.told(S.UNKNOWN)),
                WaitUntilIdle(),
            ]
        )

    assert a.nodes == ["greet"]  # the handler's (or the config's) next node is not followed
    assert a.bookings() == 0
    assert "Outcome of an earlier book_table" in contents(result)
    assert result.context_messages[-1]["content"].startswith("I can't tell yet")


GLOBAL_POLICY = POLICY + "      check_booking:\n        kind: read\n"


async def test_a_global_function_branches_on_status_from_whichever_node_calls_it(
    tmp_path: Path,
) -> None:
    ran: list[str] = []

    async def check_booking(flow_manager: FlowManager, name: str) -> tuple[Any, Any]:
        """Look a booking up.

        Args:
            name: Whose booking.
        """
        ran.append(f"{flow_manager.current_node}:{name}")
        return {"found": True}, TRANSITION_IN_YAML

    branch = {"field": "status", "cases": {"committed": "confirm", "refused": "try_again"}}
    data = {
        "initial_node": "greet",
        "global_functions": [{"name": "check_booking", "transition_to": branch}],
        "nodes": {
            name: {"task_messages": [{"role": "developer", "content": f"Node {name}."}]}
            for name in ("greet", "confirm", "try_again")
        },
    }
    script = [
        Say("Hello."),
        ToolCalls([("check_booking", {"name": "Ada"})]),
        Say("Found it."),
        ToolCalls([("check_booking", {"whose": "Ada"})]),  # misfits the signature: refused
        Say("Whose booking was it?"),
    ]
    async with flow_agent(tmp_path, script, policy_text=GLOBAL_POLICY) as a:
        flow = a.actions.flow(
            FlowConfig.from_yaml(json.dumps(data)), handlers=[{"check_booking": check_booking}]
        )
        a.global_functions = list(flow.global_functions)

        async def start(manager: FlowManager) -> None:
            await manager.initialize(flow.initial_node)

        a.start = start
        result = await a.converse(
            [
                WaitUntilIdle(),
                UserSays("Ada."),
                WaitUntilIdle(),
                UserSays("Again."),
                WaitUntilIdle(),
            ]
        )
        ops = await a.operations("check_booking")

    assert ran == ["greet:Ada"]
    assert a.nodes == ["greet", "confirm", "try_again"]
    assert [op.status for op in ops] == [S.COMMITTED, S.REJECTED]
    assert [m["status"] for m in tool_messages(result)] == ["committed", "refused"]


async def test_a_name_two_configured_nodes_reuse_follows_each_nodes_own_transition(
    tmp_path: Path,
) -> None:
    seen: list[tuple[str | None, str]] = []

    async def book_table(
        flow_manager: FlowManager, date: str, time: str, party_size: int
    ) -> tuple[Any, Any]:
        """Book a table.

        Args:
            date: The day.
            time: The time.
            party_size: How many guests.
        """
        seen.append((flow_manager.current_node, time))
        return {"booking_id": time}, TRANSITION_IN_YAML

    def node(name: str, transition_to: Any = None) -> dict[str, Any]:
        reused = {"name": "book_table", "transition_to": transition_to}
        functions = [reused] if transition_to else []
        return {
            "task_messages": [{"role": "developer", "content": f"Node {name}."}],
            "functions": functions,
        }

    data = {
        "initial_node": "greet",
        "nodes": {
            "greet": node("greet", {"field": "status", "cases": {"committed": "confirm"}}),
            "confirm": node("confirm", "elsewhere"),
            "elsewhere": node("elsewhere"),
        },
    }
    script = [
        Say("Hello."),
        ToolCalls([("book_table", DETAILS)]),
        Say("Booked."),
        ToolCalls([("book_table", {**DETAILS, "time": "22:00"})]),
        Say("Booked another."),
    ]
    async with flow_agent(tmp_path, script) as a:
        flow = a.actions.flow(
            FlowConfig.from_yaml(json.dumps(data)), handlers=[{"book_table": book_table}]
        )

        async def start(manager: FlowManager) -> None:
            await manager.initialize(flow.initial_node)

        a.start = start
        result = await a.converse(
            [
                WaitUntilIdle(),
                UserSays("Two at nine."),
                WaitUntilIdle(),
                UserSays("And two at ten."),
                WaitUntilIdle(),
            ]
        )

    assert seen == [("greet", "21:00"), ("confirm", "22:00")]
    assert a.nodes == ["greet", "confirm", "elsewhere"]
    assert [m["status"] for m in tool_messages(result)] == ["committed", "committed"]
