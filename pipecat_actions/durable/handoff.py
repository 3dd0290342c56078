"""`DurableLedger`: the bot's side of a durable operation, handed to DBOS as it is admitted.

For a tool whose policy says ``execution: durable``, admission writes the operation ADMITTED
(never RUNNING: nothing is sent from the call's process) and enqueues its DBOS workflow in the
same PostgreSQL transaction, through `DBOSClient.enqueue_in_transaction` on the ledger's own
connection: the row and the workflow commit together or not at all. The workflow id is
derived from the operation id (`workflow_id_for`), and the queue deduplicates on the tenant
and idempotency key, so a repeat never starts a second workflow. The bot process is only a
DBOS client: it never launches executors; a ``pipecat-actions worker --dbos`` runs the
workflow (`pipecat_actions.dbos_worker`).

The operation's lease belongs to `DURABLE_OWNER` and never runs out: the lease-based recovery
of bots and plain workers leaves it alone, and DBOS recovers its workflow instead.
"""

from __future__ import annotations

__all__ = ["DurableLedger", "hands_off", "psycopg_url", "workflow_state", "workflow_status"]

import asyncio
import dataclasses
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from loguru import logger
from sqlalchemy import text
from sqlalchemy.engine import Connection, make_url

from pipecat_actions.durable._names import (
    DECISION_TOPIC,
    DURABLE_LEASE_SECS,
    DURABLE_OWNER,
    WORKFLOW_NAME,
    deduplication_id,
    queue_for,
    workflow_id_for,
)
from pipecat_actions.errors import LedgerConfigurationError
from pipecat_actions.ledger import ForwardingLedger, Ledger, Operation, SqlLedger
from pipecat_actions.ledger.records import AdmitResult, NewOperation
from pipecat_actions.policy import PolicySet
from pipecat_actions.status import AWAITING_PERSON_STATUSES, ActionStatus

if TYPE_CHECKING:
    from dbos import DBOSClient

S = ActionStatus

_HANDED_STATUSES = frozenset({S.ADMITTED, S.RUNNING, S.AWAITING_APPROVAL, S.AWAITING_CONFIRMATION})
"""What admission inserts that a workflow takes over: a call that may start now (a durable one
is ADMITTED, never RUNNING), or one that waits for an approver or for the user's spoken yes
(its workflow waits too)."""

_WAITING_REASONS = {
    S.AWAITING_APPROVAL: "waiting for approval",
    S.AWAITING_CONFIRMATION: "waiting for the user's yes",
}


def psycopg_url(url: str) -> str:
    """The ledger's PostgreSQL URL for DBOS's own engine (psycopg 3), password kept.

    Raises:
        LedgerConfigurationError: ``url`` is not a PostgreSQL URL.
    """
    parsed = make_url(url)
    if parsed.get_backend_name() != "postgresql":
        raise LedgerConfigurationError(
            f"durable execution needs a PostgreSQL ledger, not {parsed.get_backend_name()}: "
            "SQLite stays the embedded default with execution: in_call"
        )
    return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def hands_off(ledger: Ledger) -> bool:
    """Whether ``ledger`` (or a ledger it wraps) hands durable operations to DBOS."""
    seen: Ledger | None = ledger
    while seen is not None:
        if isinstance(seen, DurableLedger):
            return True
        inner = seen.__dict__.get("inner")
        seen = inner if isinstance(inner, Ledger) else None
    return False


class DurableLedger(ForwardingLedger):
    """A PostgreSQL `SqlLedger` that hands each durable operation to its DBOS workflow.

    Open it with `DurableLedger.open` and give it to `ActionRuntime.create` (``ledger=``); the
    caller closes it. Every other operation is the inner ledger's, unchanged.

    Args:
        inner: The PostgreSQL ledger.
        policy: Which tools are durable, and their queues.
        client: The DBOS client on the same database.
        database_url: The ledger's URL with its password (for the DBOS client).
    """

    def __init__(self, inner: SqlLedger, policy: PolicySet, client: DBOSClient) -> None:
        super().__init__(inner)
        self._sql = inner
        self._policy = policy
        self._client = client

    @classmethod
    async def open(
        cls, url: str, policy: PolicySet, *, ledger: SqlLedger | None = None
    ) -> DurableLedger:
        """Open the ledger at ``url`` (or wrap ``ledger``) with a DBOS client on its database.

        Raises:
            LedgerConfigurationError: ``url`` is not PostgreSQL, or the database has no DBOS
                tables yet (a ``pipecat-actions worker --dbos`` creates them when it starts,
                as does ``pipecat-actions db upgrade --dbos``).
        """
        sync_url = psycopg_url(url)
        from dbos import DBOSClient

        opened = ledger or await SqlLedger.create(url)
        try:
            client = DBOSClient(system_database_url=sync_url, lazy=True)
            try:
                await asyncio.to_thread(_check_dbos_tables, client)
            except BaseException:
                await asyncio.to_thread(client.destroy)
                raise
        except BaseException:
            if ledger is None:
                await opened.close()
            raise
        return cls(opened, policy, client)

    @property
    def client(self) -> DBOSClient:
        """The DBOS client (workflow status, messages)."""
        return self._client

    async def admit(self, new: NewOperation) -> AdmitResult:
        """See `Ledger.admit`; a durable tool's operation is handed to its workflow."""
        policy = self._policy.get(new.tool)
        if policy is None or not policy.is_durable or new.status not in _HANDED_STATUSES:
            return await super().admit(new)
        queue = queue_for(new.tool, policy)
        waits = new.status in _WAITING_REASONS
        handed = dataclasses.replace(
            new,
            status=new.status if waits else S.ADMITTED,
            lease_owner=DURABLE_OWNER,
            lease_secs=DURABLE_LEASE_SECS,
            detail={
                **(new.detail or {}),
                "reason": (
                    (new.detail or {}).get("reason", _WAITING_REASONS.get(new.status, ""))
                    + "; handed to its DBOS workflow"
                    if waits
                    else "admission checks passed; handed to its DBOS workflow"
                ),
                "workflow_id": workflow_id_for(new.operation_id),
                "queue": queue,
            },
        )
        client = self._client

        def enqueue(conn: Connection, op: Operation) -> None:
            client.enqueue_in_transaction(
                conn,
                {
                    "workflow_name": WORKFLOW_NAME,
                    "queue_name": queue,
                    "workflow_id": workflow_id_for(op.operation_id),
                    "deduplication_id": deduplication_id(op.tenant, op.idempotency_key),
                    "workflow_id_reuse_policy": "reject",
                },
                op.operation_id,
            )

        return await self._sql.admit(handed, within=enqueue)

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
        """See `Ledger.transition`; a person's decision on a durable operation wakes its workflow.

        A person's decision: an approver's, or the user's spoken yes or no in the call. It is
        recorded first (once: the transition is conditional); the message
        only saves the waiting workflow the rest of its pause (`APPROVAL_POLL_SECS`), so a
        message that cannot be sent is logged, never raised.
        """
        moved = await super().transition(
            operation_id,
            expected=expected,
            to=to,
            fence=fence,
            actor=actor,
            detail=detail,
            changes=changes,
        )
        if expected in AWAITING_PERSON_STATUSES and moved.lease_owner == DURABLE_OWNER:
            try:
                await asyncio.to_thread(
                    self._client.send,
                    workflow_id_for(operation_id),
                    to.value,
                    DECISION_TOPIC,
                    f"{operation_id}:{to.value}",
                )
            except Exception as exc:
                logger.warning(
                    "operation {}: its workflow could not be told of the decision ({}); it "
                    "reads it from the ledger at its next look",
                    operation_id,
                    exc,
                )
        return moved

    async def workflow_status(self, operation_id: str) -> str | None:
        """DBOS's status of the workflow of ``operation_id`` (None: there is none)."""
        return await workflow_status(self._client, operation_id)

    async def close(self) -> None:
        """Close the DBOS client and the ledger."""
        try:
            await asyncio.to_thread(self._client.destroy)
        finally:
            await super().close()


async def workflow_status(client: DBOSClient, operation_id: str) -> str | None:
    """DBOS's status of the workflow of ``operation_id`` (None: there is none)."""
    found = await workflow_state(client, operation_id)
    return None if found is None else found[0]


async def workflow_state(client: DBOSClient, operation_id: str) -> tuple[str, Any] | None:
    """DBOS's status of the workflow of ``operation_id`` and its output (None: no workflow).

    The output of a finished workflow is the operation's final status, as its step read it
    from the ledger.
    """
    from dbos._error import DBOSNonExistentWorkflowError

    def read() -> tuple[str, Any] | None:
        try:
            handle: Any = client.retrieve_workflow(workflow_id_for(operation_id))
        except DBOSNonExistentWorkflowError:
            return None
        status = handle.get_status()
        return str(status.status), status.output

    return await asyncio.to_thread(read)


def _check_dbos_tables(client: Any) -> None:
    client.check_connection()
    with client._sys_db.engine.connect() as conn:
        found = conn.execute(text("SELECT to_regclass('dbos.workflow_status')")).scalar()
    if found is None:
        raise LedgerConfigurationError(
            "the database has no DBOS tables yet: start a `pipecat-actions worker --dbos` once "
            "(it creates them), or run `pipecat-actions db upgrade --dbos`"
        )
