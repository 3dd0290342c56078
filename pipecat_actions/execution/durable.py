"""Writes that must land: an outcome, once known, is written however long the ledger is down.

An effect's answer exists only in this process's memory until the ledger holds it. When the
write fails because the database cannot be reached (PostgreSQL stopped, a full disk, a pool
exhausted: `LedgerUnavailable`, ``retryable``), giving up would strand the operation RUNNING
with its lease renewed; `until_written` tries the write again, with backoff on the runtime's
clock, until it lands. Meanwhile the caller is answered from memory (`Executor` tells its
``on_unrecorded`` callback) and the operation is marked ``unsettled`` so that the heartbeat
stops renewing its lease: if this process never manages the write, another one claims the
operation once the lease runs out and reconciles it.

An error that trying again cannot fix (`LedgerLost`, an integrity error, a refused transition)
is raised at once.
"""

from __future__ import annotations

__all__ = ["HURRIED_PAUSE_SECS", "WriteRetry", "until_written"]

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

from pipecat_actions.clock import Clock, backoff_secs, sleep_from_now
from pipecat_actions.errors import LedgerError

T = TypeVar("T")

HURRIED_PAUSE_SECS = 0.02
"""The pause between attempts once the runtime closes (``hurry``), in real seconds.

A closing runtime has a grace period of real time to get its outcomes written, whatever its
clock says (a manual clock nobody moves any more): its writes are tried again at this pace
instead of on the clock's backoff."""


@dataclass(frozen=True)
class WriteRetry:
    """How a write that must land is tried again while the ledger is unavailable.

    Attributes:
        initial_secs: The pause after the first failure.
        multiplier: How much each pause grows.
        max_secs: The longest pause (how soon after the database is back the write lands).
    """

    initial_secs: float = 0.1
    multiplier: float = 2.0
    max_secs: float = 2.0

    def pause(self, failures: int) -> float:
        """How long to wait after the ``failures``-th failure in a row (1 for the first)."""
        return backoff_secs(self.initial_secs, self.multiplier, self.max_secs, failures)


async def until_written(
    write: Callable[[], Awaitable[T]],
    *,
    clock: Clock,
    retry: WriteRetry,
    on_failure: Callable[[LedgerError, int], None] | None = None,
    hurry: asyncio.Event | None = None,
) -> T:
    """Await ``write()`` until it succeeds, trying again while its failure is retryable.

    Args:
        write: Makes one attempt; called again after each retryable failure.
        clock: Paces the attempts.
        retry: The backoff.
        on_failure: Told each retryable failure and how many there were so far.
        hurry: Once set (the runtime closes), the next attempt is made at once and the
            following ones every `HURRIED_PAUSE_SECS` of real time.

    Raises:
        LedgerError: A failure that is not retryable (raised at once).
    """
    failures = 0
    while True:
        try:
            return await write()
        except LedgerError as exc:
            if not exc.retryable:
                raise
            failures += 1
            if on_failure is not None:
                on_failure(exc, failures)
        if hurry is not None and hurry.is_set():
            await asyncio.sleep(HURRIED_PAUSE_SECS)
            continue
        await _pause(clock, retry.pause(failures), hurry)


async def _pause(clock: Clock, secs: float, hurry: asyncio.Event | None) -> None:
    """Sleep ``secs`` of ``clock``, or until ``hurry`` is set."""
    if hurry is None:
        await clock.sleep(secs)
        return
    sleeper = asyncio.ensure_future(sleep_from_now(clock, secs))
    hurried = asyncio.ensure_future(hurry.wait())
    try:
        await asyncio.wait({sleeper, hurried}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        sleeper.cancel()
        hurried.cancel()
