"""`Recovery`: the lease heartbeat, a dead owner's operations, approvals given elsewhere.

Continuously (the heartbeat, every third of the lease), not only at start, the runtime renews
its lease, claims the operations whose owner is gone or whose owner's lease expired
(`Recovery.recover`) and picks up the operations another process approved for it.

An owner is known gone at once, without waiting for its lease, when it registered its life
with the ledger and its life lock is free (`Ledger.hold_life`, `Ledger.gone_owners`): its
process died, or lost its database session. So a runtime restarted after a crash takes over
its predecessor's operations when it starts, and a call that joins an operation of a gone
owner (`Recovery.adopt`) starts its reconciliation instead of waiting for the lease. A runtime
that finds its own owner name holding operations when it starts takes them over too: only a
previous incarnation of it can have left them (its life lock was free). The lease running out
stays the last line, for owners that never registered.

A claimed operation is finished:

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

from pipecat_actions.actions import ActionContext, Binding, ReconcileState
from pipecat_actions.admission.authorization import Authorizer
from pipecat_actions.clock import Clock
from pipecat_actions.errors import ConfigurationError, LedgerError, TransitionRefused
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
        self._not_ours: dict[str, str] = {}
        """Claimed operations this process cannot run (their action is not loaded here), with
        their tool: left to expire and not claimed again by this process while it has no such
        action (a routed tool is registered only when its handler is: instrument, Flows)."""
        self._recovering: set[str] = set()
        """Claimed operations a recovery task of this process is finishing now."""
        self._let_go: set[str] = set()
        """Claimed operations that could not be started here for now (the ledger failed): left
        to expire, then claimed again."""
        self._previous_self = False
        """The owner name held operations of a previous incarnation when its life was taken."""
        self._adopting: dict[str, asyncio.Future[None]] = {}
        """Owners being checked for a joined call (`adopt`): concurrent joins share one look."""
        self._alive = False

    async def hold_life(self) -> None:
        """Register this owner's life with the ledger (see the module docstring).

        Raises:
            ConfigurationError: A live runtime uses this owner name already.
        """
        if not await self._ledger.hold_life(self._owner):
            raise ConfigurationError(
                f"the owner name {self._owner!r} is in use by another runtime that is alive: "
                "give each process an owner name of its own (or leave owner= out)"
            )
        self._alive = True
        self._previous_self = True

    async def release_life(self, *, left: int) -> None:
        """Let go of this owner's life as the runtime closes.

        Args:
            left: How many operations this runtime leaves unsettled. None: a clean close,
                unregistered (nobody's to take over). Some: the registration stays and the
                lock goes, so other runtimes see this owner gone and take them over at once.
        """
        if self._alive:
            self._alive = False
            try:
                await self._ledger.release_life(self._owner, unregister=left == 0)
            except Exception as exc:  # the lock goes with the process (or the session) anyway
                logger.warning("could not let go of owner {}: {}", self._owner, exc)

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

    async def recover(self, *, gone: list[str] | None = None) -> list[Operation]:
        """Claim operations whose owner is gone or whose lease expired; finish them; return them.

        Args:
            gone: The owners known gone (default: as the ledger tells it now).
        """
        if gone is None:
            gone = await self._ledger.gone_owners(besides=self._owner)
        for operation_id, tool in list(self._not_ours.items()):
            if tool in self._bindings:
                del self._not_ours[operation_id]  # its action is here now: claimed again
        leave = list(self._not_ours)
        if self._previous_self:
            # This owner name's operations that this process does not track are a previous
            # incarnation's: its life lock was free when this one took it. Their leases end
            # now, and the claims below take them as any expired one.
            self._previous_self = False
            await self._ledger.end_leases(
                self._owner,
                except_ids=[tracked.operation_id for tracked in self._operations.waiting()],
            )
        claimed: list[Operation] = []
        # Each claim leaves what it took this owner's with a live lease, out of the next
        # claim's reach: the batches need no list of what they took, and one that another
        # claimer held is found again by the next (`Ledger.claim_stale`). That holds while
        # those leases live: the heartbeat that renews them waits for this pass, so a pass
        # longer than a third of a lease renews them itself (else it would claim its own
        # earlier claims again, raising their fence under the work it started on them).
        renewed_at = self._clock.now()
        while batch := await self._ledger.claim_stale(
            self._owner, lease_secs=self._lease_secs, limit=50, except_ids=leave, gone=gone
        ):
            claimed.extend(batch)
            for op in batch:
                if op.lease_owner != self._owner:
                    continue  # pragma: no cover - claim_stale gives its claimer the lease
                await self._resume(op)
                if self._clock.now() - renewed_at >= self._lease_secs / 3:
                    await self._renew()
                    renewed_at = self._clock.now()
        departed = [owner for owner in gone if owner != self._owner]
        if departed:
            await self._ledger.forget_owners(departed)
        return claimed

    async def write_told_outcomes(self, within_secs: float) -> None:
        """As the runtime closes: get every outcome told to a caller written, or say so.

        Writes still failing are tried again at once and often for ``within_secs``; each
        outcome still not in the ledger then is logged as an error by its operation id, and
        its lease is ended so that another runtime settles it.
        """
        self._executor.hurry()
        left = await self._executor.written(within_secs)
        if not left:
            return
        for _, told in left:
            operation_logger(told).error(
                "operation {}: its caller was told {}, but the ledger could not record it "
                "before the runtime closed; it still says otherwise, and another runtime takes "
                "it over to settle it from the system of record",
                told.operation_id,
                told.status.value,
            )
        try:
            await self._ledger.release_leases(self._owner, [t.operation_id for t, _ in left])
        except Exception as exc:  # its life lock goes with this runtime: taken over anyway
            logger.error("could not end the leases of {} unrecorded outcomes: {}", len(left), exc)

    async def adopt(self, op: Operation) -> Tracked | None:
        """Take over ``op`` now if its owner is gone; return its record here, if it is ours.

        For a call that joins ``op`` (a repeat of the user's): waiting for a gone owner's
        operation would wait for its lease; reconciliation starts now instead.
        """
        tracked = self._operations.get(op.operation_id)
        owner = op.lease_owner
        if tracked is not None or owner is None or owner == self._owner:
            return tracked
        # A burst of repeats (one intent, many callers) asks once per owner.
        asking = self._adopting.get(owner)
        if asking is None:
            asking = asyncio.ensure_future(self._take_over_if_gone(owner))
            self._adopting[owner] = asking
            asking.add_done_callback(lambda _: self._adopting.pop(owner, None))
        try:
            await asyncio.shield(asking)
        except Exception as exc:  # the heartbeat tries again; the caller waits as before
            operation_logger(op).warning(
                "could not take over {} from its gone owner: {}", op.operation_id, exc
            )
        return self._operations.get(op.operation_id)

    async def run_handed(self, operation_id: str) -> Operation:
        """Drive a durable operation handed to this process (a DBOS worker's) to its end.

        Called by its workflow's step, perhaps again after a worker died mid-step: what the
        ledger says decides, as for an operation recovered from a dead owner. Not sent yet
        (ADMITTED): it runs. Maybe sent (RUNNING): UNKNOWN, and its ``reconcile`` hook asks the
        system of record, so a step run again never sends twice. Settled: returned as it is.

        Raises:
            ConfigurationError: Its tool is not among this process's actions.
            LedgerError: The ledger failed (the step is tried again).
        """
        op = await self._ledger.get(operation_id)
        if op.status in TERMINAL_STATUSES:
            return op
        waits = op.status in AWAITING_PERSON_STATUSES
        if waits and (op.deadline_at is None or self._clock.now() < op.deadline_at):
            return op  # a person decides; the workflow waits for the decision
        binding = await self._binding_of(op)
        if binding is None:
            raise ConfigurationError(
                f"operation {operation_id}: its tool {op.tool} is not among this worker's "
                "actions (--app)"
            )
        tracked = Tracked(
            op.operation_id, binding, op.fence, asyncio.get_running_loop().create_future()
        )
        self._operations.track(tracked)
        final = op
        try:
            if waits:  # nobody decided in time
                rule = expiry_rule(op.status)
                assert rule is not None  # waiting for a person: EXPIRED
                to, why = rule
                try:
                    final = await self._operations.move(
                        op, tracked, to, why, error=f"deadline: {why}"
                    )
                except TransitionRefused:  # decided meanwhile: the step runs again
                    final = await self._ledger.get(operation_id)
            else:
                final = await self._finish_recovered(op, tracked)
                await self._compensator.settle_original(final)
        finally:
            self._operations.finish(tracked, final)
        return final

    async def _take_over_if_gone(self, owner: str) -> None:
        if owner in await self._ledger.gone_owners(besides=self._owner, among=[owner]):
            await self.recover(gone=[owner])

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
            self._not_ours[op.operation_id] = op.tool
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
        """Ask the system of record about an UNKNOWN or FAILED_FINAL operation now.

        See the runtime's method.
        """
        op = await self._ledger.get(operation_id)
        if op.status not in (S.UNKNOWN, S.FAILED_FINAL):
            raise ConfigurationError(
                f"operation {operation_id} is {op.status.value}, not UNKNOWN or FAILED_FINAL: "
                "nothing to reconcile"
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
            if op.status is S.FAILED_FINAL:
                final = await self._check_failed(op, tracked, executor, probes)
            else:
                final = await executor.reconcile(op, tracked, patient=False)
            operation_logger(final).info(
                "operation {} reconciled by {}: {}", op.operation_id, executor.actor, final.status
            )
        return final

    async def _check_failed(
        self, op: Operation, tracked: Tracked, executor: Executor, probes: int
    ) -> Operation:
        """Ask whether a FAILED_FINAL ``op`` really did not happen; a commit is a conflict."""
        hook = tracked.binding.action.reconcile
        assert hook is not None
        for _ in range(probes):
            answer = await hook(ActionContext.of(op))
            if answer.state is ReconcileState.COMMITTED:
                corrected = await executor.correct(
                    op,
                    tracked,
                    answer.result,
                    source=f"the reconcile hook (asked by {executor.actor})",
                )
                # Its session's conversations hear it from this process's listeners now.
                self._operations.finish(tracked, corrected)
                return corrected
            if answer.state is ReconcileState.NOT_FOUND:
                break
        return op

    async def _heartbeat_loop(self) -> None:
        while True:
            await self._clock.sleep(self._lease_secs / 3)
            await self.beat()

    async def beat(self) -> None:
        """One heartbeat: renew the lease, claim stale operations, pick up approvals."""
        try:
            await self._renew()
            if self._claims:
                await self.recover()
            await self._pick_up_approved()
        except Exception as exc:
            logger.warning("lease heartbeat failed: {}", exc)

    async def _renew(self) -> None:
        await self._ledger.renew_lease(
            self._owner,
            lease_secs=self._lease_secs,
            except_ids=[*self._operations.unsettled(), *self._not_ours, *self._let_go],
        )

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
