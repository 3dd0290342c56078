"""`ObservedLedger`: the runtime's ledger, reporting each write of this process to `Telemetry`.

Every status change goes through ``Ledger.transition`` (one table, one function), so
wrapping the ledger is the one place where retries, timeouts, UNKNOWN, cancellations,
compensations and commit times can be counted without missing a caller. A write is reported
only after it committed; a refused write (`TransitionRefused`) reports nothing.
"""

from __future__ import annotations

__all__ = ["ObservedLedger"]

import builtins
from collections.abc import Collection, Mapping
from typing import Any

from pipecat_actions.ledger import AdmitResult, ForwardingLedger, Ledger, NewOperation, Operation
from pipecat_actions.observability.telemetry import Telemetry
from pipecat_actions.status import ActionStatus


class ObservedLedger(ForwardingLedger):
    """Delegates to ``inner`` and tells ``telemetry`` about every committed write.

    Other attributes (``url``, ``upgrade_schema``, ...) are the inner ledger's. Refusals are
    counted at admission, not here.

    Args:
        inner: The ledger that stores everything.
        telemetry: Told about each write.
    """

    def __init__(self, inner: Ledger, telemetry: Telemetry) -> None:
        super().__init__(inner)
        self.telemetry = telemetry

    async def admit(self, new: NewOperation) -> AdmitResult:
        """See `Ledger.admit`."""
        # The inner ledger itself, not `ForwardingLedger`'s method: a layer less per write.
        result = await self.inner.admit(new)
        self.telemetry.admitted(new, result.operation, result.created)
        return result

    async def record_completed(self, new: NewOperation) -> Operation:
        """See `Ledger.record_completed`."""
        op = await super().record_completed(new)
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
        status = expected if type(expected) is ActionStatus else ActionStatus(expected)
        self.telemetry.transitioned(status, op, actor, detail)
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
        op = await super().annotate(
            operation_id,
            actor=actor,
            detail=detail,
            changes=changes,
            expected=expected,
            fence=fence,
        )
        self.telemetry.annotated(op, detail, changes)
        return op

    async def claim_stale(
        self,
        owner: str,
        *,
        lease_secs: float,
        limit: int,
        except_ids: Collection[str] = (),
        gone: Collection[str] = (),
    ) -> builtins.list[Operation]:
        """See `Ledger.claim_stale`."""
        claimed = await super().claim_stale(
            owner, lease_secs=lease_secs, limit=limit, except_ids=except_ids, gone=gone
        )
        self.telemetry.claimed(claimed)
        return claimed
