"""The conversation port answers an adapter's questions about a call, frame-free, typed.

No Pipecat here: the port (`ActionRuntime.calls`) is what every adapter talks to, so what a
cascade gate, a realtime adapter or a Flows adapter does with a cancelled call is decided once.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any

import pytest

from pipecat_actions import ActionContext, ActionRuntime, AllowAll, SessionState, action
from pipecat_actions.policy import load_policy_text
from pipecat_actions.results import ToolResult
from pipecat_actions.runtime.calls import CONFIRM_TOOL, Told
from pipecat_actions.status import ActionStatus

POLICY = """
version: 1
tools:
  book_table:
    kind: mutation
    cancellable_by_llm: true
  check_menu:
    kind: read
  cancel_order:
    kind: mutation
    confirmation: {mode: verbal}
"""


@action
async def book_table(ctx: ActionContext, time: str) -> dict[str, Any]:
    """Book a table."""
    return {"booked": time}


@action
async def check_menu(ctx: ActionContext) -> dict[str, Any]:
    """Read the menu."""
    return {"menu": ["soup"]}


@action
async def cancel_order(ctx: ActionContext, order_id: str) -> dict[str, Any]:
    """Cancel an order."""
    return {"cancelled": order_id}


class Outlet:
    """What an adapter gives the delivery service to speak through; here it only records."""

    def __init__(self) -> None:
        self.told: list[Told] = []

    async def tell(self, told: Told) -> None:
        self.told.append(told)

    async def interrupt(self) -> None:
        return None

    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.get_running_loop().create_task(coroutine)


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[ActionRuntime]:
    opened = await ActionRuntime.create(
        load_policy_text(POLICY),
        authorizer=AllowAll(),
        actions=[book_table, check_menu, cancel_order],
        ledger_url=f"sqlite:///{tmp_path}/ledger.db",
    )
    yield opened
    await opened.close(grace_secs=0)


def session() -> SessionState:
    return SessionState(session_id="call-1", principal="alice")


async def test_the_port_says_whose_calls_are_the_runtimes(runtime: ActionRuntime) -> None:
    calls = runtime.calls
    assert calls.owns("book_table") and calls.owns("check_menu")
    assert calls.owns(CONFIRM_TOOL)  # cancel_order asks for a verbal confirmation
    assert calls.cancel_target("cancel_book_table") == "book_table"
    assert calls.owns("cancel_book_table")
    assert calls.cancel_target("cancel_check_menu") is None  # a read is never cancelled
    assert not calls.owns("get_weather")
    # cancel_order is a tool of its own, never the cancel of an "order" tool.
    assert calls.cancel_target("cancel_order") is None
    assert calls.about_another_call(CONFIRM_TOOL)
    assert calls.about_another_call("cancel_book_table")
    assert not calls.about_another_call("book_table")


async def test_a_proposed_call_is_answered_with_a_typed_tool_result(
    runtime: ActionRuntime,
) -> None:
    answer = await runtime.calls.propose(
        "book_table", {"time": "21:00"}, session(), tool_call_id="call_1"
    )
    assert isinstance(answer, ToolResult)
    assert answer.status is ActionStatus.COMMITTED
    assert answer.operation_id == runtime.calls.operation_for("call_1")
    refused = await runtime.calls.propose(
        "book_table", {"when": "later"}, session(), tool_call_id="call_2"
    )
    assert refused.refused and refused.status is None  # "refused" is no operation status


async def test_a_cancelled_call_with_no_operation_behind_it_is_closed_at_once(
    runtime: ActionRuntime,
) -> None:
    stopped_read = runtime.calls.close_now("check_menu", "call_9")
    stopped_booking = runtime.calls.close_now("book_table", "call_9")
    assert stopped_read is not None and stopped_read.said == "cancelled"
    assert stopped_booking is not None and stopped_booking.said == "not_started"
    assert "nothing was done" in stopped_booking.message
    # A confirm_action call names its operation: its state closes it, not "not started".
    assert runtime.calls.close_now(CONFIRM_TOOL, "call_9", about="op_1") is None


async def test_a_cancelled_call_of_an_operation_is_closed_with_its_real_state(
    runtime: ActionRuntime,
) -> None:
    await runtime.calls.propose("book_table", {"time": "21:00"}, session(), tool_call_id="c1")
    assert runtime.calls.close_now("book_table", "c1") is None  # its operation decides
    delivery = runtime.calls.open_delivery(session(), Outlet())
    try:
        closed = await runtime.calls.close_cancelled(delivery, "book_table", "c1", timed_out=False)
    finally:
        delivery.close()
    assert closed.result.status is ActionStatus.COMMITTED  # never "cancelled"
    assert closed.operation is not None
    assert closed.operation_id == closed.operation.operation_id
    assert closed.result.operation_id == closed.operation_id


async def test_a_cancelled_call_that_was_never_proposed_is_closed_as_not_started(
    runtime: ActionRuntime,
) -> None:
    delivery = runtime.calls.open_delivery(session(), Outlet())
    try:
        closed = await runtime.calls.close_cancelled(
            delivery, "book_table", "never", timed_out=True
        )
    finally:
        delivery.close()
    assert closed.operation_id is None and closed.operation is None
    assert closed.result.said == "not_started"
