"""Pipecat Flows functions through admission and the ledger, with transitions on the truth.

Flows (``pipecat.flows``) wraps each function of a node in a "transition function" that runs
the handler and answers Pipecat with ``FunctionCallResultProperties``: an edge function's
answer carries ``run_llm=False`` and the ``on_context_updated`` callback that moves the
conversation to the next node. `FlowActions` keeps that machinery and puts the runtime inside
it: the handler runs as the effect of an admitted, recorded operation, and what Flows (and the
model) get back is the runtime's truthful result (``status``: ``committed``, ``refused``,
``awaiting_approval``, ``unknown``, ``running``, ...), so a flow branches on what really
happened::

    config = FlowConfig.from_file("flow.yaml")
    runtime = await ActionRuntime.create(policy, routed=flow_functions(config), ...)
    actions = FlowActions(runtime, session)
    flow = actions.flow(config, handlers=tools)  # a configured flow
    pipeline, gate = build_pipeline(..., context_aggregator=pair)
    worker = PipelineWorker(pipeline)
    flow_manager = FlowManager(worker=worker, llm=llm, context_aggregator=pair,
                               global_functions=flow.global_functions)
    actions.attach(flow_manager, gate)
    await flow_manager.initialize(flow.initial_node)

A flow built in Python (``NodeConfig`` dicts with ``FlowsFunctionSchema`` handlers or direct
functions) needs only `FlowActions.attach`.

What holds:

* **Each node's own handler.** Flows builds a fresh transition function per node; each call
  runs the handler of the node it was made in, even when two nodes reuse a function name.
* **Policy governs.** Every function needs a policy entry (or is named in ``unmanaged``, or is
  a config's ``transition_only`` function, which runs no code: an entry for one is ignored,
  with a warning); its ``mode`` and
  ``timeout_secs`` replace Flows' call options (``mode: blocking`` is Pipecat's
  ``cancel_on_interruption=True``). The runtime is told the managed names when it is created
  (``routed=``; `flow_functions` reads them from a config), since Flows registers each
  function only when its node is set.
* **Transitions on the truth.** A ``transition_to: {field: pipecat_actions_status, cases:
  {...}}`` branch (`STATUS_FIELD`) is evaluated on the runtime's status. A committed result
  also shows the handler's own fields to the branch, as the handler returned them, so
  branches on them keep working, ``status`` included (``field: status, cases: {booked:
  ...}``); where the handler's result has no ``status``, ``status`` is the runtime's too.
  An unconditional ``transition_to`` (or a Python handler's next node, also for a repeated
  call that joined the operation) is followed only when the operation committed; otherwise
  the node stays and the bot tells the truth.
* **What a handler needs.** `pipecat_actions.action_context` gives the running handler its
  operation's `ActionContext` (``idempotency_key`` for a provider that deduplicates);
  ``flow_manager.state[STATE_KEY][function]`` holds the runtime's latest result of each
  function, for the prompts of the nodes it leads to.
* **Late outcomes.** An outcome that comes after its call was answered (a barge-in, a
  background action, an approval, an unknown reconciled) is told in the node active when it
  arrives; when the conversation is still in the node the call was made in (or the node its
  earlier status led to), the same branch decides a transition then: the telling goes into the
  context silently and the new node speaks. ``delivery.late: silent`` never transitions.
"""

from __future__ import annotations

__all__ = ["STATE_KEY", "STATUS_FIELD", "FlowActions", "FunctionHooks", "flow_functions"]

import dataclasses
import functools
import inspect
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loguru import logger
from pipecat.adapters.llm.schemas.direct_function import tool_options
from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
from pipecat.flows import (
    NO_RESPONSE,
    TRANSITION_IN_YAML,
    Flow,
    FlowConfig,
    FlowsFunctionSchema,
    NodeConfig,
)
from pipecat.flows.config import case_key
from pipecat.flows.types import FlowsDirectFunctionWrapper
from pipecat.frames.frames import FunctionCallResultProperties
from pydantic import BaseModel

from pipecat_actions._recent import remember
from pipecat_actions.actions import (
    ActionContext,
    running_as,
    signature_arguments,
)
from pipecat_actions.adapters._pipecat_private import flow_manager as _private
from pipecat_actions.adapters.routed import (
    CallBook,
    FunctionHooks,
    open_model,
    propose,
    register_effect,
)
from pipecat_actions.errors import ConfigurationError
from pipecat_actions.execution.outcomes import EffectNotSent
from pipecat_actions.results import ToolResult
from pipecat_actions.runtime.calls import RoutedNames
from pipecat_actions.status import TERMINAL_STATUSES, ActionStatus

if TYPE_CHECKING:
    from pipecat.flows import FlowManager
    from pipecat.services.llm_service import FunctionCallParams

    from pipecat_actions.adapters.result_gate import ActionResultGate
    from pipecat_actions.ledger import Operation
    from pipecat_actions.runtime import ActionRuntime
    from pipecat_actions.session import SessionState

STATUS_FIELD = "pipecat_actions_status"
"""The field a ``transition_to`` branch reads the runtime's status from (``committed``,
``refused``, ``unknown``, ...). A branch on ``status`` reads the same, unless the handler's own
committed result has a ``status`` of its own (``booked``): that one is the handler's, kept as
it returned it, as are all its fields."""

STATE_KEY = "pipecat_actions"
"""``flow_manager.state[STATE_KEY][function]`` holds the runtime's latest result of each managed
function (status, operation_id, message, and a committed handler's result), set before any
transition it decides: a node's prompt may say ``{{ pipecat_actions.book_table.result.booking_id
}}`` even when the outcome became known only by reconciliation, after the handler's own state
writes were lost with its answer."""

_Run = Callable[[dict[str, Any]], Awaitable[Any]]
"""One node's handler, called with a call's arguments (the effect runs it)."""


@dataclass
class _FlowCall:
    """One Pipecat call of a Flows function, from its transition function to its outcome."""

    name: str
    tool_call_id: str
    arguments: dict[str, Any]
    node: str | None
    """The node the call was made in; then the node its outcome led to."""
    ref: FlowConfig.Function | None = None
    """Its entry in a configured flow (None: a flow built in Python)."""
    run: _Run | None = None
    ran: bool = False
    next_node: Any = None
    """What the handler returned as its next node, once it ran."""
    result: dict[str, Any] | None = None
    """The runtime's answer, as the model is given it."""
    speak: bool = False
    """The node stays and the bot tells the truth (a transition Flows would make is not)."""
    decided: str | None = None
    """The status a transition was last decided on (each status decides once)."""
    operation_id: str | None = None
    """The operation it was admitted as (or joined), once known."""


@dataclass
class _Configured:
    ref: FlowConfig.Function
    node: str | None


class _Namespace(Mapping[str, Any]):
    """A configured flow's handler namespace, its tools admitted (see `FlowActions.flow`)."""

    def __init__(
        self,
        inner: Any,
        admit: Callable[[str, Callable[..., Any]], Callable[..., Any]],
        tools: frozenset[str],
    ) -> None:
        self._inner = inner
        self._admit = admit
        self._tools = tools
        name = getattr(inner, "__name__", None)
        self.__name__ = name if isinstance(name, str) else "handlers"  # in Flow's messages

    def __getitem__(self, name: str) -> Any:
        if isinstance(self._inner, Mapping):
            target = self._inner.get(name)
        else:
            target = getattr(self._inner, name, None)
        if target is None:
            raise KeyError(name)
        return self._admit(name, target) if name in self._tools and callable(target) else target

    def __iter__(self) -> Iterator[str]:
        return iter(self._inner) if isinstance(self._inner, Mapping) else iter(())

    def __len__(self) -> int:
        return len(self._inner) if isinstance(self._inner, Mapping) else 0


_CURRENT: ContextVar[_FlowCall | None] = ContextVar("pipecat_actions_flow_call", default=None)


def flow_functions(config: FlowConfig, *, unmanaged: Iterable[str] = ()) -> RoutedNames:
    """The functions of ``config`` `FlowActions` routes, for ``ActionRuntime.create(routed=...)``.

    Every function of its nodes and its global functions, in order and once each, but its
    ``transition_only`` ones and those named in ``unmanaged`` (as given to `FlowActions`). The
    ``transition_only`` ones ride along (`RoutedNames.transition_only`): a policy entry for one
    of them is ignored with a warning rather than refused.
    """
    left_out = frozenset(unmanaged)
    functions = [*config.global_functions] + [
        f for node in config.nodes.values() for f in node.functions
    ]
    names = (f.name for f in functions if not f.transition_only and f.name not in left_out)
    passive = {f.name for f in functions if f.transition_only}
    return RoutedNames(dict.fromkeys(names), transition_only=passive)


class FlowActions:
    """Routes a Flows conversation's functions through ``runtime`` for ``session``.

    Args:
        runtime: The action runtime (its policy has an entry for every managed function, and
            it was created with those names in ``routed``: see `flow_functions`).
        session: The conversation's session state.
        unmanaged: Functions left to Flows as they are (no admission, no ledger), e.g. ones
            that only move the conversation or remember what the user said. A config's
            ``transition_only`` functions are unmanaged without being named.
        hooks: The hooks of managed functions, by function name.
    """

    LIMIT = CallBook.LIMIT
    """Calls kept for their outcome at most (the oldest go first)."""

    def __init__(
        self,
        runtime: ActionRuntime,
        session: SessionState,
        *,
        unmanaged: Iterable[str] = (),
        hooks: Mapping[str, FunctionHooks] | None = None,
    ) -> None:
        self._port = runtime.calls
        self._session = session
        self._unmanaged = frozenset(unmanaged)
        self._hooks = dict(hooks or {})
        both = sorted(self._unmanaged & self._hooks.keys())
        if both:
            raise ConfigurationError(
                f"flow functions both unmanaged and given hooks: {', '.join(both)}"
            )
        self._manager: FlowManager | None = None
        self._flow: Flow | None = None
        self._configured: dict[int, _Configured] = {}
        self._admitted: dict[tuple[str, int], Callable[..., Any]] = {}
        self._calls: CallBook[_FlowCall] = CallBook()
        self._latest: dict[str, _Run] = {}
        self._ran: OrderedDict[str, Any] = OrderedDict()
        """The next node each operation's handler returned, by operation id."""
        self._names: set[str] = set()
        self._models: dict[str, type[BaseModel]] = {}
        """The argument model of each configured direct function, from its signature."""

    # --- wiring ----------------------------------------------------------------------------

    def flow(self, config: FlowConfig, *, handlers: Any) -> Flow:
        """Build a configured `Flow` whose tools run through the runtime.

        Args:
            config: The flow config.
            handlers: As for ``Flow(config, handlers=...)``: a mapping, a module or object, or
                a list of them.

        Raises:
            ConfigurationError: A tool of the config has no policy entry (and is not
                ``unmanaged``); every such tool is named.
        """
        functions = [(None, f) for f in config.global_functions] + [
            (name, f) for name, node in config.nodes.items() for f in node.functions
        ]
        tools = frozenset(
            f.name for _, f in functions if not f.transition_only and f.name not in self._unmanaged
        )
        strays = sorted(set(self._hooks) - tools)
        if strays:
            raise ConfigurationError(
                f"hooks given for names that are no managed function of the flow: "
                f"{', '.join(strays)}"
            )
        missing = sorted(name for name in tools if self._port.policy.get(name) is None)
        if missing:
            raise ConfigurationError(
                f"flow functions without an entry in the policy {self._port.policy.source}: "
                f"{', '.join(missing)}; add an entry for each, or name it in "
                "FlowActions(unmanaged=...)"
            )
        namespaces = list(handlers) if isinstance(handlers, (list, tuple)) else [handlers]
        flow = Flow(
            config,
            handlers=[_Namespace(namespace, self._admit_direct, tools) for namespace in namespaces],
        )
        for node_name, node in config.nodes.items():
            refs = {f.name: f for f in node.functions}
            for schema in flow.node(node_name).get("functions", []):
                if isinstance(schema, FlowsFunctionSchema) and schema.name in refs:
                    self._configured[id(schema.handler)] = _Configured(refs[schema.name], node_name)
        global_refs = {f.name: f for f in config.global_functions}
        for schema in flow.global_functions:
            if isinstance(schema, FlowsFunctionSchema) and schema.name in global_refs:
                self._configured[id(schema.handler)] = _Configured(global_refs[schema.name], None)
        self._flow = flow
        return flow

    def attach(self, flow_manager: FlowManager, gate: ActionResultGate) -> None:
        """Route ``flow_manager``'s functions through the runtime; call before ``initialize``.

        Args:
            flow_manager: The conversation's `FlowManager`.
            gate: The pipeline's `ActionResultGate` (late outcomes of the flow's operations
                are told through it, and decide transitions).

        Raises:
            ConfigurationError: The manager already started (its first node's functions
                would not be routed), or another `FlowActions` holds it.
        """
        if flow_manager.current_node is not None:
            raise ConfigurationError(
                "FlowActions.attach must come before FlowManager.initialize: the first "
                f"node ({flow_manager.current_node}) was set up without admission"
            )
        if getattr(flow_manager, "_pipecat_actions", None) is not None:
            raise ConfigurationError("this FlowManager is already attached to a FlowActions")
        flow_manager._pipecat_actions = self  # type: ignore[attr-defined]
        self._manager = flow_manager
        original = _private(flow_manager)._create_function_schema

        async def create_function_schema(
            tool: FlowsFunctionSchema | FlowsDirectFunctionWrapper,
        ) -> FunctionSchema:
            return await self._function_schema(original, tool)

        _private(flow_manager)._create_function_schema = create_function_schema
        gate.delivery.then(self._after)

    # --- each node's functions -------------------------------------------------------------

    async def _function_schema(
        self,
        original: Callable[[Any], Awaitable[FunctionSchema]],
        tool: FlowsFunctionSchema | FlowsDirectFunctionWrapper,
    ) -> FunctionSchema:
        """The schema Flows advertises for ``tool`` in the node being set, routed if managed."""
        name = tool.name
        handler = tool if isinstance(tool, FlowsDirectFunctionWrapper) else tool.handler
        configured = self._configured.get(id(handler))
        if name in self._unmanaged or (configured is not None and configured.ref.transition_only):
            return await original(tool)
        policy = self._port.policy.get(name)
        if policy is None:
            raise ConfigurationError(
                f"flow function {name} has no entry in the policy {self._port.policy.source}; "
                "add one, or name it in FlowActions(unmanaged=...)"
            )
        if isinstance(tool, FlowsDirectFunctionWrapper):
            model = signature_arguments(tool.function, name)
        elif configured is not None and name in self._models:
            model = self._models[name]
        else:
            model = open_model(name)  # a handler(args, flow_manager) reads its own arguments
        self._register(name, tool.to_function_schema().description, model)
        if configured is None:
            tool = self._admitted_tool(tool)  # a flow built in Python: its handler is the effect
        schema = await original(tool)
        transition = schema.handler
        assert transition is not None  # Flows' transition function

        @functools.wraps(transition)
        async def routed(params: FunctionCallParams) -> None:
            call = self._open(name, params, configured.ref if configured else None)
            token = _CURRENT.set(call)
            try:
                answer = self._answering(call, params.result_callback)
                await transition(dataclasses.replace(params, result_callback=answer))  # type: ignore[arg-type]
            finally:
                _CURRENT.reset(token)

        # The policy's call options, not Flows' (whose default never cancels on a barge-in);
        # a cancel by the model is the runtime's cancel_<tool>, never Pipecat's own.
        tool_options(
            routed,
            cancel_on_interruption=policy.cancel_on_interruption,
            timeout_secs=policy.timeout_secs,
            cancellable_by_llm=False,
        )
        routed._pipecat_actions_wrapped = True  # type: ignore[attr-defined]
        return FunctionSchema(
            name=schema.name,
            description=schema.description,
            properties=schema.properties,
            required=schema.required,
            handler=routed,
        )

    def _register(self, name: str, description: str, args_model: type[BaseModel]) -> None:
        """Register the action of ``name``, with the argument model of the node being set.

        A direct function's model is its signature: a call that does not fit it (an unknown
        key, a missing one, a wrong type) is refused before its handler could fail on it. A
        name reused by another node's handler takes that handler's model.
        """
        registered = register_effect(
            self._port,
            name,
            effect=lambda: self._effect(name),
            args_model=args_model,
            description=description,
            ours=lambda _: name in self._names,
            clash=f"flow function {name} has the name of an action the runtime already has; "
            "rename one of them",
            hooks=self._hooks.get(name),
        )
        if registered:
            self._names.add(name)

    def _admitted_tool(
        self, tool: FlowsFunctionSchema | FlowsDirectFunctionWrapper
    ) -> FlowsFunctionSchema:
        """``tool`` of a flow built in Python, with a handler that proposes its calls."""
        if isinstance(tool, FlowsDirectFunctionWrapper):

            async def run_direct(arguments: dict[str, Any], manager: FlowManager) -> Any:
                return await tool.invoke(arguments, manager)

            run = run_direct
        else:
            handler = tool.handler

            async def run_handler(arguments: dict[str, Any], manager: FlowManager) -> Any:
                return await _call_handler(handler, arguments, manager)

            run = run_handler

        async def admitted(args: dict[str, Any], flow_manager: FlowManager) -> Any:
            call = self._current(tool.name)
            call.run = functools.partial(run, manager=flow_manager)
            result = await self._propose(call)
            if _kept_to_itself(call, result):
                return _view(result), NO_RESPONSE  # the handler's own: stay, no bot turn
            # None: the node stays, and Flows has the bot tell the truth.
            return _view(result), self._leads_on(call, result)

        base = tool.to_function_schema()
        return FlowsFunctionSchema(
            name=tool.name,
            description=base.description,
            properties=base.properties,
            required=base.required,
            handler=admitted,
            cancel_on_interruption=tool.cancel_on_interruption,
            timeout_secs=tool.timeout_secs,
        )

    def _admit_direct(self, name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        """A configured flow's tool ``function``, its calls proposed to the runtime."""
        known = self._admitted.get((name, id(function)))
        if known is not None:
            return known  # one callable reachable through two namespaces stays one tool
        self._models[name] = signature_arguments(function, name)

        @functools.wraps(function)
        async def admitted(flow_manager: FlowManager, **arguments: Any) -> Any:
            call = self._current(name)

            async def run(args: dict[str, Any]) -> Any:
                return await function(flow_manager=flow_manager, **args)

            call.run = run
            result = await self._propose(call)
            if _kept_to_itself(call, result):
                return _view(result), NO_RESPONSE  # the handler's own: stay, no bot turn
            if self._leads_on(call, result) is None:
                call.speak = True  # whatever Flows would do, the node stays; the bot speaks
                return _view(result), NO_RESPONSE
            return _view(result), TRANSITION_IN_YAML  # Flows' branch, on the runtime's result

        self._admitted[(name, id(function))] = admitted  # a callable may serve several names
        return admitted

    # --- one call --------------------------------------------------------------------------

    def _open(
        self, name: str, params: FunctionCallParams, ref: FlowConfig.Function | None
    ) -> _FlowCall:
        manager = self._manager
        call = _FlowCall(
            name=name,
            tool_call_id=params.tool_call_id,
            arguments=dict(params.arguments),
            node=manager.current_node if manager is not None else None,
            ref=ref,
        )
        return self._calls.open(params.tool_call_id, call)

    def _current(self, name: str) -> _FlowCall:
        call = _CURRENT.get()
        if call is None or call.name != name:
            raise ConfigurationError(
                f"flow function {name} was called outside a FlowManager that FlowActions "
                "routes: call FlowActions.attach(flow_manager, gate) before initialize"
            )
        return call

    async def _propose(self, call: _FlowCall) -> dict[str, Any]:
        assert call.run is not None
        self._latest[call.name] = call.run
        # Cancelled, the call is closed by the gate; its outcome may still decide (`_after`).
        result = await propose(
            self._port,
            self._calls,
            call.name,
            call.arguments,
            self._session,
            tool_call_id=call.tool_call_id,
        )
        call.result = result
        call.operation_id = result.operation_id
        self._remember(call, result)
        if result.final or result.refused:
            self._settled(call)
        return result

    def _settled(self, call: _FlowCall) -> None:
        """Nothing more comes for ``call``, nor for the other calls of its operation."""
        self._calls.pop(call.tool_call_id)
        if call.operation_id is not None:
            for other in [c for c in self._calls.calls() if c.operation_id == call.operation_id]:
                self._calls.pop(other.tool_call_id)

    def _answering(
        self, call: _FlowCall, callback: Callable[..., Awaitable[None]]
    ) -> Callable[..., Awaitable[None]]:
        """Pipecat's result callback for ``call``: the runtime's answer, with Flows' properties."""

        async def answer(result: Any, *, properties: Any = None) -> None:
            if call.result is not None:
                result = call.result  # what the model is told is the runtime's answer
            manager = self._manager
            if properties is not None and properties.on_context_updated is not None:
                # An edge: Flows moves on once the result is in the context.
                properties = dataclasses.replace(
                    properties,
                    on_context_updated=self._following(call, properties.on_context_updated),
                )
            elif manager is not None and _private(manager)._pending_transition is not None:
                # Another call's transition waits for this call to finish: it goes now (its
                # node speaks), or it would wait for ever.
                properties = FunctionCallResultProperties(
                    run_llm=False,
                    on_context_updated=_private(manager)._check_and_execute_transition,
                )
            elif call.speak:
                properties = FunctionCallResultProperties(run_llm=True)
            await callback(result, properties=properties)

        return answer

    def _following(
        self, call: _FlowCall, transition: Callable[[], Awaitable[None]]
    ) -> Callable[[], Awaitable[None]]:
        async def updated() -> None:
            await transition()
            if self._manager is not None:
                call.node = self._manager.current_node  # a later outcome goes on from there

        return updated

    def _effect(self, name: str) -> Callable[..., Awaitable[Any]]:
        """The effect of a flow function: the handler of the node its call was made in."""

        async def effect(ctx: ActionContext, **arguments: Any) -> Any:
            call = self._calls.get(ctx.tool_call_id)
            run = call.run if call is not None and call.run is not None else self._latest.get(name)
            if run is None:
                raise EffectNotSent(f"{name} has no Flows handler in this process")
            with running_as(ctx):  # action_context() for the handler (its idempotency key)
                response = await run(dict(arguments))
            result, next_node = (
                response if isinstance(response, tuple) and len(response) == 2 else (response, None)
            )
            if call is not None:
                call.ran, call.next_node = True, next_node
                call.operation_id = ctx.operation_id
            # A repeated call that joins this operation goes where its handler said.
            remember(self._ran, ctx.operation_id, next_node, keep=self.LIMIT)
            return result

        return effect

    # --- transitions -----------------------------------------------------------------------

    def _destination(self, call: _FlowCall, result: Mapping[str, Any]) -> NodeConfig | None:
        """The node ``result`` leads to from ``call``'s function, or None (the node stays)."""
        committed = ToolResult.of(result).status is ActionStatus.COMMITTED
        if call.ref is None:  # a flow built in Python: the handler's next node, once it ran
            if not committed:
                return None
            ran = call.next_node if call.ran else self._ran.get(str(result.get("operation_id")))
            return ran if isinstance(ran, dict) else None  # type: ignore[return-value]
        target = call.ref.transition_to
        if target is None or self._flow is None:
            return None
        if isinstance(target, str):
            return self._flow.node(target) if committed else None
        view = _view(result)
        if target.field not in view:
            return None  # branches on a field of the handler's own result: it did not commit
        value = case_key(view[target.field])
        rejected = ToolResult.of(result).status is ActionStatus.REJECTED
        runtimes = rejected and target.field in ("status", STATUS_FIELD)
        if runtimes and value == "rejected" and value not in target.cases:
            # A person's rejection is a refusal that came late: a ``refused:`` case catches it
            # unless the flow has a ``rejected:`` case of its own.
            value = "refused"
        node = target.cases.get(value, target.default)
        return self._flow.node(node) if node is not None else None

    def _remember(self, call: _FlowCall, result: Mapping[str, Any]) -> None:
        """Keep the latest truth of ``call``'s function in the flow's state (see `STATE_KEY`)."""
        if self._manager is not None:
            outcomes = self._manager.state.setdefault(STATE_KEY, {})
            if isinstance(outcomes, dict):
                outcomes[call.name] = dict(result)

    def _leads_on(self, call: _FlowCall, result: Mapping[str, Any]) -> NodeConfig | None:
        """Where ``result`` takes the conversation from ``call``, or None (it stays).

        Only from the node the call was made in (or the node its earlier status led to), once
        per status, and never over a transition another call has asked for meanwhile (Flows
        holds that one until every call is done).
        """
        manager = self._manager
        status = str(result.get("status"))
        if manager is None or manager.current_node != call.node or call.decided == status:
            return None
        if _private(manager)._pending_transition is not None:
            return None
        destination = self._destination(call, result)
        if destination is not None:
            call.decided = status
        return destination

    def _after(self, op: Operation) -> Callable[[], Awaitable[None]] | None:
        """What follows telling ``op`` (a `NextStep` of the gate's delivery)."""
        call = self._calls.get(op.provider_call_id)
        manager = self._manager
        if call is None or manager is None:
            return None
        if op.status in TERMINAL_STATUSES:
            call.operation_id = op.operation_id
            self._settled(call)
        result = self._port.told(op)
        self._remember(call, result)
        if _private(manager)._pending_transition is not None:
            # Another call's transition waited for this one (closed by a barge-in, or told
            # late): it goes now, or it would wait for ever.
            transition: Callable[[], Awaitable[None]] = _private(
                manager
            )._check_and_execute_transition
            return transition
        destination = self._leads_on(call, result)
        if destination is None:
            return None  # told in the node the conversation is in, which stays
        node, status = call.node, call.decided

        async def step() -> None:
            # Decided when the telling began; the telling took a while (a ledger write): only
            # if the conversation is still where it was, and nothing else asked to move on.
            if manager.current_node != node or _private(manager)._pending_transition is not None:
                logger.debug("{}: {} no longer leads on from {}", call.name, status, node)
                return
            # Flows' own way: the transition waits for calls still in progress.
            _private(manager)._pending_transition = {
                "next_node": destination,
                "function_name": call.name,
                "arguments": call.arguments,
                "result": result,
            }
            await _private(manager)._check_and_execute_transition()
            call.node = manager.current_node

        logger.bind(session_id=self._session.session_id, operation_id=op.operation_id).debug(
            "{} {}: {} leads on from node {}", call.name, op.operation_id, op.status, call.node
        )
        return step


def _kept_to_itself(call: _FlowCall, result: Mapping[str, Any]) -> bool:
    """Whether the handler, run in this call and committed, asked for no bot turn."""
    committed = ToolResult.of(result).status is ActionStatus.COMMITTED
    return committed and call.ran and call.next_node is NO_RESPONSE


def _view(result: Mapping[str, Any]) -> dict[str, Any]:
    """What a branch sees: the runtime's result, a committed handler's own fields over it.

    The handler's own fields are kept as it returned them (its ``status: booked`` stays
    ``booked``); the runtime's status is always under `STATUS_FIELD` as well.
    """
    view = dict(result)
    own = result.get("result")
    if ToolResult.of(result).status is ActionStatus.COMMITTED and isinstance(own, Mapping):
        view.update({str(key): value for key, value in own.items()})
    view.setdefault(STATUS_FIELD, result.get("status"))
    return view


async def _call_handler(handler: Any, arguments: dict[str, Any], manager: FlowManager) -> Any:
    """Call a Flows handler as Flows does: ``(args, flow_manager)``, ``(args)`` or ``()``."""
    count = len(inspect.signature(handler).parameters)
    if count == 0:
        return await handler()
    if count == 1:
        return await handler(arguments)
    return await handler(arguments, manager)
