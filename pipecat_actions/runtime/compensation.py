"""`Compensator`: reversing a committed operation with a new operation linked to it."""

from __future__ import annotations

__all__ = ["Compensator"]

import asyncio
import dataclasses
from collections.abc import Mapping
from typing import Any

from pipecat_actions.actions import ActionContext, ActionDefinition, Binding
from pipecat_actions.clock import Clock
from pipecat_actions.errors import ConfigurationError, UnexpectedStatus
from pipecat_actions.execution.tracked import Tracked
from pipecat_actions.execution.watchdog import Watchdog
from pipecat_actions.ledger import Ledger, NewOperation, Operation
from pipecat_actions.policy import ToolKind
from pipecat_actions.runtime._operations import Operations
from pipecat_actions.runtime._runner import Runner
from pipecat_actions.status import ActionStatus

S = ActionStatus


class Compensator:
    """Compensation as a new, linked operation (see `ActionRuntime.compensate`).

    Args:
        ledger: Where the compensation is admitted and the original moved.
        clock: The runtime's clock (the compensation's deadline).
        bindings: The registered actions, by tool name (their ``compensate`` hooks).
        operations: The registry the compensation is tracked in.
        runner: Runs the compensation.
        watchdog: Bounds the compensation by its deadline.
        owner: This process's name in leases.
        lease_secs: The lease the compensation is admitted with.
        actor: Recorded on the runtime's own writes.
    """

    def __init__(
        self,
        *,
        ledger: Ledger,
        clock: Clock,
        bindings: Mapping[str, Binding],
        operations: Operations,
        runner: Runner,
        watchdog: Watchdog,
        owner: str,
        lease_secs: float,
        actor: str,
    ) -> None:
        self._ledger = ledger
        self._clock = clock
        self._bindings = bindings
        self._operations = operations
        self._runner = runner
        self._watchdog = watchdog
        self._owner = owner
        self._lease_secs = lease_secs
        self._actor = actor

    async def compensate(self, operation_id: str, *, actor: str, reason: str) -> Operation:
        """Reverse a committed operation with a new operation; see `ActionRuntime.compensate`."""
        original = await self._ledger.get(operation_id)
        binding = self._bindings.get(original.tool)
        if binding is None or binding.action.compensate is None:
            raise ConfigurationError(f"{original.tool} has no compensate hook")
        key = f"compensate|{operation_id}"
        # A compensation that failed or was cancelled no longer holds the key (the ledger
        # releases a dead operation's key), so a later request tries again under it.
        existing = await self._ledger.find_by_key(original.tenant, key)
        if existing is not None:
            return await self._operations.wait(existing.operation_id)
        if original.status not in (S.COMMITTED, S.COMPENSATING):
            raise UnexpectedStatus(
                operation_id=operation_id,
                expected_status=S.COMMITTED.value,
                actual_status=original.status.value,
            )
        admitted = await self._ledger.admit(
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
                deadline_at=self._clock.now() + binding.policy.deadline_secs,
                lease_owner=self._owner,
                lease_secs=self._lease_secs,
                actor=actor,
                detail={"reason": reason},
            )
        )
        comp = admitted.operation
        if not admitted.created:
            return await self._operations.wait(comp.operation_id)
        tracked = Tracked(
            comp.operation_id,
            self.binding_for(binding),
            comp.fence,
            asyncio.get_running_loop().create_future(),
        )
        self._operations.track(tracked)
        if original.status is S.COMMITTED:
            await self._ledger.transition(
                operation_id,
                expected=S.COMMITTED,
                to=S.COMPENSATING,
                fence=original.fence,
                actor=actor,
                detail={"reason": reason, "compensation": comp.operation_id},
            )
        self._watchdog.arm(comp.operation_id, comp.deadline_at or self._clock.now())
        await self._runner.execute(comp, tracked)
        final = await asyncio.shield(tracked.done)
        await self.settle_original(final)
        return final

    def binding_for(self, binding: Binding) -> Binding:
        """The binding a compensation of ``binding``'s action runs with (its ``compensate``)."""
        hook = binding.action.compensate
        assert hook is not None
        ledger = self._ledger

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

    async def settle_original(self, compensation: Operation) -> None:
        """Move the original of a compensation that has an outcome (or escalate it)."""
        if compensation.compensates is None:
            return
        original = await self._ledger.get(compensation.compensates)
        if compensation.status is S.COMMITTED:
            steps = {S.COMMITTED: [S.COMPENSATING, S.COMPENSATED], S.COMPENSATING: [S.COMPENSATED]}
        elif compensation.status in (S.FAILED_FINAL, S.CANCELLED):
            steps = {S.COMPENSATING: [S.COMMITTED]}
        elif compensation.escalated_at is not None:
            # Nobody can tell whether it was reversed: no status of the original is true
            # but COMPENSATING, so the original is handed to a person with its compensation.
            await self._escalate_original(original, compensation)
            return
        else:
            return  # still unknown: recovery or reconciliation settles it later
        current = original
        for to in steps.get(original.status, []):
            current = await self._ledger.transition(
                original.operation_id,
                expected=current.status,
                to=to,
                fence=current.fence,
                actor=self._actor,
                detail={
                    "compensation": compensation.operation_id,
                    "reason": (
                        f"its compensation {compensation.operation_id} ended "
                        f"{compensation.status.value}"
                    ),
                },
            )

    async def _escalate_original(self, original: Operation, compensation: Operation) -> None:
        if original.status is not S.COMPENSATING or original.escalated_at is not None:
            return
        await self._ledger.annotate(
            original.operation_id,
            actor=self._actor,
            detail={
                "escalated": f"its compensation {compensation.operation_id} has an unknown outcome",
                "compensation": compensation.operation_id,
            },
            changes={"escalated_at": self._clock.now()},
        )
