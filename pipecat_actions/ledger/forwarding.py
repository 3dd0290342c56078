"""`ForwardingLedger`: a `Ledger` that passes every call to another, for wrappers to extend.

A wrapper that watches some writes (metrics, a test's timeline, a crash point) subclasses it
and overrides only those methods, calling ``super()``; every other method and attribute
(``url``, ...) is the inner ledger's.
"""

from __future__ import annotations

__all__ = ["ForwardingLedger"]

import asyncio
import builtins
import contextlib
from collections.abc import AsyncIterator, Collection, Mapping
from typing import Any

from pipecat_actions.ledger.base import Ledger
from pipecat_actions.ledger.records import (
    AdmitResult,
    NewOperation,
    Operation,
    OperationEvent,
    OperationFilter,
)
from pipecat_actions.status import ActionStatus


class ForwardingLedger(Ledger):
    """Delegates every call to ``inner``.

    Args:
        inner: The ledger that stores everything.
    """

    def __init__(self, inner: Ledger) -> None:
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    async def admit(self, new: NewOperation) -> AdmitResult:
        """See `Ledger.admit`."""
        return await self.inner.admit(new)

    def args_hash(self, tool: str, args: Mapping[str, Any]) -> str:
        """See `Ledger.args_hash`."""
        return self.inner.args_hash(tool, args)

    async def record_refusal(self, new: NewOperation) -> Operation:
        """See `Ledger.record_refusal`."""
        return await self.inner.record_refusal(new)

    async def record_completed(self, new: NewOperation) -> Operation:
        """See `Ledger.record_completed`."""
        return await self.inner.record_completed(new)

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
        return await self.inner.transition(
            operation_id,
            expected=expected,
            to=to,
            fence=fence,
            actor=actor,
            detail=detail,
            changes=changes,
        )

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
        return await self.inner.annotate(
            operation_id,
            actor=actor,
            detail=detail,
            changes=changes,
            expected=expected,
            fence=fence,
        )

    async def get(self, operation_id: str) -> Operation:
        """See `Ledger.get`."""
        return await self.inner.get(operation_id)

    async def find_by_key(self, tenant: str, idempotency_key: str) -> Operation | None:
        """See `Ledger.find_by_key`."""
        return await self.inner.find_by_key(tenant, idempotency_key)

    async def list(self, filters: OperationFilter | None = None) -> builtins.list[Operation]:
        """See `Ledger.list`."""
        return await self.inner.list(filters)

    async def statistics(self, filters: OperationFilter | None = None) -> dict[str, Any]:
        """See `Ledger.statistics`."""
        return await self.inner.statistics(filters)

    async def events(self, operation_id: str) -> builtins.list[OperationEvent]:
        """See `Ledger.events`."""
        return await self.inner.events(operation_id)

    async def events_after(self, operation_id: str, seq: int) -> builtins.list[OperationEvent]:
        """See `Ledger.events_after`."""
        return await self.inner.events_after(operation_id, seq)

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
        return await self.inner.claim_stale(
            owner, lease_secs=lease_secs, limit=limit, except_ids=except_ids, gone=gone
        )

    async def hold_life(self, owner: str) -> bool:
        """See `Ledger.hold_life`."""
        return await self.inner.hold_life(owner)

    async def release_life(self, owner: str, *, unregister: bool = True) -> None:
        """See `Ledger.release_life`."""
        await self.inner.release_life(owner, unregister=unregister)

    async def gone_owners(
        self, *, besides: str, among: Collection[str] | None = None
    ) -> builtins.list[str]:
        """See `Ledger.gone_owners`."""
        return await self.inner.gone_owners(besides=besides, among=among)

    async def forget_owners(self, owners: Collection[str]) -> None:
        """See `Ledger.forget_owners`."""
        await self.inner.forget_owners(owners)

    async def end_leases(self, owner: str, *, except_ids: Collection[str] = ()) -> int:
        """See `Ledger.end_leases`."""
        return await self.inner.end_leases(owner, except_ids=except_ids)

    async def release_leases(self, owner: str, operation_ids: Collection[str]) -> int:
        """See `Ledger.release_leases`."""
        return await self.inner.release_leases(owner, operation_ids)

    async def renew_lease(
        self, owner: str, *, lease_secs: float, except_ids: Collection[str] = ()
    ) -> int:
        """See `Ledger.renew_lease`."""
        return await self.inner.renew_lease(owner, lease_secs=lease_secs, except_ids=except_ids)

    @contextlib.asynccontextmanager
    async def notices(self, operation_id: str) -> AsyncIterator[asyncio.Event | None]:
        """See `Ledger.notices`."""
        async with self.inner.notices(operation_id) as changed:
            yield changed

    async def close(self) -> None:
        """See `Ledger.close`."""
        await self.inner.close()
