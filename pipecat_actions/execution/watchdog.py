"""The watchdog: one task per runtime that enforces the deadlines stored in the ledger.

Pipecat's ``timeout_secs`` only covers the handler coroutine and is disarmed when the handler
returns; a booking handed to a background task, or an effect that hangs after sending, has no
bound there. The watchdog covers the whole span from admission to outcome: every deadline is
armed when an operation is admitted (and re-armed from the ledger after a restart), kept in a
heap, and slept on until the earliest one is due. What happens at expiry is the ``on_expiry``
callback: in the runtime, `Expiry` (`pipecat_actions.execution.expiry`), which never claims a
cancellation.

A deadline is dropped only once its handler succeeded: when the handler fails (the ledger is
down, say), the deadline is armed again a moment later, with backoff, until it is applied.
"""

from __future__ import annotations

__all__ = ["Watchdog"]

import asyncio
import heapq
import itertools
from collections.abc import Awaitable, Callable

from loguru import logger

from pipecat_actions.clock import Clock, sleep_from_now
from pipecat_actions.execution.durable import WriteRetry


class Watchdog:
    """Calls ``on_expiry(operation_id)`` once each armed deadline is due.

    Args:
        clock: The time source and sleeper.
        on_expiry: Called in a task of its own for each due deadline (slow handling of one
            expiry never delays the next).
        retry: The backoff before a deadline whose handler failed is applied again (default
            0.25 s, doubling up to 5 s).
    """

    def __init__(
        self,
        clock: Clock,
        on_expiry: Callable[[str], Awaitable[None]],
        *,
        retry: WriteRetry | None = None,
    ) -> None:
        self._clock = clock
        self._on_expiry = on_expiry
        self._retry = retry or WriteRetry(initial_secs=0.25, max_secs=5.0)
        self._failures: dict[str, int] = {}
        self._heap: list[tuple[float, int, str]] = []
        self._armed: dict[str, float] = {}
        self._order = itertools.count()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._handlers: set[asyncio.Task[None]] = set()
        self._sleeping_until = float("-inf")
        self.lateness_secs: list[float] = []
        """How late each expiry fired (clock time), for the benchmark."""

    def arm(self, operation_id: str, deadline_at: float) -> None:
        """Arm (or move) the deadline of an operation."""
        self._armed[operation_id] = deadline_at
        heapq.heappush(self._heap, (deadline_at, next(self._order), operation_id))
        # Wake the loop only when this deadline comes before the one it sleeps until: arming a
        # later deadline (the common case) costs a heap push and nothing else.
        if deadline_at < self._sleeping_until:
            self._wake.set()

    def disarm(self, operation_id: str) -> None:
        """Forget the deadline of an operation that has an outcome."""
        self._armed.pop(operation_id, None)
        self._failures.pop(operation_id, None)
        if len(self._heap) > 2 * len(self._armed) + 1024:
            # Disarmed entries leave the heap lazily (when they reach its top); when most
            # operations end long before their deadline they would pile up: rebuild it.
            self._heap = [entry for entry in self._heap if self._armed.get(entry[2]) == entry[0]]
            heapq.heapify(self._heap)

    @property
    def pending(self) -> int:
        """How many deadlines are armed."""
        return len(self._armed)

    def start(self) -> None:
        """Start the watchdog task."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._loop(), name="pipecat_actions.watchdog"
            )

    async def stop(self) -> None:
        """Stop the task and wait for expiry handlers already started."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._handlers:
            await asyncio.gather(*self._handlers, return_exceptions=True)

    async def _loop(self) -> None:
        while True:
            self._drop_disarmed()
            if not self._heap:
                self._wake.clear()
                self._sleeping_until = float("inf")
                await self._wake.wait()
                self._sleeping_until = float("-inf")
                continue
            deadline_at, _, operation_id = self._heap[0]
            delay = deadline_at - self._clock.now()
            if delay > 0:
                self._wake.clear()
                self._sleeping_until = deadline_at
                # ``delay`` counted from now: the sleeper's task takes its first step a loop
                # pass or more later, and the clock may have moved by then.
                sleeper = asyncio.ensure_future(sleep_from_now(self._clock, delay))
                woken = asyncio.ensure_future(self._wake.wait())
                try:
                    await asyncio.wait({sleeper, woken}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    sleeper.cancel()
                    woken.cancel()
                    self._sleeping_until = float("-inf")
                continue
            heapq.heappop(self._heap)
            if self._armed.get(operation_id) != deadline_at:
                continue
            del self._armed[operation_id]
            self.lateness_secs.append(self._clock.now() - deadline_at)
            task = asyncio.get_running_loop().create_task(self._expire(operation_id))
            self._handlers.add(task)
            task.add_done_callback(self._handlers.discard)

    def _drop_disarmed(self) -> None:
        while self._heap and self._armed.get(self._heap[0][2]) != self._heap[0][0]:
            heapq.heappop(self._heap)

    async def _expire(self, operation_id: str) -> None:
        try:
            await self._on_expiry(operation_id)
        except Exception as exc:  # one failed expiry must not stop the others
            failures = self._failures.get(operation_id, 0) + 1
            self._failures[operation_id] = failures
            pause = self._retry.pause(failures)
            logger.bind(operation_id=operation_id).warning(
                "watchdog: expiry of {} failed ({}); applied again in {:.2f} s",
                operation_id,
                exc,
                pause,
            )
            if operation_id not in self._armed:  # unless re-armed meanwhile
                self.arm(operation_id, self._clock.now() + pause)
        else:
            self._failures.pop(operation_id, None)
