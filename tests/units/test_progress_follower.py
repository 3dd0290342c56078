"""`Progress.follower`: the reports another process records are told once, in order, before the
outcome only (what a durable call's bot hears of its worker's effect).

The follower is given the operation each time its watcher re-reads it; here the test plays the
watcher and the worker, on a real SQLite ledger.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from pipecat_actions.clock import ManualClock
from pipecat_actions.execution.tracked import Tracked
from pipecat_actions.execution.watchdog import Watchdog
from pipecat_actions.ledger import ForwardingLedger, NewOperation, OperationEvent, SqlLedger
from pipecat_actions.runtime._operations import Operations
from pipecat_actions.runtime.progress import Progress, ProgressReport
from pipecat_actions.status import ActionStatus

S = ActionStatus
WORKER = "runtime:dbos-worker:w1"


async def _expire(_operation_id: str) -> None:
    return None


async def test_a_follower_tells_each_new_report_once_in_order_and_none_after_the_outcome(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    ledger = await SqlLedger.create(f"sqlite:///{tmp_path / 'ledger.db'}", clock=clock)
    try:
        admitted = await ledger.admit(
            NewOperation(
                tool="transfer", kind="mutation", args={}, idempotency_key="k1",
                session_id="call-1", principal="alice", status=S.RUNNING,
            )
        )  # fmt: skip
        op = admitted.operation
        operations = Operations(ledger, Watchdog(clock, _expire), actor="runtime:bot")
        tracked: Any = Tracked(
            op.operation_id, None, op.fence, asyncio.get_running_loop().create_future()
        )  # no binding: nothing here runs it
        operations.track(tracked)
        progress = Progress(ledger=ledger, operations=operations, now=clock.now, actor="bot")
        heard: list[ProgressReport] = []
        progress.listen("call-1", heard.append)
        follow = progress.follower(op)

        async def report(message: str, **details: Any) -> None:
            detail: dict[str, Any] = {"progress": message, "attempt": 1}
            if details:
                detail["details"] = details
            await ledger.annotate(op.operation_id, actor=WORKER, detail=detail)

        await report("checking", step=1)
        await ledger.annotate(op.operation_id, actor=WORKER, detail={"cancel_answer": "unknown"})
        await report("sending", step=2)
        await follow(await ledger.get(op.operation_id))
        await follow(await ledger.get(op.operation_id))  # nothing new: nothing told again
        assert [(r.message, dict(r.details)) for r in heard] == [
            ("checking", {"step": 1}),
            ("sending", {"step": 2}),
        ]

        # The watcher read the operation still running; by the time it reads the trail, the
        # outcome is there, and a report that a racing write put after it.
        await report("almost there")
        running = await ledger.get(op.operation_id)
        await ledger.transition(
            op.operation_id, expected=S.RUNNING, to=S.COMMITTED, fence=op.fence, actor=WORKER
        )
        await report("late")
        await follow(running)
        await follow(await ledger.get(op.operation_id))
        assert [r.message for r in heard] == ["checking", "sending", "almost there"]
    finally:
        await ledger.close()


async def test_a_follower_tells_nothing_once_the_outcome_is_known_here(tmp_path: Path) -> None:
    clock = ManualClock()
    ledger = await SqlLedger.create(f"sqlite:///{tmp_path / 'ledger.db'}", clock=clock)
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
        )
        operations.track(tracked)
        progress = Progress(ledger=ledger, operations=operations, now=clock.now, actor="bot")
        heard: list[ProgressReport] = []
        progress.listen("call-1", heard.append)
        follow = progress.follower(op)
        await ledger.annotate(op.operation_id, actor=WORKER, detail={"progress": "checking"})
        operations.finish(tracked, await ledger.get(op.operation_id))  # its outcome came here
        await follow(await ledger.get(op.operation_id))
        assert heard == []
    finally:
        await ledger.close()


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


async def test_a_follower_reads_only_the_events_a_trail_gained_since_it_last_looked(
    tmp_path: Path,
) -> None:
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
        )
        operations.track(tracked)
        progress = Progress(ledger=ledger, operations=operations, now=clock.now, actor="bot")
        heard: list[ProgressReport] = []
        progress.listen("call-1", heard.append)
        follow = progress.follower(op)
        reports = 40
        for n in range(reports):
            await ledger.annotate(op.operation_id, actor=WORKER, detail={"progress": f"step {n}"})
            await follow(await ledger.get(op.operation_id))
    finally:
        await inner.close()

    assert [r.message for r in heard] == [f"step {n}" for n in range(reports)]
    # One new event read per report (the whole trail each time: hundreds, growing with it).
    assert ledger.rows == reports
