"""Live pages: what they show is read every ``poll_secs``, and a change is a new version.

`Changes` watches the ledger; the ``/events`` route (`pipecat_actions.console.routes.pages`)
tells each open page when a new version is there, and the page fetches its fragments again.
"""

from __future__ import annotations

__all__ = ["Changes"]

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from typing import Any

from loguru import logger

from pipecat_actions.errors import PipecatActionsError


class Changes:
    """What the pages show, read every ``poll_secs``; a new version when it changed."""

    def __init__(self, read: Callable[[], Awaitable[Any]], poll_secs: float) -> None:
        self._read = read
        self._poll_secs = poll_secs
        self.version = 0
        self._changed = asyncio.Condition()
        self._task: asyncio.Task[None] | None = None
        self.stopped = False

    def start(self) -> None:
        """Start watching (in the running loop)."""
        self._task = asyncio.ensure_future(self._watch())

    async def stop(self) -> None:
        """Stop watching, and wake every waiter."""
        self.stopped = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        async with self._changed:
            self._changed.notify_all()

    async def _watch(self) -> None:
        seen: Any = None
        failing = False
        while True:
            try:
                now = await self._read()
                if failing:
                    logger.info("console: the ledger can be read again")
                failing = False
            except PipecatActionsError as exc:
                if not failing:
                    logger.warning("console: reading the ledger failed: {}", exc)
                failing = True
                now = seen
            except Exception:  # live updates go on after any failure
                if not failing:
                    logger.opt(exception=True).error("console: watching the ledger failed")
                failing = True
                now = seen
            if now != seen:
                seen = now
                async with self._changed:
                    self.version += 1
                    self._changed.notify_all()
            await asyncio.sleep(self._poll_secs)

    async def after(self, version: int, within_secs: float) -> int:
        """Wait until the version is past ``version`` (or ``within_secs``); return it."""
        async with self._changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(
                    self._changed.wait_for(lambda: self.version > version or self.stopped),
                    within_secs,
                )
            return self.version
