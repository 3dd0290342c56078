"""A saturated or failing ledger makes callers wait or hear the truth; it never fails them.

A burst of duplicate calls used to exhaust the PostgreSQL pool (one audit write per joined
duplicate, nothing bounding the ledger calls in flight, one poller per waiting caller), and
the `LedgerUnavailable` escaped to Pipecat, which tells the model the call "failed" although it
had joined a running booking.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from typing import Any

import pytest
from sqlalchemy import event

from pipecat_actions.actions import ActionContext, action
from pipecat_actions.admission.authorization import AllowAll
from pipecat_actions.clock import ManualClock
from pipecat_actions.errors import LedgerUnavailable
from pipecat_actions.ledger import SqlLedger
from pipecat_actions.ledger.engine import LedgerSettings
from pipecat_actions.ledger.forwarding import ForwardingLedger
from pipecat_actions.ledger.postgresql import PostgresLedger
from pipecat_actions.ledger.records import (
    DUPLICATES_JOINED,
    EventKind,
    NewOperation,
    Operation,
    joined_calls,
)
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.session import SessionState
from tests.runtime._execution_support import eventually, gather_all, guarded, policy

SHARED_INTENT = """
    version: 1
    tools:
      book_table:
        kind: mutation
        on_duplicate: join
        idempotency: {scope: tenant}
        deadline_secs: 60
"""

TINY_POOL = LedgerSettings(pool_size=2, max_overflow=0, pool_timeout_secs=0.05)
"""Two connections, no overflow, and a pool that gives up at once: any wait on it is an error."""

BURST = 200


class Gate:
    """A booking that waits until the test lets it commit, counting the real bookings."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.started = asyncio.Event()
        self.bookings: Counter[str] = Counter()

    def action(self) -> Any:
        @action
        async def book_table(ctx: ActionContext, time: str) -> dict[str, Any]:
            """Book a table."""
            self.started.set()
            await self.release.wait()
            self.bookings[ctx.idempotency_key] += 1
            return {"booking_id": "bk_1", "time": time}

        return book_table


def callers(count: int) -> list[SessionState]:
    return [SessionState(session_id=f"s{i}", principal=f"p{i}") for i in range(count)]


async def open_runtime(ledger: SqlLedger | ForwardingLedger, gate: Gate, **options: Any) -> Any:
    return await ActionRuntime.create(
        policy(SHARED_INTENT),
        authorizer=AllowAll(),
        actions=[gate.action()],
        ledger=ledger,
        clock=ledger.inner._clock if isinstance(ledger, ForwardingLedger) else ledger._clock,
        **options,
    )


async def test_a_burst_of_duplicates_on_a_tiny_pool_waits_its_turn_and_every_caller_hears_it(
    ledger_url: str, clock: ManualClock
) -> None:
    gate = Gate()
    ledger = await SqlLedger.create(ledger_url, clock=clock, settings=TINY_POOL)
    runtime = await open_runtime(ledger, gate)
    try:
        calls = [
            asyncio.ensure_future(
                runtime.propose("book_table", {"time": "21:00"}, s, tool_call_id=f"c{i}")
            )
            for i, s in enumerate(callers(BURST))
        ]
        await guarded(gate.started.wait(), what="the booking to start")
        gate.release.set()
        results = await gather_all(*calls)
        await runtime.flush()
        op_id = results[0]["operation_id"]
        trail = await ledger.events(op_id)
    finally:
        await runtime.close()
        await ledger.close()

    assert {r["status"] for r in results} == {"committed"}, Counter(r["status"] for r in results)
    assert {r["operation_id"] for r in results} == {op_id}
    assert {r["result"]["booking_id"] for r in results} == {"bk_1"}
    assert sum(gate.bookings.values()) == 1
    # Every join is audited, in a few notes rather than one write per duplicate.
    notes = [e for e in trail if e.kind is EventKind.ANNOTATION and DUPLICATES_JOINED in e.detail]
    assert sum(joined_calls(e.detail) for e in notes) == BURST - 1
    assert len(notes) < (BURST - 1) // 10, len(notes)
    joined_ids = [j["tool_call_id"] for e in notes for j in e.detail[DUPLICATES_JOINED]]
    assert len(set(joined_ids)) == BURST - 1
    assert set(joined_ids) < {f"c{i}" for i in range(BURST)}


class CountingLedger(ForwardingLedger):
    """Counts the reads of each operation."""

    def __init__(self, inner: SqlLedger) -> None:
        super().__init__(inner)
        self.gets: Counter[str] = Counter()

    async def get(self, operation_id: str) -> Operation:
        self.gets[operation_id] += 1
        return await super().get(operation_id)


class WithoutNotices(CountingLedger):
    """A ledger that cannot tell its waiters when another process settles: they poll."""

    @contextlib.asynccontextmanager
    async def notices(self, operation_id: str) -> AsyncIterator[asyncio.Event | None]:
        yield None


@pytest.mark.parametrize("notices", [True, False], ids=["woken_by_notice", "polling"])
async def test_callers_waiting_for_another_processs_operation_share_one_waiter(
    ledger_url: str, clock: ManualClock, notices: bool
) -> None:
    # Two runtimes on one ledger stand for two processes: the first runs the booking, the
    # second's callers join it and can only learn its outcome from the ledger.
    gate = Gate()
    runner_ledger = await SqlLedger.create(ledger_url, clock=clock)
    runner = await open_runtime(runner_ledger, gate)
    counting = CountingLedger if notices else WithoutNotices
    waiter_ledger = counting(await SqlLedger.create(ledger_url, clock=clock))
    waiter = await open_runtime(waiter_ledger, Gate())
    try:
        first = asyncio.ensure_future(
            runner.propose("book_table", {"time": "21:00"}, SessionState("s-run", "p"))
        )
        await guarded(gate.started.wait(), what="the booking to start")
        joiners = [
            asyncio.ensure_future(waiter.propose("book_table", {"time": "21:00"}, s))
            for s in callers(50)
        ]
        # Every joiner joined the booking in flight and waits on the ledger; the clock has
        # not moved, so their waiter is still in its first pause.
        await eventually(
            lambda: waiter._elsewhere.waiting == len(joiners),
            what="the 50 joiners to wait for the booking",
        )
        pollers = waiter._elsewhere.pollers
        gets_while_waiting = sum(waiter_ledger.gets.values())
        gate.release.set()
        committed = await guarded(first, what="the booking to commit")
        if not notices:
            # One step of the clock (a pause is at most 1 s) wakes the poller once, long
            # before the deadline: its read finds the booking committed.
            clock.advance(1.0)
        # With notices the clock never moves: only the notice of the commit can wake it.
        results = await gather_all(*joiners)
    finally:
        await waiter.close()
        await runner.close()
        await waiter_ledger.inner.close()
        await runner_ledger.close()

    assert pollers == 1
    assert committed["status"] == "committed"
    assert {r["status"] for r in results} == {"committed"}
    assert {r["operation_id"] for r in results} == {committed["operation_id"]}
    assert {r["result"]["booking_id"] for r in results} == {"bk_1"}
    assert sum(gate.bookings.values()) == 1
    if notices:
        # Woken once, by the notice: one re-read for all of them, not one per caller.
        assert sum(waiter_ledger.gets.values()) - gets_while_waiting <= 2
    else:
        # One poller: the 50 callers did not read the ledger 50 times per pause.
        assert waiter_ledger.gets[committed["operation_id"]] - gets_while_waiting < 10


class FailingLedger(ForwardingLedger):
    """A ledger whose database fails on the chosen calls."""

    def __init__(self, inner: SqlLedger, *, fail: set[str]) -> None:
        super().__init__(inner)
        self.fail = fail

    async def admit(self, new: NewOperation) -> Any:
        if "admit" in self.fail:
            raise LedgerUnavailable("ledger database failed: connection refused")
        return await super().admit(new)

    async def get(self, operation_id: str) -> Operation:
        if "get" in self.fail:
            raise LedgerUnavailable("ledger database failed: connection refused")
        return await super().get(operation_id)


async def test_a_call_whose_admission_cannot_be_recorded_is_told_so_and_nothing_runs(
    ledger_url: str, clock: ManualClock
) -> None:
    gate = Gate()
    gate.release.set()
    inner = await SqlLedger.create(ledger_url, clock=clock)
    failing = FailingLedger(inner, fail={"admit"})
    runtime = await open_runtime(failing, gate)
    try:
        told = await runtime.propose("book_table", {"time": "21:00"}, SessionState("s", "p"))
        failing.fail.clear()
        again = await runtime.propose("book_table", {"time": "21:00"}, SessionState("s", "p"))
    finally:
        await runtime.close()
        await inner.close()

    assert told["status"] == "refused"
    assert told["reason"] == "ledger_unavailable"
    assert "did not carry it out" in told["message"]
    assert "operation_id" not in told
    assert gate.bookings == Counter({next(iter(gate.bookings)): 1})  # only the second call ran
    assert again["status"] == "committed"


async def test_a_joined_call_that_cannot_read_the_outcome_is_told_it_is_not_yet_known(
    ledger_url: str, clock: ManualClock
) -> None:
    gate = Gate()
    # The runner keeps its own clock: only the waiter's time runs past the deadline.
    runner_ledger = await SqlLedger.create(ledger_url, clock=ManualClock(clock.now()))
    runner = await open_runtime(runner_ledger, gate)
    inner = await SqlLedger.create(ledger_url, clock=clock)
    failing = FailingLedger(inner, fail=set())
    waiter = await open_runtime(failing, Gate(), recover=False)
    try:
        first = asyncio.ensure_future(
            runner.propose("book_table", {"time": "21:00"}, SessionState("s-run", "p"))
        )
        await guarded(gate.started.wait(), what="the booking to start")
        failing.fail.add("get")  # the reads fail from now on: the join itself was admitted
        joined = asyncio.ensure_future(
            waiter.propose("book_table", {"time": "21:00"}, SessionState("s-join", "q"))
        )
        await eventually(
            lambda: waiter._elsewhere.pollers > 0, what="the joined call to wait on the ledger"
        )
        # Past the deadline (60 s) and its second of grace, in one step of the clock: the
        # poller wakes, its read fails, and the deadline is over.
        clock.advance(62.0)
        told = await guarded(joined, what="the joined call's answer after the deadline")
        gate.release.set()
        await guarded(first, what="the booking to commit")
    finally:
        await waiter.close()
        await runner.close()
        await inner.close()
        await runner_ledger.close()

    # Not "failed" (the booking ran and committed), and no claim of an outcome it cannot see.
    assert told["status"] == "running"
    assert told["operation_id"] == (await_first := first.result())["operation_id"]
    assert await_first["status"] == "committed"
    assert sum(gate.bookings.values()) == 1


class CheckedOut:
    """The most connections in use at once, over the ledger's SQLAlchemy and asyncpg pools."""

    def __init__(self, ledger: SqlLedger) -> None:
        self.now = self.most = 0
        pool_events = ledger._engine.sync_engine
        event.listen(pool_events, "checkout", self._out)
        event.listen(pool_events, "checkin", self._in)
        if isinstance(ledger, PostgresLedger):
            # PostgreSQL's hot path runs on asyncpg connections of its own.
            fast = ledger._fast
            call = fast._call

            async def counted(*args: Any, **kwargs: Any) -> Any:
                self._out()
                try:
                    return await call(*args, **kwargs)
                finally:
                    self._in()

            fast._call = counted  # type: ignore[method-assign]

    def _out(self, *_: Any) -> None:
        self.now += 1
        self.most = max(self.most, self.now)

    def _in(self, *_: Any) -> None:
        self.now -= 1


def new_operation(n: int, clock: ManualClock) -> NewOperation:
    return NewOperation(
        tool="book_table",
        kind="mutation",
        args={"n": n},
        idempotency_key=f"k{n}",
        session_id="s",
        principal="p",
        deadline_at=clock.now() + 60,
    )


@pytest.mark.parametrize("pool_size", [1, 2, 5])
async def test_no_more_ledger_calls_run_at_once_than_the_pool_holds_and_reads_half_of_them(
    ledger_url: str, clock: ManualClock, pool_size: int
) -> None:
    # A generous overflow: without the ledger's own bound, a burst would take all of it.
    settings = LedgerSettings(pool_size=pool_size, max_overflow=20)
    ledger = await SqlLedger.create(ledger_url, clock=clock, settings=settings)
    try:
        seen = CheckedOut(ledger)
        admitted = await asyncio.gather(*(ledger.admit(new_operation(n, clock)) for n in range(60)))
        most_by_writes = seen.most
        seen.most = 0
        ids = [r.operation.operation_id for r in admitted]
        reads = await asyncio.gather(*(ledger.get(op_id) for op_id in ids * 3))
        most_by_reads = seen.most
    finally:
        await ledger.close()
    assert all(r.created for r in admitted)
    assert {op.operation_id for op in reads} == set(ids)
    assert most_by_writes <= pool_size
    sqlite = ledger_url.startswith("sqlite")
    assert most_by_reads <= (pool_size if sqlite else max(1, pool_size // 2))
    assert most_by_reads >= 1
