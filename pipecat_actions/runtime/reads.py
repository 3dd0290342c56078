"""Reads: no write-ahead, run in the caller's task, audited in batches after the answer."""

from __future__ import annotations

import asyncio
from typing import Any

from loguru import logger

from pipecat_actions.actions import ActionContext
from pipecat_actions.admission.decisions import ReadAdmission, Shared
from pipecat_actions.execution.executor import (
    retry_delay,
)
from pipecat_actions.execution.outcomes import Outcome, classify
from pipecat_actions.ledger import (
    NewOperation,
    new_operation_id,
)
from pipecat_actions.observability.tracing import SpanIds
from pipecat_actions.policy import ToolKind
from pipecat_actions.results import render
from pipecat_actions.runtime.base import RuntimeBase
from pipecat_actions.session import SessionState
from pipecat_actions.status import ActionStatus

S = ActionStatus


class ReadsMixin(RuntimeBase):
    """Reads: admitted in memory, run in the caller's task, audited after the answer."""

    def _record_read(self, record: NewOperation) -> None:
        # Reads are audited in batches a moment after their answers: one task and one
        # group-committed write for many reads, instead of a task and a write each on the hot
        # path. The short real-time pause batches I/O; it decides nothing about the call.
        self._read_records.append(record)
        if self._read_flusher is None or self._read_flusher.done():
            self._read_flusher = self._spawn(self._flush_reads(pause_secs=0.02), audit=True)

    async def _flush_reads(self, *, pause_secs: float = 0.0) -> None:
        if pause_secs:
            await asyncio.sleep(pause_secs)
        while self._read_records:
            batch, self._read_records = self._read_records, []
            results = await asyncio.gather(
                *(self.ledger.record_completed(record) for record in batch),
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

    async def flush(self) -> None:
        """Write the audit records of finished reads now, and wait until they are written."""
        await self._flush_reads()
        await self._join_notes.flush()
        if self._audits:
            await asyncio.gather(*self._audits, return_exceptions=True)

    async def _shared(self, shared: Shared) -> dict[str, Any]:
        if shared.pending is not None:
            return dict(await asyncio.shield(shared.pending.result))
        return {"status": "degraded", "message": "A fallback answer.", "result": shared.result}

    async def _read(
        self,
        tool: str,
        admission: ReadAdmission,
        session: SessionState,
        tool_call_id: str | None,
    ) -> dict[str, Any]:
        """Run an admitted read in the caller's task, bounded by the watchdog."""
        operation_id = new_operation_id()
        policy = admission.binding.policy
        deadline_at = self.clock.now() + policy.deadline_secs
        outcome: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.limiter.register_read(tool, admission.key, outcome)
        task = asyncio.current_task()
        assert task is not None
        self._reads[operation_id] = task
        self.watchdog.arm(operation_id, deadline_at)
        status, value, error, attempt = S.FAILED_FINAL, None, None, 0
        timed_out = False
        ids = (
            None  # built only for spans: this is the hot path of every read
            if self.telemetry.tracer is None
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
                )
                try:
                    with self.telemetry.read_attempt(ids, attempt):
                        value = await admission.binding.action.run(ctx)
                    status, error = S.COMMITTED, None
                    break
                except asyncio.CancelledError:
                    if operation_id not in self._expired_reads:
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
                            now=self.clock.now(),
                            deadline_at=deadline_at,
                            rand=self.executor.rand(),
                        )
                    )
                    if delay is None:
                        break
                    await self.clock.sleep(delay)
        finally:
            admission.slot.release()
            self.watchdog.disarm(operation_id)
            self._reads.pop(operation_id, None)
            self._expired_reads.discard(operation_id)
            if status is not S.COMMITTED and error is None:
                error = "the caller stopped waiting"
            result = render(status, tool=tool, operation_id=operation_id, value=value, error=error)
            if not outcome.done():
                outcome.set_result(result)
            # Recorded after the answer, off the critical path: a read needs no write-ahead.
            self._record_read(
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
                    actor=self.actor,
                    detail={
                        "attempts": attempt,
                        "timed_out": timed_out,
                        "reason": "read answered" if error is None else f"read failed: {error}",
                    },
                )
            )
        return result
