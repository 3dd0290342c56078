"""The model's ``cancel_<tool>``, end to end: the answer is what the ledger says, never "CANCELLED".

A real cascade (Pipecat's aggregators, `FakeTTS`, the offline output transport, the tracker and
the gate) around `ScriptedLLM`; the booking runs on a `FakeSystemOfRecord` and the runtime on a
`ScriptClock`, so a booking is sent, retried, cancelled by the provider or committed exactly
where the script moves the clock. Each test is one thing the model may be told after asking to
cancel: cancelled (nothing was sent), cancel requested (the provider is asked; the outcome
follows), already committed (the undo offered only when the policy names one), or refused by
the policy.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from pipecat.processors.aggregators.llm_context import LLMContext

from pipecat_actions import ActionRuntime, SessionState, attach, tools_schema
from pipecat_actions.actions import ActionContext, action
from pipecat_actions.adapters import ActionResultGate, ActionTurnTracker
from pipecat_actions.ledger.records import EventKind, Operation, OperationEvent
from pipecat_actions.status import ActionStatus
from pipecat_actions.testing import (
    Call,
    ConversationResult,
    FakeSystemOfRecord,
    FakeTTS,
    Say,
    ScriptedLLM,
    ToolCalls,
    UserSays,
    run_conversation,
)
from tests.processors._clocked import ScriptClock, operation, until
from tests.runtime._execution_support import Bookings, booking, running, tool_results

pytestmark = pytest.mark.timeout(60)

S = ActionStatus

BOOK = ToolCalls([("book_table", booking())], ids=["call_book"])
CANCEL = ToolCalls([("cancel_book_table", {})], ids=["call_cancel"])


def policy(*, cancellable: bool = True, undo: bool = False, retry: bool = False) -> str:
    """A background ``book_table``, with the settings a test needs."""
    lines = [
        "version: 1",
        "tools:",
        "  book_table:",
        "    kind: mutation",
        "    mode: background",
    ]
    if cancellable:
        lines.append("    cancellable_by_llm: true")  # left out: the default, false
    if undo:
        lines.append("    compensation: {tool: cancel_booking}")
    if retry:
        lines += [
            "    idempotency: {provider_dedupes: true}",
            "    retry: {max_attempts: 2, initial_backoff_secs: 1.0, jitter: 0.0}",
        ]
    lines += ["  cancel_booking:", "    kind: mutation"]
    return "\n".join(lines) + "\n"


@asynccontextmanager
async def restaurant(
    tmp_path: Path, policy_text: str, *, latency_secs: float, slow_cancel_secs: float = 0.0
) -> AsyncIterator[tuple[ActionRuntime, FakeSystemOfRecord, ScriptClock]]:
    clock = ScriptClock()
    sor = FakeSystemOfRecord(clock=clock, slow_cancel_secs=slow_cancel_secs)
    sor.add_restaurant("r1", tables=3)
    sor.faults.set_latency(latency_secs)

    @action
    async def cancel_booking(ctx: ActionContext, booking_id: str) -> dict[str, Any]:
        """Cancel a booking."""
        cancelled = await sor.cancel(booking_id, idempotency_key=ctx.idempotency_key)
        return {"booking_id": cancelled.booking_id}

    actions = [Bookings(sor).action(cancel=True), cancel_booking]
    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    async with running(policy_text, actions, ledger_url=ledger_url, clock=clock) as runtime:
        yield runtime, sor, clock


class Talk:
    """One conversation through the template's processors, around the booking runtime."""

    def __init__(self, runtime: ActionRuntime, script: Sequence[Any]) -> None:
        self.runtime = runtime
        self.session = SessionState(session_id="call-1", principal="alice")
        self.llm = ScriptedLLM(script)
        attach(runtime, self.llm, self.session)
        self.context = LLMContext(messages=[], tools=tools_schema(runtime))

    async def run(self, steps: Sequence[Any]) -> ConversationResult:
        return await run_conversation(
            steps,
            llm=self.llm,
            tts=FakeTTS(secs_per_char=0.01),
            context=self.context,
            after_user_aggregator=[ActionTurnTracker(self.session)],
            before_assistant_aggregator=[ActionResultGate(self.runtime, self.session)],
        )

    def answered(self, tool_call_id: str) -> Call:
        """Wait until the context holds the answer of ``tool_call_id``."""

        def check() -> bool:
            return isinstance(self.results().get(tool_call_id), dict)

        return Call(lambda: until(check, what=f"the answer of {tool_call_id}"))

    def results(self) -> dict[str, Any]:
        return tool_results([dict(m) for m in self.context.get_messages()])

    def mentions(self, status: S) -> Call:
        """Wait until some message of the context tells the booking as ``status``."""

        async def step() -> None:
            op = await operation(self.runtime, "book_table")
            word = status.value.lower()

            def check() -> bool:
                return any(_says(m, op.operation_id, word) for m in self.context.get_messages())

            await until(check, what=f"the booking told {word}")

        return Call(step)

    def delivered(self) -> Call:
        """Wait until the booking's outcome is recorded as told."""

        async def check() -> bool:
            op = await operation(self.runtime, "book_table")
            return op.delivered_status is op.status

        return Call(lambda: until(check, what="the booking's outcome recorded as told"))


def _says(message: Any, operation_id: str, status: str) -> bool:
    """Whether ``message`` tells ``operation_id`` as ``status`` (in a result, nested or not)."""
    return any(
        told.get("operation_id") == operation_id and told.get("status") == status
        for told in _told(message.get("content"))
    )


def _told(value: Any) -> Iterator[dict[str, Any]]:
    """Every JSON object in a message's content, also inside JSON text (async-tool payloads)."""
    if isinstance(value, dict):
        yield value
        for inner in value.values():
            yield from _told(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _told(inner)
    elif isinstance(value, str) and "{" in value:
        try:
            decoded = json.loads(value[value.index("{") :])
        except ValueError:
            return
        yield from _told(decoded)


def reaches(runtime: ActionRuntime, *statuses: S) -> Call:
    async def step() -> None:
        await operation(runtime, "book_table", *statuses)

    return Call(step)


def advance(clock: ScriptClock, secs: float) -> Call:
    async def step() -> None:
        clock.advance(secs)

    return Call(step)


async def the_booking(runtime: ActionRuntime) -> tuple[Operation, list[OperationEvent]]:
    op = await operation(runtime, "book_table")
    return op, await runtime.ledger.events(op.operation_id)


def by_the_model(trail: list[OperationEvent]) -> list[OperationEvent]:
    return [e for e in trail if e.actor == "model:call-1"]


def pipecats_own_answer(result: ConversationResult) -> bool:
    """Whether Pipecat's own cancel answer (``{"cancelled": ...}``, ``CANCELLED``) got in."""
    for message in result.context_messages:
        content = message.get("content")
        if isinstance(content, str) and "CANCELLED" in content:
            return True
        if any("cancelled" in told for told in _told(content)):
            return True
    return False


async def test_a_cancel_before_anything_was_sent_is_cancelled_and_nothing_happens(
    tmp_path: Path,
) -> None:
    # The first attempt is refused before it is sent; the retry waits 1 s on the clock. The
    # model's cancel comes in that pause: nothing was sent, so it is cancelled outright.
    async with restaurant(tmp_path, policy(retry=True), latency_secs=0.5) as (rt, sor, clock):
        sor.faults.error_before_send("book")
        talk = Talk(rt, [BOOK, CANCEL, Say("Cancelled; nothing was booked.")])
        result = await talk.run(
            [
                UserSays("A table for two at nine, please."),
                reaches(rt, S.FAILED_RETRYABLE),
                UserSays("Actually, cancel that."),
                talk.answered("call_cancel"),
                reaches(rt, S.CANCELLED),
                advance(clock, 2.0),  # the retry would be due now
            ]
        )
        op, trail = await the_booking(rt)

    answer = tool_results(result.context_messages)["call_cancel"]
    assert answer["status"] == "cancelled"
    assert answer["cancel"] == "cancelled"
    assert answer["operation_id"] == op.operation_id
    assert "nothing happened" in answer["message"]
    assert op.status is S.CANCELLED
    [asked] = by_the_model(trail)
    assert (asked.kind, asked.to_status) == (EventKind.TRANSITION, S.CANCELLED)
    assert asked.detail["requested_by"] == "model"
    assert asked.detail["cancel_tool"] == "cancel_book_table"
    assert asked.detail["tool_call_id"] == "call_cancel"
    assert sor.calls["book"] == 1  # the attempt refused before sending; no retry after
    assert sor.side_effects["book"] == 0
    assert not pipecats_own_answer(result)
    assert "Cancelled; nothing was booked." in result.heard_texts


async def test_a_cancel_while_it_runs_is_requested_and_cancelled_only_once_the_provider_confirms(
    tmp_path: Path,
) -> None:
    async with restaurant(tmp_path, policy(), latency_secs=5.0, slow_cancel_secs=1.0) as (
        rt,
        sor,
        clock,
    ):
        talk = Talk(rt, [BOOK, CANCEL, Say("I asked them to stop it.")])
        result = await talk.run(
            [
                UserSays("A table for two at nine, please."),
                Call(lambda: clock.asked(5.0)),  # at the provider, not answered
                UserSays("Actually, cancel that."),
                talk.answered("call_cancel"),
                reaches(rt, S.CANCEL_REQUESTED),
                Call(lambda: clock.asked(1.0)),  # the provider works on the cancel
                advance(clock, 1.0),  # it confirms: the pending request is aborted
                reaches(rt, S.CANCELLED),
                talk.mentions(S.CANCELLED),
                advance(clock, 5.0),  # an aborted request must not commit later
            ]
        )
        op, trail = await the_booking(rt)
        talk_messages = result.context_messages

    answer = tool_results(talk_messages)["call_cancel"]
    assert answer["status"] == "cancel_requested"
    assert answer["cancel"] == "requested"
    assert "outcome will be told" in answer["message"]
    assert "Do not say it was cancelled" in answer["message"]
    assert op.status is S.CANCELLED
    assert [(e.to_status, e.actor) for e in trail if e.kind is EventKind.TRANSITION] == [
        (S.CANCEL_REQUESTED, "model:call-1"),
        (S.CANCELLED, rt.actor),
    ]
    assert [e.detail["reason"] for e in trail if e.kind is EventKind.TRANSITION] == [
        "the model asked to cancel it",
        "the provider confirmed",
    ]
    assert sor.calls["cancel_pending"] == 1
    assert sor.side_effects["book"] == 0
    assert not pipecats_own_answer(result)
    # "Cancelled" reaches the model only after the cancel was requested, from the ledger.
    answer_at = next(
        i for i, m in enumerate(talk_messages) if m.get("tool_call_id") == "call_cancel"
    )
    cancelled_at = [
        i for i, m in enumerate(talk_messages) if _says(m, op.operation_id, "cancelled")
    ]
    assert cancelled_at and min(cancelled_at) > answer_at


@pytest.mark.parametrize("undo", [True, False], ids=["undo-configured", "no-undo"])
async def test_a_cancel_after_the_commit_says_it_happened_and_offers_the_undo_only_if_configured(
    tmp_path: Path, undo: bool
) -> None:
    async with restaurant(tmp_path, policy(undo=undo), latency_secs=0.5) as (rt, sor, clock):
        talk = Talk(rt, [BOOK, Say("Your table is booked."), CANCEL, Say("It was booked.")])
        result = await talk.run(
            [
                UserSays("A table for two at nine, please."),
                Call(lambda: clock.asked(0.5)),
                advance(clock, 0.5),
                reaches(rt, S.COMMITTED),
                talk.answered("call_book"),
                UserSays("Oh, cancel that."),
                talk.answered("call_cancel"),
            ]
        )
        op, trail = await the_booking(rt)

    answer = tool_results(result.context_messages)["call_cancel"]
    assert answer["status"] == "committed"
    assert answer["cancel"] == "too_late"
    assert "had already happened" in answer["message"]
    assert answer["result"] == op.result
    if undo:
        assert answer["undo_tool"] == "cancel_booking"
        assert "undo it with cancel_booking" in answer["message"]
    else:
        assert "undo_tool" not in answer
        assert "cannot be undone" in answer["message"]
    assert op.status is S.COMMITTED
    [asked] = by_the_model(trail)
    assert asked.kind is EventKind.ANNOTATION
    assert asked.detail["answer"] == "too_late"
    assert asked.detail["requested_by"] == "model"
    assert sor.side_effects["book"] == 1
    assert sor.side_effects["cancel"] == 0  # nothing is undone unasked
    assert not pipecats_own_answer(result)


async def test_a_cancel_the_policy_does_not_allow_is_refused_and_the_booking_goes_on(
    tmp_path: Path,
) -> None:
    async with restaurant(tmp_path, policy(cancellable=False), latency_secs=2.0) as (
        rt,
        sor,
        clock,
    ):
        talk = Talk(rt, [BOOK, CANCEL, Say("I cannot cancel that."), Say("It is booked.")])
        advertised = [tool.name for tool in talk.context.tools.standard_tools]  # type: ignore[union-attr]
        result = await talk.run(
            [
                UserSays("A table for two at nine, please."),
                Call(lambda: clock.asked(2.0)),
                UserSays("Cancel that."),  # the model calls cancel_book_table anyway
                talk.answered("call_cancel"),
                advance(clock, 2.0),
                reaches(rt, S.COMMITTED),
                talk.delivered(),
            ]
        )
        op, trail = await the_booking(rt)

    assert "cancel_book_table" not in advertised
    answer = tool_results(result.context_messages)["call_cancel"]
    assert answer["status"] == "refused"
    assert answer["reason"] == "cancel_not_allowed"
    assert "policy does not allow" in answer["message"]
    assert "It goes on" in answer["message"]
    assert answer["existing_operation_id"] == op.operation_id
    assert "operation_id" not in answer  # telling the refusal never tells the booking
    assert op.status is S.COMMITTED
    assert op.delivered_status is S.COMMITTED
    [asked] = by_the_model(trail)
    assert asked.kind is EventKind.ANNOTATION
    assert asked.detail["answer"] == "refused: not cancellable_by_llm"
    assert sor.calls["cancel_pending"] == 0
    assert sor.side_effects["book"] == 1
    assert not pipecats_own_answer(result)
