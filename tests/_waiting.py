"""Waiting in the tests without racing real time (STYLE.md rule 11).

A test waits for a cause: a condition it polls, a future or task it awaits. Time that matters to
the behaviour (deadlines, backoffs, latency) runs on a `ManualClock` the test moves. The only
real-time limit here is `HANG_GUARD_SECS`: far longer than anything takes on a busy machine, it
turns a hang (a bug) into a clear failure and never decides pass or fail under load.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

HANG_GUARD_SECS = 60.0
"""How long a wait may last before the test calls it a hang (it takes milliseconds)."""

POLL_SECS = 0.005
"""The pause between two looks at a polled condition."""


def hung(what: str | Callable[[], str]) -> AssertionError:
    """The failure of a wait that outlived the hang guard (``what`` may be built only now)."""
    described = what() if callable(what) else what
    return AssertionError(
        f"hung: still waiting for {described} after the {HANG_GUARD_SECS:g} s hang guard"
    )


async def eventually(check: Callable[[], Any], *, what: str | Callable[[], str]) -> None:
    """Poll ``check`` (sync or async) until it is truthy; fail only when the hang guard ends.

    Args:
        check: The condition; a coroutine function is awaited each time.
        what: What is awaited, for the failure message (a callable is asked at the failure,
            so it can tell the last state seen).
    """
    give_up = time.monotonic() + HANG_GUARD_SECS
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return
        if time.monotonic() > give_up:
            raise hung(what)
        await asyncio.sleep(POLL_SECS)


async def guarded(awaitable: Awaitable[T], *, what: str) -> T:
    """Await ``awaitable``; fail (cancelling it) only when the hang guard ends."""
    try:
        return await asyncio.wait_for(awaitable, HANG_GUARD_SECS)
    except TimeoutError:
        raise hung(what) from None
