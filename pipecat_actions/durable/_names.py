"""The names a durable operation and its DBOS workflow share (bot, worker and operator)."""

from __future__ import annotations

__all__ = [
    "DECISION_TOPIC",
    "DEFAULT_QUEUE",
    "DURABLE_LEASE_SECS",
    "DURABLE_OWNER",
    "WORKFLOW_NAME",
    "deduplication_id",
    "operation_of_workflow",
    "queue_for",
    "workflow_id_for",
]

from pipecat_actions.policy import ToolPolicy

WORKFLOW_NAME = "pipecat_actions.run_operation"
"""The DBOS workflow every durable operation runs as (registered by the worker)."""

DEFAULT_QUEUE = "pipecat_actions"
"""The DBOS queue of a durable tool without ``durable:`` limits."""

DURABLE_OWNER = "dbos"
"""The lease owner of a durable operation: no runtime's name, registered by none, so the
lease-based recovery of bots and of the plain worker never claims it (DBOS recovers it)."""

DURABLE_LEASE_SECS = 100 * 365 * 24 * 3600.0
"""The lease of a durable operation: it never runs out (DBOS owns it, not a lease)."""

DECISION_TOPIC = "pipecat_actions.decision"
"""The DBOS message topic that wakes a workflow waiting for a person's decision."""

_WORKFLOW_PREFIX = "pa-op:"


def workflow_id_for(operation_id: str) -> str:
    """The id of the workflow of ``operation_id``: one workflow per operation, ever."""
    return _WORKFLOW_PREFIX + operation_id


def operation_of_workflow(workflow_id: str) -> str | None:
    """The operation id a workflow id names, or None for a workflow that is not ours."""
    if not workflow_id.startswith(_WORKFLOW_PREFIX):
        return None
    return workflow_id[len(_WORKFLOW_PREFIX) :]


def deduplication_id(tenant: str, idempotency_key: str) -> str:
    """The queue's deduplication id: one live workflow per idempotency key and tenant."""
    return f"{tenant}\x1f{idempotency_key}"


def queue_for(tool: str, policy: ToolPolicy) -> str:
    """The DBOS queue of ``tool``: its own when its policy sets shared limits."""
    if policy.durable is None:
        return DEFAULT_QUEUE
    return f"{DEFAULT_QUEUE}:{tool}"
