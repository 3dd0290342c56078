"""The deadline parts alone: the `Watchdog` on a manual clock and `Expiry` against a fake ledger.

No runtime, no database: the watchdog's ordering and retry, and the expiry rule's table, its
re-read when the status moved, and what it does to an operation this process owns.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from pipecat_actions.clock import ManualClock
from pipecat_actions.errors import UnexpectedStatus
from pipecat_actions.execution.durable import WriteRetry
from pipecat_actions.execution.expiry import Expiry, expiry_rule
from pipecat_actions.execution.watchdog import Watchdog
from pipecat_actions.status import ActionStatus
from tests._waiting import eventually

S = ActionStatus


async def settle() -> None:
    """Let every task that can run, run (the watchdog's loop and its handlers)."""
    for _ in range(10):
        await asyncio.sleep(0)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start=1_000.0)


async def test_deadlines_fire_in_the_order_they_fall_due_not_the_order_they_were_armed(
    clock: ManualClock,
) -> None:
    fired: list[str] = []

    async def expire(operation_id: str) -> None:
        fired.append(operation_id)

    watchdog = Watchdog(clock, expire)
    watchdog.start()
    try:
        watchdog.arm("late", 1_030.0)
        watchdog.arm("early", 1_010.0)
        watchdog.arm("middle", 1_020.0)
        await settle()
        clock.advance(9)
        await settle()
        assert fired == []
        clock.advance(21)
        await settle()
        assert fired == ["early", "middle", "late"]
        assert watchdog.pending == 0
    finally:
        await watchdog.stop()


async def test_a_moved_deadline_fires_once_at_its_new_time_and_a_disarmed_one_never(
    clock: ManualClock,
) -> None:
    fired: list[tuple[str, float]] = []

    async def expire(operation_id: str) -> None:
        fired.append((operation_id, clock.now()))

    watchdog = Watchdog(clock, expire)
    watchdog.start()
    try:
        watchdog.arm("moved", 1_010.0)
        watchdog.arm("done", 1_005.0)
        await settle()
        watchdog.arm("moved", 1_040.0)  # an approval replaced its window
        watchdog.disarm("done")  # it had its outcome
        clock.advance(20)
        await settle()
        assert fired == []
        clock.advance(20)
        await settle()
        assert fired == [("moved", 1_040.0)]
    finally:
        await watchdog.stop()


async def test_an_earlier_deadline_armed_while_the_loop_sleeps_wakes_it(clock: ManualClock) -> None:
    fired: list[str] = []

    async def expire(operation_id: str) -> None:
        fired.append(operation_id)

    watchdog = Watchdog(clock, expire)
    watchdog.start()
    try:
        watchdog.arm("far", 2_000.0)
        await settle()  # the loop sleeps until 2,000
        watchdog.arm("near", 1_001.0)
        await settle()
        clock.advance(1)
        await settle()
        assert fired == ["near"]
    finally:
        await watchdog.stop()


@pytest.mark.parametrize("asleep_on", [None, 2_000.0], ids=["idle", "asleep_on_a_later_one"])
@pytest.mark.parametrize("passes", range(8))
async def test_a_deadline_fires_once_the_clock_reaches_it_however_many_loop_passes_came_first(
    clock: ManualClock, asleep_on: float | None, passes: int
) -> None:
    # A test moves the clock after a step of its own, which takes a number of loop passes no
    # test should count. Whatever the watchdog was doing when the clock moved (waiting for a
    # deadline, woken by this one, about to start its sleeper, asleep until this deadline),
    # it fires, and leaves no sleeper on the clock waiting past it.
    fired: list[str] = []

    async def expire(operation_id: str) -> None:
        fired.append(operation_id)

    watchdog = Watchdog(clock, expire)
    watchdog.start()
    try:
        if asleep_on is not None:
            watchdog.arm("later", asleep_on)
        await settle()
        watchdog.arm("due", 1_060.0)
        for _ in range(passes):
            await asyncio.sleep(0)
        clock.advance(60)
        await eventually(
            lambda: fired or clock.sleepers > (asleep_on is not None),
            what="the expiry, or the watchdog asleep past the deadline",
        )
        assert fired == ["due"], "the watchdog went to sleep past a deadline the clock reached"
    finally:
        await watchdog.stop()


async def test_a_failed_expiry_is_applied_again_with_backoff_until_it_succeeds(
    clock: ManualClock,
) -> None:
    attempts: list[float] = []

    async def expire(operation_id: str) -> None:
        attempts.append(clock.now())
        if len(attempts) < 3:
            raise RuntimeError("the ledger is down")

    watchdog = Watchdog(clock, expire, retry=WriteRetry(initial_secs=1.0, max_secs=4.0))
    watchdog.start()
    try:
        watchdog.arm("op", 1_000.0)
        await settle()
        for _ in range(4):
            clock.advance(1)
            await settle()
        assert attempts == [1_000.0, 1_001.0, 1_003.0]  # pauses of 1 s, then 2 s
        assert watchdog.pending == 0
    finally:
        await watchdog.stop()


@pytest.mark.parametrize(
    ("status", "moved_to"),
    [
        (S.AWAITING_CONFIRMATION, S.EXPIRED),
        (S.AWAITING_APPROVAL, S.EXPIRED),
        (S.ADMITTED, S.FAILED_FINAL),
        (S.FAILED_RETRYABLE, S.FAILED_FINAL),
        (S.RUNNING, S.UNKNOWN),
        (S.CANCEL_REQUESTED, S.UNKNOWN),
        (S.UNKNOWN, None),
        (S.COMMITTED, None),
        (S.COMPENSATED, None),
    ],
)
def test_a_deadline_never_claims_more_than_the_status_allows(
    status: ActionStatus, moved_to: ActionStatus | None
) -> None:
    rule = expiry_rule(status)
    assert (rule[0] if rule else None) is moved_to


@dataclass
class Op:
    """The fields of an operation the expiry rule reads."""

    operation_id: str
    status: ActionStatus
    deadline_at: float | None
    fence: int = 1


@dataclass
class FakeLedger:
    """Holds operations; a scripted status change can land between a read and a write."""

    ops: dict[str, Op]
    moves_before_write: list[ActionStatus] = field(default_factory=list)
    writes: list[tuple[str, ActionStatus, ActionStatus]] = field(default_factory=list)

    async def get(self, operation_id: str) -> Op:
        return self.ops[operation_id]

    async def transition(
        self, operation_id: str, *, expected: ActionStatus, to: ActionStatus, **_: Any
    ) -> Op:
        op = self.ops[operation_id]
        if self.moves_before_write:  # another writer got there first
            op.status = self.moves_before_write.pop(0)
        if op.status is not expected:
            raise UnexpectedStatus(
                operation_id=operation_id, expected_status=expected, actual_status=op.status
            )
        self.writes.append((operation_id, expected, to))
        self.ops[operation_id] = moved = replace(op, status=to)
        return moved


@dataclass
class Owned:
    """The operations this process owns, recording what the expiry rule asks of them."""

    tracked: dict[str, Any] = field(default_factory=dict)
    finished: list[tuple[str, ActionStatus]] = field(default_factory=list)
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)

    def get(self, operation_id: str) -> Any:
        return self.tracked.get(operation_id)

    def finish(self, tracked: Any, final: Any) -> None:
        self.finished.append((tracked.operation_id, final.status))

    def spawn(self, coroutine: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coroutine)
        self.tasks.append(task)
        return task


@dataclass
class Held:
    """A `Tracked` as far as expiry uses it."""

    operation_id: str
    fence: int = 1
    takeover: asyncio.Event = field(default_factory=asyncio.Event)
    effect_task: asyncio.Task[Any] | None = None


def expiry(ledger: FakeLedger, owned: Owned, clock: ManualClock, **kwargs: Any) -> Expiry:
    async def reconcile(op: Any, tracked: Any) -> Any:
        return replace(op, status=S.COMMITTED)  # the system of record had it

    parts: dict[str, Any] = {"stop_read": lambda _: False, "reconcile": reconcile, **kwargs}
    return Expiry(ledger, owned, now=clock.now, **parts)  # type: ignore[arg-type]


async def test_a_deadline_the_ledger_moved_later_does_nothing_now(clock: ManualClock) -> None:
    ledger = FakeLedger({"op": Op("op", S.AWAITING_APPROVAL, deadline_at=1_500.0)})
    await expiry(ledger, Owned(), clock).expire("op")
    assert ledger.writes == []


async def test_a_status_that_moved_between_read_and_write_gets_the_rule_of_its_new_status(
    clock: ManualClock,
) -> None:
    ledger = FakeLedger(
        {"op": Op("op", S.ADMITTED, deadline_at=999.0)}, moves_before_write=[S.RUNNING]
    )
    await expiry(ledger, Owned(), clock).expire("op")
    # ADMITTED would have been "not sent"; it started meanwhile, so it may have been sent.
    assert ledger.writes == [("op", S.RUNNING, S.UNKNOWN)]


async def test_an_owned_running_operation_is_taken_over_and_reconciled_not_called_failed(
    clock: ManualClock,
) -> None:
    effect = asyncio.get_running_loop().create_task(asyncio.Event().wait())
    held = Held("op", effect_task=effect)
    owned = Owned(tracked={"op": held})
    ledger = FakeLedger({"op": Op("op", S.RUNNING, deadline_at=1_000.0)})
    await expiry(ledger, owned, clock).expire("op")
    await asyncio.gather(*owned.tasks)
    assert held.takeover.is_set()
    assert effect.cancelled()
    assert owned.finished == [("op", S.COMMITTED)]  # what reconciliation found, not a guess


async def test_an_owned_unsent_operation_is_finished_as_failed_without_reconciling(
    clock: ManualClock,
) -> None:
    held = Held("op")
    owned = Owned(tracked={"op": held})
    ledger = FakeLedger({"op": Op("op", S.ADMITTED, deadline_at=1_000.0)})
    await expiry(ledger, owned, clock).expire("op")
    assert owned.tasks == []
    assert owned.finished == [("op", S.FAILED_FINAL)]


async def test_a_running_read_is_stopped_and_the_ledger_left_alone(clock: ManualClock) -> None:
    stopped: list[str] = []

    def stop_read(operation_id: str) -> bool:
        stopped.append(operation_id)
        return True

    ledger = FakeLedger({"op": Op("op", S.RUNNING, deadline_at=1_000.0)})
    await expiry(ledger, Owned(), clock, stop_read=stop_read).expire("op")
    assert stopped == ["op"]
    assert ledger.writes == []
