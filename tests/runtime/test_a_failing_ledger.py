"""The ledger is a dependency that fails; no operation is stranded by it (issue 12, B1).

Observed before: with the database down while bookings were RUNNING, the callers had no answer
long after it came back and the ledger said RUNNING until a restart (an outcome write was never
tried again, a read inside an ``except`` raised again, the watchdog dropped a deadline whose
handler failed, and the heartbeat kept renewing the lease of what it could not settle).

Here the ledger fails on purpose (`Outage`, a wrapper that refuses what it is told to refuse, as
an unreachable database does: `LedgerUnavailable`), on the manual clock; the test with a real
PostgreSQL server stopped and started is in ``test_a_stopped_database.py``.
"""

from __future__ import annotations

import builtins
from collections.abc import Collection
from typing import Any

from pipecat_actions.admission.authorization import AllowAll
from pipecat_actions.clock import ManualClock
from pipecat_actions.errors import LedgerUnavailable
from pipecat_actions.execution.executor import ReconcileSchedule
from pipecat_actions.ledger import ForwardingLedger, Ledger, Operation, SqlLedger
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.status import ActionStatus
from pipecat_actions.testing import FakeSystemOfRecord
from tests._waiting import eventually, guarded
from tests.runtime._execution_support import Bookings, booking, new_session, policy
from tests.runtime._execution_support import S as Status

POLICY = """
    version: 1
    tools:
      book_table:
        kind: mutation
        deadline_secs: 60
"""
TURN_CONFIRMED = """
    version: 1
    tools:
      book_table:
        kind: mutation
        admit_when: turn_confirmed
        deadline_secs: 60
"""
LEASE_SECS = 30.0


class Outage(ForwardingLedger):
    """A ledger that fails what it is told to, as a database that cannot be reached.

    Attributes:
        failing: The method names that raise `LedgerUnavailable` now (``transition``,
            ``get``, ...); empty: the ledger works.
        refused: How many calls were refused, by method name.
        renewed_except: What each `renew_lease` left out.
    """

    def __init__(self, inner: Ledger) -> None:
        super().__init__(inner)
        self.failing: set[str] = set()
        self.refused: dict[str, int] = {}
        self.renewed_except: list[set[str]] = []

    def down(self, *methods: str) -> None:
        self.failing = set(methods) or {
            "admit",
            "transition",
            "annotate",
            "get",
            "list",
            "events",
            "claim_stale",
            "renew_lease",
        }

    def up(self) -> None:
        self.failing = set()

    def _check(self, method: str) -> None:
        if method in self.failing:
            self.refused[method] = self.refused.get(method, 0) + 1
            raise LedgerUnavailable(f"ledger database failed: {method} (outage)")

    async def transition(self, operation_id: str, **kwargs: Any) -> Operation:  # type: ignore[override]
        self._check("transition")
        return await super().transition(operation_id, **kwargs)

    async def annotate(self, operation_id: str, **kwargs: Any) -> Operation:  # type: ignore[override]
        self._check("annotate")
        return await super().annotate(operation_id, **kwargs)

    async def get(self, operation_id: str) -> Operation:
        self._check("get")
        return await super().get(operation_id)

    async def events(self, operation_id: str) -> Any:
        self._check("events")
        return await super().events(operation_id)

    async def list(self, filters: Any = None) -> builtins.list[Operation]:
        self._check("list")
        return await super().list(filters)

    async def claim_stale(
        self,
        owner: str,
        *,
        lease_secs: float,
        limit: int,
        except_ids: Collection[str] = (),
        gone: Collection[str] = (),
    ) -> Any:
        self._check("claim_stale")
        return await super().claim_stale(
            owner, lease_secs=lease_secs, limit=limit, except_ids=except_ids, gone=gone
        )

    async def renew_lease(
        self, owner: str, *, lease_secs: float, except_ids: Collection[str] = ()
    ) -> int:
        self._check("renew_lease")
        self.renewed_except.append(set(except_ids))
        return await super().renew_lease(owner, lease_secs=lease_secs, except_ids=except_ids)


class World:
    """A restaurant whose bookings hang until released, and runtimes on one ledger file."""

    def __init__(self, ledger_url: str, clock: ManualClock, tools: str = POLICY) -> None:
        self.url = ledger_url
        self.tools = tools
        self.clock = clock
        self.sor = FakeSystemOfRecord(clock=clock)
        self.sor.add_restaurant("r1", tables=10)
        self.bookings = Bookings(self.sor)
        self.told: dict[str, list[ActionStatus]] = {}
        self.opened: list[tuple[ActionRuntime, Ledger]] = []

    async def runtime(self, owner: str, **options: Any) -> tuple[ActionRuntime, Outage]:
        inner = await SqlLedger.create(self.url, clock=self.clock)
        outage = Outage(inner)
        runtime = await ActionRuntime.create(
            policy(self.tools),
            authorizer=AllowAll(),
            actions=[self.bookings.action()],
            ledger=outage,
            clock=self.clock,
            owner=owner,
            lease_secs=LEASE_SECS,
            schedule=ReconcileSchedule(initial_secs=1.0, multiplier=1.0, max_secs=1.0),
            **options,
        )
        self.opened.append((runtime, inner))
        runtime.listen(
            "call-1", lambda op: self.told.setdefault(op.operation_id, []).append(op.status)
        )
        return runtime, outage

    async def close(self) -> None:
        for runtime, inner in self.opened:
            await runtime.close(grace_secs=0)
            await inner.close()

    async def sent(self, runtime: ActionRuntime, *, n: int = 1) -> builtins.list[str]:
        """Propose ``n`` bookings that hang at the provider; return their operation ids."""
        self.sor.faults.hang("book", times=n)
        ids: list[str] = []
        for i in range(n):
            told = await runtime.propose(
                "book_table", booking(time=f"2{i}:00"), new_session(), wait=False
            )
            ids.append(str(told["operation_id"]))

        async def all_sent() -> bool:
            return self.sor.calls["book"] >= n

        await eventually(all_sent, what=f"{n} bookings to reach the provider")
        return ids


async def _status(inner: Ledger, operation_id: str) -> ActionStatus:
    return (await inner.get(operation_id)).status


async def _advance_until(
    clock: ManualClock, inner: Ledger, operation_id: str, status: ActionStatus, *, what: str
) -> None:
    """Move the clock a second at a time until the ledger holds ``status`` for the operation."""

    async def there() -> bool:
        clock.advance(1.0)
        return await _status(inner, operation_id) is status

    await eventually(there, what=what)


async def test_an_outcome_the_ledger_cannot_take_is_told_now_and_written_once_it_is_back(
    ledger_url: str, clock: ManualClock
) -> None:
    world = World(ledger_url, clock)
    try:
        runtime, outage = await world.runtime("a")
        [op_id] = await world.sent(runtime)
        inner = world.opened[0][1]
        outage.down("transition", "annotate", "get")  # the database is gone
        world.sor.release_hung()  # ... and the provider commits meanwhile

        # The caller hears the truth now, from memory: the booking was made.
        final = await guarded(runtime.wait(op_id), what="the caller's answer")
        assert final.status is Status.COMMITTED
        assert final.result is not None and final.result["booking_id"]
        assert await _status(inner, op_id) is Status.RUNNING  # not written yet
        assert world.told[op_id] == [Status.COMMITTED]

        # Retried with backoff on the clock, however long the outage lasts.
        async def refused_again() -> bool:
            clock.advance(1.0)
            return outage.refused.get("transition", 0) >= 5

        await eventually(refused_again, what="the outcome write to be tried again")
        outage.up()

        await _advance_until(
            clock,
            inner,
            op_id,
            Status.COMMITTED,
            what="the outcome to be written once the ledger is back",
        )
        recorded = await inner.get(op_id)
        assert recorded.result == final.result
        assert world.told[op_id] == [Status.COMMITTED]  # told once, never again
        assert world.sor.effects_for_key(recorded.idempotency_key) == 1
    finally:
        await world.close()


async def test_what_cannot_be_settled_loses_its_lease_and_another_process_settles_it(
    ledger_url: str, clock: ManualClock
) -> None:
    world = World(ledger_url, clock)
    try:
        first, first_ledger = await world.runtime("first")
        [op_id] = await world.sent(first)
        # Only this process's outcome writes fail (its own connection, its disk quota): the
        # heartbeat can still write, and must not keep the operation to itself.
        first_ledger.down("transition")
        world.sor.release_hung()
        told = await guarded(first.wait(op_id), what="the caller's answer")
        assert told.status is Status.COMMITTED

        await world.runtime("second")  # its heartbeat claims what the first let go of

        async def taken_over() -> bool:
            clock.advance(LEASE_SECS / 6)
            op = await world.opened[1][1].get(op_id)
            return op.lease_owner == "second" and op.status is Status.COMMITTED

        await eventually(taken_over, what="the other process to claim and settle it")
        assert any(op_id in left for left in first_ledger.renewed_except)
        trail = await world.opened[1][1].events(op_id)
        statuses = [e.to_status for e in trail if e.from_status is not e.to_status]
        # Claimed once the lease ran out, reconciled: the provider has the booking.
        assert statuses[-2:] == [Status.UNKNOWN, Status.COMMITTED]
        assert world.sor.effects_for_key((await world.opened[1][1].get(op_id)).idempotency_key) == 1
    finally:
        await world.close()


async def test_a_deadline_due_while_the_ledger_is_down_is_applied_once_it_is_back(
    ledger_url: str, clock: ManualClock
) -> None:
    world = World(ledger_url, clock)
    try:
        runtime, outage = await world.runtime("a")
        [op_id] = await world.sent(runtime)  # hangs at the provider, never answers
        inner = world.opened[0][1]
        outage.down()
        clock.advance(61)  # the deadline falls during the outage

        async def expiry_refused() -> bool:
            clock.advance(1.0)
            return outage.refused.get("get", 0) + outage.refused.get("transition", 0) >= 3

        await eventually(expiry_refused, what="the watchdog to try the deadline")
        outage.up()

        await _advance_until(
            clock,
            inner,
            op_id,
            Status.FAILED_FINAL,
            what="the deadline to be applied once the ledger is back",
        )
        final = await inner.get(op_id)
        trail = await inner.events(op_id)
        moves = [(e.to_status, e.actor) for e in trail if e.from_status is not e.to_status]
        # UNKNOWN first (it may have been sent), by the watchdog; then what reconciliation
        # found once the abandoned request had ended: the provider has no trace of it.
        assert moves[-2:] == [(Status.UNKNOWN, "watchdog"), (Status.FAILED_FINAL, runtime.actor)]
        assert final.status is Status.FAILED_FINAL
        assert world.sor.effects_for_key(final.idempotency_key) == 0
    finally:
        await world.close()


async def test_an_attempt_whose_write_ahead_fails_is_never_sent_and_is_recorded_as_not_sent(
    ledger_url: str, clock: ManualClock
) -> None:
    world = World(ledger_url, clock, TURN_CONFIRMED)
    try:
        runtime, outage = await world.runtime("a")
        inner = world.opened[0][1]
        session = new_session()
        session.start_generation()
        told = await runtime.propose("book_table", booking(), session, wait=False)
        op_id = str(told["operation_id"])
        assert told["status"] == "admitted"  # it waits for the reply to end unbroken
        outage.down("transition")
        session.settle_generation()  # the reply ends: its write-ahead (RUNNING) fails
        final = await guarded(runtime.wait(op_id), what="the caller's answer")
        assert final.status is Status.FAILED_FINAL
        assert final.error is not None and final.error.startswith("not sent")
        assert world.sor.calls["book"] == 0  # nothing was sent
        assert await _status(inner, op_id) is Status.ADMITTED
        outage.up()

        await _advance_until(
            clock,
            inner,
            op_id,
            Status.FAILED_FINAL,
            what="'not sent' to be written once the ledger is back",
        )
        recorded = await inner.get(op_id)
        assert recorded.error == final.error
        assert recorded.sent_at is None and recorded.attempt == 0
    finally:
        await world.close()


async def test_reconciliation_spends_no_probe_while_the_ledger_is_down(
    ledger_url: str, clock: ManualClock
) -> None:
    world = World(ledger_url, clock)
    try:
        runtime, outage = await world.runtime("a")
        # Committed, the answer lost (UNKNOWN) once the provider is let go.
        world.sor.faults.lose_response_after_commit("book")
        [op_id] = await world.sent(runtime)
        inner = world.opened[0][1]
        outage.down("get")  # reconciliation cannot read the operation for a while
        world.sor.release_hung()

        async def unknown() -> bool:
            return await _status(inner, op_id) is Status.UNKNOWN

        await eventually(unknown, what="the lost answer to make it UNKNOWN")
        for _ in range(20):  # far more than the schedule's 8 probes
            clock.advance(1.0)
            await eventually(
                lambda: outage.refused.get("get", 0) > 0, what="reconciliation to try a read"
            )
        assert world.bookings.seen["reconcile"] == []
        assert (await inner.get(op_id)).escalated_at is None
        outage.up()

        await _advance_until(
            clock, inner, op_id, Status.COMMITTED, what="reconciliation once the ledger is back"
        )
    finally:
        await world.close()
