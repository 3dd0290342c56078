"""Time sources. Admission, execution and the ledger read time only through a `Clock`."""

from __future__ import annotations

__all__ = ["Clock", "ManualClock", "SystemClock"]

import time
from typing import Protocol, runtime_checkable


@runtime_checkable
class Clock(Protocol):
    """A source of wall-clock time."""

    def now(self) -> float:
        """Return the current time in seconds since the Unix epoch (UTC)."""
        ...


class SystemClock:
    """The real wall clock (`time.time`)."""

    def now(self) -> float:
        """Return ``time.time()``."""
        return time.time()


class ManualClock:
    """A clock that moves only when told to, for tests and replayed scenarios.

    Args:
        start: The initial time in epoch seconds.
    """

    def __init__(self, start: float = 1_800_000_000.0) -> None:
        self._now = float(start)

    def now(self) -> float:
        """Return the current manual time."""
        return self._now

    def advance(self, secs: float) -> float:
        """Move the clock forward by ``secs`` (never backwards) and return the new time."""
        if secs < 0:
            raise ValueError(f"a clock cannot go back (advance by {secs})")
        self._now += secs
        return self._now

    def set(self, now: float) -> None:
        """Jump to ``now``, which may not be earlier than the current time."""
        if now < self._now:
            raise ValueError(f"a clock cannot go back ({now} < {self._now})")
        self._now = float(now)
