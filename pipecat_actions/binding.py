"""Binding the runtime to a Pipecat `LLMService`: one handler per action, and the tool schemas.

Pipecat has no pre-run hook for tool calls, so admission happens inside the handler the
runtime registers for each action. The handler never runs the effect itself: it proposes the
call to the runtime, which runs it in a task of its own, and waits (shielded) for the outcome.
When Pipecat cancels the handler (a barge-in on a blocking tool, Pipecat's ``timeout_secs``, or
an LLM ``cancel_<tool>`` call), only the waiting stops; the action's ``on_interruption`` policy
decides what happens to the business action.

`instrument` also wraps handlers the application registers itself (``register_function``,
``register_direct_function`` and direct functions listed in ``LLMContext(tools=...)``, which
Pipecat registers lazily on every inference), so they go through admission and the ledger too.
"""

from __future__ import annotations

__all__ = ["attach", "instrument", "tools_schema"]

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pipecat.adapters.llm.schemas.direct_function import DirectFunctionWrapper
from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
from pipecat.services.llm_service import FunctionCallParams, LLMService

from pipecat_actions.actions import ActionContext, ActionDefinition
from pipecat_actions.policy import ConfirmationMode, OnDuplicate
from pipecat_actions.session import SessionState

if TYPE_CHECKING:
    from pipecat_actions.runtime import ActionRuntime

CONFIRM_TOOL = "confirm_action"


def tools_schema(runtime: ActionRuntime) -> ToolsSchema:
    """Return the schemas of every registered action (and ``confirm_action`` when needed)."""
    tools = [
        FunctionSchema(
            name=binding.action.name,
            description=binding.action.description,
            **binding.action.json_schema(),
        )
        for binding in runtime.bindings.values()
    ]
    if _needs_confirm_tool(runtime):
        tools.append(
            FunctionSchema(
                name=CONFIRM_TOOL,
                description=(
                    "Carry out an operation the user has just confirmed out loud. Call it only "
                    "after the user said yes in a new reply, with the operation_id and "
                    "confirmation_token of the needs-confirmation result."
                ),
                properties={
                    "operation_id": {"type": "string"},
                    "confirmation_token": {"type": "string"},
                },
                required=["operation_id", "confirmation_token"],
            )
        )
    return ToolsSchema(standard_tools=tools)


def attach(runtime: ActionRuntime, llm: LLMService, session: SessionState) -> None:
    """Register a handler on ``llm`` for every action of ``runtime``, bound to ``session``."""
    for name, binding in runtime.bindings.items():
        llm.register_function(
            name,
            _handler(runtime, name, session),
            cancel_on_interruption=binding.policy.cancel_on_interruption,
            timeout_secs=binding.policy.timeout_secs,
        )
    if _needs_confirm_tool(runtime):

        async def confirm(params: FunctionCallParams) -> None:
            args = params.arguments
            result = await runtime.confirm(
                str(args.get("operation_id", "")), str(args.get("confirmation_token", "")), session
            )
            await params.result_callback(result)

        llm.register_function(CONFIRM_TOOL, confirm)


def _handler(runtime: ActionRuntime, name: str, session: SessionState) -> Callable[..., Any]:
    async def handler(params: FunctionCallParams) -> None:
        result = await runtime.propose(
            name, dict(params.arguments), session, tool_call_id=params.tool_call_id
        )
        await params.result_callback(result)

    handler.__name__ = f"pipecat_actions_{name}"
    return handler


def _needs_confirm_tool(runtime: ActionRuntime) -> bool:
    return any(
        b.policy.confirmation.mode is ConfirmationMode.VERBAL
        or b.policy.on_duplicate is OnDuplicate.CONFIRM
        for b in runtime.bindings.values()
    )


def instrument(runtime: ActionRuntime, llm: LLMService, session: SessionState) -> None:
    """Route handlers the application registers on ``llm`` through ``runtime``.

    Each wrapped handler becomes an action's effect: the call is admitted, recorded and run by
    the runtime, and the handler's result (what it passes to ``result_callback``) is the
    effect's result. The wrapper keeps ``@tool_options`` attributes and the signature-derived
    schema (``functools.wraps``). Handlers already registered are wrapped too.
    """
    original_register = llm.register_function
    original_direct = llm._register_direct_function

    def register_function(function_name: str | None, handler: Any, **options: Any) -> None:
        if function_name is not None and not _is_ours(handler):
            handler = _wrap_handler(runtime, function_name, handler, session)
        original_register(function_name, handler, **options)

    def register_direct(handler: Any, **options: Any) -> None:
        if not _is_ours(handler):
            handler = _wrap_direct(runtime, handler, session)
        original_direct(handler, **options)

    llm.register_function = register_function  # type: ignore[method-assign]
    llm._register_direct_function = register_direct  # type: ignore[method-assign]
    for name, item in list(llm._functions.items()):
        if name is None or _is_ours(item.handler):
            continue
        if isinstance(item.handler, DirectFunctionWrapper):
            register_direct(item.handler.function)
        else:
            original_register(
                name,
                _wrap_handler(runtime, name, item.handler, session),
                cancel_on_interruption=item.cancel_on_interruption,
                timeout_secs=item.timeout_secs,
                cancellable_by_llm=item.cancellable_by_llm,
            )


def _is_ours(handler: Any) -> bool:
    return bool(getattr(handler, "_pipecat_actions_wrapped", False))


def _wrap_handler(
    runtime: ActionRuntime, name: str, handler: Any, session: SessionState
) -> Callable[..., Any]:
    """Wrap a ``handler(params)``: its result becomes the result of an admitted operation."""
    if name not in runtime.bindings:
        runtime.register(_definition_for(name, handler))

    @functools.wraps(handler)
    async def wrapped(params: FunctionCallParams) -> None:
        result = await runtime.propose(
            name, dict(params.arguments), session, tool_call_id=params.tool_call_id
        )
        await params.result_callback(result)

    wrapped._pipecat_actions_wrapped = True  # type: ignore[attr-defined]
    return wrapped


def _definition_for(name: str, handler: Any) -> ActionDefinition:
    async def effect(ctx: ActionContext, **arguments: Any) -> Any:
        box: dict[str, Any] = {}

        async def capture(result: Any, *, properties: Any = None) -> None:
            if properties is None or getattr(properties, "is_final", True):
                box["result"] = result

        params = FunctionCallParams(
            function_name=name,
            tool_call_id=ctx.operation_id,
            arguments=arguments,
            llm=None,  # type: ignore[arg-type]
            pipeline_worker=None,  # type: ignore[arg-type]
            context=None,  # type: ignore[arg-type]
            result_callback=capture,
        )
        await handler(params)
        return box.get("result")

    return ActionDefinition(
        name=name,
        effect=effect,
        args_model=_open_model(name),
        description=getattr(handler, "__doc__", None) or name,
    )


def _wrap_direct(runtime: ActionRuntime, function: Any, session: SessionState) -> Any:
    wrapper = DirectFunctionWrapper(function)
    name = wrapper.name
    if name not in runtime.bindings:

        async def effect(ctx: ActionContext, **arguments: Any) -> Any:
            box: dict[str, Any] = {}

            async def capture(result: Any, *, properties: Any = None) -> None:
                box["result"] = result

            params = FunctionCallParams(
                function_name=name,
                tool_call_id=ctx.operation_id,
                arguments=arguments,
                llm=None,  # type: ignore[arg-type]
                pipeline_worker=None,  # type: ignore[arg-type]
                context=None,  # type: ignore[arg-type]
                result_callback=capture,
            )
            await function(params, **arguments)
            return box.get("result")

        runtime.register(
            ActionDefinition(name, effect, _open_model(name), wrapper.description or name)
        )

    @functools.wraps(function)
    async def wrapped(params: FunctionCallParams, **arguments: Any) -> None:
        result = await runtime.propose(name, arguments, session, tool_call_id=params.tool_call_id)
        await params.result_callback(result)

    wrapped._pipecat_actions_wrapped = True  # type: ignore[attr-defined]
    return wrapped


def _open_model(name: str) -> Any:
    from pydantic import BaseModel, ConfigDict

    class Arguments(BaseModel):
        model_config = ConfigDict(extra="allow", frozen=True)

    Arguments.__name__ = f"{name}_arguments"
    return Arguments
