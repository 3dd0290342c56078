"""`Progress.follower`: the reports another process records are told once, in order, before the
outcome only (what a durable call's bot hears of its worker's effect).

The follower is given the operation each time its watcher re-reads it; here the test plays the
watcher and the worker, on a real SQLite ledger.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipecat_actions.clock import ManualClock
from pipecat_actions.execution.tracked import Tracked
from pipecat_actions.execution.watchdog import Watchdog
from pipecat_actions.ledger import (
    ForwardingLedger,
    NewOperation,
    Operation,
    OperationEvent,
    SqlLedger,
)
from pipecat_actions.runtime._operations import Operations
from pipecat_actions.runtime.progress import Progress, ProgressReport
from pipecat_actions.status import ActionStatus

S = ActionStatus
WORKER = "runtime:dbos-worker:w1"


class TrailRows(ForwardingLedger):
    """Counts the events the trail reads return."""

    rows = 0

    async def events(self, operation_id: str) -> list[OperationEvent]:
        found = await self.inner.events(operation_id)
        self.rows += len(found)
        return found

    async def events_after(self, operation_id: str, seq: int) -> list[OperationEvent]:
        found = await self.inner.events_after(operation_id, seq)
        self.rows += len(found)
        return found


@dataclass
class Followed:
    """A running transfer of session call-1 that this process tracks, and its follower."""

    ledger: TrailRows
    op: Operation
    operations: Operations
    tracked: Any
    heard: list[ProgressReport]
    follow: Callable[[Operation], Awaitable[None]]

    async def report(self, message: str, **details: Any) -> None:
        """Record a progress report as the worker does."""
        detail: dict[str, Any] = {"progress": message, "attempt": 1}
        if details:
            detail["details"] = details
        await self.ledger.annotate(self.op.operation_id, actor=WORKER, detail=detail)

    async def look(self) -> None:
        """Re-read the operation as its watcher does, and hand it to the follower."""
        await self.follow(await self.ledger.get(self.op.operation_id))


@asynccontextmanager
async def followed(tmp_path: Path) -> AsyncIterator[Followed]:
    clock = ManualClock()
    inner = await SqlLedger.create(f"sqlite:///{tmp_path / 'ledger.db'}", clock=clock)
    ledger = TrailRows(inner)
    try:
        op = (
            await ledger.admit(
                NewOperation(
                    tool="transfer", kind="mutation", args={}, idempotency_key="k1",
                    session_id="call-1", principal="alice", status=S.RUNNING,
                )
            )
        ).operation  # fmt: skip
        operations = Operations(ledger, Watchdog(clock, _expire), actor="runtime:bot")
        tracked: Any = Tracked(
            op.operation_id, None, op.fence, asyncio.get_running_loop().create_future()
        )  # no binding: nothing here runs it
        operations.track(tracked)
        progress = Progress(ledger=ledger, operations=operations, now=clock.now, actor="bot")
        heard: list[ProgressReport] = []
        progress.listen("call-1", heard.append)
        yield Followed(ledger, op, operations, tracked, heard, progress.follower(op))
    finally:
        await inner.close()


async def _expire(_operation_id: str) -> None:
    return None


async def test_a_follower_tells_each_new_report_once_in_order_and_none_after_the_outcome(
    tmp_path: Path,
) -> None:
    async with followed(tmp_path) as it:
        op = it.op
        await it.report("checking", step=1)
        not_progress = {"cancel_answer": "unknown"}
        await it.ledger.annotate(op.operation_id, actor=WORKER, detail=not_progress)
        await it.report("sending", step=2)
        await it.look()
        await it.look()  # nothing new: nothing told again
        assert [(r.message, dict(r.details)) for r in it.heard] == [
            ("checking", {"step": 1}),
            ("sending", {"step": 2}),
        ]

        # The watcher read the operation still running; by the time it reads the trail, the
        # outcome is there, and a report that a racing write put after it.
        await it.report("almost there")
        running = await it.ledger.get(op.operation_id)
        await it.ledger.transition(
            op.operation_id, expected=S.RUNNING, to=S.COMMITTED, fence=op.fence, actor=WORKER
        )
        await it.report("late")
        await it.follow(running)
        await it.look()
        assert [r.message for r in it.heard] == ["checking", "sending", "almost there"]


async def test_a_follower_tells_nothing_once_the_outcome_is_known_here(tmp_path: Path) -> None:
    async with followed(tmp_path) as it:
        await it.report("checking")
        it.operations.finish(it.tracked, await it.ledger.get(it.op.operation_id))  # it came here
        await it.look()
        assert it.heard == []


async def test_a_follower_reads_only_the_events_a_trail_gained_since_it_last_looked(
    tmp_path: Path,
) -> None:
    reports = 40
    async with followed(tmp_path) as it:
        for n in range(reports):
            await it.report(f"step {n}")
            await it.look()

    assert [r.message for r in it.heard] == [f"step {n}" for n in range(reports)]
    # One new event read per report (the whole trail each time: hundreds, growing with it).
    assert it.ledger.rows == reports
