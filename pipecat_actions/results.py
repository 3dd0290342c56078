"""What the model is told: a truthful, truthy tool result for every operation state.

Every result is a non-empty dict with ``status``, ``operation_id`` (when an operation exists)
and a plain-language ``message`` (a falsy result never triggers inference in Pipecat). The
words never claim more than the ledger knows: "cancelled" only for CANCELLED, "done" only for
COMMITTED. An UNKNOWN outcome says what happens next, which depends on the tool: with a
``reconcile`` hook it "is being checked with the system" (until the checks give up and it is
escalated); without one, or once escalated, "a person will check it", since nothing else will.
"""

from __future__ import annotations

__all__ = [
    "ToolResult",
    "is_correction",
    "reconcilable",
    "refusal_result",
    "render",
    "render_operation",
]

import json
from collections.abc import Mapping
from typing import Any

from pipecat_actions.actions import Binding
from pipecat_actions.ledger.records import Operation
from pipecat_actions.status import HAPPENED_STATUSES, TERMINAL_STATUSES, ActionStatus


class ToolResult(dict[str, Any]):
    """A call's answer: the dict the model reads, with typed accessors for the code around it.

    It is a ``dict`` so that Pipecat serialises it and every reader of the wire form keeps
    working; adapters read `status` as an `ActionStatus` (or `said` for the words beyond the
    status machine: ``refused``, ``not_started``, ``degraded``, ...) instead of comparing
    strings. `of` wraps any result a frame carries (an application's own dict included).
    """

    @classmethod
    def of(cls, value: Any) -> ToolResult:
        """``value`` as a `ToolResult` (itself when it is one; empty for a non-mapping)."""
        if isinstance(value, ToolResult):
            return value
        return cls(value) if isinstance(value, Mapping) else cls()

    @property
    def said(self) -> str | None:
        """The ``status`` word as the model reads it (lower case), if any."""
        word = self.get("status")
        return word if isinstance(word, str) else None

    @property
    def status(self) -> ActionStatus | None:
        """The operation status it tells; None for a word outside the status machine."""
        word = self.said
        if word is None:
            return None
        try:
            return ActionStatus(word.upper())
        except ValueError:
            return None

    @property
    def operation_id(self) -> str | None:
        """The operation it is about, if one exists."""
        value = self.get("operation_id")
        return value if isinstance(value, str) else None

    @property
    def message(self) -> str:
        """The plain-language words the model is told."""
        return str(self.get("message", ""))

    @property
    def refused(self) -> bool:
        """Whether admission refused the call (nothing was done)."""
        return self.said == "refused"

    @property
    def final(self) -> bool:
        """Whether it tells an outcome nothing will change (a terminal status)."""
        return self.status in TERMINAL_STATUSES

    def to_json(self) -> str:
        """The wire form (compact JSON, as the model receives it)."""
        return json.dumps(self, separators=(",", ":"), default=str)


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


_TOLD_IT_DID_NOT_HAPPEN = frozenset(
    {
        ActionStatus.FAILED_FINAL,
        ActionStatus.CANCELLED,
        ActionStatus.EXPIRED,
        ActionStatus.REJECTED,
    }
)
"""What the conversation may have been told before the system of record said otherwise."""

_UNKNOWN_FOR_A_PERSON = (
    "It is not yet known whether {tool} happened, and the system cannot tell; a person will "
    "check it. Do not say it succeeded or failed."
)
"""UNKNOWN when no reconcile hook will look (there is none, or it gave up: escalated)."""

_UNKNOWN_UNSAID = "It is not yet known whether {tool} happened. Do not say it succeeded or failed."
"""UNKNOWN when this process does not know whether anything will check it (tool not loaded)."""


def reconcilable(bindings: Mapping[str, Binding], tool: str) -> bool | None:
    """Whether an UNKNOWN operation of ``tool`` is checked by a reconcile hook here.

    None when ``tool`` is not registered in ``bindings`` (this process cannot say).
    """
    binding = bindings.get(tool)
    return None if binding is None else binding.action.reconcile is not None


def is_correction(op: Operation) -> bool:
    """Whether telling ``op`` now corrects what its conversation was told: it did happen."""
    return op.status in HAPPENED_STATUSES and op.delivered_status in _TOLD_IT_DID_NOT_HAPPEN


def render_operation(
    op: Operation, *, reconcilable: bool | None, note: str | None = None
) -> ToolResult:
    """Return the tool result that tells the model the truth about ``op``.

    Args:
        op: The operation.
        reconcilable: Whether its tool has a reconcile hook (`reconcilable`); None when that
            is not known here. An escalated operation is a person's to check either way.
        note: Said after the status's message.
    """
    result = render(
        op.status,
        tool=op.tool,
        operation_id=op.operation_id,
        value=op.result,
        error=op.error,
        note=note,
        reconcilable=False if op.escalated_at is not None else reconcilable,
    )
    if op.status is ActionStatus.AWAITING_CONFIRMATION:
        result["confirmation_token"] = op.args_hash[:12]
    if is_correction(op):
        told = op.delivered_status.value.lower() if op.delivered_status else ""
        result["correction"] = (
            f"The user was told earlier that {op.tool} did not happen ({told}); the system of "
            "record now reports that it did. Correct it plainly and apologise for the mix-up."
        )
        result["message"] = f"{result['message']} {result['correction']}"
    return result


def render(
    status: ActionStatus,
    *,
    tool: str,
    operation_id: str,
    value: Any = None,
    error: str | None = None,
    note: str | None = None,
    reconcilable: bool | None = None,
) -> ToolResult:
    """Return the tool result for an operation of ``tool`` in ``status``.

    ``reconcilable`` says who checks an UNKNOWN outcome: a reconcile hook (True), a person
    (False), or nothing is said about it (None: not known here).
    """
    reason = (error or "no reason given").rstrip(". ") + "."
    template = _MESSAGES[status]
    if status is ActionStatus.UNKNOWN and reconcilable is not True:
        template = _UNKNOWN_FOR_A_PERSON if reconcilable is False else _UNKNOWN_UNSAID
    message = template.format(tool=tool, error=reason)
    result = ToolResult(
        status=status.value.lower(),
        operation_id=operation_id,
        message=message if note is None else f"{message} {note}",
    )
    if status in (ActionStatus.COMMITTED, ActionStatus.COMPENSATED) and value is not None:
        result["result"] = value
    return result


def refusal_result(
    message: str, *, code: str, operation_id: str | None = None, **extra: Any
) -> ToolResult:
    """Return the tool result of a call refused before it could run."""
    result = ToolResult(status="refused", reason=code, message=message)
    if operation_id is not None:
        result["operation_id"] = operation_id
    result.update(extra)
    return result
