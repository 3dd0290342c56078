"""`Operations`: the one registry of what this process tracks about the operations it runs.

Every part of the runtime is built with it instead of sharing private attributes: it holds the
`Tracked` record of each operation this process owns, which operation each Pipecat tool call
became, the listeners told about outcomes, and the runtime's own tasks. Its verbs are the ones
every part needs: ``track`` an operation, ``move`` it under its owner's fence, ``finish`` it
(tell its waiters and listeners), ``wait`` for it, and ``spawn`` a task closing will wait for.

Memory stays flat however long the process runs: an operation leaves the registry once the
ledger holds its outcome (terminal, or UNKNOWN and escalated to a person); from then on it is
read from the ledger. The map of Pipecat tool calls keeps the most recent `RECENT_CALLS`.
"""

from __future__ import annotations

__all__ = ["RECENT_CALLS", "RECENT_TOLD", "Listener", "Operations"]

import asyncio
from collections import Counter, OrderedDict
from collections.abc import Callable, Coroutine, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from loguru import logger

from pipecat_actions._recent import remember
from pipecat_actions._shelter import Shelter
from pipecat_actions.admission.limits import Slot
from pipecat_actions.errors import TransitionRefused
from pipecat_actions.execution.tracked import Tracked
from pipecat_actions.execution.watchdog import Watchdog
from pipecat_actions.ledger import Ledger, Operation
from pipecat_actions.status import TERMINAL_STATUSES, ActionStatus

Listener = Callable[[Operation], None]
"""Called with an operation of the session it listens to, each time it gets an outcome."""

RECENT_CALLS = 10_000
"""How many tool call → operation links are kept (a call is looked up while it is answered)."""
RECENT_TOLD = 1_024
"""How many operations answered to a call are kept as answered, for the delivery record."""


class Operations:
    """The operations this process tracks, with the tasks and listeners around them.

    Args:
        ledger: Where moves are written, and where an operation not tracked here is read.
        watchdog: Disarmed for an operation once it has an outcome.
        actor: Recorded on every move (``runtime:<owner>``).
    """

    def __init__(self, ledger: Ledger, watchdog: Watchdog, *, actor: str) -> None:
        self._ledger = ledger
        self._watchdog = watchdog
        self._actor = actor
        self._tracked: dict[str, Tracked] = {}
        self._calls: OrderedDict[str, str] = OrderedDict()
        self._first_noted: OrderedDict[str, int] = OrderedDict()
        self._answered: OrderedDict[tuple[str, str], Operation] = OrderedDict()
        self._answering: Counter[tuple[str, str]] = Counter()
        self._notes = 0
        self._listeners: dict[str, list[Listener]] = {}
        self._watchers: list[Listener] = []
        self._tasks: set[asyncio.Task[Any]] = set()
        self._audits: set[asyncio.Future[Any]] = set()
        self._shelters: dict[asyncio.Task[Any], Shelter] = {}
        self._closing = False

    # --- tracking --------------------------------------------------------------------------

    def track(self, tracked: Tracked, slot: Slot | None = None) -> None:
        """Track ``tracked``; its limiter ``slot``, if any, is released when it finishes."""
        self._tracked[tracked.operation_id] = tracked
        if slot is not None:
            tracked.on_finish.append(slot.release)

    def get(self, operation_id: str) -> Tracked | None:
        """Return what is kept about ``operation_id``, if this process tracks it."""
        return self._tracked.get(operation_id)

    def note_call(self, tool_call_id: str, operation_id: str) -> None:
        """Remember that the Pipecat call ``tool_call_id`` was admitted as (or joined) it."""
        remember(self._calls, tool_call_id, operation_id, keep=RECENT_CALLS)
        self._notes += 1
        if operation_id not in self._first_noted:
            self._first_noted[operation_id] = self._notes
            if len(self._first_noted) > RECENT_CALLS:
                self._first_noted.popitem(last=False)

    def begin_answer(self, session_id: str, operation_id: str) -> None:
        """A call of ``session_id`` will answer with ``operation_id``'s outcome, in place.

        From when admission joins the call to the operation (or ``confirm_action`` releases
        it) until `end_answer`: that conversation's delivery leaves the outcome to the call's
        answer, which `note_answered` then records.
        """
        self._answering[(session_id, operation_id)] += 1

    def end_answer(self, session_id: str, operation_id: str) -> None:
        """The call `begin_answer` announced was answered, or stopped."""
        key = (session_id, operation_id)
        self._answering[key] -= 1
        if self._answering[key] <= 0:
            del self._answering[key]

    @contextmanager
    def answering(self, session_id: str, operation_id: str) -> Iterator[None]:
        """`begin_answer` ... `end_answer` around a block."""
        self.begin_answer(session_id, operation_id)
        try:
            yield
        finally:
            self.end_answer(session_id, operation_id)

    def is_answering(self, session_id: str, operation_id: str) -> bool:
        """Whether a call of ``session_id`` is to answer with ``operation_id``'s outcome."""
        return (session_id, operation_id) in self._answering

    def note_answered(self, op: Operation, session_id: str) -> None:
        """A call of ``session_id`` was answered from ``op``: what it is told there, in place."""
        remember(self._answered, (session_id, op.operation_id), op, keep=RECENT_TOLD)

    def answered(self, operation_id: str, session_id: str) -> Operation | None:
        """The record a call of ``session_id`` was last answered with, if still kept.

        The delivery record is made from it, not from a read of the ledger: it is what the
        conversation was told, even if the operation has moved on since. Per session: a call
        of another conversation (a duplicate of the same caller's) tells nothing here.
        """
        return self._answered.get((session_id, operation_id))

    @property
    def call_mark(self) -> int:
        """A mark in the order calls were noted here: `noted_after` compares with it."""
        return self._notes

    def noted_after(self, operation_id: str, mark: int) -> bool:
        """Whether a call first became ``operation_id`` here after ``mark`` was taken."""
        return self._first_noted.get(operation_id, 0) > mark

    def __len__(self) -> int:
        """How many operations the registry holds now."""
        return len(self._tracked)

    def waiting(self) -> list[Tracked]:
        """The operations tracked here that have no outcome yet (running or waiting)."""
        return [tracked for tracked in self._tracked.values() if not tracked.done.done()]

    def unsettled(self) -> list[str]:
        """The operations whose outcome this process could not record (see `Tracked`)."""
        return [op_id for op_id, tracked in self._tracked.items() if tracked.unsettled]

    def operation_for_call(self, tool_call_id: str) -> str | None:
        """Return the operation a Pipecat ``tool_call_id`` was admitted as (or joined), if any."""
        return self._calls.get(tool_call_id)

    # --- outcomes --------------------------------------------------------------------------

    def finish(self, tracked: Tracked, final: Operation) -> None:
        """Tell the waiters of ``tracked`` (once) and its session's listeners its outcome."""
        self._watchdog.disarm(tracked.operation_id)
        for callback in tracked.on_finish:
            callback()
        tracked.on_finish.clear()
        if not tracked.done.done():
            # Waiters get the first truthful outcome: UNKNOWN ends a wait at the deadline.
            tracked.done.set_result(final)
        settled = final.status in TERMINAL_STATUSES or final.escalated_at is not None
        if settled and not tracked.settled.done():
            tracked.settled.set_result(final)
        if settled and not tracked.unsettled and self._tracked.get(final.operation_id) is tracked:
            # The ledger holds the outcome: nothing here needs the record any more (a late
            # answer of the effect still reaches it through the effect's own callback).
            # Gone before listeners hear it: what they do next reads it from the ledger.
            del self._tracked[final.operation_id]
        escalated = final.escalated_at is not None and not tracked.reported_escalated
        if final.status is not tracked.reported or escalated:
            # Listeners (the gate) also hear what reconciliation finds afterwards, and that it
            # was handed to a person (nothing here will look at it again).
            tracked.reported = final.status
            tracked.reported_escalated = final.escalated_at is not None
            for listener in list(self._listeners.get(final.session_id, ())):
                listener(final)
            for watcher in self._watchers:
                watcher(final)

    async def move(
        self,
        op: Operation,
        tracked: Tracked,
        to: ActionStatus,
        reason: str,
        finish: bool = False,
        *,
        error: str | None = None,
        actor: str | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> Operation:
        """Move ``op`` under its owner's fence; if it moved meanwhile, return it as it is now.

        A terminal status records ``error`` (default: ``reason``) as the operation's error.
        With ``finish``, a successful move is told to waiters and listeners (`finish`).
        ``actor`` is who asked (default: this runtime); ``detail`` adds to the audit event.
        """
        try:
            moved = await self._ledger.transition(
                op.operation_id,
                expected=op.status,
                to=to,
                fence=tracked.fence,
                actor=actor or self._actor,
                detail={"reason": reason, **(detail or {})},
                changes={"error": error or reason} if to in TERMINAL_STATUSES else None,
            )
        except TransitionRefused:
            return await self._ledger.get(op.operation_id)
        if finish:
            self.finish(tracked, moved)
        return moved

    async def cancel_not_started(
        self,
        op: Operation,
        tracked: Tracked,
        reason: str,
        *,
        actor: str | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> Operation:
        """Withdraw ``op`` before anything was sent: take it over and move it to CANCELLED."""
        tracked.takeover.set()
        return await self.move(
            op, tracked, ActionStatus.CANCELLED, reason, finish=True, actor=actor, detail=detail
        )

    async def wait(self, operation_id: str, *, settled: bool = False) -> Operation:
        """Wait for the outcome of an operation tracked here; else return its record.

        ``settled``: not the first outcome (UNKNOWN ends that wait) but the one nothing more
        changes here: terminal, or UNKNOWN and handed to a person.
        """
        tracked = self._tracked.get(operation_id)
        if tracked is None:
            return await self._ledger.get(operation_id)
        return await asyncio.shield(tracked.settled if settled else tracked.done)

    def listen(self, session_id: str, listener: Listener) -> None:
        """Call ``listener`` with each operation of ``session_id`` when it gets an outcome."""
        self._listeners.setdefault(session_id, []).append(listener)

    def watch(self, watcher: Listener) -> None:
        """Call ``watcher`` with every operation, of any session, as `listen` does for one.

        For the runtime's own parts (automatic compensation); it must not block or raise.
        """
        self._watchers.append(watcher)

    def unlisten(self, session_id: str, listener: Listener) -> None:
        """Stop calling ``listener``."""
        listeners = self._listeners.get(session_id, [])
        if listener in listeners:
            listeners.remove(listener)
        if not listeners:
            self._listeners.pop(session_id, None)

    # --- tasks -----------------------------------------------------------------------------

    def spawn(
        self, coroutine: Coroutine[Any, Any, Any], *, audit: bool = False
    ) -> asyncio.Task[Any]:
        """Start a task of the runtime; ``audit``: an audit write, awaited by `flush_audits`.

        Closing cancels the other tasks, and waits for audit writes through the flush.
        """
        task = asyncio.get_running_loop().create_task(coroutine)
        if audit:
            self.keep_audit(task)
        else:
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        return task

    def keep_audit(self, write: asyncio.Future[Any]) -> None:
        """Hold ``write``, an audit write started elsewhere, for `flush_audits` to wait for.

        A pipeline records what its conversation was told and heard in tasks of its own
        (`SessionDelivery`), which outlive it until their write returns: the runtime's flush,
        and so its close, waits for them as for its own audit writes, so a runtime closed
        right after a call was answered still records its delivery (else the next pipeline of
        the session would tell it again).
        """
        if not write.done():
            self._audits.add(write)
            write.add_done_callback(self._audits.discard)

    def own(self, shelter: Shelter) -> None:
        """Stop ``shelter``'s task with the runtime's own tasks (its cancel waits for writes).

        For a task that was not spawned here: admission's, which goes on to run what it
        admitted (`Runner.prepare`).
        """
        task = shelter.task
        self._tasks.add(task)
        self._shelters[task] = shelter
        task.add_done_callback(self._forget)

    def _forget(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        self._shelters.pop(task, None)

    async def flush_audits(self) -> None:
        """Wait for the audit writes started so far."""
        if self._audits:
            logger.debug("waiting for {} audit write(s)", len(self._audits))
            await asyncio.gather(*self._audits, return_exceptions=True)

    @property
    def closing(self) -> bool:
        """Whether the runtime is closing: what stops from now on is left to recovery."""
        return self._closing

    def close(self) -> None:
        """Mark the runtime as closing (see `closing`)."""
        self._closing = True

    async def stop(self) -> None:
        """Cancel the runtime's tasks and the effects still running, and wait for the tasks.

        The effects' operations keep their ledger status; the next owner recovers them.
        """
        for task in list(self._tasks):
            shelter = self._shelters.get(task)
            if shelter is not None:
                shelter.cancel()  # once the write it is making, if any, has landed
            else:
                task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for tracked in self._tracked.values():
            if tracked.effect_task is not None and not tracked.effect_task.done():
                tracked.effect_task.cancel()
