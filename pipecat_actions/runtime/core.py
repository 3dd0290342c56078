"""`ActionRuntime`: admission, execution, deadlines, cancellation, compensation and recovery.

"The model proposes; the application admits; the system of record confirms." The runtime is
the middle of that sentence. It owns every effect's task, so cancelling Pipecat's handler
coroutine (a barge-in, Pipecat's own timeout) never cancels a business action by accident;
what a barge-in does to the action is the tool's ``on_interruption`` policy.

Wiring into Pipecat::

    runtime = await ActionRuntime.create("configs/restaurant.yaml", actions=[book_table],
                                         authorizer=MyAuthorizer())
    session = SessionState(session_id="call-1", principal="alice")
    attach(runtime, llm, session)                 # one handler per action (+ confirm_action)
    context = LLMContext(messages, tools=tools_schema(runtime))

`ActionRuntime` is a facade: each method hands the call to the part that does the work
(`pipecat_actions.runtime._parts` builds them), the way DBOS's ``DBOS`` fronts its core and
recovery modules.
"""

from __future__ import annotations

__all__ = ["ActionRuntime"]

import asyncio
import os
import socket
import uuid
import warnings
from collections.abc import Awaitable, Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from pipecat_actions.actions import ActionDefinition, Binding
from pipecat_actions.admission.authorization import Authorizer
from pipecat_actions.approvals import Approver
from pipecat_actions.clock import Clock, SystemClock
from pipecat_actions.durable.handoff import hands_off
from pipecat_actions.errors import ConfigurationError
from pipecat_actions.execution.executor import ReconcileSchedule
from pipecat_actions.ledger import Ledger, Operation, SqlLedger
from pipecat_actions.ledger.keys import LedgerKeys
from pipecat_actions.ledger.sealed import SealedLedger, sealer_for
from pipecat_actions.observability.metrics import ActionMetrics
from pipecat_actions.observability.redaction import install_log_redaction
from pipecat_actions.policy import OnInterruption, PolicySet, load_policy
from pipecat_actions.runtime._coverage import (
    RoutedNames,
    check_coverage,
    check_declared_arguments,
    no_policy_entry,
)
from pipecat_actions.runtime._operations import Listener
from pipecat_actions.runtime._parts import RuntimeParts, build_parts
from pipecat_actions.runtime.calls import Calls
from pipecat_actions.runtime.recovery import RecoverUnsent
from pipecat_actions.session import SessionState


class ActionRuntime:
    """Runs the tool calls of every session of one process against one ledger.

    Build it with `ActionRuntime.create`; stop it with `close`.

    Attributes:
        policy: The loaded tool policies.
        ledger: The ledger, as this runtime writes it (each write reported to ``telemetry``).
        telemetry: Metrics and spans of this runtime.
        clock: The time source.
        owner: This process's name in leases; ``actor`` is ``runtime:<owner>``.
        limiter: Call budgets, rates and concurrency.
        executor: Runs and reconciles operations.
        watchdog: Enforces deadlines.
        admitter: Runs the admission checks.
        deliveries: What the conversations owe their users.
        calls: The conversation port the Pipecat adapters talk to (`Calls`).
    """

    def __init__(self, parts: RuntimeParts, *, owns_ledger: bool) -> None:
        self.policy = parts.policy
        self.ledger = parts.ledger
        self.telemetry = parts.telemetry
        self.clock = parts.clock
        self.owner = parts.owner
        self.actor = parts.actor
        self.lease_secs = parts.lease_secs
        self.limiter = parts.limiter
        self.executor = parts.executor
        self.watchdog = parts.watchdog
        self.admitter = parts.admitter
        self._bindings = parts.bindings
        self._operations = parts.operations
        self._runner = parts.runner
        self._reads = parts.reads
        self._decisions = parts.decisions
        self._compensator = parts.compensator
        self._recovery = parts.recovery
        self._proposals = parts.proposals
        self._join_notes = parts.join_notes
        self._elsewhere = parts.elsewhere
        self._supersession = parts.supersession
        self.deliveries = parts.deliveries
        self._progress = parts.progress
        self._model_cancels = parts.model_cancels
        self._owns_ledger = owns_ledger
        self._routed: frozenset[str] = frozenset()
        self.calls = Calls(
            policy=parts.policy,
            bindings=parts.bindings,
            ledger=parts.ledger,
            operations=parts.operations,
            proposals=parts.proposals,
            decisions=parts.decisions,
            model_cancels=parts.model_cancels,
            deliveries=parts.deliveries,
            progress=parts.progress,
            telemetry=parts.telemetry,
            clock=parts.clock,
            register=lambda definition: self.register(definition),
        )
        """The conversation port: what the Pipecat adapters ask about a call (`Calls`)."""

    @classmethod
    async def create(
        cls,
        policy: str | os.PathLike[str] | PolicySet,
        *,
        authorizer: Authorizer,
        actions: Iterable[ActionDefinition] = (),
        routed: Iterable[str] = (),
        ledger: Ledger | None = None,
        ledger_url: str | None = None,
        clock: Clock | None = None,
        owner: str | None = None,
        lease_secs: float = 30.0,
        recover: bool = True,
        recover_unsent: RecoverUnsent = "run",
        schedule: ReconcileSchedule | None = None,
        ledger_keys: LedgerKeys | None = None,
        admits_calls: bool = True,
    ) -> ActionRuntime:
        """Load the policy, open the ledger, register ``actions`` and recover leftover work.

        Args:
            policy: A policy file path or a loaded `PolicySet`.
            authorizer: Decides whether the session principal may make each call.
            actions: The effects, with their hooks.
            routed: Tools of the policy whose handler is not an action here but the
                application's, registered on the LLM and routed through this runtime
                (`instrument`), or a Pipecat Flows function (`FlowActions`). Every other
                entry of the policy needs an action in ``actions``, but a Flows
                ``transition_only`` function's that `flow_functions` names (ignored, with a
                warning).
            ledger: An open ledger to use (the caller closes it); else one is opened.
            ledger_url: Where to open the ledger (default: `default_ledger_url`).
            clock: Time source; the ledger opened here uses it too.
            owner: This process's name in leases (default: host, pid and a random part).
            lease_secs: How long an owner may stay silent before others take over its work.
            recover: Claim and finish operations whose owner died, now and at every lease
                heartbeat (off: this runtime only renews and finishes its own, as the
                operator's ``reconcile`` does).
            recover_unsent: What to do with a recovered operation that was admitted but never
                sent: ``run`` it (after asking the authorizer again) or ``fail`` it.
            schedule: How UNKNOWN operations are probed before escalation.
            ledger_keys: The keys that seal the values the policy marks ``sensitive``
                (default: read from ``PIPECAT_ACTIONS_LEDGER_KEYS`` and
                ``PIPECAT_ACTIONS_LEDGER_HASH_KEY``; see `pipecat_actions.ledger.keys`).
            admits_calls: This runtime admits calls (a bot's). A policy with
                ``execution: durable`` tools then needs a ledger that hands them to DBOS
                (`pipecat_actions.durable.DurableLedger`). False for a process that only
                recovers, reconciles or runs what others admitted (the workers, the
                operator's commands).

        Raises:
            PolicyError: The policy file is invalid.
            ConfigurationError: An action has no policy, or its policy needs a hook it lacks;
                a policy entry is neither an action nor ``routed`` (its tool would never be
                offered to the LLM); a ``routed`` name has no entry or is also an action.
            LedgerKeysError: The policy marks values ``sensitive`` and a key they need is
                not set (``PIPECAT_ACTIONS_LEDGER_KEYS``, ``PIPECAT_ACTIONS_LEDGER_HASH_KEY``).
            LedgerError: The ledger cannot be opened.
        """
        if isinstance(routed, str):
            raise ConfigurationError(f"routed takes a list of tool names, not {routed!r}")
        policies = policy if isinstance(policy, PolicySet) else load_policy(Path(policy))
        # Pipecat logs tool-call arguments at DEBUG before any handler runs: the redaction
        # must be in place, with this policy's redact paths, before the first call.
        install_log_redaction(policy=policies)
        # A policy that marks values sensitive without the keys to seal them stops here,
        # before the ledger is opened: nothing is ever stored in plain text instead.
        sealer = sealer_for(
            {name: policies[name].sensitive for name in policies.names()}, ledger_keys
        )
        durable = policies.durable_names()
        if durable and admits_calls and (ledger is None or not hands_off(ledger)):
            raise ConfigurationError(
                f"{', '.join(sorted(durable))}: execution: durable, but this runtime's ledger "
                "does not hand operations to DBOS: open it with "
                "pipecat_actions.durable.DurableLedger.open(url, policy) on PostgreSQL and pass "
                "it as ledger= (see docs/durable.md), or set execution: in_call"
            )
        clock = clock or SystemClock()
        opened = ledger or await SqlLedger.create(ledger_url, clock=clock)
        parts = build_parts(
            policy=policies,
            ledger=opened if sealer is None else SealedLedger(opened, sealer),
            authorizer=authorizer,
            clock=clock,
            owner=owner or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}",
            lease_secs=lease_secs,
            recover_unsent=recover_unsent,
            schedule=schedule,
        )
        runtime = cls(parts, owns_ledger=ledger is None)
        try:
            runtime._routed = frozenset(routed)
            runtime.register(*actions)
            check_coverage(
                runtime.policy,
                runtime.bindings,
                runtime._routed,
                transition_only=routed.transition_only if isinstance(routed, RoutedNames) else (),
            )
            await runtime._recovery.hold_life()
            runtime.watchdog.start()
            runtime._recovery.start(claim=recover)
            if recover:
                await runtime.recover()
        except BaseException:
            await runtime.close()
            raise
        return runtime

    # --- actions and the Pipecat binding ---------------------------------------------------

    def register(self, *definitions: ActionDefinition) -> None:
        """Register actions; each needs an entry in the policy.

        Raises:
            ConfigurationError: No policy for the action; the policy asks for a hook
                (``request_cancel`` needs ``cancel``, ``compensation.automatic`` needs
                ``compensate``) that the action lacks; an ``arguments:`` list that is not the
                action's parameters; or an ``@action`` of a name declared
                ``routed`` (its handler is the application's or Flows').
        """
        for definition in definitions:
            policy = self.policy.get(definition.name)
            if policy is None:
                raise no_policy_entry(definition.name, self.policy)
            if definition.name in self._routed and not definition.app_handler:
                raise ConfigurationError(
                    f"action {definition.name} is named in routed=[...] (its handler is the "
                    "application's, or a Flows function); a tool is one or the other"
                )
            if policy.on_interruption is OnInterruption.REQUEST_CANCEL and not definition.cancel:
                raise ConfigurationError(
                    f"action {definition.name}: on_interruption is request_cancel but the "
                    "action has no cancel hook"
                )
            if policy.reconciliation.cancel_to_settle and not definition.cancel:
                raise ConfigurationError(
                    f"action {definition.name}: reconciliation.cancel_to_settle needs a cancel "
                    "hook to ask the provider with; add cancel=... to its @action, or set "
                    "cancel_to_settle: false"
                )
            check_declared_arguments(definition, policy, self.policy.source)
            automatic = policy.compensation is not None and policy.compensation.automatic
            if automatic and definition.compensate is None:
                raise ConfigurationError(
                    f"action {definition.name}: compensation.automatic is true but the action "
                    "has no compensate hook to undo a superseded change with; add "
                    "compensate=... to its @action, or set automatic: false"
                )
            self._bindings[definition.name] = Binding(definition, policy)

    @property
    def bindings(self) -> Mapping[str, Binding]:
        """The registered actions with their policies, by tool name."""
        return self._bindings

    @property
    def routed(self) -> frozenset[str]:
        """The tools declared ``routed`` at `create`: the application's or Flows' handlers."""
        return self._routed

    # Deprecated forwarders (0.2.0; removed in 0.3.0). The adapters sit above the runtime and
    # take it as an argument: `pipecat_actions.attach(runtime, llm, session)`. These are the
    # only imports from the runtime up into the adapters, named in pyproject.toml's contract.

    def attach(self, llm: Any, session: SessionState) -> None:
        """Deprecated: use ``pipecat_actions.attach(runtime, llm, session)``."""
        from pipecat_actions.adapters import attach

        _moved_to_adapters("runtime.attach(llm, session)", "attach(runtime, llm, session)")
        attach(self, llm, session)

    def instrument(self, llm: Any, session: SessionState) -> None:
        """Deprecated: use ``pipecat_actions.instrument(runtime, llm, session)``."""
        from pipecat_actions.adapters import instrument

        _moved_to_adapters("runtime.instrument(llm, session)", "instrument(runtime, llm, session)")
        instrument(self, llm, session)

    def tools_schema(self) -> Any:
        """Deprecated: use ``pipecat_actions.tools_schema(runtime)``."""
        from pipecat_actions.adapters import tools_schema

        _moved_to_adapters("runtime.tools_schema()", "tools_schema(runtime)")
        return tools_schema(self)

    @property
    def metrics(self) -> ActionMetrics:
        """This process's metrics per tool; ``runtime.metrics.snapshot()`` reads them."""
        return self.telemetry.metrics

    # --- calls -----------------------------------------------------------------------------

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
        return await self._proposals.propose(
            tool, arguments, session, tool_call_id=tool_call_id, wait=wait, on_started=on_started
        )

    async def wait(self, operation_id: str, *, settled: bool = False) -> Operation:
        """Wait for the outcome of an operation this runtime runs; else return its record.

        The first truthful outcome ends the wait: UNKNOWN, when reconciliation has to wait
        (the provider's commit horizon). With ``settled``, the wait lasts until nothing more
        changes it here: a terminal status, or UNKNOWN handed to a person (escalated).
        """
        return await self._operations.wait(operation_id, settled=settled)

    def operation_for_call(self, tool_call_id: str) -> str | None:
        """Return the operation a Pipecat ``tool_call_id`` was admitted as (or joined), if any."""
        return self._operations.operation_for_call(tool_call_id)

    def admitting(self, tool_call_id: str) -> bool:
        """Whether the Pipecat call ``tool_call_id`` is being admitted now (see `admitted_as`)."""
        return self._proposals.admitting(tool_call_id)

    async def admitted_as(self, tool_call_id: str) -> str | None:
        """Like `operation_for_call`, once an admission still under way for the call ends."""
        return await self._proposals.admitted_as(tool_call_id)

    async def superseded_by(self, op: Operation) -> str | None:
        """The operation of a later user turn on the same resource that replaces ``op``."""
        return await self._supersession.superseded_by(op)

    @property
    def call_mark(self) -> int:
        """A mark in the order tool calls became operations here (see `noted_after`)."""
        return self._operations.call_mark

    def noted_after(self, operation_id: str, mark: int) -> bool:
        """Whether a tool call of this process first became ``operation_id`` after ``mark``.

        The result gate takes a mark when its pipeline starts: what came after is its own
        pipeline's, told through the call's result, never retold as an earlier outcome.
        """
        return self._operations.noted_after(operation_id, mark)

    def listen(self, session_id: str, listener: Listener) -> None:
        """Call ``listener`` with each operation of ``session_id`` when it gets an outcome."""
        self._operations.listen(session_id, listener)

    def unlisten(self, session_id: str, listener: Listener) -> None:
        """Stop calling ``listener``."""
        self._operations.unlisten(session_id, listener)

    async def flush(self) -> None:
        """Write the audit records of finished reads now, and wait until they are written.

        It waits as well for the records pipelines started of what their conversations were
        told and heard (`Operations.keep_audit`).
        """
        await self._reads.flush()
        await self._join_notes.flush()
        await self._operations.flush_audits()

    # --- decisions about admitted operations -----------------------------------------------

    async def interrupted(self, operation_id: str) -> None:
        """Apply the tool's ``on_interruption`` policy to ``operation_id``: a barge-in on it.

        What a cancelled wait does for a blocking call, for a call nobody waits on: a
        background call the provider itself cancelled (Gemini Live's ``toolCallCancellation``).
        """
        await self._decisions.interrupted(operation_id)

    async def cancel(
        self, operation_id: str, *, reason: str, only_if_not_started: bool = False
    ) -> Operation:
        """Cancel an operation as far as the truth allows; return what the ledger then says.

        Nothing sent yet: CANCELLED. Sent, with a ``cancel`` hook and unless
        ``only_if_not_started``: CANCEL_REQUESTED, then CANCELLED only when the provider
        confirms; otherwise the operation goes on and its real outcome is recorded.
        """
        return await self._decisions.cancel(
            operation_id, reason=reason, only_if_not_started=only_if_not_started
        )

    async def cancel_for_model(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        session: SessionState,
        *,
        tool_call_id: str | None = None,
    ) -> dict[str, Any]:
        """Answer the model's ``cancel_<tool>`` call: stop ``tool``'s operation if the truth allows.

        Allowed only when the tool's policy sets ``cancellable_by_llm`` (else a refusal that
        says the action goes on). The operation is the one ``arguments`` names
        (``operation_id`` or ``tool_call_id``), else the session's one pending operation of
        ``tool``, else its latest. The cancel is the one a barge-in makes under
        ``request_cancel`` (`cancel`), recorded with ``model:<session>`` as the actor, and the
        answer says what the ledger then holds: cancelled (nothing happened), cancel
        requested (the outcome follows), or already committed (the undo offered when the
        policy names ``compensation.tool``). See `pipecat_actions.runtime.model_cancels`.
        """
        return await self._model_cancels.cancel(tool, arguments, session, tool_call_id=tool_call_id)

    def has_outcome(self, operation_id: str) -> bool:
        """Whether the outcome of ``operation_id`` is known (or this process does not run it)."""
        return self._progress.has_outcome(operation_id)

    async def confirm(
        self,
        operation_id: str,
        token: str,
        session: SessionState,
        *,
        on_started: Callable[[str], Awaitable[None]] | None = None,
    ) -> dict[str, Any]:
        """Apply the user's verbal confirmation (the ``confirm_action`` tool).

        A background tool's confirmation answers once its action is released to run, after
        ``on_started(tool)`` was awaited; a blocking tool's answers with the outcome.
        """
        return await self._decisions.confirm(operation_id, token, session, on_started=on_started)

    async def approve(
        self, operation_id: str, *, approver: Approver | str, reason: str, args_hash: str
    ) -> Operation:
        """Approve an operation waiting for approval; it then runs.

        The rules of `pipecat_actions.approvals` hold: ``approver`` must belong to the
        operation's tenant (``Approver(name, roles, tenants)``; a plain name belongs to none),
        be one its policy names (by name or role) and not its requester, ``reason`` is
        required, and ``args_hash`` is the hash of the arguments the approver was shown. The
        caller vouches for who ``approver`` is (it signed them in).

        Raises:
            ApprovalRefused: Not waiting for approval, expired, approved for other arguments
                than the ones it holds, by someone who may not (another tenant's approver
                among them: recorded on the operation), or without a reason.
        """
        return await self._decisions.approve(
            operation_id, approver=approver, reason=reason, args_hash=args_hash
        )

    async def reject(
        self, operation_id: str, *, approver: Approver | str, reason: str
    ) -> Operation:
        """Reject an operation waiting for approval (REJECTED; nothing runs); as `approve`."""
        return await self._decisions.reject(operation_id, approver=approver, reason=reason)

    async def pending_approvals(self) -> list[Operation]:
        """Operations waiting for a person's approval, oldest first."""
        return await self._decisions.pending_approvals()

    async def compensate(self, operation_id: str, *, actor: str, reason: str) -> Operation:
        """Reverse a committed operation by running its ``compensate`` hook as a new operation.

        The compensation is admitted first, under the key ``compensate|<operation>``, so
        concurrent requests join one compensation; the original then goes COMMITTED →
        COMPENSATING → COMPENSATED, or back to COMMITTED when the compensation fails for good
        (a later call may then try again: the failed compensation let go of the key). When
        nobody can tell whether the compensation happened (it stays UNKNOWN and is escalated,
        e.g. after a crash cut it off), the original stays COMPENSATING and is escalated with
        it. The hook's context carries the original operation (``ctx.operation``: its result
        and before-state). With ``compensation.automatic: true`` the runtime calls this itself
        for a committed operation that a newer committed one superseded (see
        `pipecat_actions.runtime.automatic_compensation`).

        Returns:
            The compensation operation, once it has an outcome.

        Raises:
            ConfigurationError: The action has no compensate hook.
            UnexpectedStatus: The original is not COMMITTED (nor being compensated).
        """
        return await self._compensator.compensate(operation_id, actor=actor, reason=reason)

    # --- recovery --------------------------------------------------------------------------

    @property
    def recover_unsent(self) -> RecoverUnsent:
        """What recovery does with an operation admitted but never sent (``run``, ``fail``)."""
        return self._recovery.recover_unsent

    async def recover(self) -> list[Operation]:
        """Claim operations whose owner's lease expired and finish them; return them."""
        return await self._recovery.recover()

    async def run_handed(self, operation_id: str) -> Operation:
        """Drive a durable operation handed to this runtime (a DBOS worker's) to its end.

        See `pipecat_actions.dbos_worker`: it is what a workflow's step runs, and safe to
        run again after a worker died mid-step (what may have been sent is reconciled).
        """
        return await self._recovery.run_handed(operation_id)

    async def reconcile_unknown(
        self, operation_id: str, *, actor: str | None = None, probes: int = 1
    ) -> Operation:
        """Ask the system of record about an UNKNOWN or FAILED_FINAL operation now; record it.

        The entry point of ``pipecat-actions reconcile``: the action's ``reconcile`` hook is
        asked up to ``probes`` times; COMMITTED or FAILED_FINAL is written through the same
        conditional transition (and audit event) as the runtime's own reconciliation, with
        ``actor`` recorded; an answer that settles nothing leaves the operation UNKNOWN and
        escalated. "No trace" settles nothing before the tool's commit horizon has passed
        (``reconciliation.commit_horizon_secs``). A concurrent writer (the owner finishing
        it) wins and is reported as is.

        A FAILED_FINAL operation is checked: if the system of record has it after all, that
        is a conflict; the ledger follows the system of record (COMMITTED), the conflict is
        audited, counted (``conflicts``), listed (``OperationFilter(conflicted=True)``) and
        escalated, and a conversation of its session is told the correction.

        Args:
            operation_id: The operation.
            actor: Who asks, for the audit trail (default: this runtime).
            probes: How many times the hook is asked before giving up.

        Returns:
            The operation afterwards.

        Raises:
            OperationNotFound: No such operation.
            ConfigurationError: Not UNKNOWN or FAILED_FINAL, or its tool is not loaded or has
                no reconcile hook.
        """
        return await self._recovery.reconcile_unknown(operation_id, actor=actor, probes=probes)

    async def undelivered(self) -> list[Operation]:
        """Committed operations whose result never reached a conversation."""
        return await self._recovery.undelivered()

    # --- lifecycle -------------------------------------------------------------------------

    async def close(self, *, grace_secs: float = 5.0) -> None:
        """Stop: wait up to ``grace_secs`` for running operations, then leave them to recovery.

        Within the same grace (real time), every outcome this runtime told a caller is
        written to the ledger: a write that failed (the database down, a full disk) is tried
        again at once and often. An outcome still not written then is logged as an error,
        naming the operation and what its caller was told, and its lease is ended (or, if even
        that cannot be written, this owner's life lock is let go of without unregistering),
        so that another runtime takes it over at once and settles it from the system of
        record. An operation still running at the end keeps its ledger status (RUNNING, ...)
        and is taken over the same way.

        The records pipelines started of what their conversations were told and heard are
        waited for (`flush`), as the ledger's own close waits for the writes handed to it:
        each ends written or failed, within the ledger's timeouts (a record that failed is
        logged, and the next pipeline of the session tells that outcome again).
        """
        if self._operations.closing:
            return
        self._operations.close()
        loop = asyncio.get_running_loop()
        ends_at = loop.time() + grace_secs
        await self._runner.drain(grace_secs)
        await self._recovery.write_told_outcomes(max(ends_at - loop.time(), 0.0))
        await self.flush()
        await self._recovery.stop()
        await self.watchdog.stop()
        left = len(self._operations.waiting()) + len(self._operations.unsettled())
        await self._operations.stop()
        await self._recovery.release_life(left=left)
        if self._owns_ledger:
            await self.ledger.close()


def _moved_to_adapters(old: str, new: str) -> None:
    warnings.warn(
        f"{old} is deprecated and goes in 0.3.0: use pipecat_actions.{new} (the Pipecat "
        "adapters take the runtime; the runtime no longer reaches up into them)",
        DeprecationWarning,
        stacklevel=3,
    )
