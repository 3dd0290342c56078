"""The routed-handler core: a handler the application (or Flows) registers becomes an effect.

Pipecat calls a handler the application registered; the call is proposed to the runtime's
port instead, and the handler runs as the effect of the admitted operation, in the runtime's
task. Two adapters route handlers so, and share this core: `instrument` (handlers registered
on the LLM: ``register_function``, ``register_direct_function`` and direct functions listed in
``LLMContext(tools=...)``, which Pipecat registers lazily on every inference) and
`pipecat_actions.adapters.flows.FlowActions` (a Flows node's functions). The core is:

* `CallBook`: the calls whose effect may still run, by the provider's ``tool_call_id``;
* `register_effect`: the action of a routed tool, (re)registered with the argument model of
  the handler that serves it now;
* `propose`: one call proposed through the port, its book entry dropped if the proposal fails;
* `open_model`: the argument model of a handler that reads its own arguments.
"""

from __future__ import annotations

__all__ = [
    "CallBook",
    "FunctionHooks",
    "instrument",
    "may_still_run",
    "open_model",
    "propose",
    "register_effect",
]

import asyncio
import dataclasses
import functools
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pipecat.adapters.llm.schemas.direct_function import DirectFunctionWrapper
from pipecat.frames.frames import FunctionCallResultProperties
from pipecat.services.llm_service import FunctionCallParams, LLMService
from pydantic import BaseModel

from pipecat_actions.actions import (
    ActionContext,
    ActionDefinition,
    Hook,
    open_arguments,
    running_as,
    signature_arguments,
)
from pipecat_actions.adapters._pipecat_private import llm_service
from pipecat_actions.adapters.handlers import _Lines, _register_cancel_tool
from pipecat_actions.errors import ConfigurationError
from pipecat_actions.results import ToolResult
from pipecat_actions.runtime.calls import PENDING_STATUSES
from pipecat_actions.session import SessionState, warn_if_untracked
from pipecat_actions.status import ActionStatus

if TYPE_CHECKING:
    from pipecat_actions.actions import Binding
    from pipecat_actions.runtime import ActionRuntime
    from pipecat_actions.runtime.calls import Calls, Started

C = TypeVar("C")


class CallBook(Generic[C]):
    """Routed calls whose effect may still run, by the provider's ``tool_call_id``.

    A call is kept until its effect ran or its answer says it never will (a refusal, an
    outcome); one whose waiting was cancelled stays, since its operation may start later.
    Bounded: past `LIMIT` the oldest go first (their effects then run the latest handler of
    their name).
    """

    LIMIT = 1024

    def __init__(self) -> None:
        self._calls: OrderedDict[str, C] = OrderedDict()

    def open(self, tool_call_id: str, call: C) -> C:
        """Keep ``call`` under ``tool_call_id``; forget the oldest past `LIMIT`."""
        self._calls[tool_call_id] = call
        while len(self._calls) > self.LIMIT:
            self._calls.popitem(last=False)
        return call

    def get(self, tool_call_id: str | None) -> C | None:
        """The call kept under ``tool_call_id``, if any."""
        return self._calls.get(tool_call_id or "")

    def pop(self, tool_call_id: str) -> None:
        """Forget the call of ``tool_call_id``."""
        self._calls.pop(tool_call_id, None)

    def forget(self, tool_call_id: str | None, call: C) -> None:
        """Forget ``call``, if it is still the one kept under ``tool_call_id``."""
        if tool_call_id is not None and self._calls.get(tool_call_id) is call:
            del self._calls[tool_call_id]

    def calls(self) -> list[C]:
        """The calls kept, oldest first."""
        return list(self._calls.values())


@dataclass(frozen=True)
class FunctionHooks:
    """The hooks of one routed function's action, as `pipecat_actions.action` takes them.

    A routed function's handler (a Flows function's, given to `FlowActions`) is its effect;
    these say what became of an operation whose answer was lost (``reconcile``), how to
    reverse it (``compensate``), its before-state (``snapshot``), how to ask the provider to
    stop (``cancel``, needed by ``on_interruption: request_cancel``) and domain checks
    (``preconditions``, raising `Refused`). Without ``reconcile``, an outcome that is unknown
    stays unknown and is escalated to a person.
    """

    reconcile: Hook | None = None
    compensate: Hook | None = None
    snapshot: Hook | None = None
    cancel: Hook | None = None
    preconditions: Hook | None = None


def may_still_run(result: ToolResult) -> bool:
    """Whether after ``result`` the call's effect may still run (its operation is not settled)."""
    return result.status in PENDING_STATUSES


@functools.cache
def open_model(name: str) -> type[BaseModel]:
    """The argument model of a ``handler(params)`` of this name (it reads its own arguments)."""
    return open_arguments(name)


def register_effect(
    calls: Calls,
    name: str,
    *,
    effect: Callable[[], Callable[..., Any]],
    args_model: type[BaseModel],
    description: str | None,
    ours: Callable[[Binding], bool],
    clash: str,
    hooks: FunctionHooks | None = None,
) -> bool:
    """Register (or keep) the action of routed tool ``name``, with ``args_model``.

    A handler registered again under the same name may take other arguments: the action
    keeps its effect and takes the new model. Returns whether a new action was registered.

    Args:
        calls: The runtime's port.
        name: The tool.
        effect: Makes the action's effect (called only for a new action).
        args_model: The argument model of the handler that serves the tool now.
        description: The tool's description (default: its name).
        ours: Whether an action already registered under ``name`` is this adapter's own.
        clash: The message of the error when it is not.
        hooks: The action's hooks (``reconcile``, ``compensate``, ...).

    Raises:
        ConfigurationError: ``name`` is an action the adapter did not register (``clash``).
    """
    binding = calls.bindings.get(name)
    if binding is not None:
        if not ours(binding):
            raise ConfigurationError(clash)
        if binding.action.args_model is not args_model:
            calls.register(dataclasses.replace(binding.action, args_model=args_model))
        return False
    hooks = hooks or FunctionHooks()
    calls.register(
        ActionDefinition(
            name=name,
            effect=effect(),
            args_model=args_model,
            description=description or name,
            reconcile=hooks.reconcile,
            compensate=hooks.compensate,
            snapshot=hooks.snapshot,
            cancel=hooks.cancel,
            preconditions=hooks.preconditions,
            app_handler=True,
        )
    )
    return True


async def propose(
    calls: Calls,
    book: CallBook[Any],
    name: str,
    arguments: Mapping[str, Any],
    session: SessionState,
    *,
    tool_call_id: str,
    on_started: Started | None = None,
) -> ToolResult:
    """Propose one routed call through the port and return its answer.

    A call whose waiting is cancelled stays in ``book`` (its operation may still start
    later, and its effect then runs the handler it came through); one whose proposal failed
    is dropped from it. A call in a session whose turns no tracker follows is warned about.
    """
    warn_if_untracked(session, f"a call of {name} arrived")
    try:
        return await calls.propose(
            name, dict(arguments), session, tool_call_id=tool_call_id, on_started=on_started
        )
    except asyncio.CancelledError:
        raise
    except BaseException:
        book.pop(tool_call_id)
        raise


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

    The effect runs the handler the call came through (a handler registered again under the
    same name serves the calls made after that), with the call's own ``llm``, ``context``,
    ``pipeline_worker`` and ``app_resources``. What it passes as ``properties`` with its final
    result (``run_llm``, ``on_context_updated``) goes with the call's result when the
    operation committed in that very call; a refusal, a join or an outcome the ledger holds
    otherwise is answered without them. An operation that runs without its call (recovered
    after a restart) gets the latest handler of its name, the ``llm`` given here, and a
    ``context`` and ``pipeline_worker`` that raise a clear error when read.
    """
    original_register = llm.register_function
    private = llm_service(llm)
    original_direct = private._register_direct_function
    calls = _Calls(llm)

    def register_function(function_name: str | None, handler: Any, **options: Any) -> None:
        routed = function_name is not None and not _is_ours(handler)
        if routed:
            assert function_name is not None
            handler = _wrap_handler(runtime, function_name, handler, session, calls)
            # The policy's cancellable_by_llm decides (cancel_<name>, the runtime's); an
            # explicit False also overrides a @tool_options value the wrapper carries.
            options["cancellable_by_llm"] = False
        original_register(function_name, handler, **options)
        if routed:
            assert function_name is not None
            _register_cancel_tool(runtime, llm, function_name, session)

    def register_direct(handler: Any, **options: Any) -> None:
        original_direct(handler, **options)
        _admit_direct(runtime, llm, handler, session, calls)

    llm.register_function = register_function  # type: ignore[method-assign]
    private._register_direct_function = register_direct
    # Pipecat's own cancel_<tool> handlers are not the application's: the runtime's replace
    # them below, as their tools are routed.
    builtin = set(private._cancel_tool_names)
    for name, item in list(private._functions.items()):
        if name is None or name in builtin or _is_ours(item.handler):
            continue
        if isinstance(item.handler, DirectFunctionWrapper):
            _admit_direct(runtime, llm, item.handler.function, session, calls)
        else:
            original_register(
                name,
                _wrap_handler(runtime, name, item.handler, session, calls),
                cancel_on_interruption=item.cancel_on_interruption,
                timeout_secs=item.timeout_secs,
                cancellable_by_llm=False,
            )
            _register_cancel_tool(runtime, llm, name, session)


def _is_ours(handler: Any) -> bool:
    return isinstance(handler, _AdmittedDirectFunction) or bool(
        getattr(handler, "_pipecat_actions_wrapped", False)
    )


_Invoke = Callable[[FunctionCallParams, dict[str, Any]], Awaitable[Any]]
"""How one handler is called as an effect: with its params and the call's arguments."""


@dataclass
class _Call:
    """One Pipecat call of an instrumented handler: what its effect runs, and what it gave."""

    invoke: _Invoke
    params: FunctionCallParams | None
    ran: bool = False
    properties: FunctionCallResultProperties | None = None


class _Calls(CallBook[_Call]):
    """The calls of instrumented handlers whose effect may still run (see `CallBook`)."""

    def __init__(self, llm: LLMService) -> None:
        super().__init__()
        self.llm = llm
        self.latest: dict[str, _Invoke] = {}

    def start(self, name: str, invoke: _Invoke, params: FunctionCallParams) -> _Call:
        """Keep a new call of ``name`` through ``invoke``."""
        self.latest[name] = invoke
        return self.open(params.tool_call_id, _Call(invoke, params))

    def close(self, tool_call_id: str, call: _Call, result: ToolResult) -> None:
        """``call`` was answered ``result``: kept only while its effect may still run."""
        if call.ran or not may_still_run(result):
            self.pop(tool_call_id)

    def take(self, name: str, ctx: ActionContext) -> _Call:
        """The call whose effect runs now; for an operation without one, the latest handler."""
        call = self.get(ctx.tool_call_id)
        if call is not None:
            return call
        return _Call(self.latest[name], None)

    def params(self, name: str, ctx: ActionContext, call: _Call, capture: Any) -> Any:
        arguments = dict(ctx.args)
        if call.params is not None:
            return dataclasses.replace(call.params, arguments=arguments, result_callback=capture)
        return FunctionCallParams(
            function_name=name,
            tool_call_id=ctx.tool_call_id or ctx.operation_id,
            arguments=arguments,
            llm=self.llm,
            pipeline_worker=_Unavailable(name, "pipeline_worker"),  # type: ignore[arg-type]
            context=_Unavailable(name, "context"),  # type: ignore[arg-type]
            result_callback=capture,
        )


class _Unavailable:
    """Stands in for what an effect run without its Pipecat call cannot have."""

    def __init__(self, tool: str, what: str) -> None:
        self._message = (
            f"params.{what} is not available to {tool}: this operation runs without the "
            "Pipecat call that proposed it (it was recovered or resumed after that call ended)"
        )

    def __getattr__(self, name: str) -> Any:
        raise RuntimeError(self._message)


def _effect(name: str, calls: _Calls) -> Callable[..., Any]:
    """The effect of an instrumented tool: the handler of the call it serves."""

    async def effect(ctx: ActionContext, **arguments: Any) -> Any:
        call = calls.take(name, ctx)
        box: dict[str, Any] = {}

        async def capture(result: Any, *, properties: Any = None) -> None:
            if properties is None or getattr(properties, "is_final", True):
                box["result"] = result
                call.properties = properties

        with running_as(ctx):
            await call.invoke(calls.params(name, ctx, call, capture), arguments)
        call.ran = True
        calls.forget(ctx.tool_call_id, call)  # kept no longer (its answer holds what it needs)
        return box.get("result")

    return effect


async def _answer(
    runtime: ActionRuntime,
    name: str,
    invoke: _Invoke,
    params: FunctionCallParams,
    session: SessionState,
    calls: _Calls,
) -> None:
    call = calls.start(name, invoke, params)
    # The application's handler says what it says; the runtime adds only the filler.
    lines = _Lines(runtime, name, session, params.llm, announce=False)
    try:
        result = await propose(
            runtime.calls,
            calls,
            name,
            params.arguments,
            session,
            tool_call_id=params.tool_call_id,
            on_started=lines.started if lines.needed else None,
        )
    finally:
        await lines.stop()  # before the result: a filler line never follows the outcome
    calls.close(params.tool_call_id, call, result)
    committed_here = (
        call.ran
        and result.status is ActionStatus.COMMITTED
        and result.operation_id == runtime.calls.operation_for(params.tool_call_id)
    )
    if committed_here and call.properties is not None:
        await params.result_callback(result, properties=call.properties)
    else:
        await params.result_callback(result)


def _register_effect(
    runtime: ActionRuntime,
    name: str,
    description: str | None,
    calls: _Calls,
    args_model: type[BaseModel],
) -> None:
    """Register (or keep) the action of an instrumented tool, with the model of its handler."""
    register_effect(
        runtime.calls,
        name,
        effect=lambda: _effect(name, calls),
        args_model=args_model,
        description=description,
        ours=lambda binding: binding.action.app_handler,
        clash=f"{name} is an @action of the runtime and also a handler registered on the "
        "LLM; give the handler another name or drop one of them",
    )


def _signature_model(function: Any, name: str) -> type[BaseModel]:
    """The argument model of a direct function, from its own signature.

    Pipecat calls a direct function as ``function(params=params, **arguments)``: a key it does
    not take, a missing one or one named ``params`` would fail that call (a ``TypeError`` once
    the operation is running, so its outcome unknown), and a value of another type would run.
    Validated against this model at admission, such a call is refused and nothing runs.
    """
    return signature_arguments(function, name)


def _wrap_handler(
    runtime: ActionRuntime, name: str, handler: Any, session: SessionState, calls: _Calls
) -> Callable[..., Any]:
    """Wrap a ``handler(params)``: its result becomes the result of an admitted operation."""

    async def invoke(params: FunctionCallParams, arguments: dict[str, Any]) -> Any:
        return await handler(params)

    _register_effect(runtime, name, getattr(handler, "__doc__", None), calls, open_model(name))
    calls.latest[name] = invoke

    @functools.wraps(handler)
    async def wrapped(params: FunctionCallParams) -> None:
        await _answer(runtime, name, invoke, params, session, calls)

    wrapped._pipecat_actions_wrapped = True  # type: ignore[attr-defined]
    return wrapped


class _AdmittedDirectFunction(DirectFunctionWrapper):
    """A direct function whose calls go through the runtime; ``function`` stays the original."""

    def __init__(
        self, function: Any, runtime: ActionRuntime, session: SessionState, calls: _Calls
    ) -> None:
        super().__init__(function)
        self._runtime = runtime
        self._session = session
        self._calls_book = calls

    async def call(self, params: FunctionCallParams, arguments: dict[str, Any]) -> Any:
        """Run the original function with the call's params (the effect)."""
        return await self.function(params, **arguments)

    async def invoke(self, args: Any, params: FunctionCallParams) -> None:
        await _answer(self._runtime, self.name, self.call, params, self._session, self._calls_book)


def _admit_direct(
    runtime: ActionRuntime, llm: LLMService, function: Any, session: SessionState, calls: _Calls
) -> None:
    admitted = _AdmittedDirectFunction(function, runtime, session, calls)
    model = _signature_model(function, admitted.name)
    _register_effect(runtime, admitted.name, admitted.description, calls, model)
    calls.latest[admitted.name] = admitted.call
    item = llm_service(llm)._functions[admitted.name]
    item.handler = admitted
    item.cancellable_by_llm = False  # the policy decides, through the runtime's cancel tool
    _register_cancel_tool(runtime, llm, admitted.name, session)
