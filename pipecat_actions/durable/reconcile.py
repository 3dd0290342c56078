"""What DBOS says of a durable operation's workflow, read into the ledger's status machine.

The ledger is what the conversation reads; the workflow is what runs the operation. When they
could disagree (the workflow ended without its step settling the operation: cancelled by an
operator, out of recovery attempts, failed for good), `settle_from_workflow` reads the
workflow's status with ``get_workflow_status`` (never a guess) and moves the operation where
that status proves it is:

==============================  ==================================================
workflow                        operation (if not settled already)
==============================  ==================================================
ENQUEUED, PENDING, DELAYED      unchanged: its workflow still runs it
SUCCESS                         unchanged: its step wrote its outcome (the output)
ERROR, CANCELLED,               ADMITTED (nothing sent): FAILED_FINAL;
MAX_RECOVERY_ATTEMPTS_EXCEEDED  RUNNING (maybe sent): UNKNOWN, for reconciliation
no workflow                     unchanged, and said: a durable operation has one
==============================  ==================================================
"""

from __future__ import annotations

__all__ = ["WorkflowView", "check_durable", "settle_from_workflow"]

from dataclasses import dataclass
from typing import Any

from pipecat_actions.durable._names import DURABLE_OWNER
from pipecat_actions.durable.handoff import workflow_state
from pipecat_actions.errors import TransitionRefused
from pipecat_actions.ledger import Ledger, Operation
from pipecat_actions.status import TERMINAL_STATUSES, ActionStatus

S = ActionStatus

RUNS = frozenset({"ENQUEUED", "PENDING", "DELAYED"})
"""Workflow statuses in which DBOS still runs the operation."""

ENDED_UNSETTLED = frozenset({"ERROR", "CANCELLED", "MAX_RECOVERY_ATTEMPTS_EXCEEDED"})
"""Workflow statuses in which DBOS will not run the operation again by itself."""


@dataclass(frozen=True)
class WorkflowView:
    """A durable operation as the ledger and DBOS each tell it.

    Attributes:
        operation: The operation, after any move this check made.
        workflow_status: DBOS's status of its workflow (None: it has none).
        workflow_output: The workflow's output (its final status, on SUCCESS).
        moved: Whether the check moved the operation.
    """

    operation: Operation
    workflow_status: str | None
    workflow_output: Any
    moved: bool


async def settle_from_workflow(
    ledger: Ledger, client: Any, operation_id: str, *, actor: str
) -> WorkflowView:
    """Read the workflow of ``operation_id`` and move the operation where it proves it is.

    Args:
        ledger: The ledger.
        client: The `dbos.DBOSClient` on the ledger's database.
        operation_id: The durable operation.
        actor: Recorded on the move.
    """
    op = await ledger.get(operation_id)
    found = await workflow_state(client, operation_id)
    if found is None:
        return WorkflowView(op, None, None, moved=False)
    status, output = found
    if op.status in TERMINAL_STATUSES or status not in ENDED_UNSETTLED:
        return WorkflowView(op, status, output, moved=False)
    if op.status is S.ADMITTED:
        to, error = S.FAILED_FINAL, f"its DBOS workflow ended {status} before sending it"
    elif op.status is S.RUNNING:
        to, error = (
            S.UNKNOWN,
            f"its DBOS workflow ended {status} after it may have been sent; it is checked",
        )
    else:
        return WorkflowView(op, status, output, moved=False)
    try:
        moved = await ledger.transition(
            operation_id,
            expected=op.status,
            to=to,
            fence=op.fence,
            actor=actor,
            detail={"reason": f"workflow {status}", "workflow_status": status},
            changes={"error": error},
        )
    except TransitionRefused:  # settled meanwhile (its step wrote it): what it says stands
        return WorkflowView(await ledger.get(operation_id), status, output, moved=False)
    return WorkflowView(moved, status, output, moved=True)


async def check_durable(
    url: str, operation_ids: list[str], *, actor: str = "operator:durable-check"
) -> list[WorkflowView]:
    """`settle_from_workflow` for ``operation_ids``, or every unsettled durable operation.

    What ``pipecat-actions durable check`` runs (an operator, or a scheduled job).
    """
    from pipecat_actions.durable.handoff import DurableLedger
    from pipecat_actions.ledger import OperationFilter, SqlLedger
    from pipecat_actions.policy import PolicySet

    sql = await SqlLedger.create(url, must_exist=True)
    ledger = await DurableLedger.open(url, PolicySet({}), ledger=sql)
    try:
        ids = operation_ids or [
            op.operation_id
            for op in await ledger.list(
                OperationFilter(
                    status=[s for s in ActionStatus if s not in TERMINAL_STATUSES],
                    lease_owner=DURABLE_OWNER,
                )
            )
        ]
        return [
            await settle_from_workflow(ledger, ledger.client, op_id, actor=actor) for op_id in ids
        ]
    finally:
        await ledger.close()
