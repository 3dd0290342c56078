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

import asyncio
import os
import socket
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal

from loguru import logger

from pipecat_actions.actions import ActionDefinition, Binding
from pipecat_actions.admission.admitter import Admitter
from pipecat_actions.admission.authorization import Authorizer
from pipecat_actions.admission.decisions import Admission, Joined, ReadAdmission, Refusal, Shared
from pipecat_actions.clock import Clock, SystemClock
from pipecat_actions.errors import (
    ConfigurationError,
    LedgerError,
)
from pipecat_actions.execution.executor import ReconcileSchedule
from pipecat_actions.execution.tracked import Tracked
from pipecat_actions.ledger import (
    Ledger,
    SqlLedger,
)
from pipecat_actions.observability.redaction import install_log_redaction
from pipecat_actions.policy import AdmitWhen, OnInterruption, PolicySet, ToolKind, load_policy
from pipecat_actions.results import refusal_result, render, render_operation
from pipecat_actions.runtime.decisions import DecisionsMixin
from pipecat_actions.runtime.reads import ReadsMixin
from pipecat_actions.runtime.recovery import RecoveryMixin
from pipecat_actions.session import SessionState
from pipecat_actions.status import IN_FLIGHT_STATUSES, ActionStatus

S = ActionStatus


class ActionRuntime(ReadsMixin, DecisionsMixin, RecoveryMixin):
    """Runs the tool calls of every session of one process against one ledger.

    Build it with `ActionRuntime.create`; stop it with `close`.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.admitter = Admitter(
            bindings=self._bindings,
            ledger=self.ledger,
            clock=self.clock,
            authorizer=self._authorizer,
            limiter=self.limiter,
            owner=self.owner,
            lease_secs=self.lease_secs,
            cancel=lambda op: self.cancel(op.operation_id, reason="replaced by a newer request"),
        )

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
        # Pipecat logs tool-call arguments at DEBUG before any handler runs: the redaction
        # must be in place, with this policy's redact paths, before the first call.
        install_log_redaction(policy=policies)
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

        Cancelling the caller never cancels the operation; see ``on_interruption``. Every log
        line written meanwhile (and by the tasks it starts) carries the call's correlation ids.

        Args:
            tool: The tool name.
            arguments: The arguments (a mapping, or JSON text).
            session: The session proposing it.
            tool_call_id: The provider's id of the call, recorded (never used as a key).
            wait: For a mutation, wait for its outcome (else return its admitted state).
            on_started: Called with the operation id once a new mutation was admitted and
                started (not for refusals, duplicates or calls waiting for a person).
        """
        with logger.contextualize(
            session_id=session.session_id,
            turn_id=str(session.user_turn),
            generation=session.generation,
            tool_call_id=tool_call_id,
            tool=tool,
        ):
            try:
                result = await self._propose(
                    tool, arguments, session, tool_call_id, wait=wait, on_started=on_started
                )
            except LedgerError as exc:
                result = self._ledger_failed(tool, tool_call_id, exc)
            logger.bind(operation_id=result.get("operation_id")).debug(
                "tool call {} of {}: {}", tool_call_id, tool, result.get("status")
            )
            return result

    def _ledger_failed(
        self, tool: str, tool_call_id: str | None, exc: LedgerError
    ) -> dict[str, Any]:
        """The truthful answer to a call whose ledger work failed (never Pipecat's "failed").

        With no operation known for the call, nothing was started by it; a repeat of the same
        intent is safe (it has the same idempotency key, so it joins the operation if the
        insert did commit after all). With one, it exists and its outcome is not known here.
        """
        operation_id = self._calls.get(tool_call_id) if tool_call_id else None
        logger.bind(operation_id=operation_id).warning(
            "tool call {} of {}: the ledger failed: {}", tool_call_id, tool, exc
        )
        if operation_id is None:
            if exc.retryable:
                return refusal_result(
                    f"{tool} could not be recorded because the action ledger is unavailable, "
                    "so this call did not carry it out. It is safe to ask again in a moment.",
                    code="ledger_unavailable",
                )
            return refusal_result(
                f"{tool} could not be recorded (the action ledger refused it), so this call "
                "did not carry it out.",
                code="ledger_error",
            )
        return render(
            S.UNKNOWN,
            tool=tool,
            operation_id=operation_id,
            note="Its record could not be read just now; the outcome will be told when known.",
        )

    async def _propose(
        self,
        tool: str,
        arguments: Mapping[str, Any] | str,
        session: SessionState,
        tool_call_id: str | None,
        *,
        wait: bool,
        on_started: Callable[[str], Awaitable[None]] | None,
    ) -> dict[str, Any]:
        self._sessions[session.session_id] = session
        binding = self._bindings.get(tool)
        if binding is not None and binding.policy.kind is ToolKind.READ:
            # A read writes nothing before its effect, so it is admitted and run in the
            # caller's own task: no hand-off to another task on the hot path.
            with self.telemetry.admission(tool, session, tool_call_id) as scope:
                read = await self.admitter.admit(
                    tool, arguments, session, tool_call_id=tool_call_id
                )
                scope.decided(read)
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
            if wait and op.status in IN_FLIGHT_STATUSES:
                if op.operation_id in self._tracked:
                    op = await asyncio.shield(self._tracked[op.operation_id].done)
                else:
                    op = await self._elsewhere.wait(op)
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
        with self.telemetry.admission(tool, session, tool_call_id) as scope:
            admitted = await self.admitter.admit(
                tool, arguments, session, tool_call_id=tool_call_id
            )
            scope.decided(admitted)
        if isinstance(admitted, Refusal):
            return admitted.result
        if isinstance(admitted, Joined):
            # Recorded so that an operator can tell a repeated request from a retry of ours;
            # in batches, off the caller's path (a burst of duplicates is one write or a few).
            self._join_notes.note(
                admitted.operation.operation_id,
                tool_call_id=tool_call_id,
                turn_id=str(session.user_turn),
                session_id=session.session_id,
            )
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
            with logger.contextualize(operation_id=op.operation_id):
                # The execution task copies this context: its lines name the operation.
                self._spawn(self._execute(op, tracked, session=session, wait_generation=wait_for))
        return tracked
