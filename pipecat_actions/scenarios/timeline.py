"""The timeline of a scenario run: steps, ledger writes, deliveries and utterances, in order.

Everything is stamped on the process's monotonic clock, so a causal order ("the booking
committed, then the gate told the model, then the user heard it") can be checked across the
ledger, the pipeline and the transport.
"""

from __future__ import annotations

__all__ = ["DeliveryWatch", "TimelineEntry", "TimelineLedger"]

import asyncio
import builtins
import re
import time
from collections.abc import Awaitable, Collection
from dataclasses import dataclass
from typing import Any, TypeVar

from pipecat.frames.frames import FunctionCallResultFrame, LLMMessagesAppendFrame
from pipecat.observers.base_observer import BaseObserver, FramePushed

from pipecat_actions.adapters import ActionResultGate
from pipecat_actions.ledger import (
    AdmitResult,
    ForwardingLedger,
    Ledger,
    NewOperation,
    Operation,
    OperationEvent,
    OperationFilter,
)
from pipecat_actions.status import TERMINAL_STATUSES, ActionStatus

T = TypeVar("T")


@dataclass(frozen=True)
class TimelineEntry:
    """One thing that happened, on the process's monotonic clock."""

    at: float
    what: str
    operation_id: str | None = None
    status: ActionStatus | None = None
    delivered: bool = False
    told_status: ActionStatus | None = None
    """With ``delivered``: the status a tool result told (None: a developer message)."""


class TimelineLedger(ForwardingLedger):
    """A ledger wrapper that notes each write on the timeline, stamped when it was asked for.

    A write is visible to other readers from its commit, which can be well before its caller
    resumes (a loaded machine): the delivery service may read a new status and tell it first.
    So each write is stamped at the moment it was asked for, which is before anything could
    have seen it; what the write was (created? which status?) is noted once it returns.

    It also counts the calls in flight (`in_flight`, `calls`): the ledger is the only real
    I/O the runtime does in a scenario (the provider and every timer run on the manual
    clock), so with no call in flight and none started for a while, the runtime's work is
    waiting on the clock, on a person or on nothing (see `wait_idle`).

    Args:
        inner: The ledger that stores everything.
        timeline: Where the notes go.
    """

    def __init__(self, inner: Ledger, timeline: list[TimelineEntry]) -> None:
        super().__init__(inner)
        self.timeline = timeline
        self.calls = 0
        """Ledger calls started so far, of every kind."""
        self.in_flight = 0
        """Ledger calls started and not yet returned."""
        self._idle = asyncio.Event()
        self._idle.set()

    async def wait_idle(self) -> None:
        """Return once no ledger call is in flight (at once if none is)."""
        await self._idle.wait()

    async def _counted(self, call: Awaitable[T]) -> T:
        self.calls += 1
        self.in_flight += 1
        self._idle.clear()
        try:
            return await call
        finally:
            self.in_flight -= 1
            if not self.in_flight:
                self._idle.set()

    async def admit(self, new: NewOperation) -> AdmitResult:
        """Forward; note a new operation."""
        asked_at = time.monotonic()
        result = await self._counted(super().admit(new))
        if result.created:
            self._note(asked_at, result.operation, f"admitted {result.operation.tool}")
        return result

    async def record_refusal(self, new: NewOperation) -> Operation:
        """Forward; note the refusal."""
        asked_at = time.monotonic()
        op = await self._counted(super().record_refusal(new))
        self._note(asked_at, op, f"refused {op.tool}: {op.error}")
        return op

    async def record_completed(self, new: NewOperation) -> Operation:
        """Forward; note the recorded read."""
        asked_at = time.monotonic()
        op = await self._counted(super().record_completed(new))
        self._note(asked_at, op, f"recorded {op.tool}")
        return op

    async def transition(self, operation_id: str, **kwargs: Any) -> Operation:
        """Forward; note the status change."""
        asked_at = time.monotonic()
        op = await self._counted(super().transition(operation_id, **kwargs))
        what = f"{kwargs.get('expected')} -> {op.status} by {kwargs.get('actor')}"
        self._note(asked_at, op, what)
        return op

    async def annotate(self, operation_id: str, **kwargs: Any) -> Operation:
        """Forward; note a recorded delivery (the gate records one right after pushing it)."""
        asked_at = time.monotonic()
        op = await self._counted(super().annotate(operation_id, **kwargs))
        if "delivered_at" in (kwargs.get("changes") or {}):
            self.timeline.append(
                TimelineEntry(asked_at, f"{op.operation_id} ({op.tool}) recorded as told")
            )
        return op

    async def get(self, operation_id: str) -> Operation:
        """Forward (counted)."""
        return await self._counted(super().get(operation_id))

    async def find_by_key(self, tenant: str, idempotency_key: str) -> Operation | None:
        """Forward (counted)."""
        return await self._counted(super().find_by_key(tenant, idempotency_key))

    async def list(self, filters: OperationFilter | None = None) -> builtins.list[Operation]:
        """Forward (counted)."""
        return await self._counted(super().list(filters))

    async def events(self, operation_id: str) -> builtins.list[OperationEvent]:
        """Forward (counted)."""
        return await self._counted(super().events(operation_id))

    async def events_after(self, operation_id: str, seq: int) -> builtins.list[OperationEvent]:
        """Forward (counted)."""
        return await self._counted(super().events_after(operation_id, seq))

    async def claim_stale(
        self,
        owner: str,
        *,
        lease_secs: float,
        limit: int,
        except_ids: Collection[str] = (),
        gone: Collection[str] = (),
    ) -> builtins.list[Operation]:
        """Forward (counted)."""
        return await self._counted(
            super().claim_stale(
                owner, lease_secs=lease_secs, limit=limit, except_ids=except_ids, gone=gone
            )
        )

    async def renew_lease(
        self, owner: str, *, lease_secs: float, except_ids: Collection[str] = ()
    ) -> int:
        """Forward (counted)."""
        return await self._counted(
            super().renew_lease(owner, lease_secs=lease_secs, except_ids=except_ids)
        )

    def _note(self, at: float, op: Operation, what: str) -> None:
        self.timeline.append(
            TimelineEntry(at, f"{op.operation_id} {what}", op.operation_id, op.status)
        )


_OPERATION_ID = re.compile(r"op_[0-9a-f]{26}")
_STATUSES = frozenset(status.value for status in ActionStatus)


def told_outcomes(timeline: Collection[TimelineEntry], operation_id: str) -> int:
    """How many tool results told ``operation_id``'s outcome (a terminal status) to the LLM.

    A read has no delivery in the ledger (its answer is the handler's own result, recorded
    after it); what the gate pushed is the record of its telling.
    """
    return sum(
        1
        for entry in timeline
        if entry.operation_id == operation_id
        and entry.delivered
        and entry.told_status in TERMINAL_STATUSES
    )


class DeliveryWatch(BaseObserver):
    """Stamps each operation the gate tells the LLM at the moment the gate pushes it.

    The ledger records a delivery just after the push, by which time the bot may already be
    speaking about it; the push itself is what comes before what the user hears.
    """

    def __init__(self, timeline: list[TimelineEntry], answered: set[str] | None = None) -> None:
        super().__init__()
        self._timeline = timeline
        self._answered = answered if answered is not None else set()
        """The tool_call_id of every call whose result the gate pushed (refusals included)."""

    async def on_push_frame(self, data: FramePushed) -> None:
        """Note the operations a result or a developer message from the gate tells."""
        if not isinstance(data.source, ActionResultGate):
            return
        frame = data.frame
        status: ActionStatus | None = None
        if isinstance(frame, FunctionCallResultFrame):
            self._answered.add(frame.tool_call_id)
            told = str(frame.result)
            said = frame.result.get("status") if isinstance(frame.result, dict) else None
            if isinstance(said, str) and said.upper() in _STATUSES:  # results say "committed"
                status = ActionStatus(said.upper())
        elif isinstance(frame, LLMMessagesAppendFrame):
            told = str(frame.messages)
        else:
            return
        at = time.monotonic()
        for operation_id in dict.fromkeys(_OPERATION_ID.findall(told)):
            self._timeline.append(
                TimelineEntry(
                    at,
                    f"{operation_id} told to the LLM",
                    operation_id,
                    delivered=True,
                    told_status=status,
                )
            )
