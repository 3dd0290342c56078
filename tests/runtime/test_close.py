"""`close()` never leaves an outcome it told unwritten without saying so.

Observed on a full disk: a caller was told "committed", `close()` returned normally and the
ledger still said RUNNING; the next start left the booking UNKNOWN. Now `close()` tries the
failing writes again at once and often for its grace (real time: a closing runtime's manual
clock may never move again), and for each outcome still not written it logs an error naming
the operation and what its caller was told, and ends its lease; its owner's life lock goes with
it, so another runtime takes the operation over at once and settles it from the system of
record. The ledger fails on purpose (`Outage`), as a full disk does.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from loguru import logger

from pipecat_actions.admission.authorization import AllowAll
from pipecat_actions.clock import ManualClock
from pipecat_actions.errors import LedgerUnavailable
from pipecat_actions.ledger import SqlLedger
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.testing import FakeSystemOfRecord
from tests.runtime._execution_support import Bookings, booking, new_session, policy, reaches
from tests.runtime._execution_support import S as Status
from tests.runtime.test_a_failing_ledger import Outage

POLICY = """
    version: 1
    tools:
      book_table:
        kind: mutation
        deadline_secs: 60
        reconciliation: {commit_horizon_secs: 0}
"""
HOUR = 3600.0


class FullDisk(Outage):
    """An `Outage` whose refusals read as a full disk, and that refuses ending leases too."""

    def _check(self, method: str) -> None:
        if method in self.failing:
            self.refused[method] = self.refused.get(method, 0) + 1
            raise LedgerUnavailable(f"database or disk is full ({method})")

    async def release_leases(self, owner: str, operation_ids: Any) -> int:
        self._check("release_leases")
        return await super().release_leases(owner, operation_ids)


async def runtime_on(
    ledger: Any, sor: FakeSystemOfRecord, clock: ManualClock, **options: Any
) -> ActionRuntime:
    return await ActionRuntime.create(
        policy(POLICY),
        authorizer=AllowAll(),
        actions=[Bookings(sor).action(reconcile="lookup")],
        ledger=ledger,
        clock=clock,
        lease_secs=HOUR,
        **options,
    )


def fake(clock: ManualClock) -> FakeSystemOfRecord:
    sor = FakeSystemOfRecord(clock=clock)
    sor.add_restaurant("r1", tables=3)
    return sor


async def test_close_writes_the_outcome_it_told_once_the_disk_has_room_again(
    ledger_url: str, clock: ManualClock
) -> None:
    inner = await SqlLedger.create(ledger_url, clock=clock)
    disk = FullDisk(inner)
    sor = fake(clock)
    try:
        runtime = await runtime_on(disk, sor, clock)
        disk.down("transition")  # the commit cannot be written: the disk is full
        told = await runtime.propose("book_table", booking(), new_session())
        held = await inner.get(told["operation_id"])
        disk.up()  # room again, while the runtime's write waits on a clock nobody moves
        await runtime.close(grace_secs=HOUR)
        after = await inner.get(told["operation_id"])
    finally:
        await inner.close()

    assert told["status"] == "committed"
    assert held.status is Status.RUNNING
    assert after.status is Status.COMMITTED
    assert sor.side_effects["book"] == 1


async def test_an_outcome_close_cannot_write_is_logged_by_id_and_taken_over_at_once(
    ledger_url: str, clock: ManualClock, tmp_path: Path
) -> None:
    inner = await SqlLedger.create(ledger_url, clock=clock)
    disk = FullDisk(inner)
    sor = fake(clock)
    errors: list[str] = []
    sink = logger.add(lambda m: errors.append(str(m)), level="ERROR", format="{message}")
    try:
        runtime = await runtime_on(disk, sor, clock)
        disk.down("transition", "release_leases")
        told = await runtime.propose("book_table", booking(), new_session())
        await runtime.close(grace_secs=0)
        disk.up()
        left = await inner.get(told["operation_id"])
        # Another runtime, with the clock where it was: the closed one's hour-long lease
        # still runs, but its owner is gone, so it is taken over now and reconciled.
        second = await runtime_on(inner, sor, clock)
        try:
            settled = await reaches(second, told["operation_id"], Status.COMMITTED)
        finally:
            await second.close()
    finally:
        logger.remove(sink)
        await inner.close()

    assert told["status"] == "committed"
    assert left.status is Status.RUNNING
    said = [line for line in errors if told["operation_id"] in line]
    assert said and "was told COMMITTED" in said[0]
    assert settled.lease_owner == second.owner
    assert settled.result == {"booking_id": "bk_0001", "time": "21:00"}
    assert sor.side_effects["book"] == 1


async def test_an_outcome_close_cannot_write_has_its_lease_ended_when_that_write_lands(
    ledger_url: str, clock: ManualClock
) -> None:
    inner = await SqlLedger.create(ledger_url, clock=clock)
    disk = FullDisk(inner)
    sor = fake(clock)
    try:
        runtime = await runtime_on(disk, sor, clock, owner="bot-1")
        disk.down("transition")  # the outcome cannot be written; the lease can be ended
        told = await runtime.propose("book_table", booking(), new_session())
        await runtime.close(grace_secs=0)
        disk.up()
        left = await inner.get(told["operation_id"])
        claimed = await inner.claim_stale("someone", lease_secs=30, limit=10)
    finally:
        await inner.close()

    assert left.status is Status.RUNNING
    assert left.lease_expires_at is not None and left.lease_expires_at <= clock.now()
    assert [op.operation_id for op in claimed] == [told["operation_id"]]


async def test_a_clean_close_after_everything_was_written_logs_no_error(
    ledger_url: str, clock: ManualClock
) -> None:
    errors: list[str] = []
    sink = logger.add(lambda m: errors.append(str(m)), level="ERROR", format="{message}")
    inner = await SqlLedger.create(ledger_url, clock=clock)
    sor = fake(clock)
    try:
        runtime = await runtime_on(inner, sor, clock)
        told = await runtime.propose("book_table", booking(), new_session())
        await runtime.close(grace_secs=0)
    finally:
        logger.remove(sink)
        await inner.close()

    assert told["status"] == "committed"
    assert errors == []
