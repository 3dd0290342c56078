"""Compensation: reversing a committed operation with a new operation linked to it."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

from pipecat_actions.actions import ActionContext, ActionDefinition, Binding
from pipecat_actions.errors import (
    ConfigurationError,
    UnexpectedStatus,
)
from pipecat_actions.execution.tracked import Tracked
from pipecat_actions.ledger import (
    NewOperation,
    Operation,
)
from pipecat_actions.policy import ToolKind
from pipecat_actions.runtime.base import RuntimeBase
from pipecat_actions.status import ActionStatus

S = ActionStatus


class CompensationMixin(RuntimeBase):
    """Compensation as a new, linked operation."""

    async def compensate(self, operation_id: str, *, actor: str, reason: str) -> Operation:
        """Reverse a committed operation by running its ``compensate`` hook as a new operation.

        The compensation is admitted first, under the key ``compensate|<operation>``, so
        concurrent requests join one compensation; the original then goes COMMITTED →
        COMPENSATING → COMPENSATED, or back to COMMITTED when the compensation fails for good
        (a later call may then try again under a new key). When nobody can tell whether the
        compensation happened (it stays UNKNOWN and is escalated, e.g. after a crash cut it
        off), the original stays COMPENSATING and is escalated with it. The hook's context
        carries the original operation (``ctx.operation``: its result and before-state).

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
        elif compensation.escalated_at is not None:
            # Nobody can tell whether it was reversed: no status of the original is true
            # but COMPENSATING, so the original is handed to a person with its compensation.
            await self._escalate_original(original, compensation)
            return
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
        await self.ledger.annotate(
            original.operation_id,
            actor=self.actor,
            detail={
                "escalated": f"its compensation {compensation.operation_id} has an unknown outcome",
                "compensation": compensation.operation_id,
            },
            changes={"escalated_at": self.clock.now()},
        )
