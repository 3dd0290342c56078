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

__all__ = ["attach", "instrument", "owns_tool", "tools_schema"]

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pipecat.adapters.llm.schemas.direct_function import DirectFunctionWrapper
from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
from pipecat.frames.frames import TTSSpeakFrame
from pipecat.services.llm_service import FunctionCallParams, LLMService
from pydantic import BaseModel, ConfigDict, create_model

from pipecat_actions.actions import ActionContext, ActionDefinition
from pipecat_actions.policy import ConfirmationMode, ExecutionMode, OnDuplicate
from pipecat_actions.session import SessionState

if TYPE_CHECKING:
    from pipecat_actions.runtime import ActionRuntime

CONFIRM_TOOL = "confirm_action"


def owns_tool(runtime: ActionRuntime, tool: str) -> bool:
    """Whether calls of ``tool`` are the runtime's: a registered action, or ``confirm_action``."""
    return tool in runtime.bindings or tool == CONFIRM_TOOL


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

            async def announce(tool: str) -> None:
                # The confirmed background action starts now: its line is said, as when a
                # background action starts without a confirmation.
                line = _announcement(runtime, tool)
                if line:
                    await params.llm.push_frame(TTSSpeakFrame(line))

            result = await runtime.confirm(
                str(args.get("operation_id", "")),
                str(args.get("confirmation_token", "")),
                session,
                on_started=announce,
            )
            await params.result_callback(result)

        llm.register_function(CONFIRM_TOOL, confirm)


def _announcement(runtime: ActionRuntime, tool: str) -> str | None:
    """The ``announce`` line of a background ``tool``, if it has one."""
    binding = runtime.bindings.get(tool)
    policy = binding.policy if binding is not None else None
    return policy.announce if policy and policy.mode is ExecutionMode.BACKGROUND else None


def _handler(runtime: ActionRuntime, name: str, session: SessionState) -> Callable[..., Any]:
    announcement = _announcement(runtime, name)

    async def handler(params: FunctionCallParams) -> None:
        async def announce(_: str) -> None:
            # Said through the normal TTS path when a background action starts, so the user
            # does not fill the silence and ask again; the policy checks it claims no outcome.
            await params.llm.push_frame(TTSSpeakFrame(announcement or ""))

        result = await runtime.propose(
            name,
            dict(params.arguments),
            session,
            tool_call_id=params.tool_call_id,
            on_started=announce if announcement else None,
        )
        if announcement and result.get("status") == "awaiting_approval":
            # It waits for a person: the user hears the line too, and waits without asking
            # again (it claims no outcome; the approval's outcome is told later).
            await announce(str(result.get("operation_id", "")))
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
    the runtime, and what the handler passes to ``result_callback`` is the effect's result.
    Plain handlers are wrapped with ``functools.wraps`` (``@tool_options`` attributes and
    ``__wrapped__`` survive). Direct functions keep their own function object inside a
    `DirectFunctionWrapper` subclass, so Pipecat's per-inference sync of ``LLMContext`` tools
    sees an unchanged handler and does not re-register it. Handlers registered before the call
    are wrapped too. A tool without an entry in the policy raises `ConfigurationError` when it
    is registered.
    """
    original_register = llm.register_function
    original_direct = llm._register_direct_function

    def register_function(function_name: str | None, handler: Any, **options: Any) -> None:
        if function_name is not None and not _is_ours(handler):
            handler = _wrap_handler(runtime, function_name, handler, session)
        original_register(function_name, handler, **options)

    def register_direct(handler: Any, **options: Any) -> None:
        original_direct(handler, **options)
        _admit_direct(runtime, llm, handler, session)

    llm.register_function = register_function  # type: ignore[method-assign]
    llm._register_direct_function = register_direct  # type: ignore[method-assign]
    for name, item in list(llm._functions.items()):
        if name is None or _is_ours(item.handler):
            continue
        if isinstance(item.handler, DirectFunctionWrapper):
            _admit_direct(runtime, llm, item.handler.function, session)
        else:
            original_register(
                name,
                _wrap_handler(runtime, name, item.handler, session),
                cancel_on_interruption=item.cancel_on_interruption,
                timeout_secs=item.timeout_secs,
                cancellable_by_llm=item.cancellable_by_llm,
            )


def _is_ours(handler: Any) -> bool:
    return isinstance(handler, _AdmittedDirectFunction) or bool(
        getattr(handler, "_pipecat_actions_wrapped", False)
    )


def _wrap_handler(
    runtime: ActionRuntime, name: str, handler: Any, session: SessionState
) -> Callable[..., Any]:
    """Wrap a ``handler(params)``: its result becomes the result of an admitted operation."""
    if name not in runtime.bindings:

        async def call(ctx: ActionContext, arguments: dict[str, Any], capture: Any) -> None:
            await handler(_params(name, ctx, arguments, capture))

        runtime.register(_definition(name, call, getattr(handler, "__doc__", None)))

    @functools.wraps(handler)
    async def wrapped(params: FunctionCallParams) -> None:
        result = await runtime.propose(
            name, dict(params.arguments), session, tool_call_id=params.tool_call_id
        )
        await params.result_callback(result)

    wrapped._pipecat_actions_wrapped = True  # type: ignore[attr-defined]
    return wrapped


class _AdmittedDirectFunction(DirectFunctionWrapper):
    """A direct function whose calls go through the runtime; ``function`` stays the original."""

    def __init__(self, function: Any, runtime: ActionRuntime, session: SessionState) -> None:
        super().__init__(function)
        self._runtime = runtime
        self._session = session

    async def invoke(self, args: Any, params: FunctionCallParams) -> None:
        result = await self._runtime.propose(
            self.name, dict(args), self._session, tool_call_id=params.tool_call_id
        )
        await params.result_callback(result)


def _admit_direct(
    runtime: ActionRuntime, llm: LLMService, function: Any, session: SessionState
) -> None:
    admitted = _AdmittedDirectFunction(function, runtime, session)
    name = admitted.name
    if name not in runtime.bindings:

        async def call(ctx: ActionContext, arguments: dict[str, Any], capture: Any) -> None:
            await function(_params(name, ctx, arguments, capture), **arguments)

        runtime.register(_definition(name, call, admitted.description))
    llm._functions[name].handler = admitted


def _params(
    name: str, ctx: ActionContext, arguments: dict[str, Any], capture: Any
) -> FunctionCallParams:
    # The application's handler runs as the effect, outside Pipecat's call: it gets the
    # arguments and a result callback, not the LLM, the worker or the context.
    return FunctionCallParams(
        function_name=name,
        tool_call_id=ctx.operation_id,
        arguments=arguments,
        llm=None,  # type: ignore[arg-type]
        pipeline_worker=None,  # type: ignore[arg-type]
        context=None,  # type: ignore[arg-type]
        result_callback=capture,
    )


def _definition(name: str, call: Callable[..., Any], description: str | None) -> ActionDefinition:
    async def effect(ctx: ActionContext, **arguments: Any) -> Any:
        box: dict[str, Any] = {}

        async def capture(result: Any, *, properties: Any = None) -> None:
            if properties is None or getattr(properties, "is_final", True):
                box["result"] = result

        await call(ctx, arguments, capture)
        return box.get("result")

    return ActionDefinition(
        name=name, effect=effect, args_model=_open_model(name), description=description or name
    )


def _open_model(name: str) -> type[BaseModel]:
    # The application's handler validates its own arguments; the runtime still applies the
    # payload cap and records them.
    return create_model(f"{name}_arguments", __config__=ConfigDict(extra="allow", frozen=True))
