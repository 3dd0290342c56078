"""Application code that admission depends on may fail; admission then refuses, on the record.

An authorizer that raises or answers something other than a `Decision`, preconditions or a
snapshot hook that raise: before, the exception escaped `propose` with no tool result for the
model and no audit row. Now each is a clear refusal, audited with the hook's error, and nothing
runs. Authorization fails closed.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pipecat_actions.actions import ActionContext, action
from pipecat_actions.admission.authorization import AuthorizationRequest, Decision
from pipecat_actions.clock import ManualClock
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.status import ActionStatus
from pipecat_actions.testing import FakeSystemOfRecord
from tests._waiting import eventually, guarded
from tests.runtime._execution_support import (
    Bookings,
    RecordingClock,
    booking,
    new_session,
    policy,
)

POLICY = """
    version: 1
    tools:
      book_table:
        kind: mutation
      look_up:
        kind: read
"""


class Authorizer:
    def __init__(self, answer: Any) -> None:
        self.answer = answer

    async def authorize(self, request: AuthorizationRequest) -> Decision:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer  # type: ignore[no-any-return]


def actions(effects: list[str], *, snapshot: Any = None, preconditions: Any = None) -> list[Any]:
    async def book_table(
        ctx: ActionContext, restaurant_id: str, date: str, time: str, party_size: int
    ) -> dict[str, Any]:
        """Book a table."""
        effects.append(ctx.operation_id)
        return {"booking_id": "bk_1"}

    async def look_up(ctx: ActionContext, restaurant_id: str) -> dict[str, Any]:
        """Look a restaurant up."""
        effects.append(ctx.operation_id)
        return {"open": True}

    return [
        action(snapshot=snapshot, preconditions=preconditions)(book_table),
        action(preconditions=preconditions)(look_up),
    ]


async def refused_row(runtime: ActionRuntime, result: dict[str, Any]) -> Any:
    op = await runtime.ledger.get(result["operation_id"])
    trail = await runtime.ledger.events(op.operation_id)
    return op, trail[-1].detail


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        (RuntimeError("directory service down"), "RuntimeError: directory service down"),
        (None, "the authorizer returned NoneType"),
        (True, "the authorizer returned bool"),
    ],
    ids=["raises", "returns-none", "returns-true"],
)
@pytest.mark.parametrize("tool", ["book_table", "look_up"])
async def test_an_authorizer_that_fails_refuses_the_call_closed_and_audited(
    ledger_url: str, clock: ManualClock, answer: Any, error: str, tool: str
) -> None:
    effects: list[str] = []
    runtime = await ActionRuntime.create(
        policy(POLICY),
        authorizer=Authorizer(answer),
        actions=actions(effects),
        ledger_url=ledger_url,
        clock=clock,
    )
    args = booking() if tool == "book_table" else {"restaurant_id": "r1"}
    try:
        told = await runtime.propose(tool, args, new_session(), tool_call_id="c1")
        op, detail = await refused_row(runtime, told)
    finally:
        await runtime.close()

    assert told["status"] == "refused"
    assert told["reason"] == "authorization_failed"
    assert "nothing was done" in told["message"]
    assert "directory service" not in told["message"]  # the model hears no internals
    assert op.status is ActionStatus.REJECTED
    assert op.provider_call_id == "c1"
    assert detail["reason"] == "authorization_failed"
    assert detail["hook_error"] == error
    assert effects == []


CAPPED = """
    version: 1
    tools:
      book_table:
        kind: mutation
        limits: {per_principal: 1}
      look_up:
        kind: read
"""


@pytest.mark.parametrize("hook", ["snapshot", "preconditions"])
async def test_a_hook_that_raises_during_admission_refuses_the_call_and_nothing_runs(
    ledger_url: str, clock: ManualClock, hook: str
) -> None:
    effects: list[str] = []
    failures = [KeyError("slot")]

    async def flaky(ctx: ActionContext) -> Any:
        if failures:
            raise failures.pop()
        return {"slot": "free"} if hook == "snapshot" else None

    runtime = await ActionRuntime.create(
        policy(CAPPED),
        authorizer=Authorizer(Decision.allow()),
        actions=actions(effects, **{hook: flaky}),
        ledger_url=ledger_url,
        clock=clock,
    )
    try:
        told = await runtime.propose("book_table", booking(), new_session())
        op, detail = await refused_row(runtime, told)
        # The refusal kept no capacity (per_principal: 1) and bound no key: the repeat runs.
        again = await runtime.propose("book_table", booking(), new_session())
    finally:
        await runtime.close()

    code = {"snapshot": "snapshot_failed", "preconditions": "precondition_failed"}[hook]
    assert told["status"] == "refused"
    assert told["reason"] == code
    assert op.status is ActionStatus.REJECTED
    assert detail["hook_error"] == "KeyError: 'slot'"
    assert again["status"] == "committed"
    assert len(effects) == 1


RETRIED = """
    version: 1
    tools:
      book_table:
        kind: mutation
        idempotency: {provider_dedupes: true}
        retry: {max_attempts: 3, initial_backoff_secs: 1, max_backoff_secs: 1, jitter: 0}
"""


class FailsAfterAdmission:
    """Allows the call at admission; then fails as the given answer says, at every later ask."""

    def __init__(self, later: Any) -> None:
        self.later = later
        self.stages: list[str] = []

    async def authorize(self, request: AuthorizationRequest) -> Decision:
        self.stages.append(request.stage)
        if request.stage == "admission":
            return Decision.allow()
        return await Authorizer(self.later).authorize(request)


@pytest.mark.parametrize(
    "later", [RuntimeError("directory service down"), None], ids=["raises", "returns-none"]
)
async def test_an_authorizer_that_fails_before_a_retry_stops_it_closed(
    ledger_url: str, later: Any
) -> None:
    clock = RecordingClock()
    sor = FakeSystemOfRecord(clock=clock)
    sor.add_restaurant("r1", tables=3)
    sor.faults.error_before_send("book")  # not sent: a retry is safe, after asking again
    authorizer = FailsAfterAdmission(later)
    runtime = await ActionRuntime.create(
        policy(RETRIED),
        authorizer=authorizer,
        actions=[Bookings(sor).action()],
        ledger_url=ledger_url,
        clock=clock,
    )
    try:
        call = asyncio.ensure_future(runtime.propose("book_table", booking(), new_session()))
        await eventually(lambda: 1.0 in clock.requested, what="the backoff before the retry")
        clock.advance(1.0)
        told = await guarded(call, what="the answer after the retry was refused")
        op = await runtime.ledger.get(told["operation_id"])
    finally:
        await runtime.close()

    assert authorizer.stages == ["admission", "retry"]
    assert told["status"] == "failed_final"
    assert op.status is ActionStatus.FAILED_FINAL
    assert op.error == "not authorized any more: whether it is allowed could not be checked"
    assert "directory service" not in told["message"]
    assert sor.calls["book"] == 1  # the first attempt only: nothing was sent after the ask
