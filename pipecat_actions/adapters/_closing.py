"""The frame that closes a call of the runtime's that Pipecat cancelled, instead of ``CANCELLED``.

Shared by the cascade gate (which replaces the cancel before the assistant aggregator) and the
realtime adapters (which replace it at the service, before the provider is told): both close
the call with the operation's real state, which the runtime's port decides
(`pipecat_actions.runtime.calls.Calls.close_cancelled`), never a bare cancellation.
"""

from __future__ import annotations

__all__ = ["closing_frame"]

from collections.abc import Awaitable, Callable
from typing import Any

from pipecat.frames.frames import (
    FunctionCallCancelFrame,
    FunctionCallResultFrame,
    FunctionCallResultProperties,
)


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
