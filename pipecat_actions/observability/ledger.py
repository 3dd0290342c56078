"""`ObservedLedger`: the runtime's ledger, reporting each write of this process to `Telemetry`.

Every status change goes through ``Ledger.transition`` (one table, one function), so
wrapping the ledger is the one place where retries, timeouts, UNKNOWN, cancellations,
compensations and commit times can be counted without missing a caller. A write is reported
only after it committed; a refused write (`TransitionRefused`) reports nothing.
"""

from __future__ import annotations

import builtins

__all__ = ["ObservedLedger"]

from collections.abc import Mapping
from typing import Any

from pipecat_actions.ledger import (
    AdmitResult,
    Ledger,
    NewOperation,
    Operation,
    OperationEvent,
    OperationFilter,
)
from pipecat_actions.observability.telemetry import Telemetry
from pipecat_actions.status import ActionStatus


class ObservedLedger(Ledger):
    """Delegates to ``inner`` and tells ``telemetry`` about every committed write.

    Other attributes (``url``, ``upgrade_schema``, ...) are the inner ledger's.

    Args:
        inner: The ledger that stores everything.
        telemetry: Told about each write.
    """

    def __init__(self, inner: Ledger, telemetry: Telemetry) -> None:
        self.inner = inner
        self.telemetry = telemetry

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def admit(self, new: NewOperation) -> AdmitResult:
        """See `Ledger.admit`."""
        result = await self.inner.admit(new)
        self.telemetry.admitted(new, result.operation, result.created)
        return result

    async def record_refusal(self, new: NewOperation) -> Operation:
        """See `Ledger.record_refusal` (refusals are counted at admission)."""
        return await self.inner.record_refusal(new)

    async def record_completed(self, new: NewOperation) -> Operation:
        """See `Ledger.record_completed`."""
        op = await self.inner.record_completed(new)
        self.telemetry.completed(new, op)
        return op

    async def transition(
        self,
        operation_id: str,
        *,
        expected: ActionStatus,
        to: ActionStatus,
        fence: int,
        actor: str,
        detail: Mapping[str, Any] | None = None,
        changes: Mapping[str, Any] | None = None,
    ) -> Operation:
        """See `Ledger.transition`."""
        op = await self.inner.transition(
            operation_id,
            expected=expected,
            to=to,
            fence=fence,
            actor=actor,
            detail=detail,
            changes=changes,
        )
        self.telemetry.transitioned(ActionStatus(expected), op, actor, detail)
        return op

    async def annotate(
        self,
        operation_id: str,
        *,
        actor: str,
        detail: Mapping[str, Any] | None = None,
        changes: Mapping[str, Any] | None = None,
        expected: ActionStatus | None = None,
        fence: int | None = None,
    ) -> Operation:
        """See `Ledger.annotate`."""
        op = await self.inner.annotate(
            operation_id,
            actor=actor,
            detail=detail,
            changes=changes,
            expected=expected,
            fence=fence,
        )
        self.telemetry.annotated(op, detail, changes)
        return op

    async def get(self, operation_id: str) -> Operation:
        """See `Ledger.get`."""
        return await self.inner.get(operation_id)

    async def find_by_key(self, tenant: str, idempotency_key: str) -> Operation | None:
        """See `Ledger.find_by_key`."""
        return await self.inner.find_by_key(tenant, idempotency_key)

    async def list(self, filters: OperationFilter | None = None) -> builtins.list[Operation]:
        """See `Ledger.list`."""
        return await self.inner.list(filters)

    async def events(self, operation_id: str) -> builtins.list[OperationEvent]:
        """See `Ledger.events`."""
        return await self.inner.events(operation_id)

    async def claim_stale(
        self, owner: str, *, lease_secs: float, limit: int
    ) -> builtins.list[Operation]:
        """See `Ledger.claim_stale`."""
        claimed = await self.inner.claim_stale(owner, lease_secs=lease_secs, limit=limit)
        self.telemetry.claimed(claimed)
        return claimed

    async def renew_lease(self, owner: str, *, lease_secs: float) -> int:
        """See `Ledger.renew_lease`."""
        return await self.inner.renew_lease(owner, lease_secs=lease_secs)

    async def close(self) -> None:
        """See `Ledger.close`."""
        await self.inner.close()
