"""Operations that outlive the call: durable execution on DBOS, on PostgreSQL deployments.

A tool whose policy says ``execution: durable`` is admitted in the call's process and run by a
DBOS worker (``pipecat-actions worker --dbos``): its ledger row and its workflow enqueue commit
in one transaction (`DurableLedger`), the worker runs its effect as a DBOS step on the tool's
queue, and the ledger stays what the conversation reads. ``dbos`` is imported only when a
durable ledger or worker is opened. See ``docs/durable.md``.
"""

from __future__ import annotations

__all__ = [
    "DURABLE_OWNER",
    "WORKFLOW_NAME",
    "DurableLedger",
    "hands_off",
    "install_dbos_schema",
    "operation_of_workflow",
    "queue_for",
    "workflow_id_for",
]

from pipecat_actions.durable._names import (
    DURABLE_OWNER,
    WORKFLOW_NAME,
    operation_of_workflow,
    queue_for,
    workflow_id_for,
)
from pipecat_actions.durable._schema import install_dbos_schema
from pipecat_actions.durable.handoff import DurableLedger, hands_off
