"""`Calls`: the conversation port. What an adapter asks the runtime about a tool call.

Frame-free. Every Pipecat-facing adapter (the handler binding, the cascade gate, the RTVI
status reporter, the speech-to-speech adapters, Flows) talks to the runtime through this one
port, and every answer about a call is a typed `ToolResult`:

* **whose call is it**: `owns` (an action, ``confirm_action``, a ``cancel_<tool>``),
  `cancel_target`, `about_another_call`, `operation_for`;
* **propose it**: `propose`, `confirm`, `cancel_for_model`, each answered with a `ToolResult`;
* **close a cancelled call truthfully**: `close_now` (no operation behind it) and
  `close_cancelled` (its operation's real state, never a bare ``CANCELLED``);
* **how a result is delivered**: `open_delivery` (a pipeline's view of what the session is
  owed), `is_read`, `intermediate_runs_llm`, `told` (an operation as the model reads it).

A new kind of pipeline is one adapter that turns its frames (or events) into these calls.
The vocabulary an adapter needs with them (`Told`, `SessionDelivery`, `Speaker`,
`PENDING_STATUSES`, `RoutedNames`) is re-exported here, so adapters import the runtime's
port and nothing else of it.
"""

from __future__ import annotations

__all__ = [
    "CONFIRM_TOOL",
    "PENDING_STATUSES",
    "Calls",
    "Closed",
    "RoutedNames",
    "SessionDelivery",
    "Speaker",
    "Told",
    "asks_for_confirmation",
]

from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pipecat_actions.actions import ActionDefinition, Binding
from pipecat_actions.clock import Clock
from pipecat_actions.ledger import Ledger, Operation
from pipecat_actions.observability.telemetry import Telemetry
from pipecat_actions.policy import ConfirmationMode, OnDuplicate, PolicySet, ToolPolicy
from pipecat_actions.policy.fields import CANCEL_TOOL_PREFIX, cancel_tool_name
from pipecat_actions.results import ToolResult, reconcilable, render, render_operation
from pipecat_actions.runtime._coverage import RoutedNames
from pipecat_actions.runtime._operations import Listener, Operations
from pipecat_actions.runtime.decisions import Decisions
from pipecat_actions.runtime.deliveries import (
    PENDING_STATUSES,
    Deliveries,
    Outlet,
    SessionDelivery,
    Speaker,
    Told,
)
from pipecat_actions.runtime.model_cancels import ModelCancels
from pipecat_actions.runtime.progress import Progress
from pipecat_actions.runtime.proposals import Proposals
from pipecat_actions.session import SessionState
from pipecat_actions.status import TERMINAL_STATUSES, ActionStatus

CONFIRM_TOOL = "confirm_action"
"""The runtime's tool for a verbal confirmation (or a confirmed repeat)."""

Started = Callable[[str], Awaitable[None]]
"""Called with the operation id once a new mutation was admitted and started."""


def asks_for_confirmation(binding: Binding) -> bool:
    """Whether calls of ``binding``'s tool may need ``confirm_action``."""
    policy = binding.policy
    return (
        policy.confirmation.mode is ConfirmationMode.VERBAL
        or policy.on_duplicate is OnDuplicate.CONFIRM
    )


@dataclass(frozen=True)
class Closed:
    """What closes a cancelled call: the result, its operation (None: none) and the record."""

    result: ToolResult
    operation_id: str | None
    operation: Operation | None


class Calls:
    """The conversation port (see the module docstring); `ActionRuntime.calls` holds it.

    Args:
        policy: The loaded tool policies.
        bindings: The registered actions, by tool name (shared with the runtime).
        ledger: Read for the record of an operation a caller asks about.
        operations: Which operation each tool call became; outcome listeners.
        proposals: Admits and answers proposed calls.
        decisions: Verbal confirmations.
        model_cancels: The model's ``cancel_<tool>`` calls.
        deliveries: What the conversations owe their users.
        progress: Whether an operation's outcome is known.
        telemetry: Spans of each telling.
        clock: The time source (a filler's pauses).
        register: Registers an action (the runtime's checks included).
    """

    def __init__(
        self,
        *,
        policy: PolicySet,
        bindings: Mapping[str, Binding],
        ledger: Ledger,
        operations: Operations,
        proposals: Proposals,
        decisions: Decisions,
        model_cancels: ModelCancels,
        deliveries: Deliveries,
        progress: Progress,
        telemetry: Telemetry,
        clock: Clock,
        register: Callable[[ActionDefinition], None],
    ) -> None:
        self.policy = policy
        self.clock = clock
        self._bindings = bindings
        self._ledger = ledger
        self._operations = operations
        self._proposals = proposals
        self._decisions = decisions
        self._model_cancels = model_cancels
        self._deliveries = deliveries
        self._progress = progress
        self._telemetry = telemetry
        self._register = register

    # --- whose call is it ------------------------------------------------------------------

    @property
    def bindings(self) -> Mapping[str, Binding]:
        """The registered actions with their policies, by tool name."""
        return self._bindings

    def policy_of(self, tool: str) -> ToolPolicy | None:
        """The policy of ``tool``'s action, if ``tool`` is one."""
        binding = self._bindings.get(tool)
        return binding.policy if binding is not None else None

    def register(self, definition: ActionDefinition) -> None:
        """Register (or replace) an action whose handler is an adapter's (``app_handler``)."""
        self._register(definition)

    def owns(self, tool: str) -> bool:
        """Whether calls of ``tool`` are the runtime's: an action, ``confirm_action``, a cancel."""
        if tool in self._bindings or tool == CONFIRM_TOOL:
            return True
        return self.cancel_target(tool) is not None

    def cancel_target(self, tool: str) -> str | None:
        """The mutation whose calls ``tool`` stops, if ``tool`` is the runtime's ``cancel_<name>``.

        A name that is a tool of its own (registered, or in the policy) is never a cancel tool.
        """
        if not tool.startswith(CANCEL_TOOL_PREFIX) or tool in self.policy or tool == CONFIRM_TOOL:
            return None
        target = tool[len(CANCEL_TOOL_PREFIX) :]
        binding = self._bindings.get(target)
        if binding is None or not binding.policy.is_mutation or tool in self._bindings:
            return None
        return target

    def cancel_tools(self) -> list[str]:
        """The mutations that get a ``cancel_<name>`` tool (see `cancel_target`)."""
        return [
            name for name in self._bindings if self.cancel_target(cancel_tool_name(name)) == name
        ]

    def needs_confirm_tool(self) -> bool:
        """Whether ``confirm_action`` is offered (verbal confirmations, confirmed repeats)."""
        return any(asks_for_confirmation(b) for b in self._bindings.values())

    def about_another_call(self, tool: str) -> bool:
        """Whether ``tool``'s calls name an operation another call made (confirm, cancel)."""
        return tool == CONFIRM_TOOL or self.cancel_target(tool) is not None

    def operation_for(self, tool_call_id: str) -> str | None:
        """The operation a provider's ``tool_call_id`` was admitted as (or joined), if any."""
        return self._operations.operation_for_call(tool_call_id)

    # --- propose it ------------------------------------------------------------------------

    async def propose(
        self,
        tool: str,
        arguments: Mapping[str, Any] | str,
        session: SessionState,
        *,
        tool_call_id: str | None,
        on_started: Started | None = None,
    ) -> ToolResult:
        """Admit the call and answer it with its outcome (see `ActionRuntime.propose`)."""
        answer = await self._proposals.propose(
            tool, arguments, session, tool_call_id=tool_call_id, wait=True, on_started=on_started
        )
        return ToolResult.of(answer)

    async def confirm(
        self,
        operation_id: str,
        token: str,
        session: SessionState,
        *,
        on_started: Started | None = None,
    ) -> ToolResult:
        """Answer ``confirm_action`` (see `ActionRuntime.confirm`)."""
        answer = await self._decisions.confirm(operation_id, token, session, on_started=on_started)
        return ToolResult.of(answer)

    async def cancel_for_model(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        session: SessionState,
        *,
        tool_call_id: str | None,
    ) -> ToolResult:
        """Answer the model's ``cancel_<tool>`` (see `ActionRuntime.cancel_for_model`)."""
        answer = await self._model_cancels.cancel(
            tool, arguments, session, tool_call_id=tool_call_id
        )
        return ToolResult.of(answer)

    async def interrupted(self, operation_id: str) -> None:
        """A barge-in on an operation nobody waits on (`ActionRuntime.interrupted`)."""
        await self._decisions.interrupted(operation_id)

    def has_outcome(self, operation_id: str) -> bool:
        """Whether the outcome of ``operation_id`` is known (or this process does not run it)."""
        return self._progress.has_outcome(operation_id)

    # --- close a cancelled call truthfully -------------------------------------------------

    def close_now(
        self, tool: str, tool_call_id: str, *, about: str | None = None
    ) -> ToolResult | None:
        """The result that closes a cancelled call at once, or None: its operation's state does.

        At once when no operation is behind the call and none is being admitted for it: a read
        (stopped with its handler) or a call stopped before admission began. ``about``: the
        operation a ``confirm_action`` call names.
        """
        if self.operation_for(tool_call_id) or about or self._proposals.admitting(tool_call_id):
            return None
        return self.stopped(tool)

    async def close_cancelled(
        self,
        delivery: SessionDelivery,
        tool: str,
        tool_call_id: str,
        *,
        timed_out: bool,
        about: str | None = None,
    ) -> Closed:
        """What closes a call Pipecat cancelled: its operation's real state, never CANCELLED.

        While admission is under way it runs on to its end, and what it made of the call (an
        operation that goes on, or none) closes it. Not knowing (the ledger cannot be read) is
        no reason to say cancelled either: the result says UNKNOWN, which the delivery treats
        as still to be told. ``timed_out``: the wait ran past its timeout (else a barge-in).
        """
        operation_id = self.operation_for(tool_call_id) or about
        if operation_id is None:
            operation_id = await self._proposals.admitted_as(tool_call_id)
        if operation_id is None:
            return Closed(self.stopped(tool), None, None)
        op = await delivery.current(operation_id)
        waited = (
            "It is taking longer than the wait allows"
            if timed_out
            else "The user interrupted the wait"
        )
        if op is None:
            result = render(
                ActionStatus.UNKNOWN,
                tool=tool,
                operation_id=operation_id,
                reconcilable=self.reconcilable(tool),
                note=f"{waited}; the action was not stopped. Its record could not be read just "
                "now; its outcome will be told here. Do not say it is done or that it failed.",
            )
            return Closed(ToolResult.of(result), operation_id, None)
        note = None if op.status in TERMINAL_STATUSES else f"{waited}; the action was not stopped."
        result = render_operation(op, reconcilable=self.reconcilable(op.tool), note=note)
        return Closed(ToolResult.of(result), operation_id, op)

    def stopped(self, tool: str) -> ToolResult:
        """The result of a call of the runtime's stopped with no operation behind it."""
        if self.is_read(tool):
            return ToolResult(
                status="cancelled",
                message=f"{tool} was stopped before it answered; nothing was changed. Ask "
                "again if it is still needed.",
            )
        return ToolResult(
            status="not_started",
            message=f"{tool} was stopped while it was being checked, before it started; "
            "nothing was done. Ask again if it is still wanted.",
        )

    # --- how a result is delivered ---------------------------------------------------------

    def open_delivery(self, session: SessionState, outlet: Outlet) -> SessionDelivery:
        """Open one pipeline's view of what ``session`` is owed, spoken through ``outlet``."""
        return self._deliveries.open(session, outlet)

    def is_read(self, tool: str) -> bool:
        """Whether ``tool`` is a read (it runs in the handler's task, recorded in batches)."""
        return self._deliveries.is_read(tool)

    def intermediate_runs_llm(self, tool: str) -> bool:
        """Whether an intermediate result of ``tool`` asks the model to answer it."""
        return self._deliveries.intermediate_runs_llm(tool)

    def reconcilable(self, tool: str) -> bool | None:
        """Whether an UNKNOWN of ``tool`` is checked with the system (None: no such tool)."""
        return reconcilable(self._bindings, tool)

    def told(self, op: Operation) -> ToolResult:
        """``op`` as the model reads it."""
        return ToolResult.of(render_operation(op, reconcilable=self.reconcilable(op.tool)))

    async def read(self, operation_id: str) -> Operation:
        """The ledger's record of ``operation_id``.

        Raises:
            OperationNotFound: No such operation.
            LedgerError: The ledger cannot be read.
        """
        return await self._ledger.get(operation_id)

    def listen(self, session_id: str, listener: Listener) -> None:
        """Call ``listener`` with each operation of ``session_id`` when it gets an outcome."""
        self._operations.listen(session_id, listener)

    def unlisten(self, session_id: str, listener: Listener) -> None:
        """Stop calling ``listener``."""
        self._operations.unlisten(session_id, listener)

    @contextmanager
    def telling(self, op: Operation, session: SessionState) -> Iterator[None]:
        """Scope telling ``op`` in place (the span of its delivery)."""
        with self._telemetry.delivery(op, session, late=False):
            yield

    def follow_turns(self, session_id: str, tracing_context: Any) -> None:
        """Parent the spans of ``session_id`` to a Pipecat ``TracingContext``'s turns."""
        self._telemetry.follow_turns(session_id, tracing_context)

    def forget_session(self, session_id: str) -> None:
        """Stop following ``session_id``'s turns (its pipeline ended)."""
        self._telemetry.forget_session(session_id)
