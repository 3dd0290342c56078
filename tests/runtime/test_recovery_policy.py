"""Recovery policy: re-authorization, unsent operations, and committed results never delivered."""

from __future__ import annotations

from typing import Any, Literal

from pipecat_actions.approvals import Approver, approve_operation
from pipecat_actions.clock import ManualClock
from pipecat_actions.ledger import SqlLedger
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.session import SessionState

from ._admission_support import OwnBookingsOnly, Restaurant, S, booking_args, policy

TOOLS = """
  book_table:
    kind: mutation
    confirmation: {mode: approval, approvers: [ops], expires_after_secs: 900}
    deadline_secs: 600
"""
"""An approval: the booking is released by a person, so recovery may run it."""

TURN_CONFIRMED = """
  book_table:
    kind: mutation
    admit_when: turn_confirmed
    deadline_secs: 600
"""
"""Released only by the end of the reply that proposed it: recovery never runs it."""


class Stranded:
    """An admitted booking that was never sent, left behind by a stopped owner.

    By default it was approved by an operator after its owner stopped (the CLI writes to the
    ledger directly); with ``TURN_CONFIRMED``, its owner stopped before the reply ended.
    """

    def __init__(self, url: str, tools: str = TOOLS) -> None:
        self.clock = ManualClock()
        self.restaurant = Restaurant(self.clock)
        self.authorizer = OwnBookingsOnly({})
        self.url = url
        self.policies = policy(tools)
        self.tools = tools
        self.operation_id = ""

    async def runtime(self, owner: str, **options: Any) -> ActionRuntime:
        return await ActionRuntime.create(
            self.policies,
            authorizer=self.authorizer,
            actions=self.restaurant.actions(self.policies.names()),
            ledger_url=self.url,
            clock=self.clock,
            lease_secs=30,
            owner=owner,
            **options,
        )

    async def leave_behind(self) -> None:
        first = await self.runtime("first")
        session = SessionState(session_id="call-1", principal="alice")
        session.start_generation()
        told = await first.propose("book_table", booking_args(), session, wait=False)
        self.operation_id = str(told["operation_id"])
        if self.tools is TURN_CONFIRMED:
            assert told["status"] == "admitted"
            # The process stops before the reply settles: it stays ADMITTED, unsent.
            await first.close(grace_secs=0)
            return
        assert told["status"] == "awaiting_approval"
        await first.close(grace_secs=0)
        # An operator approves it once its owner is gone: ADMITTED, owned by nobody alive.
        async with await SqlLedger.create(self.url, clock=self.clock) as ledger:
            approved = await approve_operation(
                ledger,
                self.operation_id,
                approver=Approver("ops", tenants={"default"}),
                reason="fine",
                now=self.clock.now(),
                args_hash=(await ledger.get(self.operation_id)).args_hash,
                deadline_at=self.clock.now() + 600,
            )
        assert approved.status is S.ADMITTED

    def let_the_lease_expire(self) -> None:
        self.clock.advance(31)

    async def recover(self, unsent: Literal["run", "fail"] = "run") -> tuple[ActionRuntime, Any]:
        second = await self.runtime("second", recover_unsent=unsent)
        return second, await second.wait(self.operation_id)


async def test_recovery_after_a_revocation_runs_nothing_and_fails_the_operation(
    ledger_url: str,
) -> None:
    stranded = Stranded(ledger_url)
    await stranded.leave_behind()
    stranded.authorizer.revoked.add("alice")
    stranded.let_the_lease_expire()
    second, final = await stranded.recover()
    try:
        assert final.status is S.FAILED_FINAL
        assert final.error is not None
        assert "not authorized any more" in final.error
        assert final.lease_owner == "second"
        assert stranded.restaurant.sor.side_effects["book"] == 0
        recovery_checks = [r for r in stranded.authorizer.requests if r.stage == "recovery"]
        assert len(recovery_checks) == 1
        assert recovery_checks[0].principal == "alice"
    finally:
        await second.close(grace_secs=0)


async def test_recover_unsent_fail_fails_an_unsent_operation_instead_of_running_it(
    ledger_url: str,
) -> None:
    stranded = Stranded(ledger_url)
    await stranded.leave_behind()
    stranded.let_the_lease_expire()
    second, final = await stranded.recover(unsent="fail")
    try:
        assert final.status is S.FAILED_FINAL
        assert final.error == "its owner stopped before sending it; not retried by policy"
        assert stranded.restaurant.sor.side_effects["book"] == 0
    finally:
        await second.close(grace_secs=0)


async def test_recover_unsent_run_books_once_and_lists_it_as_undelivered(ledger_url: str) -> None:
    stranded = Stranded(ledger_url)
    await stranded.leave_behind()
    stranded.let_the_lease_expire()
    second, final = await stranded.recover()
    try:
        assert final.status is S.COMMITTED
        assert stranded.restaurant.sor.side_effects["book"] == 1
        # Nobody heard about it: the conversation that asked is gone.
        assert [op.operation_id for op in await second.undelivered()] == [stranded.operation_id]
    finally:
        await second.close(grace_secs=0)


async def test_recovery_cancels_what_still_waited_for_the_users_turn_and_the_session_hears_it(
    ledger_url: str,
) -> None:
    stranded = Stranded(ledger_url, TURN_CONFIRMED)
    await stranded.leave_behind()
    stranded.let_the_lease_expire()
    second, final = await stranded.recover()
    try:
        assert final.status is S.CANCELLED
        assert final.sent_at is None
        assert final.error is not None and "turn was confirmed" in final.error
        assert stranded.restaurant.sor.side_effects["book"] == 0
        # Untold: the next pipeline of the session tells it (the gate resumes untold ones).
        assert final.delivered_at is None and final.acknowledged_at is None
    finally:
        await second.close(grace_secs=0)


async def test_recovery_never_starts_an_unsent_operation_past_its_deadline(
    ledger_url: str,
) -> None:
    stranded = Stranded(ledger_url)
    await stranded.leave_behind()
    stranded.clock.advance(601)  # the lease and the approved booking's deadline are both gone
    second, final = await stranded.recover()
    try:
        assert final.status is S.FAILED_FINAL
        assert final.error == "deadline: deadline passed before it could be sent"
        assert stranded.restaurant.sor.side_effects["book"] == 0
    finally:
        await second.close(grace_secs=0)
