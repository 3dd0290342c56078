"""The `Admitter` alone: its ordered checks, what each refusal records, and duplicates.

Against a ledger in memory (`MemoryLedger`), a `ManualClock`, a real `Limiter` and fake
authorizers and cancels; no runtime, no database, no Pipecat. Each test pins one rule.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from pipecat_actions.actions import ActionContext, ActionDefinition, Binding, Refused, action
from pipecat_actions.admission.admitter import Admitter
from pipecat_actions.admission.authorization import (
    AllowAll,
    AuthorizationRequest,
    Authorizer,
    Decision,
)
from pipecat_actions.admission.decisions import Admission, Joined, Refusal
from pipecat_actions.admission.limits import Limiter
from pipecat_actions.clock import ManualClock
from pipecat_actions.ledger import Operation
from pipecat_actions.policy import load_policy_text
from pipecat_actions.session import SessionState
from pipecat_actions.status import ActionStatus
from tests.units._fakes import MemoryLedger

S = ActionStatus


@action
async def book(ctx: ActionContext, date: str, party: int) -> str:
    """Book a table."""
    return "booked"


class Cancels:
    """The runtime's cancel, as the admitter sees it: records what it was asked to withdraw.

    A question to the user is withdrawn as no longer asked (REJECTED), anything else CANCELLED.
    """

    def __init__(self, ledger: MemoryLedger) -> None:
        self.ledger = ledger
        self.asked: list[str] = []

    async def __call__(self, op: Operation) -> Operation:
        self.asked.append(op.operation_id)
        to = S.REJECTED if op.status is S.AWAITING_CONFIRMATION else S.CANCELLED
        return await self.ledger.transition(
            op.operation_id, expected=op.status, to=to, fence=op.fence, actor="test"
        )


@dataclasses.dataclass
class Rig:
    admitter: Admitter
    ledger: MemoryLedger
    cancels: Cancels
    limiter: Limiter


def rig(
    clock: ManualClock,
    policy: str = "",
    *,
    effect: ActionDefinition = book,
    authorizer: Authorizer | None = None,
) -> Rig:
    text = f"version: 1\ntools:\n  {effect.name}:\n    kind: mutation\n{policy}"
    bindings = {effect.name: Binding(effect, load_policy_text(text).tools[effect.name])}
    ledger = MemoryLedger(clock)
    cancels = Cancels(ledger)
    limiter = Limiter(clock.now)
    admitter = Admitter(
        bindings=bindings,
        ledger=ledger,
        clock=clock,
        authorizer=authorizer or AllowAll(),
        limiter=limiter,
        owner="test",
        lease_secs=30.0,
        cancel=cancels,
    )
    return Rig(admitter, ledger, cancels, limiter)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start=1_000.0)


@pytest.fixture
def session() -> SessionState:
    return SessionState(session_id="s1", principal="alice")


def refusal(decision: Any) -> Refusal:
    assert isinstance(decision, Refusal), decision
    return decision


def admission(decision: Any) -> Admission:
    assert isinstance(decision, Admission), decision
    return decision


async def test_an_unknown_tool_is_refused_and_the_refusal_recorded_with_nothing_admitted(
    clock: ManualClock, session: SessionState
) -> None:
    r = rig(clock)
    refused = refusal(await r.admitter.admit("teleport", {"to": "mars"}, session))

    assert refused.result["reason"] == "unknown_tool"
    assert [w.verb for w in r.ledger.writes] == ["refusal"]
    assert refused.operation is not None and refused.operation.status is S.REJECTED
    assert refused.result["operation_id"] == refused.operation.operation_id


async def test_arguments_that_do_not_fit_the_effect_are_refused_before_authorization(
    clock: ManualClock, session: SessionState
) -> None:
    asked: list[AuthorizationRequest] = []

    class Recording:
        async def authorize(self, request: AuthorizationRequest) -> Decision:
            asked.append(request)
            return Decision.allow()

    r = rig(clock, authorizer=Recording())
    refused = refusal(await r.admitter.admit("book", {"date": "2030-05-01"}, session))

    assert refused.result["status"] == "refused"
    assert asked == []  # the authorizer never saw arguments that were not validated
    assert [w.verb for w in r.ledger.writes] == ["refusal"]


async def test_the_authorizer_decides_for_the_session_principal_and_its_reason_is_told(
    clock: ManualClock, session: SessionState
) -> None:
    asked: list[str] = []

    class OnlyBob:
        async def authorize(self, request: AuthorizationRequest) -> Decision:
            asked.append(request.principal)
            return Decision.deny("only Bob books tables")

    r = rig(clock, authorizer=OnlyBob())
    refused = refusal(await r.admitter.admit("book", {"date": "2030-05-01", "party": 2}, session))

    assert asked == ["alice"]
    assert refused.result["reason"] == "not_authorized"
    assert refused.result["message"] == "only Bob books tables"


async def test_a_mutation_proposed_in_an_interrupted_generation_is_refused_as_stale(
    clock: ManualClock, session: SessionState
) -> None:
    r = rig(clock)
    session.interrupt()
    refused = refusal(await r.admitter.admit("book", {"date": "2030-05-01", "party": 2}, session))

    assert refused.result["reason"] == "stale_proposal"
    assert [w.verb for w in r.ledger.writes] == ["refusal"]


async def test_preconditions_that_refuse_or_fail_end_the_call_with_their_own_codes(
    clock: ManualClock, session: SessionState
) -> None:
    async def open_days_only(ctx: ActionContext) -> None:
        if ctx.args["date"] == "2030-05-06":
            raise Refused("The restaurant is closed on Mondays.", code="closed")
        raise RuntimeError("the calendar service is down")

    @action(preconditions=open_days_only)
    async def reserve(ctx: ActionContext, date: str, party: int) -> str:
        return "reserved"

    r = rig(clock, effect=reserve)
    closed = refusal(await r.admitter.admit("reserve", {"date": "2030-05-06", "party": 2}, session))
    broken = refusal(await r.admitter.admit("reserve", {"date": "2030-05-07", "party": 2}, session))

    assert closed.result["reason"] == "closed"
    assert closed.result["message"] == "The restaurant is closed on Mondays."
    assert broken.result["reason"] == "precondition_failed"
    assert "RuntimeError" not in str(broken.result)  # the model hears no internals
    assert r.ledger.writes[-1].detail is not None
    assert "the calendar service is down" in r.ledger.writes[-1].detail["hook_error"]
    assert [w.verb for w in r.ledger.writes] == ["refusal", "refusal"]


async def test_an_admitted_mutation_starts_running_leased_to_the_runtime_holding_a_slot(
    clock: ManualClock, session: SessionState
) -> None:
    r = rig(clock, "    limits: {max_concurrent: 1}\n")
    admitted = admission(
        await r.admitter.admit("book", {"date": "2030-05-01", "party": 2}, session)
    )

    op = admitted.operation
    assert op.status is S.RUNNING
    assert (op.lease_owner, op.principal, op.session_id) == ("test", "alice", "s1")
    assert admitted.slot is not None
    assert r.limiter.running("book") == 1


async def test_a_repeat_of_the_same_intent_joins_the_first_operation_and_inserts_nothing(
    clock: ManualClock, session: SessionState
) -> None:
    r = rig(clock)
    args = {"date": "2030-05-01", "party": 2}
    first = admission(await r.admitter.admit("book", args, session))
    again = await r.admitter.admit("book", dict(args), session)

    assert isinstance(again, Joined)
    assert again.operation.operation_id == first.operation.operation_id
    assert [w.verb for w in r.ledger.writes] == ["admit"]


async def test_on_duplicate_reject_refuses_a_repeat_and_names_the_first_operation(
    clock: ManualClock, session: SessionState
) -> None:
    r = rig(clock, "    on_duplicate: reject\n")
    args = {"date": "2030-05-01", "party": 2}
    first = admission(await r.admitter.admit("book", args, session))
    refused = refusal(await r.admitter.admit("book", args, session))

    assert refused.result["reason"] == "duplicate"
    assert refused.result["existing_operation_id"] == first.operation.operation_id
    assert refused.result["operation_id"] != first.operation.operation_id


async def test_on_duplicate_replace_withdraws_the_earlier_call_and_admits_the_new_one(
    clock: ManualClock, session: SessionState
) -> None:
    r = rig(clock, "    on_duplicate: replace\n    confirmation: {mode: verbal}\n")
    args = {"date": "2030-05-01", "party": 2}
    first = admission(await r.admitter.admit("book", args, session))
    second = admission(await r.admitter.admit("book", args, session))

    assert r.cancels.asked == [first.operation.operation_id]
    assert second.operation.operation_id != first.operation.operation_id
    assert r.ledger.rows[first.operation.operation_id]["status"] == "REJECTED"
    assert second.operation.status is S.AWAITING_CONFIRMATION


async def test_a_call_waiting_for_the_user_to_confirm_holds_no_capacity(
    clock: ManualClock, session: SessionState
) -> None:
    r = rig(clock, "    limits: {max_concurrent: 1}\n    confirmation: {mode: verbal}\n")
    admitted = admission(
        await r.admitter.admit("book", {"date": "2030-05-01", "party": 2}, session)
    )

    assert admitted.operation.status is S.AWAITING_CONFIRMATION
    assert admitted.slot is None
    assert r.limiter.running("book") == 0
    assert admitted.operation.deadline_at == clock.now() + 120.0


async def test_other_details_for_the_same_key_in_the_same_turn_are_a_conflict_not_a_change(
    clock: ManualClock, session: SessionState
) -> None:
    r = rig(clock, "    idempotency: {key_fields: [date]}\n")
    first = admission(await r.admitter.admit("book", {"date": "2030-05-01", "party": 2}, session))
    refused = refusal(await r.admitter.admit("book", {"date": "2030-05-01", "party": 4}, session))

    assert refused.result["reason"] == "idempotency_mismatch"
    assert refused.result["existing_operation_id"] == first.operation.operation_id
    assert r.cancels.asked == []
