"""`Reads`: no write-ahead, run in the caller's task, audited in batches after the answer."""

from __future__ import annotations

__all__ = ["Reads"]

import asyncio
from collections.abc import Callable
from typing import Any

from loguru import logger

from pipecat_actions.actions import ActionContext
from pipecat_actions.admission.decisions import ReadAdmission, Shared
from pipecat_actions.admission.limits import Limiter
from pipecat_actions.clock import Clock
from pipecat_actions.execution.executor import retry_delay
from pipecat_actions.execution.outcomes import Outcome, classify
from pipecat_actions.execution.watchdog import Watchdog
from pipecat_actions.ledger import Ledger, NewOperation, new_operation_id
from pipecat_actions.observability.telemetry import Telemetry
from pipecat_actions.observability.tracing import SpanIds
from pipecat_actions.policy import ToolKind
from pipecat_actions.results import render
from pipecat_actions.runtime._operations import Operations
from pipecat_actions.session import SessionState
from pipecat_actions.status import ActionStatus

S = ActionStatus


class Reads:
    """Reads: admitted in memory, run in the caller's task, audited after the answer.

    Args:
        ledger: Where the reads are recorded, after their answers.
        clock: The runtime's clock (deadlines, retry pauses).
        operations: Starts the audit writes (so that a flush waits for them).
        limiter: Told about each running read (identical reads may share its outcome).
        watchdog: Bounds each read by its deadline.
        telemetry: Spans of each attempt.
        rand: Source of retry jitter in [0, 1).
        actor: Recorded on each read's audit record.
    """

    def __init__(
        self,
        *,
        ledger: Ledger,
        clock: Clock,
        operations: Operations,
        limiter: Limiter,
        watchdog: Watchdog,
        telemetry: Telemetry,
        rand: Callable[[], float],
        actor: str,
    ) -> None:
        self._ledger = ledger
        self._clock = clock
        self._operations = operations
        self._limiter = limiter
        self._watchdog = watchdog
        self._telemetry = telemetry
        self._rand = rand
        self._actor = actor
        self._running: dict[str, asyncio.Task[Any]] = {}
        self._expired: set[str] = set()
        self._records: list[NewOperation] = []
        self._flusher: asyncio.Task[Any] | None = None

    def stop(self, operation_id: str) -> bool:
        """Stop the read running as ``operation_id`` (its deadline passed); False if none is."""
        read = self._running.get(operation_id)
        if read is None:
            return False
        self._expired.add(operation_id)
        read.cancel()
        return True

    def _record(self, record: NewOperation) -> None:
        # Reads are audited in batches a moment after their answers: one task and one
        # group-committed write for many reads, instead of a task and a write each on the hot
        # path. The short real-time pause batches I/O; it decides nothing about the call.
        self._records.append(record)
        if self._flusher is None or self._flusher.done():
            self._flusher = self._operations.spawn(self.flush(pause_secs=0.02), audit=True)

    async def flush(self, *, pause_secs: float = 0.0) -> None:
        """Write the audit records of the reads answered so far (after ``pause_secs``)."""
        if pause_secs:
            await asyncio.sleep(pause_secs)
        while self._records:
            batch, self._records = self._records, []
            results = await asyncio.gather(
                *(self._ledger.record_completed(record) for record in batch),
                return_exceptions=True,
            )
            for record, result in zip(batch, results, strict=True):
                if isinstance(result, BaseException):
                    logger.bind(
                        session_id=record.session_id,
                        turn_id=record.turn_id,
                        tool_call_id=record.provider_call_id,
                        operation_id=record.operation_id,
                        tool=record.tool,
                    ).warning("read {} not audited: {}", record.operation_id, result)

    async def shared(self, shared: Shared) -> dict[str, Any]:
        """The answer of a call that shares another read's outcome, or a degraded one."""
        if shared.pending is not None:
            return dict(await asyncio.shield(shared.pending.result))
        return {"status": "degraded", "message": "A fallback answer.", "result": shared.result}

    async def read(
        self,
        tool: str,
        admission: ReadAdmission,
        session: SessionState,
        tool_call_id: str | None,
    ) -> dict[str, Any]:
        """Run an admitted read in the caller's task, bounded by the watchdog."""
        operation_id = new_operation_id()
        policy = admission.binding.policy
        deadline_at = self._clock.now() + policy.deadline_secs
        outcome: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._limiter.register_read(tool, admission.key, outcome)
        task = asyncio.current_task()
        assert task is not None
        self._running[operation_id] = task
        self._watchdog.arm(operation_id, deadline_at)
        status, value, error, attempt = S.FAILED_FINAL, None, None, 0
        timed_out = False
        ids = (
            None  # built only for spans: this is the hot path of every read
            if self._telemetry.tracer is None
            else SpanIds(
                session.session_id,
                tool,
                admission.turn_id,
                tool_call_id,
                operation_id,
                admission.key,
            )
        )
        try:
            while True:
                attempt += 1
                ctx = ActionContext(
                    operation_id=operation_id,
                    idempotency_key=admission.key,
                    tool=tool,
                    args=admission.args,
                    attempt=attempt,
                    session_id=session.session_id,
                    principal=session.principal,
                    tenant=session.tenant,
                    deadline_at=deadline_at,
                    tool_call_id=tool_call_id,
                )
                try:
                    with self._telemetry.read_attempt(ids, attempt):
                        value = await admission.binding.action.run(ctx)
                    status, error = S.COMMITTED, None
                    break
                except asyncio.CancelledError:
                    if operation_id not in self._expired:
                        raise  # the caller was cancelled: a read may simply stop
                    task.uncancel()
                    error = "deadline passed"
                    timed_out = True
                    break
                except Exception as exc:
                    error = f"{type(exc).__name__}: {exc}"
                    failure = classify(exc, mutation=False)
                    delay = (
                        None
                        if failure is Outcome.FINAL
                        else retry_delay(
                            policy,
                            attempt=attempt,
                            outcome=failure,
                            now=self._clock.now(),
                            deadline_at=deadline_at,
                            rand=self._rand(),
                        )
                    )
                    if delay is None:
                        break
                    await self._clock.sleep(delay)
        finally:
            admission.slot.release()
            self._watchdog.disarm(operation_id)
            self._running.pop(operation_id, None)
            self._expired.discard(operation_id)
            if status is not S.COMMITTED and error is None:
                error = "the caller stopped waiting"
            result = render(status, tool=tool, operation_id=operation_id, value=value, error=error)
            if not outcome.done():
                outcome.set_result(result)
            # Recorded after the answer, off the critical path: a read needs no write-ahead.
            self._record(
                NewOperation(
                    tool=tool,
                    kind=ToolKind.READ.value,
                    args=admission.args,
                    idempotency_key=admission.key,
                    session_id=session.session_id,
                    principal=session.principal,
                    tenant=session.tenant,
                    status=status,
                    operation_id=operation_id,
                    resource_key=admission.resource_key,
                    turn_id=admission.turn_id,
                    provider_call_id=tool_call_id,
                    agent=session.active_agent,
                    error=error,
                    result=value,
                    actor=self._actor,
                    detail={
                        "attempts": attempt,
                        "timed_out": timed_out,
                        "reason": "read answered" if error is None else f"read failed: {error}",
                    },
                )
            )
        return result
