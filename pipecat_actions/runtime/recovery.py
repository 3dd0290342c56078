"""Recovery: lease heartbeat, a dead owner's operations, approvals given elsewhere."""

from __future__ import annotations

import asyncio

from loguru import logger

from pipecat_actions.errors import ConfigurationError
from pipecat_actions.execution.executor import Executor, ReconcileSchedule
from pipecat_actions.execution.tracked import Tracked
from pipecat_actions.ledger import (
    Operation,
    OperationFilter,
)
from pipecat_actions.observability.correlation import operation_ids, operation_logger
from pipecat_actions.runtime.compensation import CompensationMixin
from pipecat_actions.status import ActionStatus

S = ActionStatus


class RecoveryMixin(CompensationMixin):
    """Leases, recovery of a dead owner's operations, approvals made elsewhere."""

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
            operation_logger(op).warning(
                "recovered operation {} of unknown tool {}", op.operation_id, op.tool
            )
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
            op = await self._move(op, tracked, S.UNKNOWN, "recovered after its owner stopped")
        if op.status is S.UNKNOWN:
            final = await self.executor.reconcile(op, tracked)
        elif op.status in (S.ADMITTED, S.FAILED_RETRYABLE) and self.recover_unsent == "fail":
            final = await self._move(
                op,
                tracked,
                S.FAILED_FINAL,
                "recovered unsent; recover_unsent is fail",
                error="its owner stopped before sending it; not retried by policy",
            )
        elif op.status in (S.ADMITTED, S.FAILED_RETRYABLE):
            if op.deadline_at is not None:
                self.watchdog.arm(op.operation_id, op.deadline_at)
            final = await self.executor.run(op, tracked, stage="recovery")
        else:
            final = op
        try:
            # The original is settled first, so whoever waits for the compensation then
            # finds both in their final state.
            await self._settle_original(final)
        finally:
            self._finish(tracked, final)

    async def reconcile_unknown(
        self, operation_id: str, *, actor: str | None = None, probes: int = 1
    ) -> Operation:
        """Ask the system of record about an UNKNOWN operation now, and record what it says.

        The entry point of ``pipecat-actions reconcile``: the action's ``reconcile`` hook is
        asked up to ``probes`` times; COMMITTED or FAILED_FINAL is written through the same
        conditional transition (and audit event) as the runtime's own reconciliation, with
        ``actor`` recorded; an answer that settles nothing leaves the operation UNKNOWN and
        escalated. A concurrent writer (the owner finishing it) wins and is reported as is.

        Args:
            operation_id: The operation.
            actor: Who asks, for the audit trail (default: this runtime).
            probes: How many times the hook is asked before giving up.

        Returns:
            The operation afterwards.

        Raises:
            OperationNotFound: No such operation.
            ConfigurationError: Not UNKNOWN, or its tool is not loaded or has no reconcile hook.
        """
        op = await self.ledger.get(operation_id)
        if op.status is not S.UNKNOWN:
            raise ConfigurationError(
                f"operation {operation_id} is {op.status.value}, not UNKNOWN: nothing to reconcile"
            )
        tool = op.tool.removesuffix(".compensate")
        binding = self._bindings.get(tool)
        if binding is None:
            raise ConfigurationError(
                f"operation {operation_id}: its tool {op.tool} is not among the loaded actions"
            )
        if op.tool.endswith(".compensate") and binding.action.compensate is not None:
            binding = self._compensation_binding(binding)
        if binding.action.reconcile is None:
            raise ConfigurationError(
                f"operation {operation_id}: the action {tool} has no reconcile hook"
            )
        executor = Executor(
            self.ledger,
            self.clock,
            self._authorizer,
            actor=actor or self.actor,
            schedule=ReconcileSchedule(initial_secs=0.0, max_probes=probes),
        )
        tracked = Tracked(
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
