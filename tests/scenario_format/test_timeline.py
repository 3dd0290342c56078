"""The scenario timeline orders a ledger write before whatever others did once they saw it."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from pipecat_actions.clock import ManualClock
from pipecat_actions.ledger import ForwardingLedger, Operation, SqlLedger
from pipecat_actions.scenarios.timeline import TimelineEntry, TimelineLedger
from pipecat_actions.status import ActionStatus
from tests.ledger._support import new_op

S = ActionStatus


class SlowToReturn(ForwardingLedger):
    """Commits a transition at once, then keeps its caller waiting until released."""

    def __init__(self, inner: SqlLedger) -> None:
        super().__init__(inner)
        self.committed = asyncio.Event()
        self.release = asyncio.Event()

    async def transition(self, operation_id: str, **kwargs: Any) -> Operation:
        op = await super().transition(operation_id, **kwargs)
        self.committed.set()
        await self.release.wait()  # a loaded machine: the writer resumes late
        return op


async def test_a_status_read_and_told_before_its_write_returns_is_ordered_before_the_telling(
    tmp_path: Path,
) -> None:
    # Seen under load: reconciliation's FAILED_FINAL was read back and told by the delivery
    # service before the writer resumed, so the telling came "before" the status it told.
    inner = await SqlLedger.create(f"sqlite:///{tmp_path / 'ledger.db'}", clock=ManualClock())
    slow = SlowToReturn(inner)
    timeline: list[TimelineEntry] = []
    ledger = TimelineLedger(slow, timeline)
    try:
        op = (await ledger.admit(new_op())).operation
        writer = asyncio.create_task(
            ledger.transition(
                op.operation_id, expected=S.ADMITTED, to=S.RUNNING, fence=op.fence, actor="test"
            )
        )
        await slow.committed.wait()
        seen = await ledger.get(op.operation_id)
        assert seen.status is S.RUNNING
        timeline.append(TimelineEntry(time.monotonic(), "told", op.operation_id, delivered=True))
        slow.release.set()
        await writer

        running = next(e for e in timeline if e.status is S.RUNNING)
        told = next(e for e in timeline if e.delivered)
        assert running.at <= told.at
    finally:
        await inner.close()
