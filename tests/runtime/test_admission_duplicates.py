"""Idempotency and the duplicate policy: the same intent never causes a second side effect.

The key comes from the policy's key fields, never from the provider's tool_call_id, so calls
with new ids for the same intent meet the operation already bound to that key; what happens
next is the tool's ``on_duplicate`` policy.
"""

from __future__ import annotations

import asyncio

import pytest

from pipecat_actions.clock import ManualClock
from pipecat_actions.ledger import OperationFilter
from pipecat_actions.session import SessionState
from pipecat_actions.status import ActionStatus

from ._admission_support import (
    Restaurant,
    assert_refusal_audited,
    booking_args,
    eventually,
    running,
    sqlite_url,
    wait_for_status,
)

S = ActionStatus


def _booking_policy(on_duplicate: str = "join", extra: str = "") -> str:
    return f"""
  book_table:
    kind: mutation
    arguments: [restaurant_id, date, time, party_size, guest]
    idempotency:
      key_fields: [restaurant_id, date, time]
    on_duplicate: {on_duplicate}
{extra}"""


@pytest.mark.parametrize("conversations", [1, 4])
async def test_hundred_concurrent_duplicate_calls_book_once_and_share_one_operation(
    ledger_url: str, clock: ManualClock, conversations: int
) -> None:
    restaurant = Restaurant(clock)
    async with running(_booking_policy(), restaurant, ledger_url=ledger_url, clock=clock) as rt:
        # One user: the key's scope is the principal, so parallel calls of the user match too.
        sessions = [SessionState(f"call-{n}", principal="alice") for n in range(conversations)]
        results = await asyncio.gather(
            *(
                rt.propose(
                    "book_table",
                    booking_args(),
                    sessions[n % conversations],
                    tool_call_id=f"call_{n:03d}",
                )
                for n in range(100)
            )
        )

        operation_ids = {result["operation_id"] for result in results}
        assert len(operation_ids) == 1, operation_ids
        (operation_id,) = operation_ids
        final = await rt.wait(operation_id)
        assert final.status is S.COMMITTED
        assert {result["status"] for result in results} <= {"committed", "running"}
        assert any(result["status"] == "committed" for result in results)
        assert restaurant.bookings_made == 1
        assert restaurant.sor.calls["book"] == 1
        assert len(await rt.ledger.list(OperationFilter(tool="book_table"))) == 1


@pytest.mark.parametrize("on_duplicate", ["join", "reject", "confirm", "replace"])
async def test_same_key_with_other_details_is_refused_as_idempotency_mismatch(
    ledger_url: str, clock: ManualClock, on_duplicate: str
) -> None:
    restaurant = Restaurant(clock)
    async with running(
        _booking_policy(on_duplicate), restaurant, ledger_url=ledger_url, clock=clock
    ) as rt:
        session = SessionState("call-1", principal="alice")
        first = await rt.propose("book_table", booking_args(party_size=2), session)
        assert first["status"] == "committed", first

        # Same restaurant, date and time (the key fields), another party size.
        second = await rt.propose(
            "book_table", booking_args(party_size=4), session, tool_call_id="call_2"
        )

        await assert_refusal_audited(
            rt, second, "idempotency_mismatch", refers_to=first["operation_id"]
        )
        assert restaurant.bookings_made == 1
        assert restaurant.sor.calls["book"] == 1
        assert (await rt.ledger.get(first["operation_id"])).status is S.COMMITTED


async def test_join_gives_a_repeated_call_the_first_calls_outcome(
    ledger_url: str, clock: ManualClock
) -> None:
    restaurant = Restaurant(clock)
    async with running(
        _booking_policy("join"), restaurant, ledger_url=ledger_url, clock=clock
    ) as rt:
        session = SessionState("call-1", principal="alice")
        first = await rt.propose("book_table", booking_args(), session, tool_call_id="call_1")
        again = await rt.propose("book_table", booking_args(), session, tool_call_id="call_2")

        assert first["status"] == again["status"] == "committed"
        assert again["operation_id"] == first["operation_id"]
        assert again["result"] == first["result"]
        assert "already" in again["message"]
        assert restaurant.bookings_made == 1


@pytest.mark.parametrize("cap", ["per_principal: 1", "max_concurrent: 1"])
async def test_a_repeat_of_a_call_in_flight_joins_it_even_when_a_cap_is_full(
    ledger_url: str, clock: ManualClock, cap: str
) -> None:
    # The first call holds the only slot; the repeat is the same intent, not new work: it
    # must join, not be told "busy, try again" (which invites the model to call again).
    restaurant = Restaurant(clock)
    restaurant.sor.faults.hang("book")
    policy = _booking_policy("join", f"    limits: {{{cap}}}\n")
    async with running(policy, restaurant, ledger_url=ledger_url, clock=clock) as rt:
        session = SessionState("call-1", principal="alice")
        first = await rt.propose(
            "book_table", booking_args(), session, tool_call_id="call_1", wait=False
        )
        await eventually(lambda: restaurant.sor.calls["book"] == 1, what="the booking is sent")

        again = await rt.propose(
            "book_table", booking_args(), session, tool_call_id="call_2", wait=False
        )
        other = await rt.propose(
            "book_table", booking_args(time="21:30"), session, tool_call_id="call_3", wait=False
        )

        assert again["operation_id"] == first["operation_id"], again
        restaurant.sor.release_hung()
        assert (await rt.wait(first["operation_id"])).status is S.COMMITTED
        if cap.startswith("per_principal"):
            # New work of the same user (a changed request) waits behind the first one.
            assert other["status"] == "admitted", other
            assert (await rt.wait(other["operation_id"])).status is S.COMMITTED
            assert restaurant.bookings_made == 2
        else:
            assert other["status"] == "refused", other  # the whole line is busy
            assert restaurant.bookings_made == 1


async def test_reject_refuses_a_repeated_call_naming_the_first_operation(
    ledger_url: str, clock: ManualClock
) -> None:
    restaurant = Restaurant(clock)
    async with running(
        _booking_policy("reject"), restaurant, ledger_url=ledger_url, clock=clock
    ) as rt:
        session = SessionState("call-1", principal="alice")
        first = await rt.propose("book_table", booking_args(), session, tool_call_id="call_1")
        again = await rt.propose("book_table", booking_args(), session, tool_call_id="call_2")

        assert first["status"] == "committed"
        assert again["status"] == "refused"
        assert again["reason"] == "duplicate"
        assert again["existing_operation_id"] == first["operation_id"]
        assert again["operation_id"] != first["operation_id"]  # its own refused record
        assert restaurant.bookings_made == 1
        refusals = await rt.ledger.list(OperationFilter(status=[S.REJECTED]))
        assert len(refusals) == 1
        assert refusals[0].provider_call_id == "call_2"
        trail = await rt.ledger.events(refusals[0].operation_id)
        assert trail[-1].detail == {"reason": "duplicate", "duplicate_of": first["operation_id"]}


async def test_allow_runs_a_repeated_call_again_as_a_new_operation(
    ledger_url: str, clock: ManualClock
) -> None:
    restaurant = Restaurant(clock)
    async with running(
        _booking_policy("allow"), restaurant, ledger_url=ledger_url, clock=clock
    ) as rt:
        session = SessionState("call-1", principal="alice")
        first = await rt.propose("book_table", booking_args(), session, tool_call_id="call_1")
        again = await rt.propose("book_table", booking_args(), session, tool_call_id="call_2")

        assert first["status"] == again["status"] == "committed"
        assert again["operation_id"] != first["operation_id"]
        assert restaurant.bookings_made == 2
        assert len(await rt.ledger.list(OperationFilter(status=[S.COMMITTED]))) == 2


async def test_confirm_asks_the_user_before_doing_the_same_thing_again(
    ledger_url: str, clock: ManualClock
) -> None:
    restaurant = Restaurant(clock)
    async with running(
        _booking_policy("confirm"), restaurant, ledger_url=ledger_url, clock=clock
    ) as rt:
        session = SessionState("call-1", principal="alice")
        first = await rt.propose("book_table", booking_args(), session, tool_call_id="call_1")
        again = await rt.propose("book_table", booking_args(), session, tool_call_id="call_2")

        assert first["status"] == "committed"
        assert again["status"] == "awaiting_confirmation", again
        assert again["operation_id"] != first["operation_id"]
        assert again["confirmation_token"]
        assert (await rt.ledger.get(again["operation_id"])).status is S.AWAITING_CONFIRMATION
        assert restaurant.bookings_made == 1

        session.start_user_turn()  # the user says "yes, book it again"
        confirmed = await rt.confirm(again["operation_id"], again["confirmation_token"], session)

        assert confirmed["status"] == "committed", confirmed
        assert restaurant.bookings_made == 2


async def test_replace_cancels_an_earlier_call_that_has_not_started(
    ledger_url: str, clock: ManualClock
) -> None:
    restaurant = Restaurant(clock)
    # turn_confirmed holds each call until the reply that proposed it ends: not started yet.
    policy = _booking_policy("replace", "    admit_when: turn_confirmed\n")
    async with running(policy, restaurant, ledger_url=ledger_url, clock=clock) as rt:
        session = SessionState("call-1", principal="alice")
        session.start_generation()
        first = await rt.propose(
            "book_table", booking_args(), session, tool_call_id="call_1", wait=False
        )
        assert first["status"] == "admitted", first

        again = await rt.propose(
            "book_table", booking_args(), session, tool_call_id="call_2", wait=False
        )

        assert again["operation_id"] != first["operation_id"]
        assert (await rt.ledger.get(first["operation_id"])).status is S.CANCELLED
        session.settle_generation()
        final = await rt.wait(again["operation_id"])
        assert final.status is S.COMMITTED
        assert restaurant.bookings_made == 1
        assert (await rt.wait(first["operation_id"])).status is S.CANCELLED


async def test_replace_joins_an_earlier_call_that_is_already_running(
    ledger_url: str, clock: ManualClock
) -> None:
    restaurant = Restaurant(clock)
    restaurant.sor.faults.hang("book")
    async with running(
        _booking_policy("replace"), restaurant, ledger_url=ledger_url, clock=clock
    ) as rt:
        session = SessionState("call-1", principal="alice")
        first = await rt.propose(
            "book_table", booking_args(), session, tool_call_id="call_1", wait=False
        )
        await eventually(lambda: restaurant.sor.calls["book"] == 1, what="the booking is sent")

        again = await rt.propose(
            "book_table", booking_args(), session, tool_call_id="call_2", wait=False
        )

        # Sent and without a cancel hook: it cannot be stopped, so the new call joins it.
        assert again["operation_id"] == first["operation_id"]
        assert again["status"] == "running"
        restaurant.sor.release_hung()
        final = await rt.wait(first["operation_id"])
        assert final.status is S.COMMITTED
        assert restaurant.bookings_made == 1
        assert restaurant.sor.calls["book"] == 1


async def test_replace_supersedes_an_earlier_call_still_awaiting_confirmation(
    tmp_path: object, clock: ManualClock
) -> None:
    restaurant = Restaurant(clock)
    policy = _booking_policy("replace", "    confirmation:\n      mode: verbal\n")
    async with running(policy, restaurant, ledger_url=sqlite_url(tmp_path), clock=clock) as rt:
        session = SessionState("call-1", principal="alice")
        first = await rt.propose("book_table", booking_args(), session, tool_call_id="call_1")
        assert first["status"] == "awaiting_confirmation"

        again = await rt.propose("book_table", booking_args(), session, tool_call_id="call_2")

        # The earlier question is withdrawn and the new call asks again; it is not lost.
        assert await wait_for_status(rt, first["operation_id"], S.REJECTED, S.CANCELLED)
        assert again["status"] == "awaiting_confirmation", again
        assert again["operation_id"] != first["operation_id"]
        session.start_user_turn()
        confirmed = await rt.confirm(again["operation_id"], again["confirmation_token"], session)
        assert confirmed["status"] == "committed", confirmed
        assert restaurant.bookings_made == 1


_CHANGEABLE = """    resource: "table:{restaurant_id}:{date}"
    limits: {per_principal: 1}
"""


@pytest.mark.parametrize("on_duplicate", ["join", "replace"])
async def test_a_party_size_changed_in_a_later_turn_while_the_booking_runs_is_booked(
    ledger_url: str, clock: ManualClock, on_duplicate: str
) -> None:
    # "A table for two at eight" (it is being booked), then "make it four": the same intent
    # (restaurant, date, time) with other details, from a later user turn. The user's final
    # wish is booked; the first went ahead and is told as superseded. It used to be refused
    # as an idempotency mismatch, and the party of four never booked.
    restaurant = Restaurant(clock)
    restaurant.sor.faults.hang("book")
    policy = _booking_policy(on_duplicate, _CHANGEABLE)
    async with running(policy, restaurant, ledger_url=ledger_url, clock=clock) as rt:
        session = SessionState("call-1", principal="alice")
        first = await rt.propose(
            "book_table", booking_args(party_size=2), session, tool_call_id="c1", wait=False
        )
        await eventually(lambda: restaurant.sor.calls["book"] == 1, what="the booking is sent")

        session.start_user_turn()
        changed = await rt.propose(
            "book_table", booking_args(party_size=4), session, tool_call_id="c2", wait=False
        )
        assert changed["status"] == "admitted", changed  # behind the first (per_principal)
        assert changed["operation_id"] != first["operation_id"]

        restaurant.sor.release_hung()
        assert (await rt.wait(first["operation_id"])).status is S.COMMITTED
        final = await rt.wait(changed["operation_id"])
        assert final.status is S.COMMITTED
        assert final.args["party_size"] == 4
        assert restaurant.bookings_made == 2
        assert await rt.superseded_by(await rt.ledger.get(first["operation_id"])) == (
            final.operation_id
        )


async def test_a_change_in_a_later_turn_before_anything_was_sent_replaces_the_request(
    ledger_url: str, clock: ManualClock
) -> None:
    restaurant = Restaurant(clock)
    extra = _CHANGEABLE + "    admit_when: turn_confirmed\n"
    async with running(
        _booking_policy("join", extra), restaurant, ledger_url=ledger_url, clock=clock
    ) as rt:
        session = SessionState("call-1", principal="alice")
        first = await rt.propose(
            "book_table", booking_args(party_size=2), session, tool_call_id="c1", wait=False
        )
        assert first["status"] == "admitted", first  # waits for the reply to end unbroken

        session.start_user_turn()
        changed = await rt.propose(
            "book_table", booking_args(party_size=4), session, tool_call_id="c2", wait=False
        )

        assert (await rt.ledger.get(first["operation_id"])).status is S.CANCELLED
        assert changed["operation_id"] != first["operation_id"]
        assert changed["status"] != "refused", changed
        assert restaurant.sor.calls["book"] == 0 or all(
            call.arguments["party_size"] == 4 for call in restaurant.received
        )


async def test_an_earlier_turns_call_arriving_late_never_overrides_the_users_later_change(
    ledger_url: str, clock: ManualClock
) -> None:
    restaurant = Restaurant(clock)
    async with running(
        _booking_policy("join", _CHANGEABLE), restaurant, ledger_url=ledger_url, clock=clock
    ) as rt:
        session = SessionState("call-1", principal="alice")
        session.start_user_turn()
        later = await rt.propose(
            "book_table", booking_args(party_size=4), session, tool_call_id="c2"
        )
        assert later["status"] == "committed", later

        session.user_turn = 0  # a call of the earlier turn, delivered late (a replayed call)
        earlier = await rt.propose(
            "book_table", booking_args(party_size=2), session, tool_call_id="c1"
        )
        await assert_refusal_audited(
            rt, earlier, "idempotency_mismatch", refers_to=later["operation_id"]
        )
        assert restaurant.bookings_made == 1


@pytest.mark.parametrize("first_finished", [True, False], ids=["after-commit", "while-running"])
async def test_other_details_in_a_later_turn_are_refused_after_the_fact_or_under_reject(
    ledger_url: str, clock: ManualClock, first_finished: bool
) -> None:
    # What already happened is not done again with other details (a second refund), and a
    # tool whose repeats are rejected refuses a changed repeat too.
    restaurant = Restaurant(clock)
    if not first_finished:
        restaurant.sor.faults.hang("book")
    policy = _booking_policy("join" if first_finished else "reject", _CHANGEABLE)
    async with running(policy, restaurant, ledger_url=ledger_url, clock=clock) as rt:
        session = SessionState("call-1", principal="alice")
        first = await rt.propose(
            "book_table",
            booking_args(party_size=2),
            session,
            tool_call_id="c1",
            wait=first_finished,
        )
        session.start_user_turn()
        changed = await rt.propose(
            "book_table", booking_args(party_size=4), session, tool_call_id="c2", wait=False
        )
        await assert_refusal_audited(
            rt, changed, "idempotency_mismatch", refers_to=first["operation_id"]
        )
        if not first_finished:
            restaurant.sor.release_hung()
        assert (await rt.wait(first["operation_id"])).status is S.COMMITTED
        assert restaurant.bookings_made == 1
