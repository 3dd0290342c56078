"""Pipecat Flows functions through admission and the ledger: transitions on the truth.

Each test runs a real `FlowManager` in a real pipeline (aggregators, gate, tracker) with a
scripted model; the booking is at a fake restaurant until the test lets it answer.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pipecat.flows import FlowManager, FlowsFunctionSchema

from pipecat_actions import Decision, instrument
from pipecat_actions.adapters.flows import STATE_KEY, STATUS_FIELD
from pipecat_actions.approvals import Approver
from pipecat_actions.errors import ConfigurationError
from pipecat_actions.runtime.deliveries import WATCH_SECS
from pipecat_actions.status import ActionStatus
from pipecat_actions.testing.conversation import (
    BargeIn,
    Call,
    UserSays,
    WaitUntilIdle,
)
from pipecat_actions.testing.llm import Say, ToolCalls
from tests.flows._support import (
    DEADLINE,
    DETAILS,
    POLICY,
    booking_policy,
    contents,
    flow_agent,
    python_node,
    tool_messages,
)
from tests.processors._clocked import until

S = ActionStatus
KINDS = ["configured", "python"]


def _script_book(*after: Any) -> list[Any]:
    return [Say("Hello, what can I book for you?"), ToolCalls([("book_table", DETAILS)]), *after]


class _Deny:
    async def authorize(self, request: Any) -> Decision:
        return Decision.deny("alice may not book here")


@pytest.mark.parametrize("kind", KINDS)
async def test_a_committed_booking_moves_the_flow_on_with_no_inference_in_the_old_node(
    tmp_path: Path, kind: str
) -> None:
    async with flow_agent(tmp_path, _script_book(Say("Booked, see you at nine.")), kind=kind) as a:
        result = await a.converse([WaitUntilIdle(), UserSays("Two at nine."), Call(a.answers())])
        op = await a.settled(S.COMMITTED)

    assert a.nodes == ["greet", "confirm"]
    assert a.bookings() == 1 and a.handled == [kind]
    assert a.sor.find_by_idempotency_key(op.idempotency_key) is not None  # action_context()
    assert op.delivered_status is S.COMMITTED
    # Flows' run_llm=False kept: greet, the tool call, then only the confirm node's answer.
    assert a.llm.inferences == 3
    messages = result.context_messages
    told = next(i for i, m in enumerate(messages) if m.get("role") == "tool")
    assert [m.get("content") for m in messages[told + 1 :]] == [
        "Node confirm.",
        "Booked, see you at nine.",
    ]
    assert tool_messages(result)[0]["status"] == "committed"


@pytest.mark.parametrize("kind", KINDS)
async def test_a_barge_in_during_a_slow_booking_moves_the_flow_on_once_it_commits(
    tmp_path: Path, kind: str
) -> None:
    blocking = booking_policy("mode: blocking")
    script = [
        Say("Hello, what can I book for you?"),
        ToolCalls([("book_table", DETAILS)], say="One moment while I book that for you."),
        Say("Still working on it."),
        Say("You're booked."),
    ]
    async with flow_agent(tmp_path, script, kind=kind, policy_text=blocking) as a:
        result = await a.converse(
            [
                WaitUntilIdle(),
                UserSays("Two at nine."),
                BargeIn("Are you still there?", after_secs=0.1),
                WaitUntilIdle(),
                Call(a.answers()),
                Call(a.entered("confirm")),
                WaitUntilIdle(),
            ]
        )
        op = await a.settled(S.COMMITTED)

    assert "CANCELLED" not in contents(result)
    assert a.nodes == ["greet", "confirm"]  # when the truth was known, not before
    assert a.bookings() == 1
    told = tool_messages(result)
    assert [m["status"] for m in told] == ["running"]  # the call was closed with the truth
    assert "Outcome of an earlier book_table" in contents(result)
    assert op.delivered_status is S.COMMITTED
    assert result.context_messages[-1]["content"] == "You're booked."


@pytest.mark.parametrize(
    ("kind", "transition_to"),
    [
        ("configured", {"field": "status", "cases": {"committed": "confirm"}}),
        ("configured", "confirm"),  # unconditional: the ledger says refused, so it is not followed
        ("python", None),
    ],
)
async def test_a_refused_call_keeps_the_node_and_the_bot_tells_the_truth(
    tmp_path: Path, kind: str, transition_to: Any
) -> None:
    script = _script_book(Say("I'm sorry, I can't book that."))
    options: dict[str, Any] = {"transition_to": transition_to} if transition_to else {}
    async with flow_agent(tmp_path, script, kind=kind, authorizer=_Deny(), **options) as a:
        result = await a.converse([WaitUntilIdle(), UserSays("Two at nine."), WaitUntilIdle()])

    assert a.nodes == ["greet"]
    assert a.bookings() == 0 and a.handled == []
    assert [m["status"] for m in tool_messages(result)] == ["refused"]
    assert a.llm.inferences == 3  # the model was asked to tell the refusal, in greet
    assert result.context_messages[-1]["content"] == "I'm sorry, I can't book that."


async def test_a_branch_on_status_follows_the_case_of_the_refusal(tmp_path: Path) -> None:
    branch = {"field": "status", "cases": {"committed": "confirm", "refused": "try_again"}}
    script = _script_book(Say("Shall we try another time?"))
    async with flow_agent(tmp_path, script, transition_to=branch, authorizer=_Deny()) as a:
        result = await a.converse([WaitUntilIdle(), UserSays("Two at nine."), WaitUntilIdle()])

    assert a.nodes == ["greet", "try_again"]
    assert result.context_messages[-1]["content"] == "Shall we try another time?"


async def test_a_branch_on_a_field_of_the_handlers_own_result_works_when_it_committed(
    tmp_path: Path,
) -> None:
    branch = {"field": "booking_id", "cases": {"bk_0001": "confirm"}, "default": "checking"}
    async with flow_agent(tmp_path, _script_book(Say("Done.")), transition_to=branch) as a:
        result = await a.converse([WaitUntilIdle(), UserSays("Two at nine."), Call(a.answers())])
        await a.settled(S.COMMITTED)

    assert a.nodes == ["greet", "confirm"]
    # What the model is told is the runtime's result (the handler's fields under "result").
    assert set(tool_messages(result)[0]) == {"status", "operation_id", "message", "result"}


OWN_STATUS = {"field": "status", "cases": {"booked": "confirm"}, "default": "try_again"}
"""A branch on the handler's own ``status``, as a flow written for bare Flows has it."""
RUNTIMES = {"field": STATUS_FIELD, "cases": {"committed": "confirm"}, "default": "try_again"}
"""A branch on the runtime's status, whatever the handler's result holds."""


@pytest.mark.parametrize("branch", [OWN_STATUS, RUNTIMES], ids=["own_status", "runtimes"])
async def test_a_handlers_own_status_is_kept_for_its_branch_and_the_runtimes_is_beside_it(
    tmp_path: Path, branch: dict[str, Any]
) -> None:
    own = {"status": "booked", "message": "Table 4 is yours."}
    script = _script_book(Say("Done."))
    async with flow_agent(tmp_path, script, transition_to=branch, own=own) as a:
        result = await a.converse([WaitUntilIdle(), UserSays("Two at nine."), Call(a.answers())])
        await a.settled(S.COMMITTED)

    assert a.nodes == ["greet", "confirm"]
    # The model is told the runtime's result, the handler's own fields under "result".
    (told,) = tool_messages(result)
    assert told["status"] == "committed"
    assert told["result"]["status"] == "booked"


async def test_a_late_commit_follows_the_branch_on_the_handlers_own_status(
    tmp_path: Path,
) -> None:
    # The wait ended at a barge-in; the outcome came later, through the delivery: the branch
    # still sees the handler's own status.
    blocking = booking_policy("mode: blocking")
    script = [
        Say("Hello, what can I book for you?"),
        ToolCalls([("book_table", DETAILS)], say="One moment while I book that for you."),
        Say("Still working on it."),
        Say("You're booked."),
    ]
    own = {"status": "booked"}
    branch = {"field": "status", "cases": {"booked": "confirm"}}  # "running" keeps the node
    async with flow_agent(
        tmp_path, script, policy_text=blocking, transition_to=branch, own=own
    ) as a:
        await a.converse(
            [
                WaitUntilIdle(),
                UserSays("Two at nine."),
                BargeIn("Are you still there?", after_secs=0.1),
                WaitUntilIdle(),
                Call(a.answers()),
                Call(a.entered("confirm")),
                WaitUntilIdle(),
            ]
        )
        await a.settled(S.COMMITTED)

    assert a.nodes == ["greet", "confirm"]


async def test_awaiting_approval_waits_and_the_approval_moves_the_flow_on(tmp_path: Path) -> None:
    approval = booking_policy("confirmation: {mode: approval, approvers: [maria]}")
    branch = {
        "field": "status",
        "cases": {"committed": "confirm", "awaiting_approval": "wait"},
    }
    script = _script_book(Say("A manager has to agree."), Say("Approved and booked."))
    async with flow_agent(tmp_path, script, policy_text=approval, transition_to=branch) as a:

        async def approve() -> None:
            waiting = await a.settled(S.AWAITING_APPROVAL)
            await a.runtime.approve(
                waiting.operation_id,
                approver=Approver("maria", tenants={"default"}),
                reason="regular",
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
        await a.settled(S.COMMITTED)

    assert a.nodes == ["greet", "wait", "confirm"]
    assert a.bookings() == 1
    assert result.context_messages[-1]["content"] == "Approved and booked."


async def test_an_unknown_outcome_goes_to_checking_and_its_reconciled_commit_to_confirm(
    tmp_path: Path,
) -> None:
    # The restaurant commits and the answer is lost; its checks say "pending" until the
    # runtime gives up (UNKNOWN, escalated); an operator's check later finds the booking.
    script = _script_book(Say("I'm checking with the restaurant."), Say("Booked after all."))
    async with flow_agent(tmp_path, script, reconcile=True) as a:
        a.sor.faults.lose_response_after_commit("book")

        async def checks_give_up() -> None:
            async def escalated() -> bool:
                a.clock.advance(DEADLINE)  # the next pause between checks passes
                return (await a.settled(S.UNKNOWN)).escalated_at is not None

            await until(escalated, what="the runtime to give up checking")

        async def an_operator_checks() -> None:
            a.still_checking.clear()
            op = await a.settled(S.UNKNOWN)
            await a.runtime.reconcile_unknown(op.operation_id, actor="operator:maria")

            async def heard() -> bool:
                # Escalated, it is no longer run here: the conversation re-reads it every
                # WATCH_SECS (of the runtime's clock) until it is told.
                a.clock.advance(WATCH_SECS)
                current = await a.runtime.ledger.get(op.operation_id)
                return current.delivered_status is S.COMMITTED

            await until(heard, what="the operator's finding to be told")

        result = await a.converse(
            [
                WaitUntilIdle(),
                UserSays("Two at nine."),
                Call(a.answers()),
                Call(checks_give_up),
                Call(a.entered("checking")),
                WaitUntilIdle(),
                Call(an_operator_checks),
                Call(a.entered("confirm")),
                WaitUntilIdle(),
            ]
        )
        await a.settled(S.COMMITTED)

    assert a.nodes == ["greet", "checking", "confirm"]
    assert a.bookings() == 1
    assert [m["status"] for m in tool_messages(result)] == ["unknown"]
    # What reconciliation found is in the flow's state, for the confirm node's prompt.
    assert a.manager is not None
    known = a.manager.state[STATE_KEY]["book_table"]
    assert known["status"] == "committed" and known["result"]["booking_id"] == "bk_0001"
    assert result.context_messages[-1]["content"] == "Booked after all."


@pytest.mark.parametrize("kind", KINDS)
async def test_a_late_outcome_is_told_in_the_node_active_when_it_arrives(
    tmp_path: Path, kind: str
) -> None:
    blocking = booking_policy("mode: blocking")
    script = [
        Say("Hello, what can I book for you?"),
        ToolCalls([("book_table", DETAILS)], say="One moment while I book that for you."),
        ToolCalls([("ask_elsewhere", {})]),
        Say("Parking is round the back."),
        Say("By the way, your table is booked."),
    ]
    async with flow_agent(tmp_path, script, kind=kind, policy_text=blocking) as a:
        result = await a.converse(
            [
                WaitUntilIdle(),
                UserSays("Two at nine."),
                BargeIn("Where do I park?", after_secs=0.1),
                Call(a.entered("elsewhere")),
                WaitUntilIdle(),
                Call(a.answers()),
                Call(a.told(S.COMMITTED)),
                WaitUntilIdle(),
            ]
        )
        await a.settled(S.COMMITTED)

    assert a.nodes == ["greet", "elsewhere"]  # the outcome moved nothing: greet was left
    text = contents(result)
    assert text.index("Node elsewhere.") < text.index("Outcome of an earlier book_table")
    assert result.context_messages[-1]["content"] == "By the way, your table is booked."


@pytest.mark.parametrize("kind", KINDS)
async def test_a_background_outcome_never_overrides_a_transition_asked_for_since(
    tmp_path: Path, kind: str
) -> None:
    background = booking_policy("mode: background")
    script = [
        Say("Hello, what can I book for you?"),
        ToolCalls([("book_table", DETAILS)]),
        ToolCalls([("ask_elsewhere", {})]),
        Say("Your table is booked, and parking is round the back."),
    ]
    async with flow_agent(tmp_path, script, kind=kind, policy_text=background) as a:
        result = await a.converse(
            [
                WaitUntilIdle(),
                UserSays("Two at nine."),
                WaitUntilIdle(function_calls=False),
                UserSays("Where do I park?"),
                WaitUntilIdle(function_calls=False),
                Call(a.answers()),
                Call(a.entered("elsewhere")),
                WaitUntilIdle(),
            ]
        )
        await a.settled(S.COMMITTED)

    # Flows held ask_elsewhere's transition until the booking finished; it then went there,
    # not to the booking's confirm node.
    assert a.nodes == ["greet", "elsewhere"]
    assert a.llm.inferences == 4
    assert result.context_messages[-1]["content"] == (
        "Your table is booked, and parking is round the back."
    )


async def test_a_function_name_reused_by_two_nodes_runs_each_nodes_own_handler(
    tmp_path: Path,
) -> None:
    ran: list[str] = []

    def node_with_note(name: str, then: dict[str, Any] | None) -> dict[str, Any]:
        async def note(args: dict[str, Any], flow_manager: FlowManager) -> tuple[Any, Any]:
            ran.append(f"{name}:{args['text']}")
            return {"noted": args["text"]}, then

        schema = FlowsFunctionSchema(
            name="note_details",
            description="Note what the caller said.",
            properties={"text": {"type": "string"}},
            required=["text"],
            handler=note,
        )
        return python_node(name, [schema])

    second = node_with_note("second", None)
    first = node_with_note("first", second)
    script = [
        Say("Hello."),
        ToolCalls([("note_details", {"text": "two people"})]),
        Say("Noted, and the time?"),
        ToolCalls([("note_details", {"text": "at nine"})]),
        Say("Noted."),
    ]
    async with flow_agent(tmp_path, script, kind="python") as a:

        async def start(manager: FlowManager) -> None:
            await manager.initialize(first)

        a.start = start
        await a.converse(
            [WaitUntilIdle(), UserSays("Two people."), WaitUntilIdle(), UserSays("At nine.")]
        )
        notes = await a.operations("note_details")

    assert ran == ["first:two people", "second:at nine"]
    assert a.nodes == ["first", "second"]
    assert len(notes) == 2 and all(op.status is S.COMMITTED for op in notes)


async def test_the_policy_decides_the_call_options_flows_registers(tmp_path: Path) -> None:
    timed = booking_policy("mode: blocking", "timeout_secs: 7")
    async with flow_agent(tmp_path, [Say("Hello.")], policy_text=timed) as a:
        await a.converse([WaitUntilIdle()])
        item = a.llm._functions["book_table"]
        other = a.llm._functions["ask_elsewhere"]

    assert item.cancel_on_interruption is True  # Flows' own default is False
    assert item.timeout_secs == 7
    assert other.cancel_on_interruption is False  # transition_only: left to Flows


async def test_a_flow_function_without_a_policy_entry_is_refused_by_name(tmp_path: Path) -> None:
    lacking = POLICY.replace("      book_table:", "      book_a_table:")
    with pytest.raises(ConfigurationError, match="book_table"):
        async with flow_agent(tmp_path, [], policy_text=lacking):
            pass


async def test_a_python_flow_function_without_a_policy_entry_fails_the_node_by_name(
    tmp_path: Path,
) -> None:
    async def anything(args: dict[str, Any], flow_manager: FlowManager) -> Any:
        return {}

    stray = FlowsFunctionSchema(
        name="order_pizza", description="", properties={}, required=[], handler=anything
    )
    errors: list[BaseException] = []
    async with flow_agent(tmp_path, [Say("Hello.")], kind="python") as a:

        async def start(manager: FlowManager) -> None:
            try:
                await manager.initialize(python_node("greet", [stray]))
            except Exception as exc:
                errors.append(exc)

        a.start = start
        await a.converse([WaitUntilIdle()])

    assert len(errors) == 1 and "order_pizza has no entry in the policy" in str(errors[0])


async def test_attach_after_the_flow_started_is_refused(tmp_path: Path) -> None:
    errors: list[BaseException] = []
    async with flow_agent(tmp_path, [Say("Hello.")]) as a:
        attach = a.actions.attach

        def late_attach(manager: FlowManager, gate: Any) -> None:
            a.actions.attach = attach  # type: ignore[method-assign]

        a.actions.attach = late_attach  # type: ignore[method-assign]
        start = a.start

        async def start_then_attach(manager: FlowManager) -> None:
            await start(manager)
            try:
                attach(manager, a.gate)
            except ConfigurationError as exc:
                errors.append(exc)

        a.start = start_then_attach
        await a.converse([WaitUntilIdle()])

    assert len(errors) == 1 and "before FlowManager.initialize" in str(errors[0])


async def test_instrument_alone_keeps_a_flows_edge_transition(tmp_path: Path) -> None:
    # Without FlowActions, instrument() wraps Flows' transition function as a whole:
    # the call is admitted and recorded, and Flows' run_llm=False and transition still hold.
    # (Every function then needs a policy entry: instrument routes them all.)
    every = POLICY + "      ask_elsewhere:\n        kind: read\n"
    script = _script_book(Say("Booked."))
    async with flow_agent(tmp_path, script, kind="python", policy_text=every) as a:

        def instrument_instead(manager: FlowManager, gate: Any) -> None:
            instrument(a.runtime, a.llm, a.session)

        a.actions.attach = instrument_instead  # type: ignore[method-assign]

        await a.converse([WaitUntilIdle(), UserSays("Two at nine."), Call(a.answers())])
        op = await a.settled(S.COMMITTED)

    assert a.nodes == ["greet", "confirm"]
    assert a.llm.inferences == 3
    assert op.provider_call_id is not None and a.bookings() == 1


async def test_a_silent_late_outcome_goes_into_the_context_and_moves_nothing(
    tmp_path: Path,
) -> None:
    silent = booking_policy("mode: blocking", "delivery: {late: silent}")
    script = [
        Say("Hello, what can I book for you?"),
        ToolCalls([("book_table", DETAILS)], say="One moment while I book that for you."),
        Say("Still working on it."),
    ]
    async with flow_agent(tmp_path, script, policy_text=silent) as a:
        result = await a.converse(
            [
                WaitUntilIdle(),
                UserSays("Two at nine."),
                BargeIn("Are you still there?", after_secs=0.1),
                WaitUntilIdle(),
                Call(a.answers()),
                Call(a.told(S.COMMITTED)),
                WaitUntilIdle(),
            ]
        )

    assert a.nodes == ["greet"]
    assert "Outcome of an earlier book_table" in contents(result)
    assert a.llm.inferences == 3  # told silently: no inference for it


@pytest.mark.parametrize("kind", KINDS)
async def test_a_repeated_call_after_a_barge_in_tells_the_commit_once_and_moves_on_once(
    tmp_path: Path, kind: str
) -> None:
    blocking = booking_policy("mode: blocking")
    script = [
        Say("Hello, what can I book for you?"),
        ToolCalls([("book_table", DETAILS)], say="One moment while I book that for you."),
        ToolCalls([("book_table", DETAILS)], say="I'm still on it."),  # the model repeats it
        Say("You're booked."),
    ]
    async with flow_agent(tmp_path, script, kind=kind, policy_text=blocking) as a:

        async def commit() -> None:
            await until(
                lambda: a.runtime.operation_for_call("call_2") is not None,
                what="the repeat to join the booking",
            )
            await a.at_the_restaurant()
            a.commit()

        result = await a.converse(
            [
                WaitUntilIdle(),
                UserSays("Two at nine."),
                BargeIn("Are you still there?", after_secs=0.1),
                Call(commit),
                Call(a.entered("confirm")),
                WaitUntilIdle(),
            ]
        )
        (op,) = await a.operations()

    told = [m for m in tool_messages(result) if m.get("status") == "committed"]
    late = [m for m in result.context_messages if "Outcome of an earlier" in str(m.get("content"))]
    assert len(told) + len(late) == 1  # the commit, told once
    assert a.nodes == ["greet", "confirm"]  # entered once
    assert a.bookings() == 1 and op.status is S.COMMITTED
