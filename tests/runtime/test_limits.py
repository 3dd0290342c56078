"""Limits and backpressure: a runaway model is stopped, a busy tool rejects, queues or degrades.

Limits are counted in memory per runtime, so these tests use one SQLite ledger each; every
refusal is still audited in it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from pipecat_actions.clock import ManualClock
from pipecat_actions.session import SessionState
from pipecat_actions.status import ActionStatus

from ._admission_support import (
    Restaurant,
    assert_refusal_audited,
    booking_args,
    eventually,
    running,
    sqlite_url,
)

S = ActionStatus
TIMES = [f"{hour}:{minute}" for hour in range(12, 23) for minute in ("00", "30")]


async def test_session_budget_stops_a_runaway_loop(tmp_path: Path, clock: ManualClock) -> None:
    restaurant = Restaurant(clock)
    budget = """
  book_table:
    kind: mutation
    limits:
      session_budget: 3
"""
    async with running(budget, restaurant, ledger_url=sqlite_url(tmp_path), clock=clock) as rt:
        session = SessionState("call-1", principal="alice")
        results = [
            await rt.propose("book_table", booking_args(time=time), session, tool_call_id=time)
            for time in TIMES[:10]
        ]

        assert [r["status"] for r in results[:3]] == ["committed"] * 3
        for refused in results[3:]:
            await assert_refusal_audited(rt, refused, "session_budget")
        assert restaurant.bookings_made == 3
        # The budget is per conversation: another call of the same user may still book.
        other = SessionState("call-2", principal="alice")
        fresh = await rt.propose("book_table", booking_args(time=TIMES[10]), other)
        assert fresh["status"] == "committed", fresh
        assert restaurant.bookings_made == 4


async def test_max_concurrent_with_overflow_reject_refuses_while_busy(
    tmp_path: Path, clock: ManualClock
) -> None:
    restaurant = Restaurant(clock)
    restaurant.sor.faults.hang("book")
    busy = """
  book_table:
    kind: mutation
    limits:
      max_concurrent: 1
      overflow: reject
"""
    async with running(busy, restaurant, ledger_url=sqlite_url(tmp_path), clock=clock) as rt:
        session = SessionState("call-1", principal="alice")
        first = await rt.propose("book_table", booking_args(time="19:00"), session, wait=False)
        await eventually(lambda: restaurant.sor.calls["book"] == 1, what="the first booking")

        second = await rt.propose("book_table", booking_args(time="20:00"), session)

        await assert_refusal_audited(rt, second, "concurrency")
        restaurant.sor.release_hung()
        assert (await rt.wait(first["operation_id"])).status is S.COMMITTED
        third = await rt.propose("book_table", booking_args(time="21:00"), session)
        assert third["status"] == "committed", third  # the slot was given back
        assert restaurant.bookings_made == 2
        assert restaurant.sor.calls["book"] == 2


async def test_per_principal_limit_queues_a_users_changed_request_behind_their_running_one(
    tmp_path: Path, clock: ManualClock
) -> None:
    # "Book 19:00" runs; "no, 20:00" from the same user used to be refused "busy, try again
    # shortly" (three times in the races) and never made. It waits behind the first one;
    # another user is not held back at all.
    restaurant = Restaurant(clock)
    restaurant.sor.faults.hang("book")
    per_user = """
  book_table:
    kind: mutation
    limits:
      per_principal: 1
"""
    async with running(per_user, restaurant, ledger_url=sqlite_url(tmp_path), clock=clock) as rt:
        alice = SessionState("call-1", principal="alice")
        bob = SessionState("call-2", principal="bob")
        first = await rt.propose("book_table", booking_args(time="19:00"), alice, wait=False)
        await eventually(lambda: restaurant.sor.calls["book"] == 1, what="alice's booking")

        second = await rt.propose("book_table", booking_args(time="20:00"), alice, wait=False)
        bobs = await rt.propose("book_table", booking_args(time="20:00"), bob, wait=False)

        assert second["status"] == "admitted", second  # behind her first, not bounced
        # Bob is not held back by Alice's slot (his booking may already have committed).
        assert bobs["status"] in ("running", "committed"), bobs
        await eventually(lambda: restaurant.sor.calls["book"] == 2, what="bob's booking")
        assert (await rt.ledger.get(second["operation_id"])).status is S.ADMITTED
        restaurant.sor.release_hung()
        assert (await rt.wait(first["operation_id"])).status is S.COMMITTED
        assert (await rt.wait(second["operation_id"])).status is S.COMMITTED
        assert (await rt.wait(bobs["operation_id"])).status is S.COMMITTED
        assert restaurant.bookings_made == 3
        started = {op.operation_id: op.started_at for op in await rt.ledger.list()}
        finished = (await rt.ledger.get(first["operation_id"])).finished_at
        assert started[second["operation_id"]] >= finished  # it waited for her first


async def test_overflow_queue_waits_for_a_slot_and_refuses_beyond_max_queued(
    tmp_path: Path, clock: ManualClock
) -> None:
    restaurant = Restaurant(clock)
    restaurant.sor.faults.hang("book")
    queued = """
  book_table:
    kind: mutation
    limits:
      max_concurrent: 1
      max_queued: 1
      overflow: queue
"""
    async with running(queued, restaurant, ledger_url=sqlite_url(tmp_path), clock=clock) as rt:
        session = SessionState("call-1", principal="alice")
        first = await rt.propose("book_table", booking_args(time="19:00"), session, wait=False)
        await eventually(lambda: restaurant.sor.calls["book"] == 1, what="the first booking")

        # Two more callers: one takes the only queue place, the other finds the queue full.
        waiting = [
            asyncio.ensure_future(rt.propose("book_table", booking_args(time=time), session))
            for time in ("20:00", "21:00")
        ]
        await eventually(lambda: any(task.done() for task in waiting), what="one refusal")
        assert restaurant.sor.calls["book"] == 1  # the queued call did not start
        restaurant.sor.release_hung()
        results = await asyncio.gather(*waiting)

        assert (await rt.wait(first["operation_id"])).status is S.COMMITTED
        assert sorted(r["status"] for r in results) == ["committed", "refused"], results
        (refused,) = [r for r in results if r["status"] == "refused"]
        await assert_refusal_audited(rt, refused, "concurrency")
        assert restaurant.bookings_made == 2


async def test_overflow_degrade_answers_with_the_fallback_result(
    tmp_path: Path, clock: ManualClock
) -> None:
    restaurant = Restaurant(clock)
    degrade = """
  search_tables:
    kind: read
    limits:
      max_concurrent: 1
      overflow: degrade
      degrade_result:
        times: []
        note: busy, try again shortly
"""
    async with running(degrade, restaurant, ledger_url=sqlite_url(tmp_path), clock=clock) as rt:
        session = SessionState("call-1", principal="alice")
        restaurant.read_gate.clear()
        first = asyncio.ensure_future(rt.propose("search_tables", booking_args(), session))
        await eventually(lambda: restaurant.reads == 1, what="the first search")

        fallback = await rt.propose("search_tables", booking_args(time="21:00"), session)

        assert fallback["status"] == "degraded", fallback
        assert fallback["result"] == {"times": [], "note": "busy, try again shortly"}
        assert restaurant.reads == 1
        restaurant.read_gate.set()
        answered = await first
        assert answered["status"] == "committed", answered
        assert answered["result"]["times"]


async def test_overflow_coalesce_shares_the_result_of_an_identical_read_in_flight(
    tmp_path: Path, clock: ManualClock
) -> None:
    restaurant = Restaurant(clock)
    coalesce = """
  search_tables:
    kind: read
    limits:
      max_concurrent: 1
      overflow: coalesce
"""
    async with running(coalesce, restaurant, ledger_url=sqlite_url(tmp_path), clock=clock) as rt:
        alice = SessionState("call-1", principal="alice")
        restaurant.read_gate.clear()
        first = asyncio.ensure_future(rt.propose("search_tables", booking_args(), alice))
        await eventually(lambda: restaurant.reads == 1, what="the first search")

        same = asyncio.ensure_future(
            rt.propose("search_tables", booking_args(), alice, tool_call_id="call_2")
        )
        other = await rt.propose("search_tables", booking_args(time="21:00"), alice)
        restaurant.read_gate.set()
        answers = await asyncio.gather(first, same)

        assert answers[0]["status"] == "committed", answers
        assert answers[1] == answers[0]
        assert restaurant.reads == 1  # the effect ran once for both callers
        # A different read is not identical: nothing to share, and the tool is busy.
        await assert_refusal_audited(rt, other, "concurrency")


async def test_rate_per_minute_refuses_beyond_the_rate_until_the_minute_passes(
    tmp_path: Path, clock: ManualClock
) -> None:
    restaurant = Restaurant(clock)
    rated = """
  search_tables:
    kind: read
    limits:
      rate_per_minute: 3
  book_table:
    kind: mutation
    limits:
      rate_per_minute: 2
"""
    async with running(rated, restaurant, ledger_url=sqlite_url(tmp_path), clock=clock) as rt:
        session = SessionState("call-1", principal="alice")
        reads = [
            await rt.propose("search_tables", booking_args(time=time), session)
            for time in TIMES[:4]
        ]
        books = [
            await rt.propose("book_table", booking_args(time=time), session) for time in TIMES[:3]
        ]

        assert [r["status"] for r in reads] == ["committed"] * 3 + ["refused"]
        assert [r["status"] for r in books] == ["committed"] * 2 + ["refused"]
        await assert_refusal_audited(rt, reads[3], "rate")
        await assert_refusal_audited(rt, books[2], "rate")
        assert restaurant.reads == 3
        assert restaurant.bookings_made == 2

        clock.advance(30)
        still = await rt.propose("book_table", booking_args(time=TIMES[5]), session)
        clock.advance(31)
        later = await rt.propose("book_table", booking_args(time=TIMES[6]), session)
        read_later = await rt.propose("search_tables", booking_args(time=TIMES[6]), session)

        assert still["status"] == "refused"
        assert later["status"] == "committed", later
        assert read_later["status"] == "committed", read_later
        assert restaurant.bookings_made == 3


async def test_a_call_waiting_for_approval_does_not_hold_a_concurrency_slot(
    tmp_path: Path, clock: ManualClock
) -> None:
    restaurant = Restaurant(clock)
    approval = """
  book_table:
    kind: mutation
    risk: high
    confirmation:
      mode: approval
      approvers: [ops]
    limits:
      max_concurrent: 1
"""
    async with running(approval, restaurant, ledger_url=sqlite_url(tmp_path), clock=clock) as rt:
        alice = SessionState("call-1", principal="alice")
        bob = SessionState("call-2", principal="bob")
        pending = await rt.propose("book_table", booking_args(time="19:00"), alice)
        assert pending["status"] == "awaiting_approval"

        # Nothing of alice's runs while a person decides: bob's request is not "busy".
        other = await rt.propose("book_table", booking_args(time="20:00"), bob)

        assert other["status"] == "awaiting_approval", other
        assert restaurant.bookings_made == 0
