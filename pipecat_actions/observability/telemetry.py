"""`Telemetry`: the one interface through which the runtime and the processors report.

Instrumentation points call it; it keeps the metrics (`ActionMetrics`) and, when tracing is
on, opens the spans (`OtelTracer`). Three kinds of reports reach it:

* **ledger writes**, from `ObservedLedger`, which wraps the runtime's ledger: every status
  change, annotation and insertion of this process passes there, so most metrics (retries,
  timeouts, UNKNOWN, cancellations, compensations, commit times) come from one place and
  cannot miss a caller;
* **scopes** around work that writes nothing by itself: `admission`, each `attempt` of an
  effect, `reconciliation` and `delivery`, which time the work and carry its span;
* **session events** the ledger does not see: `handoff`, `follow_turns` (Pipecat's tracing
  context of a pipeline).

Nothing here imports ``opentelemetry``: spans are made by `OtelTracer`, built only when
tracing is turned on.
"""

from __future__ import annotations

__all__ = ["Decided", "Telemetry", "Traced", "enable_tracing"]

import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Protocol

from pipecat_actions.ledger import NewOperation, Operation
from pipecat_actions.ledger.records import First
from pipecat_actions.observability.metrics import ActionMetrics
from pipecat_actions.observability.tracing import NULL_SPAN, OtelTracer, Span, SpanIds, key_hash
from pipecat_actions.session import SessionState
from pipecat_actions.status import TERMINAL_STATUSES, UNSENT_STATUSES, ActionStatus

S = ActionStatus
_DUPLICATE_REFUSALS = frozenset({"duplicate", "idempotency_mismatch"})
_PARENTS_KEPT = 10_000
"""How many operations' proposing-turn contexts are remembered for their later spans."""


class Decided(Protocol):
    """What telemetry reads of an admission decision (`pipecat_actions.admission.decisions`)."""

    @property
    def kind(self) -> str:
        """``admitted``, ``joined``, ``refused``, ``read`` or ``shared``."""
        ...

    @property
    def operation(self) -> Operation | None:
        """The operation the call became (admitted) or shares (joined), if any."""
        ...

    @property
    def reason(self) -> str | None:
        """Why a call was refused (None for the other kinds)."""
        ...


class Telemetry:
    """Metrics and spans of one runtime (see the module docstring).

    Args:
        metrics: The registry to feed; a new one when None.
        timer: Monotonic seconds, for the durations no ledger stamp gives (admission).

    Attributes:
        metrics: The registry (``runtime.metrics``).
        tracer: The span maker; None while tracing is off.
    """

    def __init__(
        self,
        metrics: ActionMetrics | None = None,
        *,
        timer: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.metrics = metrics or ActionMetrics()
        self.tracer: OtelTracer | None = None
        self._timer = timer
        self._turns: dict[str, Any] = {}
        self._parents: OrderedDict[str, Any] = OrderedDict()
        self._unknown: set[str] = set()

    # --- Pipecat's turns -------------------------------------------------------------------

    def follow_turns(self, session_id: str, tracing_context: Any) -> None:
        """Parent the spans of ``session_id`` to the turns of a Pipecat ``TracingContext``.

        Called by the `ActionResultGate` when its pipeline runs with Pipecat's tracing on;
        turns tracing on if it was off (Pipecat's tracing means it is configured).
        """
        self._turns[session_id] = tracing_context
        if self.tracer is None:
            self.tracer = OtelTracer()

    def forget_session(self, session_id: str) -> None:
        """Stop following the turns of ``session_id`` (its pipeline ended)."""
        self._turns.pop(session_id, None)

    def _turn(self, session_id: str) -> Any:
        context = self._turns.get(session_id)
        if context is None:
            return None
        return context.get_turn_context() or context.get_conversation_context()

    def _remember_parent(self, operation_id: str, parent: Any) -> None:
        if parent is None:
            return
        self._parents[operation_id] = parent
        if len(self._parents) > _PARENTS_KEPT:
            self._parents.popitem(last=False)

    # --- scopes ----------------------------------------------------------------------------

    def admission(
        self, tool: str, session: SessionState, tool_call_id: str | None
    ) -> AdmissionScope:
        """Scope one call's admission: its latency, its span, and its decision."""
        return AdmissionScope(self, tool, session, tool_call_id)

    def attempt(self, op: Operation) -> AbstractContextManager[Span]:
        """Scope one attempt of a mutation's effect (``op`` is RUNNING, attempt n)."""
        if self.tracer is None:
            return NULL_SPAN
        return self._span(
            "pipecat_actions.attempt",
            SpanIds.of(op),
            self._parents.get(op.operation_id),
            attempt=op.attempt,
        )

    def read_attempt(self, ids: SpanIds | None, attempt: int) -> AbstractContextManager[Span]:
        """Scope one attempt of a read (run in the caller's task, recorded afterwards).

        ``ids`` may be None while tracing is off (the caller skips building them).
        """
        if self.tracer is None or ids is None:
            return NULL_SPAN
        return self._span(
            "pipecat_actions.attempt", ids, self._turn(ids.session_id), attempt=attempt
        )

    def reconciliation(self, op: Operation) -> AbstractContextManager[Span]:
        """Scope the reconciliation of an UNKNOWN operation (all its probes)."""
        if self.tracer is None:
            return NULL_SPAN
        return self._span(
            "pipecat_actions.reconciliation", SpanIds.of(op), self._parents.get(op.operation_id)
        )

    def delivery(
        self, op: Operation, session: SessionState, *, late: bool, superseded_by: str | None = None
    ) -> AbstractContextManager[Span]:
        """Scope telling an outcome to the conversation; ``late``: after it moved on.

        The span is a child of the turn in which the outcome is told.
        """
        if late:
            self.metrics.add("late_results", op.tool)
        if self.tracer is None:
            return NULL_SPAN
        return self._span(
            "pipecat_actions.delivery",
            SpanIds.of(op),
            self._turn(session.session_id),
            status=op.status.value,
            late=late,
            superseded=superseded_by is not None,
        )

    @contextmanager
    def _span(self, name: str, ids: SpanIds, parent: Any, **attributes: Any) -> Iterator[Span]:
        assert self.tracer is not None
        with self.tracer.span(name, ids, parent) as span:
            for key, value in attributes.items():
                span.set(key, value)
            yield span

    # --- session events --------------------------------------------------------------------

    def suppressed(self, op: Operation) -> None:
        """An outcome was recorded but, by policy, not told."""
        self.metrics.add("suppressed_results", op.tool)

    def handoff(self, agent: str, pending: Sequence[Operation]) -> None:
        """A new agent took over a session that still had ``pending`` operations."""
        for op in pending:
            self.metrics.add("handoffs_with_pending", op.tool)

    # --- ledger writes (from ObservedLedger) -----------------------------------------------

    def admitted(self, new: NewOperation, op: Operation, created: bool) -> None:
        """An operation was inserted (or the key's existing one returned)."""
        if not created:
            return
        self.metrics.add("operations", op.tool)
        if op.status is S.RUNNING:  # inserted as sent: its first attempt starts now
            self.metrics.add("attempts", op.tool)
        if new.compensates is not None:
            self.metrics.add("compensations", op.tool)

    def completed(self, new: NewOperation, op: Operation) -> None:
        """A read was recorded after the fact, with its outcome."""
        tool = op.tool
        detail = new.detail or {}
        attempts = int(detail.get("attempts", 1) or 1)
        self.metrics.add("operations", tool)
        self.metrics.add("attempts", tool, attempts)
        if attempts > 1:
            self.metrics.add("retries", tool, attempts - 1)
        if detail.get("timed_out"):
            self.metrics.add("timeouts", tool)
        self.metrics.add("outcomes", tool, label=op.status.value)

    def transitioned(
        self, expected: ActionStatus, op: Operation, actor: str, detail: Mapping[str, Any] | None
    ) -> None:
        """An operation moved from ``expected`` to ``op.status``."""
        tool, to = op.tool, op.status
        metrics = self.metrics
        if to is S.RUNNING:
            metrics.add("attempts", tool)
            if op.attempt > 1:
                metrics.add("retries", tool)
        if actor == "watchdog":
            metrics.add("timeouts", tool)
        if to is S.UNKNOWN:
            metrics.add("unknown", tool)
            self._enter_unknown(op)
        elif expected is S.UNKNOWN:
            self._leave_unknown(op)
            if (detail or {}).get("reason") == "reconciled":
                found = "committed" if to is S.COMMITTED else "not_happened"
                metrics.add("reconciliations", tool, label=found)
        if (detail or {}).get("conflict"):
            metrics.add("conflicts", tool)
        if to is S.CANCEL_REQUESTED:
            metrics.add("cancellations_requested", tool)
        elif to is S.CANCELLED:
            if expected is S.CANCEL_REQUESTED:
                metrics.add("cancellations_confirmed", tool)
            elif expected in UNSENT_STATUSES:
                metrics.add("cancelled_before_send", tool)
        elif to is S.COMPENSATED:
            metrics.add("compensated", tool)
        if to is S.COMMITTED and expected is not S.COMPENSATING and op.committed_at is not None:
            if op.sent_at is not None:
                metrics.observe("execution_to_commit", tool, op.committed_at - op.sent_at)
            metrics.observe("admission_to_commit", tool, op.committed_at - op.created_at)
        if to in TERMINAL_STATUSES:
            metrics.add("outcomes", tool, label=to.value)

    def annotated(
        self, op: Operation, detail: Mapping[str, Any] | None, changes: Mapping[str, Any] | None
    ) -> None:
        """Something was recorded about an operation without a status change."""
        detail = detail or {}
        if "reconcile_error" in detail:
            self.metrics.add("reconciliation_errors", op.tool)
        if "escalated" in detail:
            self.metrics.add("escalations", op.tool)
        if "late_answer" in detail:
            self.metrics.add("late_answers", op.tool)
        heard = (changes or {}).get("acknowledged_at")
        if isinstance(heard, First):
            heard = heard.value
        # Only the hearing that set it: a later one leaves the first time (see `First`).
        at, committed_at = op.acknowledged_at, op.committed_at
        if heard is not None and at == heard and at is not None and committed_at is not None:
            self.metrics.observe("commit_to_acknowledged", op.tool, at - committed_at)

    def claimed(self, ops: Sequence[Operation]) -> None:
        """This process took over operations whose owner's lease expired."""
        for op in ops:
            if op.status is S.UNKNOWN:
                self._enter_unknown(op)

    def _enter_unknown(self, op: Operation) -> None:
        if op.operation_id not in self._unknown:
            self._unknown.add(op.operation_id)
            self.metrics.add("unknown_now", op.tool)

    def _leave_unknown(self, op: Operation) -> None:
        if op.operation_id in self._unknown:
            self._unknown.discard(op.operation_id)
            self.metrics.add("unknown_now", op.tool, -1)


class AdmissionScope:
    """The scope of one admission (see `Telemetry.admission`); tell it the decision."""

    __slots__ = ("_cm", "_ids", "_parent", "_span", "_started", "_telemetry", "_tool")

    def __init__(
        self, telemetry: Telemetry, tool: str, session: SessionState, tool_call_id: str | None
    ) -> None:
        self._telemetry = telemetry
        self._tool = tool
        self._started = 0.0
        self._cm: AbstractContextManager[Span] | None = None
        self._span: Span = NULL_SPAN
        self._parent: Any = None
        self._ids: SpanIds | None = None
        if telemetry.tracer is not None:
            self._parent = telemetry._turn(session.session_id)
            self._ids = SpanIds(
                session_id=session.session_id,
                tool=tool,
                turn_id=str(session.user_turn),
                tool_call_id=tool_call_id,
            )

    def __enter__(self) -> AdmissionScope:
        self._started = self._telemetry._timer()
        if self._ids is not None and self._telemetry.tracer is not None:
            self._cm = self._telemetry.tracer.span(
                "pipecat_actions.admission", self._ids, self._parent
            )
            self._span = self._cm.__enter__()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self._telemetry.metrics.observe(
            "admission_latency", self._tool, self._telemetry._timer() - self._started
        )
        if self._cm is not None:
            self._cm.__exit__(*exc_info)

    def decided(self, decision: Decided) -> None:
        """Record the admission's decision (an `Admission`, `Refusal`, `Joined`, ...)."""
        metrics, tool, span = self._telemetry.metrics, self._tool, self._span
        outcome = str(decision.kind)
        # Only an admitted or joined call has an operation of its own; a refusal's record is
        # its audit row.
        operation = decision.operation if outcome in ("admitted", "joined") else None
        if outcome == "joined":
            metrics.add("duplicates_suppressed", tool, label="joined")
        elif outcome == "refused":
            reason = "unknown" if decision.reason is None else decision.reason
            metrics.add("refusals", tool, label=reason)
            if reason in _DUPLICATE_REFUSALS:
                metrics.add("duplicates_suppressed", tool, label="rejected")
            span.set("refusal_reason", reason)
        metrics.add("proposals", tool, label=outcome)
        if span is NULL_SPAN:
            return  # tracing is off: no attributes to set (nor the key's hash to take)
        span.set("admission", outcome)
        if operation is not None:
            span.set("operation_id", operation.operation_id)
            span.set("idempotency_key_hash", key_hash(operation.idempotency_key))
            if outcome == "admitted":
                # Its attempts and reconciliation go under the proposing turn; without
                # Pipecat's turns, under this admission, so that one trace tells the story.
                parent = self._parent if self._parent is not None else span.as_parent()
                self._telemetry._remember_parent(operation.operation_id, parent)


class Traced(Protocol):
    """What `enable_tracing` needs of a runtime: its telemetry."""

    @property
    def telemetry(self) -> Telemetry:
        """The runtime's `Telemetry`."""
        ...


def enable_tracing(runtime: Traced, tracer_provider: Any = None) -> OtelTracer:
    """Turn on spans for ``runtime``'s operations; return the tracer.

    Needed only without Pipecat's tracing (with it, the `ActionResultGate` turns this on).

    Args:
        runtime: The runtime to trace.
        tracer_provider: An OpenTelemetry ``TracerProvider``; the global one when None.

    Raises:
        ImportError: ``opentelemetry-api`` is not installed (``pipecat-actions[tracing]``).
    """
    tracer = OtelTracer(tracer_provider)
    runtime.telemetry.tracer = tracer
    return tracer
