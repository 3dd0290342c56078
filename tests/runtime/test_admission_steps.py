"""The admission steps and their order: each refusal is a final, truthful result and is audited.

unknown tool → stale proposal → payload cap → argument validation → authorization → ... A call
that fails an early step never reaches a later one (the authorizer is not even asked).
"""

from __future__ import annotations

import json

from pipecat_actions.clock import ManualClock
from pipecat_actions.session import SessionState
from pipecat_actions.status import ActionStatus

from ._admission_support import (
    OwnBookingsOnly,
    Restaurant,
    assert_refusal_audited,
    booking_args,
    running,
)

S = ActionStatus

TOOLS = """
  book_table:
    kind: mutation
    max_payload_bytes: 1024
  search_tables:
    kind: read
  add_tip:
    kind: mutation
    allow_stale_proposal: true
"""


async def test_an_unknown_tool_is_refused_and_audited(ledger_url: str, clock: ManualClock) -> None:
    restaurant = Restaurant(clock)
    async with running(TOOLS, restaurant, ledger_url=ledger_url, clock=clock) as rt:
        session = SessionState("call-1", principal="alice")

        result = await rt.propose(
            "drop_all_bookings", {"everything": True}, session, tool_call_id="call_1"
        )

        op = await assert_refusal_audited(rt, result, "unknown_tool")
        assert "drop_all_bookings" in result["message"]
        assert op.tool == "drop_all_bookings"
        assert op.principal == "alice"
        assert op.session_id == "call-1"
        assert op.provider_call_id == "call_1"
        assert restaurant.received == []


async def test_a_mutation_proposed_by_an_interrupted_reply_is_refused_as_stale(
    ledger_url: str, clock: ManualClock
) -> None:
    restaurant = Restaurant(clock)
    async with running(TOOLS, restaurant, ledger_url=ledger_url, clock=clock) as rt:
        session = SessionState("call-1", principal="alice")
        session.start_generation()
        session.interrupt()  # the user barged in on the reply that proposes the call

        result = await rt.propose("book_table", booking_args(), session)

        await assert_refusal_audited(rt, result, "stale_proposal")
        assert restaurant.received == []
        assert restaurant.bookings_made == 0
        # The next reply is not interrupted: the same call is admitted then.
        session.start_generation()
        again = await rt.propose("book_table", booking_args(), session)
        assert again["status"] == "committed", again
        assert restaurant.bookings_made == 1


async def test_a_stale_read_or_a_mutation_allowing_stale_proposals_still_runs(
    ledger_url: str, clock: ManualClock
) -> None:
    restaurant = Restaurant(clock)
    async with running(TOOLS, restaurant, ledger_url=ledger_url, clock=clock) as rt:
        session = SessionState("call-1", principal="alice")
        session.start_generation()
        session.interrupt()

        read = await rt.propose("search_tables", booking_args(), session)
        tip = await rt.propose("add_tip", {"booking_id": "bk_0001", "percent": 12.5}, session)

        assert read["status"] == "committed", read
        assert tip["status"] == "committed", tip
        assert restaurant.reads == 1
        assert restaurant.effects["add_tip"] == 1


async def test_invalid_arguments_are_refused_before_the_authorizer_is_asked(
    ledger_url: str, clock: ManualClock
) -> None:
    restaurant = Restaurant(clock)
    authorizer = OwnBookingsOnly({})
    async with running(
        TOOLS, restaurant, ledger_url=ledger_url, clock=clock, authorizer=authorizer
    ) as rt:
        session = SessionState("call-1", principal="alice")

        missing = await rt.propose("book_table", {"restaurant_id": "trattoria"}, session)
        wrong_type = await rt.propose("book_table", booking_args(party_size="many"), session)
        extra = await rt.propose("book_table", booking_args(admin=True), session)

        for result in (missing, wrong_type, extra):
            await assert_refusal_audited(rt, result, "invalid_arguments")
        assert "party_size" in wrong_type["message"]
        assert "admin" in extra["message"]
        assert authorizer.requests == []
        assert restaurant.received == []


async def test_the_payload_cap_is_applied_before_the_arguments_are_parsed(
    ledger_url: str, clock: ManualClock
) -> None:
    restaurant = Restaurant(clock)
    authorizer = OwnBookingsOnly({})
    async with running(
        TOOLS, restaurant, ledger_url=ledger_url, clock=clock, authorizer=authorizer
    ) as rt:
        session = SessionState("call-1", principal="alice")
        # Not even JSON, but too big: the cap answers first, nothing is parsed.
        junk = "{" + "x" * 5000

        result = await rt.propose("book_table", junk, session)

        op = await assert_refusal_audited(rt, result, "payload_too_large")
        assert op.args == {"oversized_arguments_bytes": len(junk)}
        assert authorizer.requests == []
        assert restaurant.received == []


async def test_arguments_given_as_json_text_are_admitted_like_a_mapping(
    ledger_url: str, clock: ManualClock
) -> None:
    restaurant = Restaurant(clock)
    async with running(TOOLS, restaurant, ledger_url=ledger_url, clock=clock) as rt:
        session = SessionState("call-1", principal="alice")

        as_text = await rt.propose("book_table", json.dumps(booking_args()), session)
        as_mapping = await rt.propose("book_table", booking_args(), session)

        assert as_text["status"] == "committed", as_text
        assert as_mapping["operation_id"] == as_text["operation_id"]
        assert restaurant.bookings_made == 1


async def test_a_long_provider_tool_call_id_never_crashes_admission(
    ledger_url: str, clock: ManualClock
) -> None:
    restaurant = Restaurant(clock)
    async with running(TOOLS, restaurant, ledger_url=ledger_url, clock=clock) as rt:
        session = SessionState("call-1", principal="alice")
        call_id = "call_" + "x" * 300  # providers do not promise a length

        admitted = await rt.propose("book_table", booking_args(), session, tool_call_id=call_id)
        refused = await rt.propose("drop_all_bookings", {}, session, tool_call_id=call_id)

        assert admitted["status"] == "committed", admitted
        await assert_refusal_audited(rt, refused, "unknown_tool")
        assert restaurant.bookings_made == 1
