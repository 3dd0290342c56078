"""Human approval: a risky call waits for a person, for exactly the arguments they approved.

While it waits the conversation goes on; the approval, a rejection or the expiry settles it.
"""

from __future__ import annotations

import pytest

from pipecat_actions.approvals import Approver
from pipecat_actions.clock import ManualClock
from pipecat_actions.ledger import hash_arguments
from pipecat_actions.runtime import ActionRuntime, ApprovalRefused
from pipecat_actions.session import SessionState
from pipecat_actions.status import ActionStatus

from ._admission_support import Restaurant, booking_args, guarded, running

S = ActionStatus

APPROVAL = """
  book_table:
    kind: mutation
    risk: high
    confirmation:
      mode: approval
      approvers: [bob, carol, maria]
      expires_after_secs: 300
  search_tables:
    kind: read
  add_tip:
    kind: mutation
"""


async def _ask(rt: ActionRuntime, session: SessionState) -> str:
    asked = await rt.propose("book_table", booking_args(party_size=4), session)
    assert asked["status"] == "awaiting_approval", asked
    return str(asked["operation_id"])


async def test_a_call_needing_approval_waits_and_books_nothing(
    ledger_url: str, clock: ManualClock
) -> None:
    restaurant = Restaurant(clock)
    async with running(APPROVAL, restaurant, ledger_url=ledger_url, clock=clock) as rt:
        session = SessionState("call-1", principal="alice")
        operation_id = await _ask(rt, session)

        pending = await rt.pending_approvals()

        assert [op.operation_id for op in pending] == [operation_id]
        assert pending[0].status is S.AWAITING_APPROVAL
        assert pending[0].deadline_at == clock.now() + 300
        assert restaurant.received == []
        assert restaurant.bookings_made == 0


async def test_approval_given_for_other_arguments_is_refused(
    ledger_url: str, clock: ManualClock
) -> None:
    restaurant = Restaurant(clock)
    async with running(APPROVAL, restaurant, ledger_url=ledger_url, clock=clock) as rt:
        session = SessionState("call-1", principal="alice")
        operation_id = await _ask(rt, session)
        # The approver looked at a party of 12, not the party of 4 the call holds.
        seen = hash_arguments(booking_args(party_size=12, guest="guest"))

        with pytest.raises(ApprovalRefused, match="other arguments"):
            await rt.approve(
                operation_id,
                approver=Approver("bob", tenants={"default"}),
                reason="looks fine",
                args_hash=seen,
            )

        assert (await rt.ledger.get(operation_id)).status is S.AWAITING_APPROVAL
        assert restaurant.bookings_made == 0


async def test_approval_of_the_arguments_held_runs_the_call_once(
    ledger_url: str, clock: ManualClock
) -> None:
    restaurant = Restaurant(clock)
    async with running(APPROVAL, restaurant, ledger_url=ledger_url, clock=clock) as rt:
        session = SessionState("call-1", principal="alice")
        operation_id = await _ask(rt, session)
        held = (await rt.ledger.get(operation_id)).args_hash
        assert held == hash_arguments(booking_args(party_size=4, guest="guest"))

        await rt.approve(
            operation_id,
            approver=Approver("bob", tenants={"default"}),
            reason="regular guest",
            args_hash=held,
        )
        final = await rt.wait(operation_id)

        assert final.status is S.COMMITTED
        assert restaurant.bookings_made == 1
        with pytest.raises(ApprovalRefused):
            await rt.approve(
                operation_id,
                approver=Approver("bob", tenants={"default"}),
                reason="again",
                args_hash=held,
            )
        assert restaurant.bookings_made == 1
        trail = await rt.ledger.events(operation_id)
        approved = [e for e in trail if e.from_status is S.AWAITING_APPROVAL]
        assert [(e.to_status, e.actor) for e in approved] == [(S.ADMITTED, "approver:bob")]
        assert approved[0].detail["reason"] == "regular guest"


async def test_a_rejected_call_never_runs(ledger_url: str, clock: ManualClock) -> None:
    restaurant = Restaurant(clock)
    async with running(APPROVAL, restaurant, ledger_url=ledger_url, clock=clock) as rt:
        session = SessionState("call-1", principal="alice")
        operation_id = await _ask(rt, session)

        rejected = await rt.reject(
            operation_id, approver=Approver("bob", tenants={"default"}), reason="fully booked event"
        )

        assert rejected.status is S.REJECTED
        assert "fully booked event" in (rejected.error or "")
        assert (await rt.wait(operation_id)).status is S.REJECTED
        with pytest.raises(ApprovalRefused):
            await rt.approve(
                operation_id,
                approver=Approver("carol", tenants={"default"}),
                reason="overrule",
                args_hash=rejected.args_hash,
            )
        assert restaurant.received == []
        assert restaurant.bookings_made == 0


async def test_an_approval_request_nobody_answers_expires_and_books_nothing(
    ledger_url: str, clock: ManualClock
) -> None:
    restaurant = Restaurant(clock)
    async with running(APPROVAL, restaurant, ledger_url=ledger_url, clock=clock) as rt:
        session = SessionState("call-1", principal="alice")
        operation_id = await _ask(rt, session)

        clock.advance(301)
        expired = await rt.wait(operation_id)

        assert expired.status is S.EXPIRED
        with pytest.raises(ApprovalRefused):
            await rt.approve(
                operation_id,
                approver=Approver("bob", tenants={"default"}),
                reason="sorry, late",
                args_hash=expired.args_hash,
            )
        assert (await rt.ledger.get(operation_id)).status is S.EXPIRED
        assert restaurant.received == []
        assert restaurant.bookings_made == 0


async def test_the_conversation_goes_on_while_an_approval_is_pending(
    ledger_url: str, clock: ManualClock
) -> None:
    restaurant = Restaurant(clock)
    async with running(APPROVAL, restaurant, ledger_url=ledger_url, clock=clock) as rt:
        session = SessionState("call-1", principal="alice")
        operation_id = await _ask(rt, session)

        search = await rt.propose("search_tables", booking_args(), session)
        tip = await rt.propose("add_tip", {"booking_id": "bk_0042", "percent": 10}, session)

        assert search["status"] == "committed", search
        assert tip["status"] == "committed", tip
        assert (await rt.ledger.get(operation_id)).status is S.AWAITING_APPROVAL
        assert restaurant.bookings_made == 0


async def test_repeating_a_call_that_awaits_approval_answers_at_once(
    ledger_url: str, clock: ManualClock
) -> None:
    restaurant = Restaurant(clock)
    async with running(APPROVAL, restaurant, ledger_url=ledger_url, clock=clock) as rt:
        session = SessionState("call-1", principal="alice")
        operation_id = await _ask(rt, session)

        # Nothing settles the request while it answers (the clock stands still, nobody
        # decides): a repeat that waited for the outcome would hang until the hang guard.
        again = await guarded(
            rt.propose("book_table", booking_args(party_size=4), session, tool_call_id="call_2"),
            what="the repeated call to answer without waiting for the approval",
        )

        assert again["status"] == "awaiting_approval", again
        assert again["operation_id"] == operation_id
        assert (await rt.ledger.get(operation_id)).status is S.AWAITING_APPROVAL
        assert restaurant.bookings_made == 0


async def test_a_call_approved_in_another_runtime_gets_its_own_policys_deadline(
    ledger_url: str, clock: ManualClock
) -> None:
    slow = APPROVAL.replace(
        "      expires_after_secs: 300", "      expires_after_secs: 300\n    deadline_secs: 900"
    )
    restaurant = Restaurant(clock)
    async with running(slow, restaurant, ledger_url=ledger_url, clock=clock) as rt:
        operation_id = await _ask(rt, SessionState("call-1", principal="alice"))
    async with running(slow, restaurant, ledger_url=ledger_url, clock=clock) as operator:
        waiting = await operator.ledger.get(operation_id)
        approved = await operator.approve(
            operation_id,
            approver=Approver("maria", tenants={"default"}),
            reason="known guest",
            args_hash=waiting.args_hash,
        )

    # Not the 30 s default of a tool without a policy: this runtime has book_table's.
    assert approved.deadline_at == clock.now() + 900
