"""The timeline of a scenario run: steps, ledger writes, deliveries and utterances, in order.

Everything is stamped on the process's monotonic clock, so a causal order ("the booking
committed, then the gate told the model, then the user heard it") can be checked across the
ledger, the pipeline and the transport.
"""

from __future__ import annotations

__all__ = ["DeliveryWatch", "TimelineEntry", "TimelineLedger"]

import re
import time
from dataclasses import dataclass
from typing import Any

from pipecat.frames.frames import FunctionCallResultFrame, LLMMessagesAppendFrame
from pipecat.observers.base_observer import BaseObserver, FramePushed

from pipecat_actions.ledger import (
    AdmitResult,
    ForwardingLedger,
    Ledger,
    NewOperation,
    Operation,
)
from pipecat_actions.processors import ActionResultGate
from pipecat_actions.status import ActionStatus


@dataclass(frozen=True)
class TimelineEntry:
    """One thing that happened, on the process's monotonic clock."""

    at: float
    what: str
    operation_id: str | None = None
    status: ActionStatus | None = None
    delivered: bool = False


class TimelineLedger(ForwardingLedger):
    """A ledger wrapper that notes each write on the timeline once it is committed.

    Args:
        inner: The ledger that stores everything.
        timeline: Where the notes go.
    """

    def __init__(self, inner: Ledger, timeline: list[TimelineEntry]) -> None:
        super().__init__(inner)
        self.timeline = timeline

    async def admit(self, new: NewOperation) -> AdmitResult:
        """Forward; note a new operation."""
        result = await super().admit(new)
        if result.created:
            self._note(result.operation, f"admitted {result.operation.tool}")
        return result

    async def record_refusal(self, new: NewOperation) -> Operation:
        """Forward; note the refusal."""
        op = await super().record_refusal(new)
        self._note(op, f"refused {op.tool}: {op.error}")
        return op

    async def record_completed(self, new: NewOperation) -> Operation:
        """Forward; note the recorded read."""
        op = await super().record_completed(new)
        self._note(op, f"recorded {op.tool}")
        return op

    async def transition(self, operation_id: str, **kwargs: Any) -> Operation:
        """Forward; note the status change."""
        op = await super().transition(operation_id, **kwargs)
        self._note(op, f"{kwargs.get('expected')} -> {op.status} by {kwargs.get('actor')}")
        return op

    async def annotate(self, operation_id: str, **kwargs: Any) -> Operation:
        """Forward; note a recorded delivery, stamped when it was asked for."""
        asked_at = time.monotonic()  # the gate records a delivery right after pushing it
        op = await super().annotate(operation_id, **kwargs)
        if "delivered_at" in (kwargs.get("changes") or {}):
            self.timeline.append(
                TimelineEntry(asked_at, f"{op.operation_id} ({op.tool}) recorded as told")
            )
        return op

    def _note(self, op: Operation, what: str) -> None:
        self.timeline.append(
            TimelineEntry(time.monotonic(), f"{op.operation_id} {what}", op.operation_id, op.status)
        )


_OPERATION_ID = re.compile(r"op_[0-9a-f]{26}")


class DeliveryWatch(BaseObserver):
    """Stamps each operation the gate tells the LLM at the moment the gate pushes it.

    The ledger records a delivery just after the push, by which time the bot may already be
    speaking about it; the push itself is what comes before what the user hears.
    """

    def __init__(self, timeline: list[TimelineEntry]) -> None:
        super().__init__()
        self._timeline = timeline

    async def on_push_frame(self, data: FramePushed) -> None:
        """Note the operations a result or a developer message from the gate tells."""
        if not isinstance(data.source, ActionResultGate):
            return
        frame = data.frame
        if isinstance(frame, FunctionCallResultFrame):
            told = str(frame.result)
        elif isinstance(frame, LLMMessagesAppendFrame):
            told = str(frame.messages)
        else:
            return
        at = time.monotonic()
        for operation_id in dict.fromkeys(_OPERATION_ID.findall(told)):
            self._timeline.append(
                TimelineEntry(at, f"{operation_id} told to the LLM", operation_id, delivered=True)
            )
