"""The state every part of the runtime shares, and the machinery they all use.

Starting and finishing an operation's execution, its deadline (the watchdog's expiry rule),
the listeners told about outcomes, and the runtime's own tasks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, Literal

from pipecat_actions.actions import Binding
from pipecat_actions.admission.authorization import Authorizer
from pipecat_actions.admission.limits import Limiter, Slot
from pipecat_actions.clock import Clock
from pipecat_actions.errors import (
    TransitionRefused,
)
from pipecat_actions.execution.executor import Executor, ReconcileSchedule
from pipecat_actions.execution.tracked import Tracked
from pipecat_actions.execution.watchdog import Watchdog
from pipecat_actions.ledger import (
    Ledger,
    NewOperation,
    Operation,
)
from pipecat_actions.observability.correlation import operation_logger
from pipecat_actions.observability.ledger import ObservedLedger
from pipecat_actions.observability.metrics import ActionMetrics
from pipecat_actions.observability.telemetry import Telemetry
from pipecat_actions.policy import PolicySet
from pipecat_actions.runtime._joins import JoinNotes, SharedWaits
from pipecat_actions.session import SessionState
from pipecat_actions.status import TERMINAL_STATUSES, ActionStatus

S = ActionStatus


class RuntimeBase:
    """State and machinery shared by the parts of `ActionRuntime` (see `core`)."""

    def __init__(
        self,
        *,
        policy: PolicySet,
        ledger: Ledger,
        authorizer: Authorizer,
        clock: Clock,
        owner: str,
        lease_secs: float,
        owns_ledger: bool,
        schedule: ReconcileSchedule | None = None,
    ) -> None:
        self.policy = policy
        self.telemetry = Telemetry()
        # Every write of this process passes the telemetry on its way to the ledger.
        self.ledger: Ledger = ObservedLedger(ledger, self.telemetry)
        self.clock = clock
        self.owner = owner
        self.actor = f"runtime:{owner}"
        self.lease_secs = lease_secs
        self._owns_ledger = owns_ledger
        self._bindings: dict[str, Binding] = {}
        self._tracked: dict[str, Tracked] = {}
        self._sessions: dict[str, SessionState] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._executing: set[str] = set()
        self._reads: dict[str, asyncio.Task[Any]] = {}
        self._expired_reads: set[str] = set()
        self._read_records: list[NewOperation] = []
        self._calls: dict[str, str] = {}
        self._listeners: dict[str, list[Callable[[Operation], None]]] = {}
        self._read_flusher: asyncio.Task[Any] | None = None
        self._audits: set[asyncio.Task[Any]] = set()
        self.limiter = Limiter(clock.now)
        self.executor = Executor(
            self.ledger,
            clock,
            authorizer,
            actor=self.actor,
            schedule=schedule,
            telemetry=self.telemetry,
        )
        self.watchdog = Watchdog(clock, self._expire)
        self._join_notes = JoinNotes(
            self.ledger, actor=self.actor, spawn=lambda c: self._spawn(c, audit=True)
        )
        self._elsewhere = SharedWaits(self.ledger, clock, spawn=self._spawn)
        self._authorizer = authorizer
        self._heartbeat: asyncio.Task[None] | None = None
        self._closed = False
        self.recover_unsent: Literal["run", "fail"] = "run"

    @property
    def metrics(self) -> ActionMetrics:
        """This process's metrics per tool; ``runtime.metrics.snapshot()`` reads them."""
        return self.telemetry.metrics

    @property
    def bindings(self) -> Mapping[str, Binding]:
        """The registered actions with their policies, by tool name."""
        return self._bindings

    def _track(self, tracked: Tracked, slot: Slot | None) -> None:
        self._tracked[tracked.operation_id] = tracked
        if slot is not None:
            tracked.on_finish.append(slot.release)

    async def _execute(
        self,
        op: Operation,
        tracked: Tracked,
        *,
        session: SessionState | None = None,
        wait_generation: int | None = None,
        stage: str = "admission",
        take_slot: bool = False,
    ) -> None:
        final = op
        self._executing.add(op.operation_id)
        try:
            if take_slot:
                policy = tracked.binding.policy
                slot = await self.limiter.wait_for_slot(op.tool, policy, op.principal)
                tracked.on_finish.append(slot.release)
            if wait_generation is not None and session is not None:
                settled = await self._wait_generation(session, wait_generation, tracked)
                if not settled:
                    await self._cancel_not_started(
                        op, tracked, "the user interrupted the reply that proposed it"
                    )
                    final = await self.ledger.get(op.operation_id)
                    return
            final = await self.executor.run(op, tracked, stage=stage)
        except Exception as exc:
            if self._closed:
                # Stopped mid-flight: the ledger keeps the last status written; the next owner
                # of the lease recovers the operation.
                operation_logger(op).info("operation {} left to recovery: {}", op.operation_id, exc)
                return
            operation_logger(op).exception(
                "operation {}: execution failed: {}", op.operation_id, exc
            )
            final = await self.ledger.get(op.operation_id)
        finally:
            self._executing.discard(op.operation_id)
            if final.status in TERMINAL_STATUSES or final.status is S.UNKNOWN:
                self._finish(tracked, final)

    async def _wait_generation(
        self, session: SessionState, generation: int, tracked: Tracked
    ) -> bool:
        outcome = asyncio.ensure_future(session.wait_generation_outcome(generation))
        takeover = asyncio.ensure_future(tracked.takeover.wait())
        try:
            await asyncio.wait({outcome, takeover}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            takeover.cancel()
            if not outcome.done():
                outcome.cancel()
        return outcome.done() and not outcome.cancelled() and outcome.result()

    def _finish(self, tracked: Tracked, final: Operation) -> None:
        self.watchdog.disarm(tracked.operation_id)
        for callback in tracked.on_finish:
            callback()
        tracked.on_finish.clear()
        if not tracked.done.done():
            # Waiters get the first truthful outcome: UNKNOWN ends a wait at the deadline.
            tracked.done.set_result(final)
        if final.status is not tracked.reported:
            # Listeners (the gate) also hear what reconciliation finds afterwards.
            tracked.reported = final.status
            for listener in list(self._listeners.get(final.session_id, ())):
                listener(final)

    def operation_for_call(self, tool_call_id: str) -> str | None:
        """Return the operation a Pipecat ``tool_call_id`` was admitted as (or joined), if any."""
        return self._calls.get(tool_call_id)

    def listen(self, session_id: str, listener: Callable[[Operation], None]) -> None:
        """Call ``listener`` with each operation of ``session_id`` when it gets an outcome."""
        self._listeners.setdefault(session_id, []).append(listener)

    def unlisten(self, session_id: str, listener: Callable[[Operation], None]) -> None:
        """Stop calling ``listener``."""
        listeners = self._listeners.get(session_id, [])
        if listener in listeners:
            listeners.remove(listener)

    def _spawn(self, coroutine: Any, *, audit: bool = False) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coroutine)
        tasks = self._audits if audit else self._tasks
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        return task

    async def wait(self, operation_id: str) -> Operation:
        """Wait for the outcome of an operation this runtime runs; else return its record."""
        tracked = self._tracked.get(operation_id)
        if tracked is None:
            return await self.ledger.get(operation_id)
        return await asyncio.shield(tracked.done)

    async def _expire(self, operation_id: str) -> None:
        read = self._reads.get(operation_id)
        if read is not None:
            self._expired_reads.add(operation_id)
            read.cancel()
            return
        op = await self.ledger.get(operation_id)
        tracked = self._tracked.get(operation_id)
        fence = tracked.fence if tracked else op.fence
        moved = None
        for _ in range(3):
            # The status may change between the read and the write (an attempt starting):
            # read again and apply the rule for the new status, so no deadline is lost.
            if op.status in TERMINAL_STATUSES:
                return
            if op.status in (S.AWAITING_APPROVAL, S.AWAITING_CONFIRMATION):
                to, why = S.EXPIRED, "not confirmed or approved in time"
            elif op.status in (S.ADMITTED, S.FAILED_RETRYABLE):
                to, why = S.FAILED_FINAL, "deadline passed before it could be sent"
            elif op.status in (S.RUNNING, S.CANCEL_REQUESTED):
                to, why = S.UNKNOWN, "deadline passed while it may have been sent"
            else:
                return
            try:
                moved = await self.ledger.transition(
                    operation_id,
                    expected=op.status,
                    to=to,
                    fence=fence,
                    actor="watchdog",
                    detail={"reason": why, "deadline_at": op.deadline_at},
                    changes={"error": f"deadline: {why}"},
                )
                break
            except TransitionRefused:
                op = await self.ledger.get(operation_id)
        if moved is None:
            return
        if tracked is None:
            return
        tracked.takeover.set()
        if tracked.effect_task is not None and not tracked.effect_task.done():
            tracked.effect_task.cancel()
        if moved.status is S.UNKNOWN:
            self._spawn(self._reconcile_and_finish(moved, tracked))
        else:
            self._finish(tracked, moved)

    async def _reconcile_and_finish(self, op: Operation, tracked: Tracked) -> None:
        final = await self.executor.reconcile(op, tracked)
        self._finish(tracked, final)

    async def _cancel_not_started(self, op: Operation, tracked: Tracked, reason: str) -> Operation:
        tracked.takeover.set()
        return await self._move(op, tracked, S.CANCELLED, reason, finish=True)

    async def _move(
        self,
        op: Operation,
        tracked: Tracked,
        to: ActionStatus,
        reason: str,
        finish: bool = False,
        *,
        error: str | None = None,
    ) -> Operation:
        """Move ``op`` under its owner's fence; if it moved meanwhile, return it as it is now.

        A terminal status records ``error`` (default: ``reason``) as the operation's error.
        """
        try:
            moved = await self.ledger.transition(
                op.operation_id,
                expected=op.status,
                to=to,
                fence=tracked.fence,
                actor=self.actor,
                detail={"reason": reason},
                changes={"error": error or reason} if to in TERMINAL_STATUSES else None,
            )
        except TransitionRefused:
            return await self.ledger.get(op.operation_id)
        if finish:
            self._finish(tracked, moved)
        return moved

    def _deadline_for(self, operation_id: str) -> float:
        tracked = self._tracked.get(operation_id)
        return tracked.binding.policy.deadline_secs if tracked else 30.0

    def _deadline(self, tool: str) -> float:
        policy = self.policy.get(tool)
        return policy.deadline_secs if policy is not None else 30.0
