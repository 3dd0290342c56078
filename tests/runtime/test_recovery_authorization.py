"""A permission revoked while an operation waits is checked again when a new owner recovers it."""

from __future__ import annotations

from pathlib import Path

from pipecat_actions.clock import ManualClock
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.session import SessionState

from ._admission_support import OwnBookingsOnly, Restaurant, S, booking_args, policy, sqlite_url

TOOLS = """
  book_table:
    kind: mutation
    admit_when: turn_confirmed
    deadline_secs: 600
"""


async def test_recovery_after_a_revocation_runs_nothing_and_fails_the_operation(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    restaurant = Restaurant(clock)
    authorizer = OwnBookingsOnly({})
    url = sqlite_url(tmp_path)
    policies = policy(TOOLS)
    first = await ActionRuntime.create(
        policies,
        authorizer=authorizer,
        actions=restaurant.actions(policies.names()),
        ledger_url=url,
        clock=clock,
        lease_secs=30,
        owner="first",
    )
    session = SessionState(session_id="call-1", principal="alice")
    session.start_generation()
    told = await first.propose("book_table", booking_args(), session, wait=False)
    operation_id = told["operation_id"]
    assert told["status"] == "admitted"
    # The process stops before the reply settles: the operation stays ADMITTED, never sent.
    await first.close(grace_secs=0)
    authorizer.revoked.add("alice")
    clock.advance(31)  # the first owner's lease has expired

    second = await ActionRuntime.create(
        policies,
        authorizer=authorizer,
        actions=restaurant.actions(policies.names()),
        ledger_url=url,
        clock=clock,
        lease_secs=30,
        owner="second",
    )
    try:
        final = await second.wait(operation_id)
        assert final.status is S.FAILED_FINAL
        assert final.error is not None
        assert "not authorized any more" in final.error
        assert final.lease_owner == "second"
        assert restaurant.sor.side_effects["book"] == 0
        recovery_checks = [r for r in authorizer.requests if r.stage == "recovery"]
        assert len(recovery_checks) == 1
        assert recovery_checks[0].principal == "alice"
    finally:
        await second.close(grace_secs=0)
