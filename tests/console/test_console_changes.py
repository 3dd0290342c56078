"""What pushes live updates: a new version when what the pages show changed, and only then."""

from __future__ import annotations

import asyncio

from pipecat_actions.console.live import Changes as _Changes
from pipecat_actions.errors import LedgerUnavailable
from tests._waiting import guarded


async def test_a_new_version_comes_when_the_pages_would_change_and_a_failing_read_waits() -> None:
    answers: list[object] = ["a", "a", LedgerUnavailable("down"), "a", "b", "b"]
    reads = asyncio.Event()

    async def read() -> object:
        answer = answers.pop(0) if answers else "b"
        if not answers:
            reads.set()
        if isinstance(answer, Exception):
            raise answer
        return answer

    changes = _Changes(read, poll_secs=0.001)
    changes.start()
    try:
        first = await guarded(changes.after(0, within_secs=60), what="the first read")
        await guarded(reads.wait(), what="every answer to be read")
        second = await guarded(changes.after(first, within_secs=60), what="the change to b")
    finally:
        await changes.stop()
    assert (first, second) == (1, 2)  # "a" once (the failure changed nothing), then "b"
    assert changes.version == 2


async def test_stopping_wakes_every_stream_waiting_for_a_change() -> None:
    async def read() -> object:
        return "same"

    changes = _Changes(read, poll_secs=0.001)
    changes.start()
    first = await guarded(changes.after(0, within_secs=60), what="the first read")
    waiting = asyncio.ensure_future(changes.after(first, within_secs=3600))
    await asyncio.sleep(0)
    await changes.stop()
    assert await guarded(waiting, what="the waiter to wake") == first
    assert changes.stopped
