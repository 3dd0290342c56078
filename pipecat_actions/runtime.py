"""`ActionRuntime`: admission, execution, deadlines, cancellation, compensation and recovery.

"The model proposes; the application admits; the system of record confirms." The runtime is
the middle of that sentence. It owns every effect's task, so cancelling Pipecat's handler
coroutine (a barge-in, Pipecat's own timeout) never cancels a business action by accident;
what a barge-in does to the action is the tool's ``on_interruption`` policy.

Wiring into Pipecat::

    runtime = await ActionRuntime.create("configs/restaurant.yaml", actions=[book_table],
                                         authorizer=MyAuthorizer())
    session = SessionState(session_id="call-1", principal="alice")
    runtime.attach(llm, session)                  # one handler per action (+ confirm_action)
    context = LLMContext(messages, tools=runtime.tools_schema())
"""

from __future__ import annotations

__all__ = ["ActionRuntime", "ApprovalRefused"]


import asyncio
import dataclasses
import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from loguru import logger

from pipecat_actions.actions import ActionContext, ActionDefinition, CancelOutcome
from pipecat_actions.admission.admitter import (
    Admission,
    Admitter,
    Joined,
    ReadAdmission,
    Refusal,
    Shared,
)
from pipecat_actions.admission.authorization import Authorizer
from pipecat_actions.admission.limits import Limiter, Slot
from pipecat_actions.approvals import ApprovalRefused, approve_operation, reject_operation
from pipecat_actions.clock import Clock, SystemClock
from pipecat_actions.errors import (
    ConfigurationError,
    PipecatActionsError,
    TransitionRefused,
    UnexpectedStatus,
)
from pipecat_actions.execution.executor import (
    Binding,
    Executor,
    ReconcileSchedule,
    Tracked,
    retry_delay,
)
from pipecat_actions.execution.outcomes import Outcome, classify
from pipecat_actions.execution.results import refusal_result, render, render_operation
from pipecat_actions.execution.watchdog import Watchdog
from pipecat_actions.ledger import (
    Ledger,
    NewOperation,
    Operation,
    OperationFilter,
    SqlLedger,
    new_operation_id,
)
from pipecat_actions.policy import AdmitWhen, OnInterruption, PolicySet, ToolKind, load_policy
from pipecat_actions.session import SessionState
from pipecat_actions.status import TERMINAL_STATUSES, ActionStatus

S = ActionStatus
_IN_FLIGHT = frozenset({S.ADMITTED, S.RUNNING, S.FAILED_RETRYABLE, S.CANCEL_REQUESTED})
"""Statuses worth waiting for: the outcome is due within the deadline (not a person's answer)."""


class ActionRuntime:
    """Runs the tool calls of every session of one process against one ledger.

    Build it with `ActionRuntime.create`; stop it with `close`.
    """

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
        self.ledger = ledger
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
        self.executor = Executor(ledger, clock, authorizer, actor=self.actor, schedule=schedule)
        self.watchdog = Watchdog(clock, self._expire)
        self.admitter = Admitter(
            bindings=self._bindings,
            ledger=ledger,
            clock=clock,
            authorizer=authorizer,
            limiter=self.limiter,
            executor=self.executor,
            owner=owner,
            lease_secs=lease_secs,
            cancel=lambda op: self.cancel(op.operation_id, reason="replaced by a newer request"),
        )
        self._heartbeat: asyncio.Task[None] | None = None
        self._closed = False
        self.recover_unsent: Literal["run", "fail"] = "run"

    # --- construction ----------------------------------------------------------------------

    @classmethod
    async def create(
        cls,
        policy: str | os.PathLike[str] | PolicySet,
        *,
        authorizer: Authorizer,
        actions: Iterable[ActionDefinition] = (),
        ledger: Ledger | None = None,
        ledger_url: str | None = None,
        clock: Clock | None = None,
        owner: str | None = None,
        lease_secs: float = 30.0,
        recover: bool = True,
        recover_unsent: Literal["run", "fail"] = "run",
        schedule: ReconcileSchedule | None = None,
    ) -> ActionRuntime:
        """Load the policy, open the ledger, register ``actions`` and recover leftover work.

        Args:
            policy: A policy file path or a loaded `PolicySet`.
            authorizer: Decides whether the session principal may make each call.
            actions: The effects, with their hooks.
            ledger: An open ledger to use (the caller closes it); else one is opened.
            ledger_url: Where to open the ledger (default: `default_ledger_url`).
            clock: Time source; the ledger opened here uses it too.
            owner: This process's name in leases (default: host, pid and a random part).
            lease_secs: How long an owner may stay silent before others take over its work.
            recover: Claim and finish operations whose owner died.
            recover_unsent: What to do with a recovered operation that was admitted but never
                sent: ``run`` it (after asking the authorizer again) or ``fail`` it.
            schedule: How UNKNOWN operations are probed before escalation.

        Raises:
            PolicyError: The policy file is invalid.
            ConfigurationError: An action has no policy, or its policy needs a hook it lacks.
            LedgerError: The ledger cannot be opened.
        """
        policies = policy if isinstance(policy, PolicySet) else load_policy(Path(policy))
        clock = clock or SystemClock()
        owns = ledger is None
        opened = ledger or await SqlLedger.create(ledger_url, clock=clock)
        runtime = cls(
            policy=policies,
            ledger=opened,
            authorizer=authorizer,
            clock=clock,
            owner=owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}",
            lease_secs=lease_secs,
            owns_ledger=owns,
            schedule=schedule,
        )
        runtime.recover_unsent = recover_unsent
        try:
            runtime.register(*actions)
            runtime.watchdog.start()
            runtime._heartbeat = asyncio.get_running_loop().create_task(
                runtime._heartbeat_loop(), name="pipecat_actions.heartbeat"
            )
            if recover:
                await runtime.recover()
        except BaseException:
            await runtime.close()
            raise
        return runtime

    def register(self, *definitions: ActionDefinition) -> None:
        """Register actions; each needs an entry in the policy.

        Raises:
            ConfigurationError: No policy for the action, or the policy asks for a hook
                (``request_cancel`` needs ``cancel``) that the action lacks.
        """
        for definition in definitions:
            policy = self.policy.get(definition.name)
            if policy is None:
                raise ConfigurationError(
                    f"action {definition.name} has no entry in the policy {self.policy.source}"
                )
            if policy.on_interruption is OnInterruption.REQUEST_CANCEL and not definition.cancel:
                raise ConfigurationError(
                    f"action {definition.name}: on_interruption is request_cancel but the "
                    "action has no cancel hook"
                )
            self._bindings[definition.name] = Binding(definition, policy)

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
                    logger.warning("read {} not audited: {}", record.operation_id, result)

    async def flush(self) -> None:
        """Write the audit records of finished reads now, and wait until they are written."""
        await self._flush_reads()
        if self._audits:
            await asyncio.gather(*self._audits, return_exceptions=True)

    async def close(self, *, grace_secs: float = 5.0) -> None:
        """Stop: wait up to ``grace_secs`` for running operations, then leave them to recovery.

        An operation still running at the end keeps its ledger status (RUNNING, ...); the next
        runtime to claim its lease reconciles it.
        """
        if self._closed:
            return
        self._closed = True
        pending = [
            t.done
            for t in self._tracked.values()
            if t.operation_id in self._executing and not t.done.done()
        ]
        if pending and grace_secs > 0:
            await asyncio.wait(pending, timeout=grace_secs)
        await self.flush()
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            await asyncio.gather(self._heartbeat, return_exceptions=True)
        await self.watchdog.stop()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for tracked in self._tracked.values():
            if tracked.effect_task is not None and not tracked.effect_task.done():
                tracked.effect_task.cancel()
        if self._owns_ledger:
            await self.ledger.close()

    @property
    def bindings(self) -> Mapping[str, Binding]:
        """The registered actions with their policies, by tool name."""
        return self._bindings

    def attach(self, llm: Any, session: SessionState) -> None:
        """Register a handler on a Pipecat ``llm`` for every action, bound to ``session``."""
        from pipecat_actions.binding import attach

        self._sessions[session.session_id] = session
        attach(self, llm, session)

    def instrument(self, llm: Any, session: SessionState) -> None:
        """Route handlers the application registers on ``llm`` through this runtime."""
        from pipecat_actions.binding import instrument

        self._sessions[session.session_id] = session
        instrument(self, llm, session)

    def tools_schema(self) -> Any:
        """Return a Pipecat ``ToolsSchema`` of every action, for ``LLMContext(tools=...)``."""
        from pipecat_actions.binding import tools_schema

        return tools_schema(self)

    # --- proposing -------------------------------------------------------------------------

    async def propose(
        self,
        tool: str,
        arguments: Mapping[str, Any] | str,
        session: SessionState,
        *,
        tool_call_id: str | None = None,
        wait: bool = True,
        on_started: Callable[[str], Awaitable[None]] | None = None,
    ) -> dict[str, Any]:
        """Admit a proposed call and, with ``wait``, return its outcome as a tool result.

        Cancelling the caller never cancels the operation; see ``on_interruption``.

        Args:
            tool: The tool name.
            arguments: The arguments (a mapping, or JSON text).
            session: The session proposing it.
            tool_call_id: The provider's id of the call, recorded (never used as a key).
            wait: For a mutation, wait for its outcome (else return its admitted state).
            on_started: Called with the operation id once a new mutation was admitted and
                started (not for refusals, duplicates or calls waiting for a person).
        """
        self._sessions[session.session_id] = session
        binding = self._bindings.get(tool)
        if binding is not None and binding.policy.kind is ToolKind.READ:
            # A read writes nothing before its effect, so it is admitted and run in the
            # caller's own task: no hand-off to another task on the hot path.
            read = await self.admitter.admit(tool, arguments, session, tool_call_id=tool_call_id)
            if isinstance(read, ReadAdmission):
                return await self._read(tool, read, session, tool_call_id)
            if isinstance(read, Refusal):
                return read.result
            if isinstance(read, Shared):
                return await self._shared(read)
        # Admission runs to its end even when the caller is cancelled meanwhile (a barge-in):
        # an operation it inserted must be started and bounded, never left behind.
        admitting = asyncio.ensure_future(
            self._admit_and_start(tool, arguments, session, tool_call_id)
        )
        try:
            admitted = await asyncio.shield(admitting)
        except asyncio.CancelledError:
            admitting.add_done_callback(self._interrupted_during_admission)
            raise
        if isinstance(admitted, dict):
            return admitted
        if isinstance(admitted, ReadAdmission):
            return await self._read(tool, admitted, session, tool_call_id)
        if isinstance(admitted, Shared):
            return await self._shared(admitted)
        if isinstance(admitted, Joined):
            op = admitted.operation
            note = "This request was already made; this is its outcome."
            if wait and op.status in _IN_FLIGHT and op.operation_id in self._tracked:
                op = await asyncio.shield(self._tracked[op.operation_id].done)
            return render_operation(op, note=note)
        tracked = admitted
        if on_started is not None:
            await on_started(tracked.operation_id)
        if not wait:
            return render_operation(await self.ledger.get(tracked.operation_id))
        try:
            final = await asyncio.shield(tracked.done)
        except asyncio.CancelledError:
            self._spawn(self._interrupted(tracked.operation_id))
            raise
        return render_operation(final)

    async def _admit_and_start(
        self,
        tool: str,
        arguments: Mapping[str, Any] | str,
        session: SessionState,
        tool_call_id: str | None,
    ) -> dict[str, Any] | ReadAdmission | Shared | Joined | Tracked:
        admitted = await self.admitter.admit(tool, arguments, session, tool_call_id=tool_call_id)
        if isinstance(admitted, Refusal):
            return admitted.result
        if isinstance(admitted, Joined) and tool_call_id:
            self._calls[tool_call_id] = admitted.operation.operation_id
        if not isinstance(admitted, Admission):
            return admitted
        if tool_call_id:
            self._calls[tool_call_id] = admitted.operation.operation_id
        tracked = self._start(admitted, session)
        if admitted.operation.status in (S.AWAITING_APPROVAL, S.AWAITING_CONFIRMATION):
            return render_operation(admitted.operation)
        return tracked

    def _interrupted_during_admission(self, admitting: asyncio.Future[Any]) -> None:
        if admitting.cancelled() or admitting.exception() is not None:
            return
        if isinstance(admitting.result(), Tracked):
            self._spawn(self._interrupted(admitting.result().operation_id))

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
                    value = await admission.binding.action.run(ctx)
                    status, error = S.COMMITTED, None
                    break
                except asyncio.CancelledError:
                    if operation_id not in self._expired_reads:
                        raise  # the caller was cancelled: a read may simply stop
                    task.uncancel()
                    error = "deadline passed"
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
                    detail={"attempts": attempt},
                )
            )
        return result

    def _start(self, admission: Admission, session: SessionState) -> Tracked:
        op = admission.operation
        tracked = Tracked(
            operation_id=op.operation_id,
            binding=admission.binding,
            fence=op.fence,
            done=asyncio.get_running_loop().create_future(),
        )
        self._track(tracked, admission.slot)
        if op.deadline_at is not None:
            self.watchdog.arm(op.operation_id, op.deadline_at)
        if op.status in (S.RUNNING, S.ADMITTED):
            wait_for = (
                admission.generation
                if op.status is S.ADMITTED
                and admission.binding.policy.admit_when is AdmitWhen.TURN_CONFIRMED
                else None
            )
            self._spawn(self._execute(op, tracked, session=session, wait_generation=wait_for))
        return tracked

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
            logger.exception("operation {}: execution failed: {}", op.operation_id, exc)
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
            tracked.done.set_result(final)
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

    # --- deadlines -------------------------------------------------------------------------

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

    # --- cancellation ----------------------------------------------------------------------

    async def _interrupted(self, operation_id: str) -> None:
        tracked = self._tracked.get(operation_id)
        if tracked is None:
            return
        mode = tracked.binding.policy.on_interruption
        if mode is OnInterruption.CONTINUE:
            return
        await self.cancel(
            operation_id,
            reason="the user interrupted",
            only_if_not_started=mode is OnInterruption.CANCEL_IF_NOT_STARTED,
        )

    async def cancel(
        self, operation_id: str, *, reason: str, only_if_not_started: bool = False
    ) -> Operation:
        """Cancel an operation as far as the truth allows; return what the ledger then says.

        Nothing sent yet: CANCELLED. Sent, with a ``cancel`` hook and unless
        ``only_if_not_started``: CANCEL_REQUESTED, then CANCELLED only when the provider
        confirms; otherwise the operation goes on and its real outcome is recorded.
        """
        op = await self.ledger.get(operation_id)
        tracked = self._tracked.get(operation_id)
        if tracked is None or op.status in TERMINAL_STATUSES:
            return op
        if op.status in (S.ADMITTED, S.FAILED_RETRYABLE):
            return await self._cancel_not_started(op, tracked, reason)
        if op.status in (S.AWAITING_APPROVAL, S.AWAITING_CONFIRMATION):
            return await self._move(op, tracked, S.REJECTED, reason, finish=True)
        hook = tracked.binding.action.cancel
        if op.status is not S.RUNNING or only_if_not_started or hook is None:
            return op
        requested = await self._move(op, tracked, S.CANCEL_REQUESTED, reason)
        if requested.status is not S.CANCEL_REQUESTED:
            return requested
        try:
            answer = await hook(self.executor.context(requested, tracked.binding))
        except Exception as exc:
            logger.warning("operation {}: cancel hook failed: {}", operation_id, exc)
            answer = CancelOutcome.UNKNOWN
        if answer is CancelOutcome.CANCELLED:
            tracked.takeover.set()
            if tracked.effect_task is not None:
                tracked.effect_task.cancel()
            return await self._move(requested, tracked, S.CANCELLED, "the provider confirmed", True)
        return await self.ledger.annotate(
            operation_id, actor=self.actor, detail={"cancel_answer": str(answer)}
        )

    async def _cancel_not_started(self, op: Operation, tracked: Tracked, reason: str) -> Operation:
        tracked.takeover.set()
        return await self._move(op, tracked, S.CANCELLED, reason, finish=True)

    async def _move(
        self, op: Operation, tracked: Tracked, to: ActionStatus, reason: str, finish: bool = False
    ) -> Operation:
        try:
            moved = await self.ledger.transition(
                op.operation_id,
                expected=op.status,
                to=to,
                fence=tracked.fence,
                actor=self.actor,
                detail={"reason": reason},
                changes={"error": reason} if to in TERMINAL_STATUSES else None,
            )
        except TransitionRefused:
            return await self.ledger.get(op.operation_id)
        if finish:
            self._finish(tracked, moved)
        return moved

    # --- confirmation and approval ---------------------------------------------------------

    async def confirm(self, operation_id: str, token: str, session: SessionState) -> dict[str, Any]:
        """Apply the user's verbal confirmation (the ``confirm_action`` tool)."""
        try:
            op = await self.ledger.get(operation_id)
        except PipecatActionsError:
            return refusal_result("There is no such operation.", code="unknown_operation")
        tracked = self._tracked.get(operation_id)
        problem = None
        if op.session_id != session.session_id or tracked is None:
            problem = "That operation does not belong to this conversation."
        elif op.status is not S.AWAITING_CONFIRMATION:
            problem = f"That operation is {op.status.value.lower()}, not waiting for a yes."
        elif token != op.args_hash[:12]:
            problem = "The confirmation does not match the request's details; ask again."
        elif session.user_turn <= int(op.turn_id or 0):
            problem = "The user has not answered yet: ask them and wait for their reply."
        elif op.deadline_at is not None and self.clock.now() >= op.deadline_at:
            problem = "The confirmation came too late; the request expired."
        if problem is not None or tracked is None:
            return refusal_result(
                problem or "", code="confirmation_refused", operation_id=operation_id
            )
        return await self._release(
            op,
            tracked,
            actor=f"user:{session.principal}",
            reason="confirmed by the user",
            wait=True,
        )

    async def approve(
        self, operation_id: str, *, approver: str, reason: str, args_hash: str | None = None
    ) -> Operation:
        """Approve an operation waiting for approval; it then runs.

        Raises:
            ApprovalRefused: Not waiting for approval, expired, or approved for other
                arguments than the ones it holds.
        """
        tracked = self._tracked.get(operation_id)
        try:
            approved = await approve_operation(
                self.ledger,
                operation_id,
                approver=approver,
                reason=reason,
                now=self.clock.now(),
                args_hash=args_hash,
                fence=tracked.fence if tracked else None,
                deadline_at=self.clock.now() + self._deadline_for(operation_id),
            )
        except ApprovalRefused:
            if tracked is not None:
                current = await self.ledger.get(operation_id)
                if current.status in TERMINAL_STATUSES:
                    self._finish(tracked, current)
            raise
        if tracked is not None and approved.deadline_at is not None:
            self.watchdog.arm(operation_id, approved.deadline_at)
            self._spawn(self._execute(approved, tracked, take_slot=True))
        return approved

    async def reject(self, operation_id: str, *, approver: str, reason: str) -> Operation:
        """Reject an operation waiting for approval (REJECTED; nothing runs)."""
        tracked = self._tracked.get(operation_id)
        rejected = await reject_operation(
            self.ledger,
            operation_id,
            approver=approver,
            reason=reason,
            fence=tracked.fence if tracked else None,
        )
        if tracked is not None:
            self._finish(tracked, rejected)
        return rejected

    def _deadline_for(self, operation_id: str) -> float:
        tracked = self._tracked.get(operation_id)
        return tracked.binding.policy.deadline_secs if tracked else 30.0

    async def _release(
        self, op: Operation, tracked: Tracked, *, actor: str, reason: str, wait: bool
    ) -> dict[str, Any]:
        deadline_at = self.clock.now() + self._deadline(op.tool)
        try:
            admitted = await self.ledger.transition(
                op.operation_id,
                expected=op.status,
                to=S.ADMITTED,
                fence=tracked.fence,
                actor=actor,
                detail={"reason": reason},
                changes={"deadline_at": deadline_at},
            )
        except TransitionRefused:
            return render_operation(await self.ledger.get(op.operation_id))
        self.watchdog.arm(op.operation_id, deadline_at)
        self._spawn(self._execute(admitted, tracked, take_slot=True))
        if not wait:
            return render_operation(admitted)
        return render_operation(await asyncio.shield(tracked.done))

    def _deadline(self, tool: str) -> float:
        policy = self.policy.get(tool)
        return policy.deadline_secs if policy is not None else 30.0

    async def pending_approvals(self) -> list[Operation]:
        """Operations waiting for a person's approval, oldest first."""
        return await self.ledger.list(OperationFilter(status=[S.AWAITING_APPROVAL]))

    # --- compensation ----------------------------------------------------------------------

    async def compensate(self, operation_id: str, *, actor: str, reason: str) -> Operation:
        """Reverse a committed operation by running its ``compensate`` hook as a new operation.

        The compensation is admitted first, under the key ``compensate|<operation>``, so
        concurrent requests join one compensation; the original then goes COMMITTED →
        COMPENSATING → COMPENSATED, or back to COMMITTED when the compensation fails for good
        (a later call may then try again under a new key). The hook's context carries the
        original operation (``ctx.operation``: its result and before-state).

        Returns:
            The compensation operation, once it has an outcome.

        Raises:
            ConfigurationError: The action has no compensate hook.
            UnexpectedStatus: The original is not COMMITTED (nor being compensated).
        """
        original = await self.ledger.get(operation_id)
        binding = self._bindings.get(original.tool)
        if binding is None or binding.action.compensate is None:
            raise ConfigurationError(f"{original.tool} has no compensate hook")
        key = f"compensate|{operation_id}"
        existing = await self.ledger.find_by_key(original.tenant, key)
        while existing is not None and existing.status in (S.FAILED_FINAL, S.CANCELLED):
            key = f"compensate|{operation_id}|after:{existing.operation_id}"
            existing = await self.ledger.find_by_key(original.tenant, key)
        if existing is not None:
            return await self.wait(existing.operation_id)
        if original.status not in (S.COMMITTED, S.COMPENSATING):
            raise UnexpectedStatus(
                operation_id=operation_id,
                expected_status=S.COMMITTED.value,
                actual_status=original.status.value,
            )
        admitted = await self.ledger.admit(
            NewOperation(
                tool=f"{original.tool}.compensate"[:64],
                kind=ToolKind.MUTATION.value,
                args=original.args,
                idempotency_key=key,
                session_id=original.session_id,
                principal=original.principal,
                tenant=original.tenant,
                status=S.RUNNING,
                compensates=operation_id,
                before_state=original.before_state,
                deadline_at=self.clock.now() + binding.policy.deadline_secs,
                lease_owner=self.owner,
                lease_secs=self.lease_secs,
                actor=actor,
                detail={"reason": reason},
            )
        )
        comp = admitted.operation
        if not admitted.created:
            return await self.wait(comp.operation_id)
        tracked = Tracked(
            comp.operation_id,
            self._compensation_binding(binding),
            comp.fence,
            asyncio.get_running_loop().create_future(),
        )
        self._tracked[comp.operation_id] = tracked
        if original.status is S.COMMITTED:
            await self.ledger.transition(
                operation_id,
                expected=S.COMMITTED,
                to=S.COMPENSATING,
                fence=original.fence,
                actor=actor,
                detail={"reason": reason, "compensation": comp.operation_id},
            )
        self.watchdog.arm(comp.operation_id, comp.deadline_at or self.clock.now())
        await self._execute(comp, tracked)
        final = await asyncio.shield(tracked.done)
        await self._settle_original(final)
        return final

    def _compensation_binding(self, binding: Binding) -> Binding:
        hook = binding.action.compensate
        assert hook is not None
        ledger = self.ledger

        async def effect(ctx: ActionContext, **_: Any) -> Any:
            # The hook reverses the original: it gets the original operation (its result and
            # before-state) and arguments, under the compensation's own id and key.
            assert ctx.operation is not None
            assert ctx.operation.compensates is not None
            original = await ledger.get(ctx.operation.compensates)
            return await hook(dataclasses.replace(ctx, operation=original, args=original.args))

        return Binding(
            ActionDefinition(
                name=f"{binding.action.name}.compensate",
                effect=effect,
                args_model=binding.action.args_model,
                description=f"Reverse {binding.action.name}",
            ),
            binding.policy,
        )

    async def _settle_original(self, compensation: Operation) -> None:
        if compensation.compensates is None:
            return
        original = await self.ledger.get(compensation.compensates)
        if compensation.status is S.COMMITTED:
            steps = {S.COMMITTED: [S.COMPENSATING, S.COMPENSATED], S.COMPENSATING: [S.COMPENSATED]}
        elif compensation.status in (S.FAILED_FINAL, S.CANCELLED):
            steps = {S.COMPENSATING: [S.COMMITTED]}
        else:
            return  # still unknown: recovery or reconciliation settles it later
        current = original
        for to in steps.get(original.status, []):
            current = await self.ledger.transition(
                original.operation_id,
                expected=current.status,
                to=to,
                fence=current.fence,
                actor=self.actor,
                detail={"compensation": compensation.operation_id},
            )

    # --- recovery and leases ---------------------------------------------------------------

    async def recover(self) -> list[Operation]:
        """Claim operations whose owner's lease expired and finish them; return them."""
        claimed: list[Operation] = []
        while True:
            batch = await self.ledger.claim_stale(self.owner, lease_secs=self.lease_secs, limit=50)
            if not batch:
                break
            claimed.extend(batch)
            for op in batch:
                self._resume(op)
        return claimed

    def _resume(self, op: Operation) -> None:
        tool = op.tool.removesuffix(".compensate")
        binding = self._bindings.get(tool)
        if binding is None:
            logger.warning("recovered operation {} of unknown tool {}", op.operation_id, op.tool)
            return
        tracked = Tracked(
            op.operation_id, binding, op.fence, asyncio.get_running_loop().create_future()
        )
        if op.tool.endswith(".compensate") and binding.action.compensate is not None:
            tracked = Tracked(
                op.operation_id, self._compensation_binding(binding), op.fence, tracked.done
            )
        self._tracked[op.operation_id] = tracked
        if op.deadline_at is not None and op.status in (
            S.AWAITING_APPROVAL,
            S.AWAITING_CONFIRMATION,
        ):
            self.watchdog.arm(op.operation_id, op.deadline_at)
            return
        self._spawn(self._recover_one(op, tracked))

    async def _recover_one(self, op: Operation, tracked: Tracked) -> None:
        if op.status in (S.RUNNING, S.CANCEL_REQUESTED):
            op = await self.ledger.transition(
                op.operation_id,
                expected=op.status,
                to=S.UNKNOWN,
                fence=tracked.fence,
                actor=self.actor,
                detail={"reason": "recovered after its owner stopped"},
            )
        if op.status is S.UNKNOWN:
            final = await self.executor.reconcile(op, tracked)
        elif op.status in (S.ADMITTED, S.FAILED_RETRYABLE) and self.recover_unsent == "fail":
            final = await self.ledger.transition(
                op.operation_id,
                expected=op.status,
                to=S.FAILED_FINAL,
                fence=tracked.fence,
                actor=self.actor,
                detail={"reason": "recovered unsent; recover_unsent is fail"},
                changes={"error": "its owner stopped before sending it; not retried by policy"},
            )
        elif op.status in (S.ADMITTED, S.FAILED_RETRYABLE):
            if op.deadline_at is not None:
                self.watchdog.arm(op.operation_id, op.deadline_at)
            final = await self.executor.run(op, tracked, stage="recovery")
        else:
            final = op
        self._finish(tracked, final)
        await self._settle_original(final)

    async def _heartbeat_loop(self) -> None:
        while True:
            await self.clock.sleep(self.lease_secs / 3)
            try:
                await self.ledger.renew_lease(self.owner, lease_secs=self.lease_secs)
                await self._pick_up_approved()
            except Exception as exc:
                logger.warning("lease heartbeat failed: {}", exc)

    async def _pick_up_approved(self) -> None:
        for op in await self.ledger.list(OperationFilter(status=[S.ADMITTED])):
            tracked = self._tracked.get(op.operation_id)
            if op.lease_owner != self.owner or tracked is None or tracked.done.done():
                continue
            if op.operation_id not in self._executing:
                if op.deadline_at is None:
                    op = await self.ledger.annotate(
                        op.operation_id,
                        actor=self.actor,
                        fence=tracked.fence,
                        detail={"reason": "approved elsewhere; deadline set by its owner"},
                        changes={"deadline_at": self.clock.now() + self._deadline(op.tool)},
                    )
                self.watchdog.arm(op.operation_id, op.deadline_at or self.clock.now())
                self._spawn(self._execute(op, tracked, take_slot=True))

    async def undelivered(self) -> list[Operation]:
        """Committed operations whose result never reached a conversation."""
        return await self.ledger.list(OperationFilter(status=[S.COMMITTED], undelivered=True))
