"""`Runner`: starting and running the operations this process admitted, released or recovered.

An admitted operation runs in a task of the runtime (never in Pipecat's handler coroutine), under
a deadline the watchdog enforces. A turn-confirmed mutation first waits for the reply that
proposed it to end unbroken; an operation released by a person first takes a limiter slot.
"""

from __future__ import annotations

__all__ = ["DEFAULT_DEADLINE_SECS", "Runner"]

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from loguru import logger

from pipecat_actions.admission.decisions import Admission
from pipecat_actions.admission.limits import Limiter
from pipecat_actions.errors import LedgerError
from pipecat_actions.execution.executor import Executor
from pipecat_actions.execution.tracked import Tracked
from pipecat_actions.execution.watchdog import Watchdog
from pipecat_actions.ledger import Ledger, Operation
from pipecat_actions.observability.correlation import operation_logger
from pipecat_actions.policy import AdmitWhen, PolicySet
from pipecat_actions.runtime._operations import Operations
from pipecat_actions.session import SessionState
from pipecat_actions.status import TERMINAL_STATUSES, ActionStatus

S = ActionStatus

DEFAULT_DEADLINE_SECS = 30.0
"""The deadline of an operation whose tool has no policy loaded here."""

_HANDED = frozenset({S.ADMITTED, S.AWAITING_APPROVAL, S.AWAITING_CONFIRMATION})
"""What a durable operation is admitted as, handed to its workflow (`DurableLedger.admit`)."""


class Runner:
    """Starts operations and drives each to an outcome with the executor.

    Args:
        ledger: Read for the outcome when execution fails.
        policy: The loaded policies (deadlines).
        operations: The registry the operations are tracked and finished in.
        executor: Runs each operation.
        limiter: Slots for operations released after admission.
        watchdog: Armed with each started operation's deadline.
        hands_off: The ledger hands durable operations to DBOS (`pipecat_actions.durable`):
            such an operation is not run here; its outcome, its worker's, is waited for.
        observe: Waits for the outcome of an operation another process settles.
    """

    def __init__(
        self,
        *,
        ledger: Ledger,
        policy: PolicySet,
        operations: Operations,
        executor: Executor,
        limiter: Limiter,
        watchdog: Watchdog,
        hands_off: bool = False,
        observe: Callable[[Operation], Awaitable[Operation]] | None = None,
    ) -> None:
        self._ledger = ledger
        self._policy = policy
        self._operations = operations
        self._executor = executor
        self._limiter = limiter
        self._watchdog = watchdog
        self._executing: dict[str, Tracked] = {}
        self._hands_off = hands_off
        self._observe = observe
        self._handed_ids: set[str] = set()
        """The operations handed to DBOS whose outcome this runner waits for."""

    def deadline_secs(self, tool: str) -> float:
        """How long an operation of ``tool`` may take, from its policy."""
        policy = self._policy.get(tool)
        return policy.deadline_secs if policy is not None else DEFAULT_DEADLINE_SECS

    def is_executing(self, operation_id: str) -> bool:
        """Whether an execution task of this runner drives ``operation_id`` now."""
        return operation_id in self._executing

    def start(self, admission: Admission, session: SessionState) -> Tracked:
        """Track an admitted operation, arm its deadline and, unless it waits, start it."""
        tracked, execution = self.prepare(admission, session)
        if execution is not None:
            with logger.contextualize(operation_id=admission.operation.operation_id):
                # The execution task copies this context: its lines name the operation.
                self._operations.spawn(execution)
        return tracked

    def prepare(
        self, admission: Admission, session: SessionState
    ) -> tuple[Tracked, Coroutine[Any, Any, None] | None]:
        """Track an admitted operation and arm its deadline; return its execution to run.

        The execution (`execute`) is for the caller to run in a task `Operations` stops
        (`start` spawns one; admission runs it in its own task, `Operations.own`); None when
        the operation waits (for a person) or runs on a DBOS worker.
        """
        op = admission.operation
        tracked = Tracked(
            operation_id=op.operation_id,
            binding=admission.binding,
            fence=op.fence,
            done=asyncio.get_running_loop().create_future(),
        )
        self._operations.track(tracked, admission.slot)
        if self.handed_off(admission):
            # Its workflow runs it on a DBOS worker (and keeps its deadline): its progress and
            # outcome are read from the ledger when the worker writes them, and told like ours.
            self._handed_ids.add(op.operation_id)
            self._operations.spawn(self._handed(op, tracked))
            return tracked, None
        if op.deadline_at is not None:
            self._watchdog.arm(op.operation_id, op.deadline_at)
        if op.status in (S.RUNNING, S.ADMITTED):
            wait_for = (
                admission.generation
                if op.status is S.ADMITTED
                and admission.binding.policy.admit_when is AdmitWhen.TURN_CONFIRMED
                else None
            )
            return tracked, self.execute(
                op,
                tracked,
                session=session,
                wait_generation=wait_for,
                take_slot=admission.waits_for_slot,
            )
        return tracked, None

    def handed_off(self, admission: Admission) -> bool:
        """Whether ``admission``'s operation was handed to a DBOS workflow, not run here."""
        return (
            self._hands_off
            and admission.binding.policy.is_durable
            and admission.operation.status in _HANDED
        )

    def is_handed(self, operation_id: str) -> bool:
        """Whether ``operation_id`` runs on a DBOS worker and this runner waits for it."""
        return operation_id in self._handed_ids

    async def _handed(self, op: Operation, tracked: Tracked) -> None:
        """Wait for the outcome of a handed-off ``op``; finish it here once it has one."""
        assert self._observe is not None
        try:
            final = await self._observe(op)
        finally:
            self._handed_ids.discard(op.operation_id)
        if final.status in TERMINAL_STATUSES or final.status is S.UNKNOWN:
            self._operations.finish(tracked, final)

    async def execute(
        self,
        op: Operation,
        tracked: Tracked,
        *,
        session: SessionState | None = None,
        wait_generation: int | None = None,
        stage: str = "admission",
        take_slot: bool = False,
    ) -> None:
        """Drive ``op`` to an outcome, then finish it (an UNKNOWN outcome too).

        Args:
            op: The operation, as last read.
            tracked: Its record in the registry.
            session: The proposing session, for ``wait_generation``.
            wait_generation: Start only once this reply of ``session`` ended unbroken;
                cancelled if the user interrupted it.
            stage: What the authorizer is told when asked again (``recovery``, ...).
            take_slot: Wait for a limiter slot first (released by a person, recovered).
        """
        final = op
        self._executing[op.operation_id] = tracked
        try:
            if take_slot:
                policy = tracked.binding.policy
                slot = await self._limiter.wait_for_slot(op.tool, policy, op.principal)
                tracked.on_finish.append(slot.release)
            if wait_generation is not None and session is not None:
                settled = await self._wait_generation(session, wait_generation, tracked)
                if not settled:
                    await self._operations.cancel_not_started(
                        op, tracked, "the user interrupted the reply that proposed it"
                    )
                    final = await self._ledger.get(op.operation_id)
                    return
            final = await self._executor.run(op, tracked, stage=stage)
        except Exception as exc:
            if self._operations.closing:
                # Stopped mid-flight: the ledger keeps the last status written; the next owner
                # of the lease recovers the operation.
                operation_logger(op).info("operation {} left to recovery: {}", op.operation_id, exc)
                return
            operation_logger(op).exception(
                "operation {}: execution failed: {}", op.operation_id, exc
            )
            final = await self._after_failure(op, tracked, exc)
        finally:
            self._executing.pop(op.operation_id, None)
            if final.status in TERMINAL_STATUSES or final.status is S.UNKNOWN:
                self._operations.finish(tracked, final)

    async def _after_failure(self, op: Operation, tracked: Tracked, exc: Exception) -> Operation:
        """What the waiters of ``op`` are told when its execution here broke down.

        The ledger's status when it is an outcome; otherwise (still RUNNING, or unreadable)
        the outcome is not known here: the waiters hear UNKNOWN, and the operation's lease is
        let go of (``unsettled``) so that whoever claims it next reconciles it.
        """
        try:
            current = await self._ledger.get(op.operation_id)
        except LedgerError:
            current = op
        if current.status in TERMINAL_STATUSES or current.status is S.UNKNOWN:
            return current
        tracked.unsettled = True
        return dataclasses.replace(
            current,
            status=S.UNKNOWN,
            error=f"its execution broke down here ({type(exc).__name__}); it will be checked",
        )

    async def drain(self, grace_secs: float) -> None:
        """Wait up to ``grace_secs`` for the operations being executed to get an outcome."""
        pending = [t.done for t in self._executing.values() if not t.done.done()]
        if pending and grace_secs > 0:
            await asyncio.wait(pending, timeout=grace_secs)

    async def _wait_generation(
        self, session: SessionState, generation: int, tracked: Tracked
    ) -> bool:
        outcome = asyncio.ensure_future(session.wait_generation_outcome(generation))
        either: set[asyncio.Future[Any]] = {outcome, tracked.takeover.future()}
        try:
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not outcome.done():
                outcome.cancel()
        return outcome.done() and not outcome.cancelled() and outcome.result()
