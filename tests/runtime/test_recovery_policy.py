"""Recovery policy: re-authorization, unsent operations, and committed results never delivered."""

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


async def _stranded_unsent(tmp_path: Path, clock: ManualClock, restaurant: Restaurant) -> str:
    """Leave an admitted, never-sent operation behind a stopped owner; return its id."""
    policies = policy(TOOLS)
    first = await ActionRuntime.create(
        policies,
        authorizer=OwnBookingsOnly({}),
        actions=restaurant.actions(policies.names()),
        ledger_url=sqlite_url(tmp_path),
        clock=clock,
        lease_secs=30,
        owner="first",
    )
    session = SessionState(session_id="call-1", principal="alice")
    session.start_generation()
    told = await first.propose("book_table", booking_args(), session, wait=False)
    await first.close(grace_secs=0)
    clock.advance(31)
    return str(told["operation_id"])


async def test_recover_unsent_fail_fails_an_unsent_operation_instead_of_running_it(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    restaurant = Restaurant(clock)
    operation_id = await _stranded_unsent(tmp_path, clock, restaurant)
    policies = policy(TOOLS)
    second = await ActionRuntime.create(
        policies,
        authorizer=OwnBookingsOnly({}),
        actions=restaurant.actions(policies.names()),
        ledger_url=sqlite_url(tmp_path),
        clock=clock,
        lease_secs=30,
        owner="second",
        recover_unsent="fail",
    )
    try:
        final = await second.wait(operation_id)
        assert final.status is S.FAILED_FINAL
        assert final.error == "its owner stopped before sending it; not retried by policy"
        assert restaurant.sor.side_effects["book"] == 0
    finally:
        await second.close(grace_secs=0)


async def test_recover_unsent_run_books_once_and_lists_it_as_undelivered(tmp_path: Path) -> None:
    clock = ManualClock()
    restaurant = Restaurant(clock)
    operation_id = await _stranded_unsent(tmp_path, clock, restaurant)
    policies = policy(TOOLS)
    second = await ActionRuntime.create(
        policies,
        authorizer=OwnBookingsOnly({}),
        actions=restaurant.actions(policies.names()),
        ledger_url=sqlite_url(tmp_path),
        clock=clock,
        lease_secs=30,
        owner="second",
    )
    try:
        final = await second.wait(operation_id)
        assert final.status is S.COMMITTED
        assert restaurant.sor.side_effects["book"] == 1
        # Nobody heard about it: the conversation that asked is gone.
        assert [op.operation_id for op in await second.undelivered()] == [operation_id]
    finally:
        await second.close(grace_secs=0)
