"""What closes a call of the runtime's that Pipecat cancelled, instead of its ``"CANCELLED"``.

Shared by the cascade gate (which replaces the cancel before the assistant aggregator) and the
realtime adapters (which replace it at the service, before the provider is told): both close
the call with the operation's real state, never a bare cancellation.
"""

from __future__ import annotations

__all__ = ["closing_frame", "closing_result", "stopped_result", "truthful_close"]

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from pipecat.frames.frames import (
    FunctionCallCancelFrame,
    FunctionCallResultFrame,
    FunctionCallResultProperties,
)

from pipecat_actions.results import render, render_operation
from pipecat_actions.status import TERMINAL_STATUSES, ActionStatus

if TYPE_CHECKING:
    from pipecat_actions.ledger import Operation
    from pipecat_actions.runtime import ActionRuntime
    from pipecat_actions.runtime.deliveries import SessionDelivery


def closing_frame(
    cancel: FunctionCallCancelFrame,
    result: Any,
    *,
    then: Callable[[], Awaitable[None]] | None = None,
) -> FunctionCallResultFrame:
    """The result frame that closes a call Pipecat cancelled, in place of its ``CANCELLED``.

    After a barge-in, no inference (the user's turn drives the next one). After Pipecat's
    timeout (the only cancel with ``run_llm`` set), the aggregator's own rule decides:
    inference once every call proposed together is done, never one per call of the group.
    ``then``: what follows once the result is in the context (a Flows transition, which makes
    the bot speak in its new node); no inference of its own then.
    """
    run_llm = None if cancel.run_llm and then is None else False
    return FunctionCallResultFrame(
        function_name=cancel.function_name,
        tool_call_id=cancel.tool_call_id,
        arguments={},
        result=result,
        run_llm=run_llm,
        properties=FunctionCallResultProperties(run_llm=run_llm, on_context_updated=then),
    )


async def closing_result(
    delivery: SessionDelivery, cancel: FunctionCallCancelFrame, operation_id: str
) -> tuple[dict[str, Any], Operation | None]:
    """The operation's real state as the result of its cancelled call, and the record read.

    Not knowing (the ledger cannot be read) is no reason to say CANCELLED either: the action
    was not stopped, and its outcome is told when it comes (the result says UNKNOWN, which the
    delivery service treats as still to be told).
    """
    op = await delivery.current(operation_id)
    # Pipecat sets run_llm on a cancel only when the call ran past its own timeout.
    waited = (
        "It is taking longer than the wait allows"
        if cancel.run_llm
        else "The user interrupted the wait"
    )
    if op is None:
        result = render(
            ActionStatus.UNKNOWN,
            tool=cancel.function_name,
            operation_id=operation_id,
            reconcilable=delivery.reconcilable(cancel.function_name),
            note=f"{waited}; the action was not stopped. Its record could not be read just "
            "now; its outcome will be told here. Do not say it is done or that it failed.",
        )
        return result, None
    terminal = op.status in TERMINAL_STATUSES
    note = None if terminal else f"{waited}; the action was not stopped."
    return render_operation(op, reconcilable=delivery.reconcilable(op.tool), note=note), op


def stopped_result(runtime: ActionRuntime, cancel: FunctionCallCancelFrame) -> dict[str, Any]:
    """The result of a call of the runtime's that Pipecat stopped with no operation behind."""
    if runtime.deliveries.is_read(cancel.function_name):
        return {
            "status": "cancelled",
            "message": f"{cancel.function_name} was stopped before it answered; nothing was "
            "changed. Ask again if it is still needed.",
        }
    return {
        "status": "not_started",
        "message": f"{cancel.function_name} was stopped while it was being checked, "
        "before it started; nothing was done. Ask again if it is still wanted.",
    }


async def truthful_close(
    runtime: ActionRuntime,
    delivery: SessionDelivery,
    cancel: FunctionCallCancelFrame,
    operation_id: str | None,
) -> tuple[dict[str, Any], str | None, Operation | None]:
    """What closes ``cancel``'s call: the result, its operation (None: none), the record read.

    The one place the cascade gate and the realtime adapters decide it. ``operation_id``: the
    operation the call is known to be about, or None while admission may still be under way:
    admission runs on to its end, and what it made of the call (an operation that goes on, or
    none) closes it. With no operation behind the call (a read, stopped with its handler, or a
    call stopped before it was admitted), the result says it was stopped.
    """
    if operation_id is None:
        operation_id = await runtime.admitted_as(cancel.tool_call_id)
    if operation_id is None:
        return stopped_result(runtime, cancel), None, None
    result, op = await closing_result(delivery, cancel, operation_id)
    return result, operation_id, op
