"""`ModelCancels`: the model asks to stop an operation (``cancel_<tool>``) and is told the truth.

Pipecat's own ``cancel_<tool>`` cancels the handler's coroutine and answers
``{"cancelled": <call>}``, whatever became of the work. Here the request goes through the same
cancellation as a barge-in under ``on_interruption: request_cancel`` (`Decisions.cancel`),
with the model recorded as the one who asked, and the answer is what the ledger then says:

* nothing sent yet (admitted, waiting for its turn, between two attempts): ``cancelled``,
  nothing happened; waiting for a person: withdrawn (``rejected``), nothing happened;
* sent: ``cancel_requested`` once that is written; the action's ``cancel`` hook asks the system
  of record in a task of the runtime, and the outcome follows as any late outcome does (the
  model must not say it was cancelled before that). Without a ``cancel`` hook it goes on, and
  the answer says so;
* already committed: the cancel came too late; the answer says it happened and, only when the
  tool names a ``compensation.tool``, that the user may be asked whether to undo it with it;
* not known (UNKNOWN) or already ended: said as it is.

A tool whose policy does not set ``cancellable_by_llm`` is refused, and the refusal says the
action goes on. Every request is in the operation's audit trail, the model as its actor
(``model:<session>``): in the transition it caused, or as an annotation when it changed
nothing.
"""

from __future__ import annotations

__all__ = ["ModelCancels", "model_actor"]

import asyncio
from collections.abc import Mapping
from typing import Any

from loguru import logger

from pipecat_actions.actions import Binding
from pipecat_actions.errors import PipecatActionsError
from pipecat_actions.ledger import Ledger, Operation, OperationFilter
from pipecat_actions.policy.fields import cancel_tool_name
from pipecat_actions.results import refusal_result, render_operation
from pipecat_actions.runtime._operations import Operations
from pipecat_actions.runtime.decisions import Decisions
from pipecat_actions.session import SessionState
from pipecat_actions.status import (
    AWAITING_PERSON_STATUSES,
    IN_FLIGHT_STATUSES,
    TERMINAL_STATUSES,
    ActionStatus,
)

S = ActionStatus

_PENDING = frozenset(IN_FLIGHT_STATUSES | AWAITING_PERSON_STATUSES | {S.UNKNOWN})
"""An operation in one of these may still be stopped, or is not settled: a cancel's target."""
_CANCELLING = frozenset({S.CANCELLED, S.REJECTED, S.CANCEL_REQUESTED})
"""What a cancel request moves an operation to (`Decisions.cancel`)."""
_LISTED = 10
"""How many pending operations a refusal asking "which one?" lists."""


def model_actor(session: SessionState) -> str:
    """Who is recorded as asking when the model of ``session`` asks to cancel."""
    return f"model:{session.session_id}"


class ModelCancels:
    """Answers the model's ``cancel_<tool>`` calls (see the module docstring).

    Args:
        ledger: Where the session's operations are read and the requests recorded.
        bindings: The registered actions and their policies, by tool name.
        operations: The operations this process runs (and which call became which).
        decisions: The cancellation shared with barge-ins.
    """

    def __init__(
        self,
        *,
        ledger: Ledger,
        bindings: Mapping[str, Binding],
        operations: Operations,
        decisions: Decisions,
    ) -> None:
        self._ledger = ledger
        self._bindings = bindings
        self._operations = operations
        self._decisions = decisions

    async def cancel(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        session: SessionState,
        *,
        tool_call_id: str | None = None,
    ) -> dict[str, Any]:
        """Answer the model's request to stop a call of ``tool``; see the module docstring.

        The work runs in a task of the runtime: a barge-in that stops the caller never leaves
        a cancel half recorded.
        """
        work = self._operations.spawn(self._cancel(tool, arguments, session, tool_call_id))
        return await asyncio.shield(work)

    async def _cancel(
        self,
        tool: str,
        arguments: Mapping[str, Any],
        session: SessionState,
        tool_call_id: str | None,
    ) -> dict[str, Any]:
        binding = self._bindings.get(tool)
        if binding is None or not binding.policy.is_mutation:
            return refusal_result(
                f"There is no action {tool} that can be cancelled; nothing was changed.",
                code="unknown_tool",
            )
        found = await self._target(tool, arguments, session)
        op = found if not isinstance(found, dict) else None
        actor = model_actor(session)
        asked: dict[str, Any] = {"requested_by": "model", "cancel_tool": cancel_tool_name(tool)}
        if tool_call_id:
            asked["tool_call_id"] = tool_call_id
        if op is not None and tool_call_id:
            # A barge-in on this call is closed with this operation's real state.
            self._operations.note_call(tool_call_id, op.operation_id)
        if not binding.policy.cancellable_by_llm:
            return await self._refused(tool, op, actor, asked)
        if op is None:
            assert isinstance(found, dict)
            return found
        with logger.contextualize(session_id=session.session_id, operation_id=op.operation_id):
            return await self._decide(op, binding, actor, asked)

    async def _refused(
        self, tool: str, op: Operation | None, actor: str, asked: dict[str, Any]
    ) -> dict[str, Any]:
        """The refusal of a tool whose policy does not let the model cancel it."""
        extra: dict[str, Any] = {}
        still = ""
        if op is not None:
            await self._note(op, actor, {**asked, "answer": "refused: not cancellable_by_llm"})
            extra["existing_operation_id"] = op.operation_id
            if op.status not in TERMINAL_STATUSES:
                still = " It goes on; its outcome will be told."
        return refusal_result(
            f"{tool} cannot be cancelled at the assistant's request: its policy does not allow "
            f"it, so nothing was cancelled.{still} Do not tell the user it was cancelled.",
            code="cancel_not_allowed",
            **extra,
        )

    async def _decide(
        self, op: Operation, binding: Binding, actor: str, asked: dict[str, Any]
    ) -> dict[str, Any]:
        before = op.status
        after = op
        if before not in TERMINAL_STATUSES:
            after = await self._decisions.cancel(
                op.operation_id,
                reason="the model asked to cancel it",
                actor=actor,
                detail=asked,
                wait_for_provider=False,
            )
        if after.status is not before and after.status in _CANCELLING:
            return _moved(after, binding.action.reconcile is not None)  # who asked: recorded
        answer, note = _unmoved(
            after, binding, here=self._operations.get(op.operation_id) is not None
        )
        await self._note(after, actor, {**asked, "answer": answer})
        result = render_operation(
            after, reconcilable=binding.action.reconcile is not None, note=note
        )
        result["cancel"] = answer
        undo = _undo_tool(binding)
        if answer == "too_late" and undo:
            result["undo_tool"] = undo
        return result

    async def _target(
        self, tool: str, arguments: Mapping[str, Any], session: SessionState
    ) -> Operation | dict[str, Any]:
        """The operation of ``session`` the request is about, or the refusal that says why not.

        Named by ``operation_id`` or ``tool_call_id``; else the one pending; else the latest
        (an operation that already ended is answered as it is).
        """
        named = arguments.get("operation_id") or None
        call = arguments.get("tool_call_id") or None
        if call is not None and named is None:
            named = self._operations.operation_for_call(str(call))
            if named is None:
                return _no_such(tool)
        if named is not None:
            try:
                op = await self._ledger.get(str(named))
            except PipecatActionsError:
                return _no_such(tool)
            if op.session_id != session.session_id or op.tool != tool:
                return _no_such(tool)
            return op
        history = await self._ledger.list(
            OperationFilter(session_id=session.session_id, tool=tool, newest_first=True, limit=50)
        )
        history = [op for op in history if op.compensates is None]
        pending = [op for op in history if op.status in _PENDING]
        if len(pending) == 1:
            return pending[0]
        if pending:
            listed = [
                {
                    "operation_id": op.operation_id,
                    "status": op.status.value.lower(),
                    "arguments": op.args,
                }
                for op in pending[:_LISTED]
            ]
            return refusal_result(
                f"{len(pending)} {tool} requests are pending; nothing was cancelled. Call "
                f"{cancel_tool_name(tool)} again with the operation_id of the one the user "
                "wants to stop.",
                code="which_one",
                pending=listed,
            )
        ended = [op for op in history if op.status is not S.REJECTED]
        if ended:
            return ended[0]
        return refusal_result(
            f"There is no {tool} request in this conversation to cancel; nothing was changed.",
            code="nothing_to_cancel",
        )

    async def _note(self, op: Operation, actor: str, detail: dict[str, Any]) -> None:
        """Record a request that changed nothing in ``op``'s trail (a failed write is logged)."""
        try:
            await self._ledger.annotate(op.operation_id, actor=actor, detail=detail)
        except Exception as exc:  # the answer is still the truth; the trail lacks a line
            logger.warning("cancel request on {} not recorded: {}", op.operation_id, exc)


def _moved(after: Operation, reconcilable: bool | None) -> dict[str, Any]:
    """The answer when the request moved the operation (the ledger recorded who asked)."""
    if after.status is S.CANCELLED:
        result = render_operation(after, reconcilable=reconcilable)
        result["cancel"] = "cancelled"
    elif after.status is S.REJECTED:
        result = render_operation(
            after,
            reconcilable=reconcilable,
            note="It was withdrawn before it started; nothing happened.",
        )
        result["cancel"] = "withdrawn"
    else:
        result = render_operation(
            after,
            reconcilable=reconcilable,
            note="The system is being asked to stop it; the outcome will be told. Do not say "
            "it was cancelled until then.",
        )
        result["cancel"] = "requested"
    return result


def _unmoved(op: Operation, binding: Binding, *, here: bool) -> tuple[str, str]:
    """What the answer says about an operation the request did not move: (answer, note)."""
    status = op.status
    if status is S.COMMITTED:
        undo = _undo_tool(binding)
        offer = (
            f"Ask the user whether to undo it with {undo}; do not undo it unasked."
            if undo
            else "It cannot be undone from here: tell the user it stands."
        )
        return "too_late", f"Cancelling it was asked for, but it had already happened. {offer}"
    if status is S.CANCEL_REQUESTED:
        return (
            "already_requested",
            "Stopping it was already requested; the outcome will be told. Do not say it was "
            "cancelled until then.",
        )
    if status is S.UNKNOWN:
        return (
            "not_known",
            "It cannot be cancelled now: it may already have happened. Do not say it was "
            "cancelled.",
        )
    if status in TERMINAL_STATUSES:
        return "already_ended", "It had already ended; there is nothing to cancel."
    where = (
        "It is handled elsewhere and could not be stopped from here"
        if not here
        else ("It was already sent and cannot be stopped")
    )
    return (
        "not_possible",
        f"{where}; the outcome will be told. Do not say it was cancelled.",
    )


def _undo_tool(binding: Binding) -> str | None:
    compensation = binding.policy.compensation
    return compensation.tool if compensation is not None else None


def _no_such(tool: str) -> dict[str, Any]:
    return refusal_result(
        f"No {tool} request of this conversation has that id; nothing was cancelled.",
        code="no_such_request",
    )
