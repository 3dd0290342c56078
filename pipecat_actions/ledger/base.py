"""The ledger contract: what the runtime needs from durable storage, whatever the backend."""

from __future__ import annotations

import builtins

__all__ = ["Ledger"]

import asyncio
import contextlib
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator, Collection, Mapping
from typing import Any, Self

from pipecat_actions.ledger.records import (
    AdmitResult,
    NewOperation,
    Operation,
    OperationEvent,
    OperationFilter,
    hash_arguments,
)
from pipecat_actions.status import ActionStatus


class Ledger(ABC):
    """Durable record of every operation and its append-only audit trail.

    Every write is one transaction: a row change and its audit event commit together or not at
    all, and no caller is answered before the commit is durable.
    """

    @abstractmethod
    async def admit(self, new: NewOperation) -> AdmitResult:
        """Insert ``new``, or return the operation already bound to its idempotency key.

        The key is unique per tenant while its retention window is open. A key whose window
        closed, or whose operation ended without anything standing (`REPEATABLE_STATUSES`:
        cancelled, failed, expired, compensated), is released (audited) and bound to the new
        operation: a repeat joins what is alive, never what is dead.

        Returns:
            The operation bound to the key, and whether this call created it.

        Raises:
            IdempotencyMismatch: The key is bound to an operation of another tool or with other
                arguments. Nothing was written.
            ValueError: ``new.status`` is not one an operation can start in (ADMITTED,
                RUNNING, AWAITING_CONFIRMATION, AWAITING_APPROVAL).
            TypeError: Arguments, before-state or detail cannot be encoded as JSON.
        """

    def args_hash(self, tool: str, args: Mapping[str, Any]) -> str:
        """The hash this ledger stores as the ``args_hash`` of a call of ``tool`` with ``args``.

        The SHA-256 of their canonical JSON; a ledger that seals a tool's sensitive values
        uses a keyed hash for that tool (`pipecat_actions.ledger.sealed`). Admission compares
        a repeat's arguments, and builds idempotency keys, with this.
        """
        return hash_arguments(args)

    @abstractmethod
    async def record_refusal(self, new: NewOperation) -> Operation:
        """Insert ``new`` as REJECTED without binding its idempotency key, for the audit trail."""

    @abstractmethod
    async def record_completed(self, new: NewOperation) -> Operation:
        """Insert ``new`` with its outcome already known (COMMITTED or FAILED_FINAL).

        For reads, recorded after the fact and off the critical path: nothing of the real world
        depends on them, so they need no write-ahead. The idempotency key is not bound.

        Raises:
            ValueError: ``new.status`` is not COMMITTED or FAILED_FINAL.
        """

    @abstractmethod
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
        """Move an operation from ``expected`` to ``to`` if it is still there under ``fence``.

        The update and its audit event are one transaction. Entering RUNNING increments the
        attempt and stamps ``sent_at``; entering a terminal status stamps ``finished_at``.

        Args:
            operation_id: The operation.
            expected: The status the caller believes it is in.
            to: The status to move to; must be allowed by the status machine.
            fence: The caller's fence (from its lease); a newer fence wins.
            actor: Who does this (``runtime:<owner>``, ``approver:alice``, ...).
            detail: Why, recorded in the audit event.
            changes: Other columns to set at the same time; see `Ledger.CHANGEABLE`.

        Raises:
            IllegalTransition: ``expected → to`` is not in the table; nothing was written.
            UnexpectedStatus: The operation is in another status; nothing was written.
            StaleFence: The operation was claimed under a newer fence; nothing was written.
            OperationNotFound: No such operation.
        """

    @abstractmethod
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
        """Record something about an operation without changing its status.

        Used for delivery (``delivered_at``), acknowledgement, escalation and late results.
        With ``expected`` or ``fence`` it is a compare-and-set like `transition`.
        """

    @abstractmethod
    async def get(self, operation_id: str) -> Operation:
        """Return the operation, or raise `OperationNotFound`."""

    @abstractmethod
    async def find_by_key(self, tenant: str, idempotency_key: str) -> Operation | None:
        """Return the live operation bound to the key, or None.

        None too when the key's window closed or its operation is in `REPEATABLE_STATUSES`
        (the next `admit` of the key makes a new operation).
        """

    @abstractmethod
    async def list(self, filters: OperationFilter | None = None) -> builtins.list[Operation]:
        """Return operations matching ``filters``, oldest first."""

    async def statistics(self, filters: OperationFilter | None = None) -> dict[str, Any]:
        """Return per-tool statistics of every operation matching ``filters`` (no limit).

        Exact: computed over every matching row in a few aggregate queries, never sampled.
        ``filters.limit`` and ``filters.after`` are ignored. The figures are described in
        `pipecat_actions.operator.statistics`.

        Raises:
            NotImplementedError: This ledger cannot aggregate.
        """
        raise NotImplementedError(f"{type(self).__name__} does not compute statistics")

    @abstractmethod
    async def events(self, operation_id: str) -> builtins.list[OperationEvent]:
        """Return the audit trail of an operation in order."""

    async def events_after(self, operation_id: str, seq: int) -> builtins.list[OperationEvent]:
        """Return the events of an operation's trail after its ``seq``-th, in order.

        What a reader that has seen the trail up to ``seq`` reads when it grew (a follower of
        another process's progress reports), without reading it all again. This default
        filters `events`; a ledger that can read only the new rows overrides it.
        """
        return [event for event in await self.events(operation_id) if event.seq > seq]

    @abstractmethod
    async def claim_stale(
        self,
        owner: str,
        *,
        lease_secs: float,
        limit: int,
        except_ids: Collection[str] = (),
        gone: Collection[str] = (),
    ) -> builtins.list[Operation]:
        """Take over non-terminal operations whose owner's lease expired, or whose owner is gone.

        Each claimed operation gets ``owner``, a new lease and a fence one higher, so writes of
        the previous owner are refused from now on. Two claimers never get the same operation.
        The operations in ``except_ids`` are left alone (the claimer knows it cannot run them).
        The operations held by an owner in ``gone`` (`gone_owners` says so) are claimed
        whatever their lease says; ``owner`` itself is never gone to its own claims (its
        previous incarnation's leases are ended first: `end_leases`).

        A claimed operation is ``owner``'s with a live lease, so that it no longer matches:
        a pass of claims, repeated until one comes back empty, needs no list of those it
        claimed and never takes one twice. No order is promised. An operation another
        claimer holds at that moment is passed over while there are others, and waited for
        when it is all that is left: such a pass leaves none behind for the next one.
        """

    async def hold_life(self, owner: str) -> bool:
        """Hold ``owner``'s life lock and register it, for as long as this ledger is open.

        Other runtimes then tell at once when ``owner`` is gone (`gone_owners`), instead of
        waiting for its leases to run out. A ledger that cannot tell holds nothing.

        Returns:
            False when a live runtime holds that owner name already; True otherwise.
        """
        return True

    async def release_life(self, owner: str, *, unregister: bool = True) -> None:
        """Let go of ``owner``'s life lock and, with ``unregister``, of its registration.

        Unregistered (a clean close), the owner is nobody's to take over. Still registered,
        its lock free, it is gone (`gone_owners`): what it leaves is taken over at once.
        """
        return

    async def gone_owners(
        self, *, besides: str, among: Collection[str] | None = None
    ) -> builtins.list[str]:
        """The owners of live leases of non-terminal operations that are known to be gone.

        Gone: registered (`hold_life`) and its life lock is free, so its process ended (or
        lost its database session). ``besides`` (the caller) is never named. An owner that
        never registered is never named: its lease running out decides. A ledger that cannot
        tell names none. ``among``: only these owners are looked at.
        """
        return []

    async def forget_owners(self, owners: Collection[str]) -> None:
        """Unregister gone ``owners`` that hold no non-terminal operation any more."""
        return

    async def release_leases(self, owner: str, operation_ids: Collection[str]) -> int:
        """End ``owner``'s leases of ``operation_ids`` now, so that another owner claims them.

        Returns:
            How many leases were ended.
        """
        return 0

    async def end_leases(self, owner: str, *, except_ids: Collection[str] = ()) -> int:
        """End now every lease ``owner`` holds on a non-terminal operation, but ``except_ids``'.

        For a runtime that finds its own owner name holding operations a previous incarnation
        of it left: ended, they are claimed as any expired lease is (`claim_stale`), by this
        runtime's next claim or another's. A claim then leaves them with a live lease, so a
        pass of claims never takes one twice.

        Returns:
            How many leases were ended.
        """
        return 0

    @abstractmethod
    async def renew_lease(
        self, owner: str, *, lease_secs: float, except_ids: Collection[str] = ()
    ) -> int:
        """Extend the lease of every non-terminal operation held by ``owner``; return how many.

        The operations in ``except_ids`` are left to expire: their owner cannot settle them,
        so that another owner may claim them once their lease runs out.
        """

    @contextlib.asynccontextmanager
    async def notices(self, operation_id: str) -> AsyncIterator[asyncio.Event | None]:
        """While open, an event set when another process may have settled ``operation_id``.

        Settled here means: a transition out of the in-flight statuses (an outcome, or a
        wait for a person); a progress report of its running effect (an annotation with
        `PROGRESS`) is noticed too, so that a durable call's bot hears it. Listening has
        started when the block is entered, so a caller that reads the operation after
        entering misses nothing; the event may also be set for nothing (a lost notification
        connection wakes everyone), so the caller re-reads and clears it. None: this ledger
        cannot tell, and the caller polls.
        """
        yield None

    @abstractmethod
    async def close(self) -> None:
        """Release connections. The ledger cannot be used afterwards."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()
