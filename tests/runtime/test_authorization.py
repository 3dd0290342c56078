"""Authorization of the session principal: ids in the arguments are data, never identity.

The application's `Authorizer` is asked at admission and again before every retry, so a
permission revoked meanwhile stops every later execution.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pipecat_actions.clock import ManualClock
from pipecat_actions.ledger import OperationFilter
from pipecat_actions.session import SessionState
from pipecat_actions.status import ActionStatus

from ._admission_support import (
    DATE,
    RESTAURANT,
    OwnBookingsOnly,
    Restaurant,
    eventually,
    running,
    wait_for_status,
)
from ._execution_support import RecordingClock

S = ActionStatus
ATTEMPTS = 1000
BATCH = 50

CANCEL = """
  cancel_booking:
    kind: mutation
    arguments: [booking_id, principal, user_id]
    resource: "booking:{booking_id}"
"""


async def _alice_has_a_booking(restaurant: Restaurant) -> str:
    booking = await restaurant.sor.book(RESTAURANT, DATE, "20:00", 2, "Alice")
    return booking.booking_id


def _hostile_variants(booking_id: str, n: int) -> dict[str, Any]:
    """The same attack worded 4 ways: claiming to be alice in the arguments changes nothing."""
    variants: list[dict[str, Any]] = [
        {"booking_id": booking_id},
        {"booking_id": booking_id, "principal": "alice"},
        {"booking_id": booking_id, "user_id": "alice"},
        {"booking_id": f" {booking_id} ", "principal": "alice", "user_id": "alice"},
    ]
    return variants[n % len(variants)]


async def test_a_thousand_attempts_on_another_principals_booking_are_all_refused_and_audited(
    ledger_url: str, clock: ManualClock
) -> None:
    restaurant = Restaurant(clock)
    booking_id = await _alice_has_a_booking(restaurant)
    authorizer = OwnBookingsOnly({booking_id: "alice"})
    async with running(
        CANCEL, restaurant, ledger_url=ledger_url, clock=clock, authorizer=authorizer
    ) as rt:
        mallory = SessionState("call-m", principal="mallory")
        results: list[dict[str, Any]] = []
        for start in range(0, ATTEMPTS, BATCH):
            results += await asyncio.gather(
                *(
                    rt.propose(
                        "cancel_booking",
                        _hostile_variants(booking_id, n),
                        mallory,
                        tool_call_id=f"call_{n:04d}",
                    )
                    for n in range(start, start + BATCH)
                )
            )

        assert len(results) == ATTEMPTS
        assert all(r["status"] == "refused" for r in results), [
            r for r in results if r["status"] != "refused"
        ][:3]
        assert {r["reason"] for r in results} == {"not_authorized"}
        assert restaurant.sor.calls["cancel"] == 0
        assert restaurant.sor.side_effects["cancel"] == 0
        assert restaurant.sor.get_booking(booking_id).status == "confirmed"
        assert {r.principal for r in authorizer.requests} == {"mallory"}

        rows = await rt.ledger.list(
            OperationFilter(status=[S.REJECTED], principal="mallory", limit=ATTEMPTS * 2)
        )
        assert len(rows) == ATTEMPTS
        assert {row.operation_id for row in rows} == {r["operation_id"] for r in results}
        assert all(row.tool == "cancel_booking" for row in rows)
        assert all("does not belong to mallory" in (row.error or "") for row in rows)
        assert {row.resource_key for row in rows} == {f"booking:{booking_id}"}
        assert len(await rt.ledger.list(OperationFilter(status=[S.REJECTED]))) == ATTEMPTS
        for start in range(0, ATTEMPTS, BATCH):
            trails = await asyncio.gather(
                *(rt.ledger.events(row.operation_id) for row in rows[start : start + BATCH])
            )
            for trail in trails:
                assert trail[-1].to_status is S.REJECTED
                assert trail[-1].detail["reason"] == "not_authorized"


async def test_a_principal_named_in_the_arguments_does_not_change_who_is_authorized(
    ledger_url: str, clock: ManualClock
) -> None:
    restaurant = Restaurant(clock)
    alices = await _alice_has_a_booking(restaurant)
    mallorys = (await restaurant.sor.book(RESTAURANT, DATE, "21:00", 2, "Mallory")).booking_id
    authorizer = OwnBookingsOnly({alices: "alice", mallorys: "mallory"})
    async with running(
        CANCEL, restaurant, ledger_url=ledger_url, clock=clock, authorizer=authorizer
    ) as rt:
        alice = SessionState("call-a", principal="alice")
        mallory = SessionState("call-m", principal="mallory")

        # Mallory claims to be alice; alice claims to be mallory: only the session counts.
        posing = await rt.propose(
            "cancel_booking",
            {"booking_id": alices, "principal": "alice", "user_id": "alice"},
            mallory,
        )
        own = await rt.propose(
            "cancel_booking",
            {"booking_id": alices, "principal": "mallory", "user_id": "mallory"},
            alice,
        )
        not_hers = await rt.propose(
            "cancel_booking",
            {"booking_id": mallorys, "principal": "mallory", "user_id": "mallory"},
            alice,
        )

        assert posing["status"] == "refused"
        assert posing["reason"] == "not_authorized"
        assert own["status"] == "committed", own
        assert not_hers["status"] == "refused"
        assert not_hers["reason"] == "not_authorized"
        assert [(r.principal, r.args["booking_id"]) for r in authorizer.requests] == [
            ("mallory", alices),
            ("alice", alices),
            ("alice", mallorys),
        ]
        assert [(c.principal, c.arguments["booking_id"]) for c in restaurant.received] == [
            ("alice", alices)
        ]
        assert (await rt.ledger.get(own["operation_id"])).principal == "alice"
        assert (await rt.ledger.get(posing["operation_id"])).principal == "mallory"
        assert restaurant.sor.get_booking(alices).status == "cancelled"
        assert restaurant.sor.get_booking(mallorys).status == "confirmed"


async def test_a_permission_revoked_before_a_retry_stops_every_later_attempt(
    ledger_url: str,
) -> None:
    clock = RecordingClock()
    restaurant = Restaurant(clock)
    booking_id = await _alice_has_a_booking(restaurant)
    authorizer = OwnBookingsOnly({booking_id: "alice"})
    retried = """
  cancel_booking:
    kind: mutation
    idempotency:
      provider_dedupes: true
    retry:
      max_attempts: 3
      initial_backoff_secs: 1
      max_backoff_secs: 1
      jitter: 0
"""
    restaurant.sor.faults.error_before_send("cancel")
    async with running(
        retried, restaurant, ledger_url=ledger_url, clock=clock, authorizer=authorizer
    ) as rt:
        alice = SessionState("call-a", principal="alice")
        started = await rt.propose("cancel_booking", {"booking_id": booking_id}, alice, wait=False)
        operation_id = started["operation_id"]
        await wait_for_status(rt, operation_id, S.FAILED_RETRYABLE)
        await eventually(
            lambda: restaurant.sor.calls["cancel"] == 1 and 1.0 in clock.requested,
            what="the first attempt and the backoff sleep after it",
        )

        authorizer.revoked.add("alice")  # e.g. the account was locked meanwhile
        clock.advance(1.0)  # the backoff is over: the retry asks the authorizer again
        final = await wait_for_status(rt, operation_id, S.FAILED_FINAL, S.COMMITTED, S.UNKNOWN)

        assert final.status is S.FAILED_FINAL, final
        assert "not authorized" in (final.error or ""), final.error
        assert restaurant.sor.calls["cancel"] == 1  # nothing reached the provider after the flip
        assert restaurant.sor.side_effects["cancel"] == 0
        assert restaurant.sor.get_booking(booking_id).status == "confirmed"
        assert [r.stage for r in authorizer.requests] == ["admission", "retry"]
        assert (await rt.wait(operation_id)).status is S.FAILED_FINAL
