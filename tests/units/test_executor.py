"""The `Executor` alone: write-ahead, classified outcomes, retries and reconciliation.

Against a ledger in memory (`MemoryLedger`), a `ManualClock` and fake effects that say what
they saw; no runtime, no database, no Pipecat. Each test pins one rule of the executor.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from pipecat_actions.actions import (
    ActionContext,
    ActionDefinition,
    Binding,
    Reconciliation,
    action,
)
from pipecat_actions.admission.authorization import AllowAll, AuthorizationRequest, Decision
from pipecat_actions.clock import ManualClock
from pipecat_actions.errors import LedgerUnavailable
from pipecat_actions.execution.executor import Executor
from pipecat_actions.execution.outcomes import EffectOutcomeUnknown, EffectRetryable
from pipecat_actions.execution.tracked import Tracked
from pipecat_actions.ledger import NewOperation, Operation
from pipecat_actions.policy import load_policy_text
from pipecat_actions.status import ActionStatus
from tests.units._fakes import MemoryLedger

S = ActionStatus


def binding(effect: ActionDefinition, policy: str = "{}") -> Binding:
    """``effect`` bound to the mutation policy ``policy`` (flow YAML of the tool's fields)."""
    text = f"version: 1\ntools:\n  {effect.name}:\n    kind: mutation\n    {policy}\n"
    if policy == "{}":
        text = f"version: 1\ntools:\n  {effect.name}:\n    kind: mutation\n"
    return Binding(effect, load_policy_text(text).tools[effect.name])


async def admitted(ledger: MemoryLedger, bound: Binding) -> tuple[Operation, Tracked]:
    """An operation of ``bound``'s tool admitted in ``ledger`` (ADMITTED), and its record."""
    result = await ledger.admit(
        NewOperation(
            tool=bound.action.name,
            kind="mutation",
            args={"party": 2},
            idempotency_key="k1",
            session_id="s1",
            principal="alice",
        )
    )
    op = result.operation
    done: asyncio.Future[Operation] = asyncio.get_running_loop().create_future()
    return op, Tracked(op.operation_id, bound, op.fence, done)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start=1_000.0)


@pytest.fixture
def ledger(clock: ManualClock) -> MemoryLedger:
    return MemoryLedger(clock)


def executor(ledger: MemoryLedger, clock: ManualClock, **kwargs: Any) -> Executor:
    return Executor(ledger, clock, AllowAll(), actor="runtime:test", rand=lambda: 0.5, **kwargs)


async def settle() -> None:
    """Let every task that can run, run."""
    for _ in range(20):
        await asyncio.sleep(0)


async def test_the_attempt_is_recorded_running_before_the_effect_runs_and_its_result_after(
    clock: ManualClock, ledger: MemoryLedger
) -> None:
    seen: list[str] = []

    @action
    async def book(ctx: ActionContext, party: int) -> dict[str, Any]:
        seen.append(ledger.rows[ctx.operation_id]["status"])
        return {"booking": "B1", "party": party}

    op, tracked = await admitted(ledger, binding(book))
    final = await executor(ledger, clock).run(op, tracked)

    assert seen == ["RUNNING"]  # the write-ahead landed before the effect was called
    assert final.status is S.COMMITTED
    assert final.result == {"booking": "B1", "party": 2}
    assert ledger.statuses(op.operation_id) == [S.ADMITTED, S.RUNNING, S.COMMITTED]


async def test_nothing_is_sent_when_the_ledger_cannot_record_the_attempt(
    clock: ManualClock, ledger: MemoryLedger
) -> None:
    calls: list[int] = []

    @action
    async def book(ctx: ActionContext, party: int) -> str:
        calls.append(party)
        return "booked"

    op, tracked = await admitted(ledger, binding(book))
    ledger.fail_next.append(LedgerUnavailable("the database is down"))
    final = await executor(ledger, clock).run(op, tracked)

    assert calls == []
    assert final.status is S.FAILED_FINAL
    assert final.error is not None and final.error.startswith("not sent: the ledger could not")
    assert ledger.statuses(op.operation_id) == [S.ADMITTED, S.FAILED_FINAL]


async def test_an_unknown_outcome_is_asked_of_the_reconcile_hook_and_the_effect_not_called_again(
    clock: ManualClock, ledger: MemoryLedger
) -> None:
    calls: list[int] = []

    async def look_up(ctx: ActionContext) -> Reconciliation:
        return Reconciliation.committed({"booking": "found"})

    @action(reconcile=look_up)
    async def book(ctx: ActionContext, party: int) -> str:
        calls.append(party)
        raise EffectOutcomeUnknown("the connection dropped after the request was sent")

    op, tracked = await admitted(ledger, binding(book))
    final = await executor(ledger, clock).run(op, tracked)

    assert calls == [2]
    assert final.status is S.COMMITTED
    assert final.result == {"booking": "found"}
    assert ledger.statuses(op.operation_id) == [S.ADMITTED, S.RUNNING, S.UNKNOWN, S.COMMITTED]
    assert ledger.writes[-1].detail == {"reason": "reconciled"}


async def test_an_unknown_outcome_without_a_reconcile_hook_stays_unknown_and_is_escalated(
    clock: ManualClock, ledger: MemoryLedger
) -> None:
    @action
    async def book(ctx: ActionContext, party: int) -> str:
        raise EffectOutcomeUnknown("no answer")

    op, tracked = await admitted(ledger, binding(book))
    final = await executor(ledger, clock).run(op, tracked)

    assert final.status is S.UNKNOWN
    assert final.escalated_at == clock.now()
    escalation = ledger.writes[-1]
    assert escalation.verb == "annotate"
    assert escalation.detail is not None and "no reconcile hook" in escalation.detail["escalated"]


async def test_a_retryable_failure_waits_its_backoff_on_the_clock_before_the_next_attempt(
    clock: ManualClock, ledger: MemoryLedger
) -> None:
    answers: list[BaseException | str] = [EffectRetryable("503 from the provider"), "booked"]
    attempts: list[int] = []

    @action
    async def book(ctx: ActionContext, party: int) -> str:
        attempts.append(ctx.attempt)
        answer = answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    policy = (
        "retry: {max_attempts: 2, initial_backoff_secs: 4, jitter: 0}\n"
        "    idempotency: {provider_dedupes: true}"
    )
    op, tracked = await admitted(ledger, binding(book, policy))
    running = asyncio.create_task(executor(ledger, clock).run(op, tracked))
    await settle()

    assert attempts == [1]
    assert ledger.rows[op.operation_id]["status"] == "FAILED_RETRYABLE"
    clock.advance(3.9)
    await settle()
    assert attempts == [1]  # the backoff is not over
    clock.advance(0.1)
    final = await running

    assert attempts == [1, 2]
    assert final.status is S.COMMITTED
    assert final.attempt == 2


async def test_the_last_attempt_that_fails_ends_final_with_no_retry_left(
    clock: ManualClock, ledger: MemoryLedger
) -> None:
    attempts: list[int] = []

    @action
    async def book(ctx: ActionContext, party: int) -> str:
        attempts.append(ctx.attempt)
        raise EffectRetryable("503 from the provider")

    policy = (
        "retry: {max_attempts: 2, initial_backoff_secs: 1, jitter: 0}\n"
        "    idempotency: {provider_dedupes: true}"
    )
    op, tracked = await admitted(ledger, binding(book, policy))
    running = asyncio.create_task(executor(ledger, clock).run(op, tracked))
    await settle()
    clock.advance(1)
    final = await running

    assert attempts == [1, 2]
    assert final.status is S.FAILED_FINAL
    assert final.error == "EffectRetryable: 503 from the provider (no retry left)"


async def test_a_retry_is_authorized_again_and_a_refusal_ends_it_without_sending(
    clock: ManualClock, ledger: MemoryLedger
) -> None:
    attempts: list[int] = []

    @action
    async def book(ctx: ActionContext, party: int) -> str:
        attempts.append(ctx.attempt)
        raise EffectRetryable("503 from the provider")

    class RevokedAfterFirst:
        def __init__(self) -> None:
            self.stages: list[str] = []

        async def authorize(self, request: AuthorizationRequest) -> Decision:
            self.stages.append(request.stage)
            return Decision.deny("the account was closed")

    policy = (
        "retry: {max_attempts: 2, initial_backoff_secs: 1, jitter: 0}\n"
        "    idempotency: {provider_dedupes: true}"
    )
    op, tracked = await admitted(ledger, binding(book, policy))
    authorizer = RevokedAfterFirst()
    run = Executor(ledger, clock, authorizer, actor="runtime:test", rand=lambda: 0.5)
    running = asyncio.create_task(run.run(op, tracked))
    await settle()
    clock.advance(1)
    final = await running

    assert attempts == [1]
    assert authorizer.stages == ["retry"]
    assert final.status is S.FAILED_FINAL
    assert final.error == "not authorized any more: the account was closed"
