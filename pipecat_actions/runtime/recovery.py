"""`Recovery`: the lease heartbeat, a dead owner's operations, approvals given elsewhere.

Continuously (the heartbeat, every third of the lease), not only at start, the runtime renews
its lease, claims the operations whose owner's lease expired (`Recovery.recover`) and picks up
the operations another process approved for it. A claimed operation is finished:

* waiting for a person → its deadline is re-armed;
* maybe sent (RUNNING, CANCEL_REQUESTED) → UNKNOWN, reconciled;
* never sent, waiting for the user's turn to end (``admit_when: turn_confirmed``) → CANCELLED:
  the user never heard the reply that proposed it end, so it is not theirs to run;
* never sent, past its deadline → FAILED_FINAL, as the deadline rule says;
* never sent otherwise → run again, or failed (``recover_unsent``).

The lease is not renewed for an operation this process could not settle (`Tracked.unsettled`):
once it runs out, the operation is claimed (by this process or another) and reconciled.
"""

from __future__ import annotations

__all__ = ["RecoverUnsent", "Recovery"]

import asyncio
from collections.abc import Mapping
from typing import Literal

from loguru import logger

from pipecat_actions.actions import Binding
from pipecat_actions.admission.authorization import Authorizer
from pipecat_actions.clock import Clock
from pipecat_actions.errors import ConfigurationError, LedgerError
from pipecat_actions.execution.executor import Executor, ReconcileSchedule
from pipecat_actions.execution.expiry import expiry_rule
from pipecat_actions.execution.tracked import Tracked
from pipecat_actions.execution.watchdog import Watchdog
from pipecat_actions.ledger import Ledger, Operation, OperationFilter
from pipecat_actions.observability.correlation import operation_ids, operation_logger
from pipecat_actions.policy import AdmitWhen
from pipecat_actions.runtime._operations import Operations
from pipecat_actions.runtime._runner import Runner
from pipecat_actions.runtime.compensation import Compensator
from pipecat_actions.status import (
    AWAITING_PERSON_STATUSES,
    MAYBE_SENT_STATUSES,
    TERMINAL_STATUSES,
    UNSENT_STATUSES,
    ActionStatus,
)

S = ActionStatus

RecoverUnsent = Literal["run", "fail"]
"""What recovery does with an operation admitted but never sent: run it, or fail it."""


class Recovery:
    """Leases, recovery of a dead owner's operations, approvals made elsewhere.

    Args:
        ledger: Where leases are renewed and stale operations claimed.
        clock: The runtime's clock (the heartbeat's pace).
        authorizer: Asked again before a recovered operation runs.
        bindings: The registered actions, by tool name.
        operations: The registry recovered operations are tracked in.
        runner: Runs what was approved elsewhere.
        executor: Runs and reconciles recovered operations.
        compensator: Builds a recovered compensation's binding and settles its original.
        watchdog: Re-armed with recovered deadlines.
        owner: This process's name in leases.
        lease_secs: How long this owner may stay silent before others take over its work.
        actor: Recorded on the runtime's own writes.
        recover_unsent: See `RecoverUnsent`.
    """

    def __init__(
        self,
        *,
        ledger: Ledger,
        clock: Clock,
        authorizer: Authorizer,
        bindings: Mapping[str, Binding],
        operations: Operations,
        runner: Runner,
        executor: Executor,
        compensator: Compensator,
        watchdog: Watchdog,
        owner: str,
        lease_secs: float,
        actor: str,
        recover_unsent: RecoverUnsent,
    ) -> None:
        self._ledger = ledger
        self._clock = clock
        self._authorizer = authorizer
        self._bindings = bindings
        self._operations = operations
        self._runner = runner
        self._executor = executor
        self._compensator = compensator
        self._watchdog = watchdog
        self._owner = owner
        self._lease_secs = lease_secs
        self._actor = actor
        self.recover_unsent: RecoverUnsent = recover_unsent
        self._heartbeat: asyncio.Task[None] | None = None
        self._claims = True
        self._not_ours: set[str] = set()
        """Claimed operations this process cannot run (their action is not loaded here): left
        to expire and never claimed again by this process, for one that has the action."""
        self._recovering: set[str] = set()
        """Claimed operations a recovery task of this process is finishing now."""
        self._let_go: set[str] = set()
        """Claimed operations that could not be started here for now (the ledger failed): left
        to expire, then claimed again."""

    def start(self, *, claim: bool = True) -> None:
        """Start the lease heartbeat; with ``claim``, each beat claims stale operations too."""
        self._claims = claim
        self._heartbeat = asyncio.get_running_loop().create_task(
            self._heartbeat_loop(), name="pipecat_actions.heartbeat"
        )

    async def stop(self) -> None:
        """Stop the heartbeat (the lease then expires unless another runtime renews it)."""
        if self._heartbeat is not None:
            self._heartbeat.cancel()
            await asyncio.gather(self._heartbeat, return_exceptions=True)

    async def recover(self) -> list[Operation]:
        """Claim operations whose owner's lease expired and finish them; return them."""
        claimed: list[Operation] = []
        while True:
            batch = await self._ledger.claim_stale(
                self._owner, lease_secs=self._lease_secs, limit=50, except_ids=self._not_ours
            )
            if not batch:
                break
            claimed.extend(batch)
            for op in batch:
                await self._resume(op)
        return claimed

    async def _binding_of(self, op: Operation) -> Binding | None:
        """The binding ``op`` runs with: its action's, or its original's ``compensate`` hook.

        A compensation is found through its link to the original, never by its tool's name.
        """
        if op.compensates is None:
            return self._bindings.get(op.tool)
        original = await self._ledger.get(op.compensates)
        binding = self._bindings.get(original.tool)
        if binding is None or binding.action.compensate is None:
            return None
        return self._compensator.binding_for(binding)

    async def _resume(self, op: Operation) -> None:
        self._let_go.discard(op.operation_id)
        try:
            binding = await self._binding_of(op)
        except LedgerError as exc:
            operation_logger(op).warning(
                "recovered operation {} could not be started: {}", op.operation_id, exc
            )
            self._let_go.add(op.operation_id)
            return
        if binding is None:
            why = f"its tool {op.tool} is not among the loaded actions"
            # Not this process's to run: its lease is left to expire (the claim renewed it
            # once), so that a process that has the action claims it.
            operation_logger(op).warning(
                "recovered operation {} is left to another process: {}", op.operation_id, why
            )
            self._not_ours.add(op.operation_id)
            return
        tracked = Tracked(
            op.operation_id, binding, op.fence, asyncio.get_running_loop().create_future()
        )
        self._operations.track(tracked)
        if op.deadline_at is not None and op.status in AWAITING_PERSON_STATUSES:
            self._watchdog.arm(op.operation_id, op.deadline_at)
            return
        self._operations.spawn(self._recover_one(op, tracked))

    async def _recover_one(self, op: Operation, tracked: Tracked) -> None:
        final = op
        self._recovering.add(op.operation_id)
        try:
            final = await self._finish_recovered(op, tracked)
            # The original is settled first, so whoever waits for the compensation then
            # finds both in their final state.
            await self._compensator.settle_original(final)
        except Exception as exc:
            # Not settled here: the lease is let go of, and the next heartbeat that finds it
            # expired (this process's or another's) claims it again.
            tracked.unsettled = True
            operation_logger(op).warning(
                "recovered operation {} could not be finished: {}", op.operation_id, exc
            )
        finally:
            self._recovering.discard(op.operation_id)
            self._operations.finish(tracked, final)

    async def _finish_recovered(self, op: Operation, tracked: Tracked) -> Operation:
        policy = tracked.binding.policy
        if op.status in MAYBE_SENT_STATUSES:
            op = await self._operations.move(
                op, tracked, S.UNKNOWN, "recovered after its owner stopped"
            )
        if op.status is S.UNKNOWN:
            return await self._executor.reconcile(op, tracked)
        if op.status not in UNSENT_STATUSES:
            return op
        if (
            op.status is S.ADMITTED
            and policy.admit_when is AdmitWhen.TURN_CONFIRMED
            and not await self._approved(op)
        ):
            # It waited for the reply that proposed it to end unbroken, and its owner stopped
            # first: the user never let it go. Told when the session is back (the gate).
            return await self._operations.move(
                op,
                tracked,
                S.CANCELLED,
                "recovered while it waited for the user's turn to end; not sent",
                error="not sent: the conversation ended before the user's turn was confirmed",
            )
        if op.deadline_at is not None and self._clock.now() >= op.deadline_at:
            rule = expiry_rule(op.status)
            assert rule is not None  # unsent: FAILED_FINAL
            to, why = rule
            return await self._operations.move(op, tracked, to, why, error=f"deadline: {why}")
        if self.recover_unsent == "fail":
            return await self._operations.move(
                op,
                tracked,
                S.FAILED_FINAL,
                "recovered unsent; recover_unsent is fail",
                error="its owner stopped before sending it; not retried by policy",
            )
        if op.deadline_at is not None:
            self._watchdog.arm(op.operation_id, op.deadline_at)
        return await self._executor.run(op, tracked, stage="recovery")

    async def _approved(self, op: Operation) -> bool:
        """Whether a person released ``op`` (approved it, or confirmed it by voice)."""
        events = await self._ledger.events(op.operation_id)
        return any(
            e.to_status is S.ADMITTED and e.from_status in AWAITING_PERSON_STATUSES for e in events
        )

    async def reconcile_unknown(
        self, operation_id: str, *, actor: str | None = None, probes: int = 1
    ) -> Operation:
        """Ask the system of record about an UNKNOWN operation now; see the runtime's method."""
        op = await self._ledger.get(operation_id)
        if op.status is not S.UNKNOWN:
            raise ConfigurationError(
                f"operation {operation_id} is {op.status.value}, not UNKNOWN: nothing to reconcile"
            )
        tool = op.tool
        binding = await self._binding_of(op)
        if binding is None:
            raise ConfigurationError(
                f"operation {operation_id}: its tool {op.tool} is not among the loaded actions"
            )
        if binding.action.reconcile is None:
            raise ConfigurationError(
                f"operation {operation_id}: the action {tool} has no reconcile hook"
            )
        executor = Executor(
            self._ledger,
            self._clock,
            self._authorizer,
            actor=actor or self._actor,
            schedule=ReconcileSchedule(initial_secs=0.0, max_probes=probes),
            telemetry=self._executor.telemetry,
            write_retry=self._executor.write_retry,
        )
        # When this process runs the operation, its own record is used: reconciliation then
        # sees the effect still running (no trace yet is not "it did not happen").
        tracked = self._operations.get(op.operation_id) or Tracked(
            op.operation_id, binding, op.fence, asyncio.get_running_loop().create_future()
        )
        with logger.contextualize(**operation_ids(op)):
            final = await executor.reconcile(op, tracked)
            operation_logger(final).info(
                "operation {} reconciled by {}: {}", op.operation_id, executor.actor, final.status
            )
        return final

    async def _heartbeat_loop(self) -> None:
        while True:
            await self._clock.sleep(self._lease_secs / 3)
            await self.beat()

    async def beat(self) -> None:
        """One heartbeat: renew the lease, claim stale operations, pick up approvals."""
        try:
            await self._ledger.renew_lease(
                self._owner,
                lease_secs=self._lease_secs,
                except_ids=[*self._operations.unsettled(), *self._not_ours, *self._let_go],
            )
            if self._claims:
                await self.recover()
            await self._pick_up_approved()
        except Exception as exc:
            logger.warning("lease heartbeat failed: {}", exc)

    async def _pick_up_approved(self) -> None:
        """Act on decisions made elsewhere (``pipecat-actions approvals``) about waiting work.

        Each operation this process tracks that nothing runs now (it waits for a person) is
        read again: approved elsewhere, it runs; rejected or expired elsewhere, its waiters and
        the conversation are told, as for a decision made here.
        """
        for tracked in self._operations.waiting():
            driven = self._runner.is_executing(tracked.operation_id)
            if driven or tracked.operation_id in self._recovering:
                continue  # something here drives it: no decision of a person to pick up
            op = await self._ledger.get(tracked.operation_id)
            if op.status in TERMINAL_STATUSES:
                self._operations.finish(tracked, op)
                continue
            if op.status is not S.ADMITTED or op.lease_owner != self._owner:
                continue
            if op.deadline_at is None:
                deadline_at = self._clock.now() + self._runner.deadline_secs(op.tool)
                op = await self._ledger.annotate(
                    op.operation_id,
                    actor=self._actor,
                    fence=tracked.fence,
                    detail={"reason": "approved elsewhere; deadline set by its owner"},
                    changes={"deadline_at": deadline_at},
                )
            self._watchdog.arm(op.operation_id, op.deadline_at or self._clock.now())
            self._operations.spawn(self._runner.execute(op, tracked, take_slot=True))

    async def undelivered(self) -> list[Operation]:
        """Committed operations whose result never reached a conversation."""
        return await self._ledger.list(OperationFilter(status=[S.COMMITTED], undelivered=True))
