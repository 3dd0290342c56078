"""`ManualClock` and `sleep_from_now`: a sleep's wake time never depends on loop passes.

A wait raced against an event runs in a task of its own, whose first step comes a loop pass or
more after the wait was decided. A test that moves the clock in between must see the wait end
on time, however many passes the code under test took before the test's step.
"""

from __future__ import annotations

import asyncio

import pytest

from pipecat_actions.clock import ManualClock, sleep_from_now
from tests._waiting import eventually


class AsyncSleepClock(ManualClock):
    """A clock whose ``sleep`` is a plain coroutine function: it begins on its first step."""

    def __init__(self, start: float = 0.0) -> None:
        super().__init__(start=start)
        self.asked: list[float] = []

    async def sleep(self, secs: float) -> None:
        self.asked.append(secs)
        await super().sleep(secs)


async def ended_or_asleep(clock: ManualClock, waiting: asyncio.Future[None]) -> None:
    """Wait until ``waiting`` ended or sleeps on ``clock`` (one or the other comes at once)."""
    await eventually(lambda: waiting.done() or clock.sleepers, what="the sleep to end or begin")


async def test_a_sleep_handed_to_a_task_counts_from_the_call_not_from_its_first_step() -> None:
    clock = ManualClock(start=0.0)
    sleeping = asyncio.ensure_future(clock.sleep(10))
    clock.advance(10)  # before the task's first step
    await ended_or_asleep(clock, sleeping)
    assert sleeping.done(), "the sleep began when its task started, 10 s too late"
    assert clock.sleepers == 0


async def test_a_sleep_still_waits_its_whole_time() -> None:
    clock = ManualClock(start=0.0)
    sleeping = asyncio.ensure_future(clock.sleep(10))
    clock.advance(4)
    await ended_or_asleep(clock, sleeping)
    assert not sleeping.done() and clock.sleepers == 1
    clock.advance(5.5)
    await asyncio.sleep(0)
    assert not sleeping.done()
    clock.advance(0.5)
    await ended_or_asleep(clock, sleeping)
    assert sleeping.done() and clock.sleepers == 0


@pytest.mark.parametrize("moved_secs", [0.0, 4.0, 10.0, 15.0])
async def test_sleep_from_now_counts_from_the_call_whatever_the_clock(
    moved_secs: float,
) -> None:
    clock = AsyncSleepClock()
    waiting = asyncio.ensure_future(sleep_from_now(clock, 10))
    clock.advance(moved_secs)  # before the wait's first step
    await ended_or_asleep(clock, waiting)
    assert clock.asked == [max(0.0, 10 - moved_secs)]
    if moved_secs < 10:
        assert not waiting.done()
        clock.advance(10 - moved_secs)
        await ended_or_asleep(clock, waiting)
    assert waiting.done() and clock.sleepers == 0


async def test_sleep_from_now_asks_for_exactly_its_pause_when_the_clock_has_not_moved() -> None:
    clock = AsyncSleepClock(start=1_800_000_000.0)  # where now + 0.3 - now is not 0.3
    waiting = asyncio.ensure_future(sleep_from_now(clock, 0.3))
    await ended_or_asleep(clock, waiting)
    assert clock.asked == [0.3]
    waiting.cancel()


async def test_a_cancelled_sleep_leaves_the_clock() -> None:
    clock = ManualClock(start=0.0)
    sleeping = asyncio.ensure_future(clock.sleep(10))
    await ended_or_asleep(clock, sleeping)
    assert clock.sleepers == 1
    sleeping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sleeping
    assert clock.sleepers == 0
