"""Running an admitted operation: write-ahead, effect, classified outcome, retries, reconciliation.

The status is written **before** the effect is called (RUNNING, attempt n, sent_at) and after
its answer. A lost answer is UNKNOWN and is never retried blindly: the action's ``reconcile``
hook asks the system of record; without one the operation stays UNKNOWN and is escalated.

An exception the effect raises is logged with its traceback (a bug in the effect, a
``NameError``, is an error of the application's, and the ledger keeps only its one-line text),
unless it is one of the `pipecat_actions.execution.outcomes` classes the effect raises to say
what happened, which is logged as one line.

The effect runs in a task of its own that only the watchdog (deadline) or a confirmed cancel
may stop. When one of them takes an operation over, this executor stops waiting; if the effect
still answers later, the answer is recorded as a late event and only settles an operation that
is still UNKNOWN (it never overwrites a terminal status).
"""

from __future__ import annotations

__all__ = ["Executor", "ReconcileSchedule", "retry_delay"]

import asyncio
import contextlib
import dataclasses
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from loguru import logger

from pipecat_actions.actions import (
    ActionContext,
    Binding,
    CancelOutcome,
    ReconcileState,
    Reconciliation,
    Reporter,
)
from pipecat_actions.admission.authorization import (
    AuthorizationRequest,
    Authorizer,
    AuthorizerFailed,
    ask,
)
from pipecat_actions.clock import Clock, backoff_secs, sleep_from_now
from pipecat_actions.errors import LedgerError, TransitionRefused
from pipecat_actions.execution.durable import WriteRetry, until_written
from pipecat_actions.execution.outcomes import (
    EffectFailed,
    EffectNotSent,
    EffectOutcomeUnknown,
    EffectRetryable,
    Outcome,
    classify,
)
from pipecat_actions.execution.tracked import Tracked
from pipecat_actions.ledger import Ledger, Operation
from pipecat_actions.ledger.records import canonical_json
from pipecat_actions.ledger.sealing import unreadable_reason
from pipecat_actions.observability.correlation import operation_ids, operation_logger
from pipecat_actions.observability.telemetry import Telemetry
from pipecat_actions.policy import ToolKind, ToolPolicy
from pipecat_actions.status import TERMINAL_STATUSES, TRANSITIONS, UNSENT_STATUSES, ActionStatus

S = ActionStatus


@dataclass(frozen=True)
class ReconcileSchedule:
    """How often an UNKNOWN operation is checked before it is escalated.

    Attributes:
        initial_secs: The pause after the first probe.
        multiplier: How much each pause grows.
        max_secs: The longest pause.
        max_probes: How many probes before the operation is escalated.
        probe_timeout_secs: How long one probe (the ``reconcile`` hook) may take; a probe that
            has not answered by then counts as "cannot tell yet" (it is abandoned).
    """

    initial_secs: float = 0.5
    multiplier: float = 2.0
    max_secs: float = 30.0
    max_probes: int = 8
    probe_timeout_secs: float = 10.0

    def pause(self, step: int) -> float:
        """The pause after the ``step``-th wait of a reconciliation (1 for the first)."""
        return backoff_secs(self.initial_secs, self.multiplier, self.max_secs, step)


class Executor:
    """Runs operations for one runtime.

    Args:
        ledger: Where every status change is written first.
        clock: Time and sleeping.
        authorizer: Asked again before every retry and every recovered run.
        actor: Recorded on every audit event this executor writes.
        schedule: Reconciliation probe schedule.
        rand: Source of jitter in [0, 1).
        telemetry: Given the span of each attempt and reconciliation (none: no spans).
        on_late_outcome: Told each outcome that a late answer of an effect wrote after the
            operation was taken over (UNKNOWN → COMMITTED), so that it reaches the
            conversation like any other outcome.
        on_unrecorded: Told an outcome this executor knows but could not write yet (the
            ledger is unavailable; the write is tried again until it lands): the operation as
            it will be recorded, so that its caller is answered truthfully meanwhile.
        on_unknown: Told an attempt's outcome is UNKNOWN when its reconciliation's first probe
            did not settle it (the rest may wait for the tool's commit horizon), so that its
            caller hears now that it is not known yet and being checked.
        write_retry: The backoff of outcome writes that fail because the ledger is unavailable.
        reporter: Gives each attempt's effect where its progress reports go
            (`ActionContext.report`); none: reports are dropped.
    """

    def __init__(
        self,
        ledger: Ledger,
        clock: Clock,
        authorizer: Authorizer,
        *,
        actor: str,
        schedule: ReconcileSchedule | None = None,
        rand: Callable[[], float] = random.random,
        telemetry: Telemetry | None = None,
        on_late_outcome: Callable[[Tracked, Operation], None] | None = None,
        on_unrecorded: Callable[[Tracked, Operation], None] | None = None,
        on_unknown: Callable[[Tracked, Operation], None] | None = None,
        write_retry: WriteRetry | None = None,
        reporter: Callable[[Operation, Tracked], Reporter] | None = None,
    ) -> None:
        self.telemetry = telemetry if telemetry is not None else Telemetry()
        self._on_late_outcome = on_late_outcome
        self._on_unrecorded = on_unrecorded
        self._on_unknown = on_unknown
        self.write_retry = write_retry or WriteRetry()
        self.ledger = ledger
        self.clock = clock
        self.authorizer = authorizer
        self.actor = actor
        self.schedule = schedule or ReconcileSchedule()
        self.rand = rand
        self._reporter = reporter
        self._hurry = asyncio.Event()
        self._unwritten: dict[str, tuple[Tracked, Operation]] = {}
        """Outcomes told to their callers that the ledger does not hold yet, by operation."""
        self._all_written = asyncio.Event()
        self._all_written.set()

    # --- closing ---------------------------------------------------------------------------

    def hurry(self) -> None:
        """The runtime closes: outcome writes still failing are tried again now, and often."""
        self._hurry.set()

    async def written(self, timeout_secs: float) -> list[tuple[Tracked, Operation]]:
        """Wait up to ``timeout_secs`` (real time) until every told outcome is written.

        Returns:
            The outcomes still not written then: each operation's record here, and the
            operation as its caller was told it.
        """
        if self._unwritten:
            # At least a turn for writes that were hurried: a zero grace still tries once.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._all_written.wait(), max(timeout_secs, 0.05))
        return list(self._unwritten.values())

    # --- running ---------------------------------------------------------------------------

    async def run(self, op: Operation, tracked: Tracked, *, stage: str = "admission") -> Operation:
        """Drive ``op`` (ADMITTED, RUNNING or FAILED_RETRYABLE) to an outcome and return it."""
        binding = tracked.binding
        mutation = binding.policy.kind is ToolKind.MUTATION
        while True:
            if op.status in UNSENT_STATUSES:
                unreadable = unreadable_reason(op)
                if unreadable is not None:
                    # A sealed argument did not open (a damaged row, a key no longer set):
                    # sending a stand-in for the real value would be worse than not sending.
                    error = f"not sent: {unreadable}"
                    return await self._settle(op, tracked, S.FAILED_FINAL, error=error)
                if op.attempt > 0 or stage != "admission":
                    denied = await self._denied(op, binding, "retry" if op.attempt else stage)
                    if denied is not None:
                        return await self._settle(op, tracked, S.FAILED_FINAL, error=denied)
                try:
                    started = await self._try_move(op, tracked, S.RUNNING, reason="attempt starts")
                except LedgerError as exc:
                    # Nothing is sent without its write-ahead record: this attempt did not
                    # happen, and that is what is recorded (once the ledger takes it).
                    return await self._settle(
                        op,
                        tracked,
                        S.FAILED_FINAL,
                        error=f"not sent: the ledger could not record the attempt ({exc})",
                    )
                if started is None:
                    return await self._read(op)
                op = started
            if op.status is not S.RUNNING:
                return op
            with self.telemetry.attempt(op) as span:
                answer = await self._call_effect(op, tracked)
                if answer is not _TAKEN_OVER and answer[1] is not None:
                    span.fail(type(answer[1]).__name__)
            if answer is _TAKEN_OVER:
                return await self._read(op)
            value, error = answer
            if error is None:
                return await self._settle(op, tracked, S.COMMITTED, result=value)
            outcome = classify(error, mutation=mutation)
            _log_failure(op, error, outcome)
            message = f"{type(error).__name__}: {error}"
            if outcome is Outcome.FINAL:
                return await self._settle(op, tracked, S.FAILED_FINAL, error=message)
            if outcome is Outcome.UNKNOWN:
                unknown = await self._settle(op, tracked, S.UNKNOWN, error=message)
                if unknown.status is not S.UNKNOWN:
                    return unknown
                return await self.reconcile(unknown, tracked, on_wait=self._on_unknown)
            failed = await self._settle(op, tracked, S.FAILED_RETRYABLE, error=message)
            if failed.status is not S.FAILED_RETRYABLE:
                return failed
            delay = self._retry_delay(failed, binding.policy, outcome)
            if delay is None:
                return await self._settle(
                    failed, tracked, S.FAILED_FINAL, error=f"{message} (no retry left)"
                )
            await self.clock.sleep(delay)
            op = await self._read(failed)

    def _retry_delay(self, op: Operation, policy: ToolPolicy, outcome: Outcome) -> float | None:
        return retry_delay(
            policy,
            attempt=op.attempt,
            outcome=outcome,
            now=self.clock.now(),
            deadline_at=op.deadline_at,
            rand=self.rand(),
        )

    async def _call_effect(self, op: Operation, tracked: Tracked) -> Any:
        binding = tracked.binding
        reporter = self._reporter(op, tracked) if self._reporter is not None else None
        ctx = ActionContext.of(op, reporter=reporter)
        with logger.contextualize(**operation_ids(op)):
            # The effect's task copies this context: the application's own log lines in the
            # effect carry the operation's correlation ids.
            task = asyncio.get_running_loop().create_task(
                binding.action.run(ctx), name=f"pipecat_actions.effect.{op.operation_id}"
            )
        tracked.effect_task = task
        tracked.effect_ended_at = None
        task.add_done_callback(lambda _: _ended(tracked, self.clock.now()))
        await _first_of(task, tracked.takeover.future())
        if not task.done():
            # The watchdog or a confirmed cancel took the operation over; a late answer of the
            # effect is still recorded.
            task.add_done_callback(lambda t: self._late_answer(op.operation_id, tracked, t))
            return _TAKEN_OVER
        if task.cancelled():
            return _TAKEN_OVER
        error = _said(task)
        return (None, error) if error is not None else (task.result(), None)

    def _late_answer(self, operation_id: str, tracked: Tracked, task: asyncio.Task[Any]) -> None:
        if task.cancelled():
            return
        error = _said(task)
        if error is not None and not isinstance(error, _SAID_BY_THE_EFFECT):
            logger.bind(operation_id=operation_id).opt(exception=error).error(
                "operation {}: its effect raised {} after it was taken over: {}",
                operation_id,
                type(error).__name__,
                error,
            )
        asyncio.get_running_loop().create_task(
            self._record_late(operation_id, tracked, None if error else task.result(), error)
        )

    async def _record_late(
        self, operation_id: str, tracked: Tracked, value: Any, error: BaseException | None
    ) -> None:
        detail = {"late_answer": "error" if error else "result", "error": repr(error)}
        try:
            op = await self._must_write(
                lambda: self.ledger.annotate(operation_id, actor=self.actor, detail=detail)
            )
            if error is None and op.status is S.UNKNOWN:
                settled = await self._settle(
                    op, tracked, S.COMMITTED, result=value, reason="late answer"
                )
                if settled.status is S.COMMITTED and self._on_late_outcome is not None:
                    self._on_late_outcome(tracked, settled)
            elif error is None and op.status is S.FAILED_FINAL:
                # The effect says it happened, the ledger says it did not: the system of
                # record is the truth, and the contradiction is a fact of its own.
                corrected = await self.correct(
                    op, tracked, value, source="the late answer of its effect"
                )
                if corrected.status is S.COMMITTED and self._on_late_outcome is not None:
                    self._on_late_outcome(tracked, corrected)
        except Exception as exc:  # a late answer must never crash the runtime
            logger.bind(operation_id=operation_id).warning(
                "operation {}: could not record a late answer: {}", operation_id, exc
            )

    # --- reconciliation --------------------------------------------------------------------

    async def reconcile(
        self,
        op: Operation,
        tracked: Tracked,
        *,
        patient: bool = True,
        on_wait: Callable[[Tracked, Operation], None] | None = None,
    ) -> Operation:
        """Ask the system of record what became of an UNKNOWN operation; escalate if unsure.

        "No trace" settles it as not happened only once the tool's commit horizon has passed
        (`horizon_at`), or the provider confirmed a cancel by key (``cancel_to_settle``).
        ``patient``: such a "no trace" before the horizon spends no probe, and the horizon is
        waited for (the runtime's own reconciliation); else it spends one, as any answer that
        settles nothing does (a person's one-off check). ``on_wait`` is told the operation
        once, when a first probe did not settle it and reconciliation is about to wait (its
        caller then hears that it is not known yet and being checked).
        """
        with self.telemetry.reconciliation(op) as span:
            final = await self._reconcile(op, tracked, patient=patient, on_wait=on_wait)
            span.set("status", final.status.value)
            span.set("escalated", final.escalated_at is not None)
            return final

    async def _reconcile(
        self,
        op: Operation,
        tracked: Tracked,
        *,
        patient: bool,
        on_wait: Callable[[Tracked, Operation], None] | None,
    ) -> Operation:
        hook = tracked.binding.action.reconcile
        if hook is None:
            return await self.escalate(op, "no reconcile hook: the outcome cannot be checked")
        horizon_at = await self.horizon_at(op, tracked)
        settle_by_cancel = (
            tracked.binding.policy.reconciliation.cancel_to_settle
            and tracked.binding.action.cancel is not None
        )
        step = 1  # of the schedule's backoff: one more after each pause
        probe = 0
        while probe < self.schedule.max_probes:
            try:
                current = await self.ledger.get(op.operation_id)
            except LedgerError as exc:
                if not exc.retryable:
                    raise
                # The ledger is down: no probe is spent; its answer could not be written.
                await self.clock.sleep(self.schedule.pause(step))
                step += 1
                continue
            probe += 1
            if current.status is not S.UNKNOWN:
                return current
            # Taken before the probe: an effect that commits while the hook looks must not
            # turn the hook's "no trace" into "it did not happen".
            running_at_probe = _still_running(tracked)
            try:
                with logger.contextualize(**operation_ids(current)):
                    answer = await self._probe(hook, ActionContext.of(current))
                state, result = answer.state, answer.result
            except Exception as exc:
                await self._note(
                    op.operation_id,
                    {"reconcile_error": f"{type(exc).__name__}: {exc}", "probe": probe},
                )
                state, result = ReconcileState.PENDING, None
            delay = pause = self.schedule.pause(step)
            if state is ReconcileState.NOT_FOUND:
                running = running_at_probe or _still_running(tracked)
                horizon_at = max(horizon_at, _horizon_from(tracked, current))
                if running or self.clock.now() < horizon_at:
                    if not running and settle_by_cancel:
                        settle_by_cancel = False  # asked once: its answer stands
                        cancelled = await self._cancel_to_settle(current, tracked)
                        if cancelled is not None:
                            return cancelled
                    # No trace yet, but the provider may still apply it (the effect may still
                    # be sending, or the request may still be queued there): "it did not
                    # happen" would be a guess. The operation stays UNKNOWN and is asked about
                    # again. Waiting for the horizon spends none of the schedule's probes (a
                    # running effect does: one that never answers is a person's to look at).
                    await self._note(
                        op.operation_id,
                        {
                            "reconcile_not_final": (
                                "no trace yet, but the effect is still running"
                                if running
                                else "no trace yet, but the provider may still apply it"
                            ),
                            "horizon_at": horizon_at,
                            "probe": probe,
                        },
                    )
                    state = ReconcileState.PENDING
                    if not running and patient:
                        probe -= 1
                        pause = min(delay, max(horizon_at - self.clock.now(), 0.0))
            if state is ReconcileState.COMMITTED:
                return await self._settle(
                    current, tracked, S.COMMITTED, result=result, reason="reconciled"
                )
            if state is ReconcileState.NOT_FOUND:
                return await self._settle(
                    current,
                    tracked,
                    S.FAILED_FINAL,
                    error=(
                        "the system of record has no trace of it, and it can no longer be "
                        "applied: it did not happen"
                    ),
                    reason="reconciled",
                )
            if on_wait is not None:
                on_wait(tracked, current)
                on_wait = None
            await self.clock.sleep(pause)
            step += 1
        return await self.escalate(op, f"still unknown after {self.schedule.max_probes} checks")

    async def horizon_at(self, op: Operation, tracked: Tracked) -> float:
        """When a "no trace" of ``op`` (UNKNOWN) becomes evidence that it did not happen.

        The tool's ``reconciliation.commit_horizon_secs`` after the last moment its request
        could have left: when it became UNKNOWN (its effect was stopped then, or its owner was
        gone), or when its effect ended here, if later. Read from the audit trail; when the
        trail cannot be read, the operation's last change stands in (later, so safe).
        """
        since = op.updated_at
        try:
            events = await self.ledger.events(op.operation_id)
        except LedgerError:
            events = []
        for event in reversed(events):
            if event.to_status is S.UNKNOWN and event.from_status is not S.UNKNOWN:
                since = event.at
                break
        if op.sent_at is not None:
            since = max(since, op.sent_at)
        return max(since + _horizon_secs(tracked), _horizon_from(tracked, op))

    async def _cancel_to_settle(self, op: Operation, tracked: Tracked) -> Operation | None:
        """Ask the provider to cancel ``op`` by its key; FAILED_FINAL if it confirms, else None.

        ``reconciliation.cancel_to_settle``: once the provider confirms that the request is
        cancelled, nothing of it can be applied any more, so "no trace" is final now.
        """
        cancel = tracked.binding.action.cancel
        assert cancel is not None
        try:
            with logger.contextualize(**operation_ids(op)):
                outcome = await self._ask(cancel, ActionContext.of(op), "cancel")
        except Exception as exc:
            await self._note(
                op.operation_id, {"cancel_to_settle_error": f"{type(exc).__name__}: {exc}"}
            )
            return None
        await self._note(op.operation_id, {"cancel_to_settle": str(outcome)})
        if outcome != CancelOutcome.CANCELLED:
            return None  # too late (it is there: the next probe finds it) or not known
        return await self._settle(
            op,
            tracked,
            S.FAILED_FINAL,
            error=(
                "the system of record had no trace of it and confirmed it cancelled by its "
                "key: it did not happen and will not"
            ),
            reason="reconciled",
        )

    async def correct(
        self, op: Operation, tracked: Tracked | None, result: Any, *, source: str
    ) -> Operation:
        """Record that the system of record reports a commit for ``op``, held as FAILED_FINAL.

        The ledger follows the system of record: ``op`` moves to COMMITTED, the audit event
        records the conflict (``conflict``: what was held and who reports otherwise), and the
        operation is escalated for a person, since whoever was told it failed was told wrong.
        Its conversation is told the correction like any outcome that changed after it was
        told. An operation in any other status is returned as it is.
        """
        if op.status is not S.FAILED_FINAL:
            return op
        conflict = (
            f"{source} reports that it happened, but the ledger held it as failed "
            f"({op.error or 'no reason recorded'})"
        )
        try:
            corrected = await self._must_write(
                lambda: self.ledger.transition(
                    op.operation_id,
                    expected=S.FAILED_FINAL,
                    to=S.COMMITTED,
                    fence=tracked.fence if tracked is not None else op.fence,
                    actor=self.actor,
                    detail={"reason": "conflict", "conflict": conflict},
                    changes={"result": _recordable(result), "escalated_at": self.clock.now()},
                )
            )
        except TransitionRefused:
            return await self._read(op)
        operation_logger(op).error(
            "operation {}: CONFLICT: {}; recorded as COMMITTED and escalated",
            op.operation_id,
            conflict,
        )
        return corrected

    async def _probe(self, hook: Any, ctx: ActionContext) -> Reconciliation:
        """Ask the reconcile hook once, within the schedule's time limit on the clock."""
        answer: Reconciliation = await self._ask(hook, ctx, "reconcile")
        return answer

    async def _ask(self, hook: Any, ctx: ActionContext, name: str) -> Any:
        """Call a hook once, within the schedule's probe time limit on the clock."""
        asking = asyncio.ensure_future(hook(ctx))
        limit = asyncio.ensure_future(sleep_from_now(self.clock, self.schedule.probe_timeout_secs))
        try:
            await asyncio.wait({asking, limit}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            limit.cancel()
        if not asking.done():
            asking.cancel()  # abandoned, not awaited: a hook may ignore cancellation
            asking.add_done_callback(_consume)
            raise TimeoutError(
                f"the {name} hook gave no answer within {self.schedule.probe_timeout_secs} s"
            )
        return asking.result()

    async def escalate(self, op: Operation, why: str) -> Operation:
        """Mark an UNKNOWN operation as needing a person; it stays UNKNOWN."""
        at = self.clock.now()
        escalated = await self._must_write(
            lambda: self.ledger.annotate(
                op.operation_id,
                actor=self.actor,
                detail={"escalated": why},
                changes={"escalated_at": at},
            )
        )
        operation_logger(op).warning("operation {} escalated: {}", op.operation_id, why)
        return escalated

    # --- helpers ---------------------------------------------------------------------------

    async def _denied(self, op: Operation, binding: Binding, stage: str) -> str | None:
        decision = await ask(
            self.authorizer,
            AuthorizationRequest(
                principal=op.principal,
                tenant=op.tenant,
                session_id=op.session_id,
                tool=op.tool,
                kind=op.kind,
                args=op.args,
                resource_key=op.resource_key,
                stage=stage,
            ),
        )
        if isinstance(decision, AuthorizerFailed):
            # Fails closed, as at admission; the model hears no internals.
            operation_logger(op).warning(
                "operation {}: the authorizer failed before the {}: {}",
                op.operation_id,
                stage,
                decision.error,
            )
            return "not authorized any more: whether it is allowed could not be checked"
        return None if decision.allowed else f"not authorized any more: {decision.reason}"

    async def _try_move(
        self, op: Operation, tracked: Tracked, to: ActionStatus, *, reason: str
    ) -> Operation | None:
        """Move ``op`` under its fence; None when it moved meanwhile (the caller reads it again)."""
        try:
            return await self.ledger.transition(
                op.operation_id,
                expected=op.status,
                to=to,
                fence=tracked.fence,
                actor=self.actor,
                detail={"reason": reason},
            )
        except TransitionRefused:
            return None

    async def _settle(
        self,
        op: Operation,
        tracked: Tracked,
        to: ActionStatus,
        *,
        result: Any = None,
        error: str | None = None,
        reason: str | None = None,
    ) -> Operation:
        """Write an outcome from whatever non-terminal status the operation is in now.

        Someone else (the watchdog, a cancel) may have moved it meanwhile: the outcome is then
        written from that status if the table allows it, or recorded as a late event.
        """
        changes: dict[str, Any] = {}
        if result is not None:
            changes["result"] = _recordable(result)
        if error is not None:
            changes["error"] = error
        told = False

        def unrecorded(exc: LedgerError, failures: int) -> None:
            # The outcome is known here and the ledger cannot take it yet: the caller hears
            # it now, the write goes on, and the lease is let go of until it lands.
            nonlocal told
            if told:
                return
            told = True
            tracked.unsettled = True
            self._unwritten[op.operation_id] = (tracked, _as_recorded(op, to, changes))
            self._all_written.clear()
            operation_logger(op).warning(
                "operation {}: its outcome {} cannot be recorded yet ({}); trying again",
                op.operation_id,
                to.value,
                exc,
            )
            if self._on_unrecorded is not None:
                self._on_unrecorded(tracked, _as_recorded(op, to, changes))

        current = op
        for _ in range(3):
            if current.status in TERMINAL_STATUSES or to not in TRANSITIONS[current.status]:
                break
            expected = current.status
            try:
                settled = await self._must_write(
                    lambda expected=expected: self.ledger.transition(  # type: ignore[misc]
                        op.operation_id,
                        expected=expected,
                        to=to,
                        fence=tracked.fence,
                        actor=self.actor,
                        detail={"reason": reason or to.value.lower()},
                        changes=changes,
                    ),
                    on_failure=unrecorded,
                )
            except TransitionRefused:
                current = await self._must_write(
                    lambda: self.ledger.get(op.operation_id), on_failure=unrecorded
                )
                continue
            self._written(tracked)
            return settled
        noted = await self._must_write(
            lambda: self.ledger.annotate(
                op.operation_id,
                actor=self.actor,
                detail={"late_outcome": to.value, "error": error, "reason": reason},
            ),
            on_failure=unrecorded,
        )
        self._written(tracked)
        return noted

    def _written(self, tracked: Tracked) -> None:
        """The outcome of ``tracked`` this executor knows is in the ledger now."""
        tracked.unsettled = False
        if self._unwritten.pop(tracked.operation_id, None) is not None and not self._unwritten:
            self._all_written.set()

    async def _must_write(
        self,
        write: Callable[[], Awaitable[Operation]],
        on_failure: Callable[[LedgerError, int], None] | None = None,
    ) -> Operation:
        """``write()`` until it lands (`until_written`), with this executor's backoff."""
        return await until_written(
            write,
            clock=self.clock,
            retry=self.write_retry,
            on_failure=on_failure,
            hurry=self._hurry,
        )

    async def _note(self, operation_id: str, detail: dict[str, Any]) -> None:
        """Add an audit note; best effort (a reconciliation goes on without it)."""
        try:
            await self.ledger.annotate(operation_id, actor=self.actor, detail=detail)
        except LedgerError as exc:
            logger.bind(operation_id=operation_id).warning(
                "operation {}: could not note {}: {}", operation_id, sorted(detail), exc
            )

    async def _read(self, op: Operation) -> Operation:
        """``op`` as the ledger holds it now; as last known here when it cannot be read."""
        try:
            return await self.ledger.get(op.operation_id)
        except LedgerError as exc:
            operation_logger(op).warning(
                "operation {}: could not be read again: {}", op.operation_id, exc
            )
            return op


def retry_delay(
    policy: ToolPolicy,
    *,
    attempt: int,
    outcome: Outcome,
    now: float,
    deadline_at: float | None,
    rand: float,
) -> float | None:
    """Return how long to wait before the next attempt, or None when there must be none.

    A retry needs an attempt left, safety (a read, a provider that dedupes on our key, or a
    request known not to have been sent) and time before the deadline.
    """
    retry = policy.retry
    if attempt >= retry.max_attempts:
        return None
    safe = (
        policy.kind is ToolKind.READ
        or policy.idempotency.provider_dedupes
        or outcome is Outcome.NOT_SENT
    )
    if not safe:
        return None
    delay = retry.delay_for(attempt, rand=rand)
    if deadline_at is not None and now + delay >= deadline_at:
        return None
    return delay


_TAKEN_OVER: Any = object()

_SAID_BY_THE_EFFECT = (
    EffectFailed,
    EffectNotSent,
    EffectOutcomeUnknown,
    EffectRetryable,
    # What a client raises when the wire failed: classified like a real client's, not a bug.
    TimeoutError,
    ConnectionError,
)
"""What an effect raises to say what happened: no traceback is logged for them."""


_OUTCOMES = (EffectFailed, EffectNotSent, EffectOutcomeUnknown, EffectRetryable)
"""What an effect may also return instead of raising (a handler that answers with a value)."""


def _said(task: asyncio.Task[Any]) -> BaseException | None:
    """The failure an ended effect's task says: what it raised, or an outcome it returned.

    A handler written for bare Pipecat answers with a value (``result_callback``, a Flows
    return): it says "sent, outcome unknown" by answering with an `EffectOutcomeUnknown`
    (or another outcome class), which counts as raising it.
    """
    error = task.exception()
    if error is not None:
        return error
    value = task.result()
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[0], _OUTCOMES):
        value = value[0]  # a Flows handler's (result, next node)
    return value if isinstance(value, _OUTCOMES) else None


def _log_failure(op: Operation, error: BaseException, outcome: Outcome) -> None:
    """Log an effect's failure: with its traceback, unless the effect classified it itself."""
    log = operation_logger(op)
    if isinstance(error, _SAID_BY_THE_EFFECT):
        log.warning(
            "operation {}: {} attempt {} failed ({}): {}: {}",
            op.operation_id,
            op.tool,
            op.attempt,
            outcome.value,
            type(error).__name__,
            error,
        )
        return
    log.opt(exception=error).error(
        "operation {}: the effect of {} raised {} on attempt {} ({}): {}",
        op.operation_id,
        op.tool,
        type(error).__name__,
        op.attempt,
        outcome.value,
        error,
    )


def _recordable(result: Any) -> Any:
    """``result`` if the ledger can hold it as JSON, else a note saying why it is missing.

    An effect that returns something JSON cannot represent still happened: its outcome is
    written (COMMITTED) with this note instead of the value, never left unwritten.
    """
    try:
        canonical_json(result)
    except (TypeError, ValueError) as exc:
        return {"unrecorded_result": f"{type(result).__name__} is not JSON: {exc}"[:300]}
    return result


def _as_recorded(op: Operation, to: ActionStatus, changes: dict[str, Any]) -> Operation:
    """``op`` as it will be once the outcome ``to`` with ``changes`` is written."""
    result = changes.get("result")
    return dataclasses.replace(
        op,
        status=to,
        result_json=op.result_json if result is None else canonical_json(result),
        error=changes.get("error", op.error),
    )


async def _first_of(task: asyncio.Task[Any], takeover: asyncio.Future[None]) -> None:
    """Wait until ``task`` or ``takeover`` is done; cancel neither (``asyncio.wait``, leaner).

    On every propose: one future and two callbacks, no set of futures made and taken apart.
    """
    if task.done() or takeover.done():
        return
    waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def wake(_: asyncio.Future[Any]) -> None:
        if not waiter.done():
            waiter.set_result(None)

    task.add_done_callback(wake)
    takeover.add_done_callback(wake)
    try:
        await waiter
    finally:
        takeover.remove_done_callback(wake)  # shared by every wait of the operation
        task.remove_done_callback(wake)


def _ended(tracked: Tracked, at: float) -> None:
    tracked.effect_ended_at = at


def _horizon_secs(tracked: Tracked) -> float:
    return tracked.binding.policy.reconciliation.commit_horizon_secs


def _horizon_from(tracked: Tracked, op: Operation) -> float:
    """The horizon counted from when this process's effect of ``op`` ended (if it did here)."""
    ended = tracked.effect_ended_at
    if ended is None or tracked.operation_id != op.operation_id:
        return float("-inf")
    return ended + _horizon_secs(tracked)


def _still_running(tracked: Tracked) -> bool:
    """Whether the effect of ``tracked`` was started and has not ended (it may still commit)."""
    return tracked.effect_task is not None and not tracked.effect_task.done()


def _consume(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()
