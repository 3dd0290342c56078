"""Time sources. Admission, execution and the ledger read time and wait only through a `Clock`."""

from __future__ import annotations

__all__ = ["Clock", "ManualClock", "SystemClock", "backoff_secs", "sleep_from_now"]

import asyncio
import heapq
import itertools
import time
from collections.abc import Coroutine
from typing import Any, Protocol, runtime_checkable


def backoff_secs(initial_secs: float, multiplier: float, max_secs: float, step: int) -> float:
    """The pause before try ``step + 1`` after ``step`` failures: exponential, capped.

    ``min(initial_secs * multiplier ** (step - 1), max_secs)``, without overflow however large
    ``step`` grows. The one backoff formula of the package: a tool's retries
    (`RetryPolicy.delay_for`, which adds jitter), writes that must land (`WriteRetry`), the
    watchdog's re-armed deadlines and reconciliation probes (`ReconcileSchedule`). Each waits
    on its own `Clock`, which is why no retry library drives these loops.

    Args:
        initial_secs: The first pause.
        multiplier: How much each pause grows (1 keeps it constant).
        max_secs: The longest pause.
        step: 1 for the first pause, 2 for the next, and so on.

    Raises:
        ValueError: ``step`` is below 1.
    """
    if step < 1:
        raise ValueError(f"a backoff counts its steps from 1, got {step}")
    try:
        grown = initial_secs * multiplier ** (step - 1)
    except OverflowError:
        return max_secs
    return min(grown, max_secs)


@runtime_checkable
class Clock(Protocol):
    """A source of wall-clock time that can also be waited on."""

    def now(self) -> float:
        """Return the current time in seconds since the Unix epoch (UTC)."""
        ...

    async def sleep(self, secs: float) -> None:
        """Return once ``secs`` seconds of this clock's time have passed."""
        ...


def sleep_from_now(clock: Clock, secs: float) -> Coroutine[Any, Any, None]:
    """Sleep ``secs`` of ``clock`` counted from this call, not from the first step of the wait.

    A wait raced against an event runs in a task of its own, which takes its first step a loop
    pass or more after the call; time that passed in between (a test's `ManualClock.advance`)
    counts towards it whatever the clock, so how many loop passes the caller took never moves
    the wake time. When the clock has not moved, ``clock.sleep`` is asked for ``secs`` exactly.
    """
    return _sleep_rest(clock, secs, clock.now())


async def _sleep_rest(clock: Clock, secs: float, since: float) -> None:
    await clock.sleep(max(0.0, secs - (clock.now() - since)))


class SystemClock:
    """The real wall clock (`time.time`, `asyncio.sleep`)."""

    def now(self) -> float:
        """Return ``time.time()``."""
        return time.time()

    async def sleep(self, secs: float) -> None:
        """Wait ``secs`` real seconds."""
        await asyncio.sleep(max(0.0, secs))


class ManualClock:
    """A clock that moves only when told to, for tests and replayed scenarios.

    Args:
        start: The initial time in epoch seconds.
    """

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = float(start)
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()

    def now(self) -> float:
        """Return the current manual time."""
        return self._now

    def sleep(self, secs: float) -> Coroutine[Any, Any, None]:
        """Wait until the clock reads ``secs`` past the time of this call (yields once if due).

        The wake time is fixed by the call, not by the first step of the coroutine returned: a
        sleep handed to a task of its own (`asyncio.ensure_future`) starts a loop pass or more
        later, and an `advance` made in between counts towards it, as it would for a sleep
        awaited at once.
        """
        return self._until(self._now + secs)

    async def _until(self, due: float) -> None:
        if due <= self._now:
            await asyncio.sleep(0)
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (due, next(self._order), future))
        await future

    @property
    def sleepers(self) -> int:
        """How many `sleep` calls are waiting (from their first step until woken or cancelled)."""
        return sum(1 for *_, f in self._sleepers if not f.done())

    def advance(self, secs: float) -> float:
        """Move the clock forward by ``secs`` (never backwards), wake due sleepers, return now."""
        if secs < 0:
            raise ValueError(f"a clock cannot go back (advance by {secs})")
        self._now += secs
        self._wake()
        return self._now

    def set(self, now: float) -> None:
        """Jump to ``now``, which may not be earlier than the current time."""
        if now < self._now:
            raise ValueError(f"a clock cannot go back ({now} < {self._now})")
        self._now = float(now)
        self._wake()

    def _wake(self) -> None:
        while self._sleepers and self._sleepers[0][0] <= self._now:
            _, _, future = heapq.heappop(self._sleepers)
            if not future.done():
                future.set_result(None)
