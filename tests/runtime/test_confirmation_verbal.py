"""Verbal confirmation: nothing runs until the user says yes, in a later turn, to these details.

The first call answers ``awaiting_confirmation`` with a token bound to the arguments; the model
asks the user and calls ``confirm_action`` with the token once the user answered. A "yes" from
the same user turn as the proposal is the model talking to itself, not the user.
"""

from __future__ import annotations

from pipecat_actions.clock import ManualClock
from pipecat_actions.session import SessionState
from pipecat_actions.status import ActionStatus

from ._admission_support import Restaurant, booking_args, eventually, guarded, running

S = ActionStatus

VERBAL = """
  book_table:
    kind: mutation
    risk: high
    confirmation:
      mode: verbal
      expires_after_secs: 60
"""


async def test_a_call_needing_confirmation_asks_first_and_books_nothing(
    ledger_url: str, clock: ManualClock
) -> None:
    restaurant = Restaurant(clock)
    async with running(VERBAL, restaurant, ledger_url=ledger_url, clock=clock) as rt:
        session = SessionState("call-1", principal="alice")
        asked = await rt.propose("book_table", booking_args(), session, tool_call_id="call_1")

        assert asked["status"] == "awaiting_confirmation", asked
        assert asked["confirmation_token"]
        assert "confirm" in asked["message"]
        op = await rt.ledger.get(asked["operation_id"])
        assert op.status is S.AWAITING_CONFIRMATION
        assert op.deadline_at == clock.now() + 60
        assert restaurant.received == []
        assert restaurant.bookings_made == 0


async def test_confirmation_in_the_same_user_turn_is_refused(
    ledger_url: str, clock: ManualClock
) -> None:
    restaurant = Restaurant(clock)
    async with running(VERBAL, restaurant, ledger_url=ledger_url, clock=clock) as rt:
        session = SessionState("call-1", principal="alice")
        asked = await rt.propose("book_table", booking_args(), session)

        answer = await rt.confirm(asked["operation_id"], asked["confirmation_token"], session)

        assert answer["status"] == "refused", answer
        assert answer["reason"] == "confirmation_refused"
        assert (await rt.ledger.get(asked["operation_id"])).status is S.AWAITING_CONFIRMATION
        assert restaurant.bookings_made == 0


async def test_confirmation_in_a_later_user_turn_books_exactly_once(
    ledger_url: str, clock: ManualClock
) -> None:
    restaurant = Restaurant(clock)
    async with running(VERBAL, restaurant, ledger_url=ledger_url, clock=clock) as rt:
        session = SessionState("call-1", principal="alice")
        asked = await rt.propose("book_table", booking_args(), session)
        session.start_user_turn()  # "yes, please"

        answer = await rt.confirm(asked["operation_id"], asked["confirmation_token"], session)
        repeated = await rt.confirm(asked["operation_id"], asked["confirmation_token"], session)

        assert answer["status"] == "committed", answer
        assert answer["operation_id"] == asked["operation_id"]
        assert repeated["status"] == "refused", repeated
        assert restaurant.bookings_made == 1
        trail = await rt.ledger.events(asked["operation_id"])
        confirmed = [e for e in trail if e.from_status is S.AWAITING_CONFIRMATION]
        assert [(e.to_status, e.actor) for e in confirmed] == [(S.ADMITTED, "user:alice")]


async def test_confirmation_with_a_wrong_token_is_refused(
    ledger_url: str, clock: ManualClock
) -> None:
    restaurant = Restaurant(clock)
    async with running(VERBAL, restaurant, ledger_url=ledger_url, clock=clock) as rt:
        session = SessionState("call-1", principal="alice")
        asked = await rt.propose("book_table", booking_args(), session)
        other = await rt.propose("book_table", booking_args(time="21:00"), session)
        session.start_user_turn()

        wrong = await rt.confirm(asked["operation_id"], "not-the-token", session)
        # The token of another request does not confirm this one either.
        swapped = await rt.confirm(asked["operation_id"], other["confirmation_token"], session)

        assert wrong["status"] == swapped["status"] == "refused"
        assert wrong["reason"] == swapped["reason"] == "confirmation_refused"
        assert (await rt.ledger.get(asked["operation_id"])).status is S.AWAITING_CONFIRMATION
        assert restaurant.bookings_made == 0


async def test_confirmation_from_another_conversation_is_refused(
    ledger_url: str, clock: ManualClock
) -> None:
    restaurant = Restaurant(clock)
    async with running(VERBAL, restaurant, ledger_url=ledger_url, clock=clock) as rt:
        session = SessionState("call-1", principal="alice")
        intruder = SessionState("call-2", principal="mallory", user_turn=5)
        asked = await rt.propose("book_table", booking_args(), session)

        answer = await rt.confirm(asked["operation_id"], asked["confirmation_token"], intruder)

        assert answer["status"] == "refused", answer
        assert (await rt.ledger.get(asked["operation_id"])).status is S.AWAITING_CONFIRMATION
        assert restaurant.bookings_made == 0


async def test_an_unconfirmed_request_expires_and_a_late_yes_books_nothing(
    ledger_url: str, clock: ManualClock
) -> None:
    restaurant = Restaurant(clock)
    async with running(VERBAL, restaurant, ledger_url=ledger_url, clock=clock) as rt:
        session = SessionState("call-1", principal="alice")
        asked = await rt.propose("book_table", booking_args(), session)
        session.start_user_turn()

        clock.advance(61)  # the watchdog expires the question
        expired = await rt.wait(asked["operation_id"])
        late = await rt.confirm(asked["operation_id"], asked["confirmation_token"], session)

        assert expired.status is S.EXPIRED
        assert late["status"] == "refused", late
        assert (await rt.ledger.get(asked["operation_id"])).status is S.EXPIRED
        assert restaurant.received == []
        assert restaurant.bookings_made == 0


async def test_repeating_a_call_that_awaits_confirmation_answers_at_once_with_the_same_question(
    ledger_url: str, clock: ManualClock
) -> None:
    restaurant = Restaurant(clock)
    async with running(VERBAL, restaurant, ledger_url=ledger_url, clock=clock) as rt:
        session = SessionState("call-1", principal="alice")
        asked = await rt.propose("book_table", booking_args(), session, tool_call_id="call_1")

        # The model calls the tool again instead of asking: it must not hang the conversation
        # until the question expires. The clock stands still, so the question never expires
        # here: a repeat that waited for it would hang until the hang guard.
        again = await guarded(
            rt.propose("book_table", booking_args(), session, tool_call_id="call_2"),
            what="the repeated call to answer without waiting for the question to expire",
        )

        assert again["status"] == "awaiting_confirmation", again
        assert again["operation_id"] == asked["operation_id"]
        assert again["confirmation_token"] == asked["confirmation_token"]
        assert (await rt.ledger.get(asked["operation_id"])).status is S.AWAITING_CONFIRMATION
        assert restaurant.bookings_made == 0


async def test_the_policys_prompt_reaches_the_model_filled_with_the_calls_arguments(
    ledger_url: str, clock: ManualClock
) -> None:
    prompted = VERBAL.replace(
        "      expires_after_secs: 60\n",
        "      expires_after_secs: 60\n      prompt: 'Book {party_size} at {time}, {{really}}?'\n",
    )
    restaurant = Restaurant(clock)
    async with running(prompted, restaurant, ledger_url=ledger_url, clock=clock) as rt:
        session = SessionState("call-1", principal="alice")
        args = {**booking_args(), "time": "21:00 {party_size}"}  # braces in a value stay text
        asked = await rt.propose("book_table", args, session)
        again = await rt.propose("book_table", args, session)  # a repeat asks the same

    question = f"Book {args['party_size']} at 21:00 {{party_size}}, {{really}}?"
    assert asked["status"] == "awaiting_confirmation", asked
    assert asked["ask"] == question
    assert question in asked["message"]
    assert again["ask"] == question
    assert restaurant.bookings_made == 0


async def test_confirming_a_background_action_announces_it_and_answers_once_it_started(
    ledger_url: str, clock: ManualClock
) -> None:
    # A background tool's confirmation used to hold the conversation until the outcome, and
    # its announce line was never said: the user heard silence after "yes".
    restaurant = Restaurant(clock)
    restaurant.sor.faults.hang("book")
    background = VERBAL + "    mode: background\n    announce: Booking that now, one moment.\n"
    async with running(background, restaurant, ledger_url=ledger_url, clock=clock) as rt:
        session = SessionState("call-1", principal="alice")
        asked = await rt.propose("book_table", booking_args(), session)
        session.start_user_turn()  # "yes, please"
        started: list[str] = []

        async def on_started(tool: str) -> None:
            started.append(tool)

        answer = await guarded(
            rt.confirm(
                asked["operation_id"], asked["confirmation_token"], session, on_started=on_started
            ),
            what="the confirmation's answer while the booking hangs",
        )

        assert answer["status"] == "admitted", answer
        assert started == ["book_table"]
        await eventually(lambda: restaurant.sor.calls["book"] == 1, what="the booking is sent")
        restaurant.sor.release_hung()
        assert (await rt.wait(asked["operation_id"])).status is S.COMMITTED
        assert restaurant.bookings_made == 1


async def test_confirming_a_blocking_action_still_answers_with_its_outcome(
    ledger_url: str, clock: ManualClock
) -> None:
    restaurant = Restaurant(clock)
    async with running(VERBAL, restaurant, ledger_url=ledger_url, clock=clock) as rt:
        session = SessionState("call-1", principal="alice")
        asked = await rt.propose("book_table", booking_args(), session)
        session.start_user_turn()
        started: list[str] = []

        async def on_started(tool: str) -> None:
            started.append(tool)

        answer = await rt.confirm(
            asked["operation_id"], asked["confirmation_token"], session, on_started=on_started
        )
        assert answer["status"] == "committed", answer
        assert started == []  # no announce line for a blocking tool
