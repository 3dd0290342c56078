"""The model's cancel (`ActionRuntime.cancel_for_model`) on the states a pipeline rarely reaches.

The pipeline tests (`tests/processors/test_model_cancel.py`) cover the main answers end to end;
these call the runtime as the ``cancel_<tool>`` handler does, on a manual clock.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pipecat_actions.clock import ManualClock
from pipecat_actions.ledger.records import EventKind
from pipecat_actions.testing import FakeSystemOfRecord
from tests.runtime._execution_support import (
    Bookings,
    booking,
    eventually,
    new_session,
    only_operation,
    running,
    status_of,
)
from tests.runtime._execution_support import S as Status

POLICY = """
    version: 1
    tools:
      book_table:
        kind: mutation
        cancellable_by_llm: true
      book_without_a_cancel_hook:
        kind: mutation
        cancellable_by_llm: true
      book_after_approval:
        kind: mutation
        cancellable_by_llm: true
        confirmation: {mode: approval, approvers: [manager]}
"""


def fake(clock: ManualClock, *, latency_secs: float = 5.0) -> FakeSystemOfRecord:
    sor = FakeSystemOfRecord(clock=clock)
    sor.add_restaurant("r1", tables=5)
    sor.faults.set_latency(latency_secs)
    return sor


def actions(sor: FakeSystemOfRecord) -> list[Any]:
    bookings = Bookings(sor)
    return [
        bookings.action(cancel=True),
        bookings.action(name="book_without_a_cancel_hook"),
        bookings.action(name="book_after_approval", cancel=True),
    ]


async def test_several_pending_requests_are_listed_and_the_named_one_is_cancelled(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = fake(clock)
    session = new_session()
    async with running(POLICY, actions(sor), ledger_url=ledger_url, clock=clock) as runtime:
        nine = asyncio.ensure_future(runtime.propose("book_table", booking("21:00"), session))
        half = asyncio.ensure_future(runtime.propose("book_table", booking("21:30"), session))
        await eventually(lambda: sor.calls["book"] == 2, what="both requests sent")

        which = await runtime.cancel_for_model("book_table", {}, session)
        listed = {entry["arguments"]["time"]: entry["operation_id"] for entry in which["pending"]}
        named = await runtime.cancel_for_model(
            "book_table", {"operation_id": listed["21:30"]}, session
        )
        clock.advance(5.0)
        outcomes = await asyncio.gather(nine, half)

    assert which["status"] == "refused"
    assert which["reason"] == "which_one"
    assert set(listed) == {"21:00", "21:30"}
    assert named["status"] in ("cancel_requested", "cancelled")
    assert named["operation_id"] == listed["21:30"]
    assert [o["status"] for o in outcomes] == ["committed", "cancelled"]
    assert sor.side_effects["book"] == 1


async def test_a_request_waiting_for_approval_is_withdrawn_and_nothing_happens(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = fake(clock)
    session = new_session()
    async with running(POLICY, actions(sor), ledger_url=ledger_url, clock=clock) as runtime:
        waiting = await runtime.propose("book_after_approval", booking(), session, wait=False)
        assert waiting["status"] == "awaiting_approval"
        answer = await runtime.cancel_for_model("book_after_approval", {}, session)
        [op] = await runtime.ledger.list()
        trail = await runtime.ledger.events(op.operation_id)

    assert answer["status"] == "rejected"
    assert answer["cancel"] == "withdrawn"
    assert "nothing happened" in answer["message"]
    assert "cancelled" not in answer["message"].lower().replace("cancel_", "")
    assert op.status is Status.REJECTED
    last = trail[-1]
    assert (last.kind, last.to_status, last.actor) == (
        EventKind.TRANSITION,
        Status.REJECTED,
        "model:call-1",
    )
    assert sor.calls["book"] == 0


async def test_a_running_request_without_a_cancel_hook_goes_on_and_the_model_is_told_so(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = fake(clock)
    session = new_session()
    async with running(POLICY, actions(sor), ledger_url=ledger_url, clock=clock) as runtime:
        call = asyncio.ensure_future(
            runtime.propose("book_without_a_cancel_hook", booking(), session)
        )
        await eventually(lambda: sor.calls["book"] == 1, what="the request sent")
        answer = await runtime.cancel_for_model("book_without_a_cancel_hook", {}, session)
        op = await only_operation(runtime, "book_without_a_cancel_hook")
        still = await status_of(runtime, op.operation_id)
        clock.advance(5.0)
        final = await call
        trail = await runtime.ledger.events(op.operation_id)

    assert answer["status"] == "running"
    assert answer["cancel"] == "not_possible"
    assert "cannot be stopped" in answer["message"]
    assert still is Status.RUNNING
    assert final["status"] == "committed"
    assert any(
        e.actor == "model:call-1" and (e.detail or {}).get("answer") == "not_possible"
        for e in trail
    )


async def test_nothing_to_cancel_and_another_conversations_request_are_refused(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = fake(clock)
    alice, bob = new_session("call-1", "alice"), new_session("call-2", "bob")
    async with running(POLICY, actions(sor), ledger_url=ledger_url, clock=clock) as runtime:
        nothing = await runtime.cancel_for_model("book_table", {}, alice)
        call = asyncio.ensure_future(runtime.propose("book_table", booking(), bob))
        await eventually(lambda: sor.calls["book"] == 1, what="bob's request sent")
        op = await only_operation(runtime)
        not_hers = await runtime.cancel_for_model(
            "book_table", {"operation_id": op.operation_id}, alice
        )
        unknown_tool = await runtime.cancel_for_model("no_such_tool", {}, alice)
        clock.advance(5.0)
        final = await call

    assert (nothing["status"], nothing["reason"]) == ("refused", "nothing_to_cancel")
    assert (not_hers["status"], not_hers["reason"]) == ("refused", "no_such_request")
    assert (unknown_tool["status"], unknown_tool["reason"]) == ("refused", "unknown_tool")
    assert final["status"] == "committed"  # bob's booking was never touched


async def test_a_cancel_whose_caller_is_stopped_is_still_requested_in_full(
    ledger_url: str, clock: ManualClock
) -> None:
    # A barge-in cancels the cancel_<tool> handler itself: the request it made runs to its end.
    sor = fake(clock)
    session = new_session()
    async with running(POLICY, actions(sor), ledger_url=ledger_url, clock=clock) as runtime:
        call = asyncio.ensure_future(runtime.propose("book_table", booking(), session))
        await eventually(lambda: sor.calls["book"] == 1, what="the request sent")
        asking = asyncio.ensure_future(runtime.cancel_for_model("book_table", {}, session))
        await asyncio.sleep(0)
        asking.cancel()
        await asyncio.gather(asking, return_exceptions=True)
        final = await call

    assert final["status"] == "cancelled"
    assert sor.side_effects["book"] == 0
