"""What the model is told: a truthful, truthy tool result for every operation state.

Every result is a non-empty dict with ``status``, ``operation_id`` (when an operation exists)
and a plain-language ``message`` (a falsy result never triggers inference in Pipecat). The
words never claim more than the ledger knows: "cancelled" only for CANCELLED, "done" only for
COMMITTED.
"""

from __future__ import annotations

__all__ = ["refusal_result", "render", "render_operation"]

from typing import Any

from pipecat_actions.ledger.records import Operation
from pipecat_actions.status import ActionStatus

_MESSAGES: dict[ActionStatus, str] = {
    ActionStatus.COMMITTED: "Done: {tool} succeeded.",
    ActionStatus.FAILED_FINAL: "{tool} did not happen: {error}",
    ActionStatus.CANCELLED: "{tool} was cancelled; nothing happened.",
    ActionStatus.REJECTED: "{tool} was refused: {error}",
    ActionStatus.EXPIRED: "{tool} expired before it was confirmed; nothing happened.",
    ActionStatus.UNKNOWN: (
        "It is not yet known whether {tool} happened; it is being checked with the system. "
        "Do not say it succeeded or failed."
    ),
    ActionStatus.RUNNING: "{tool} is in progress; the outcome will follow.",
    ActionStatus.ADMITTED: "{tool} is about to start; the outcome will follow.",
    ActionStatus.FAILED_RETRYABLE: "{tool} is being retried; the outcome will follow.",
    ActionStatus.CANCEL_REQUESTED: (
        "Cancelling {tool} was requested; it is not yet known whether it was stopped in time."
    ),
    ActionStatus.AWAITING_APPROVAL: (
        "{tool} is waiting for approval by a person; the user will be told the outcome."
    ),
    ActionStatus.AWAITING_CONFIRMATION: (
        "{tool} needs the user's confirmation: ask them, and call confirm_action only if they "
        "say yes."
    ),
    ActionStatus.COMPENSATING: "{tool} happened and is being reversed.",
    ActionStatus.COMPENSATED: "{tool} happened and was reversed.",
}


def render_operation(op: Operation, *, note: str | None = None) -> dict[str, Any]:
    """Return the tool result that tells the model the truth about ``op``."""
    result = render(
        op.status,
        tool=op.tool,
        operation_id=op.operation_id,
        value=op.result,
        error=op.error,
        note=note,
    )
    if op.status is ActionStatus.AWAITING_CONFIRMATION:
        result["confirmation_token"] = op.args_hash[:12]
    return result


def render(
    status: ActionStatus,
    *,
    tool: str,
    operation_id: str,
    value: Any = None,
    error: str | None = None,
    note: str | None = None,
) -> dict[str, Any]:
    """Return the tool result for an operation of ``tool`` in ``status``."""
    reason = (error or "no reason given").rstrip(". ") + "."
    message = _MESSAGES[status].format(tool=tool, error=reason)
    result: dict[str, Any] = {
        "status": status.value.lower(),
        "operation_id": operation_id,
        "message": message if note is None else f"{message} {note}",
    }
    if status in (ActionStatus.COMMITTED, ActionStatus.COMPENSATED) and value is not None:
        result["result"] = value
    return result


def refusal_result(
    message: str, *, code: str, operation_id: str | None = None, **extra: Any
) -> dict[str, Any]:
    """Return the tool result of a call refused before it could run."""
    result: dict[str, Any] = {"status": "refused", "reason": code, "message": message}
    if operation_id is not None:
        result["operation_id"] = operation_id
    result.update(extra)
    return result
