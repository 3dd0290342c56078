"""Actions: the application's effects, with the hooks the runtime needs to keep them truthful.

An action is an async function that changes (or reads) the system of record. Its first
parameter is an `ActionContext`; the others are the tool's arguments, typed, and become both the
pydantic model that validates what the LLM sends and the tool schema the LLM sees. The
docstring's summary is the tool's description; a Google-style arguments section in it
describes each argument to the LLM::

    @action(reconcile=find_booking, compensate=cancel_booking_for, snapshot=None, cancel=None)
    async def book_table(ctx: ActionContext, restaurant_id: str, date: str, time: str,
                         party_size: int) -> dict[str, Any]:
        \"\"\"Book a table and return its booking reference.\"\"\"
        booking = await provider.book(..., idempotency_key=ctx.idempotency_key)
        return {"booking_id": booking.booking_id}

An effect that cannot work is refused by ``@action`` itself, in one line naming the action and
the parameter (see `pipecat_actions._arguments`).

Hooks, each optional:

* ``reconcile(ctx) -> Reconciliation``: ask the system of record what became of an operation
  whose outcome is unknown, by operation id or idempotency key.
* ``compensate(ctx) -> result``: reverse a committed operation, given its result and
  before-state; it runs as a new operation of its own.
* ``snapshot(ctx) -> before_state``: capture what the effect will change, before it runs.
* ``cancel(ctx) -> CancelOutcome``: ask the provider to stop an operation already sent.
* ``preconditions(ctx) -> None``: domain checks before admission; raise `Refused` to refuse.
"""

from __future__ import annotations

__all__ = [
    "ActionContext",
    "ActionDefinition",
    "Binding",
    "CancelOutcome",
    "Reconciliation",
    "Refused",
    "Reporter",
    "action",
    "action_context",
    "open_arguments",
    "running_as",
    "signature_arguments",
]

import inspect
import weakref
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, TypeVar, get_type_hints, overload

from loguru import logger
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PydanticUserError,
    TypeAdapter,
    create_model,
    model_validator,
)

from pipecat_actions._arguments import argument_schema, arguments_of
from pipecat_actions.errors import ConfigurationError, Refused
from pipecat_actions.ledger.records import Operation
from pipecat_actions.policy import ToolPolicy

Reporter = Callable[[str, Mapping[str, Any]], Awaitable[None]]
"""Where an effect's progress reports go: ``(message, details)``; see `ActionContext.report`."""


@dataclass(frozen=True, slots=True)
class ActionContext:
    """What an effect and its hooks know about the operation they serve.

    Attributes:
        operation_id: The ledger's id of the operation.
        idempotency_key: The key to send to a provider that deduplicates requests.
        tool: The tool name.
        args: The validated, normalised arguments.
        attempt: 1 for the first try, 2 for the first retry, ...
        session_id: The conversation the operation belongs to.
        principal: Who the operation acts for (the session's principal, never an LLM id).
        tenant: The tenant.
        deadline_at: When the operation must have an outcome (epoch seconds), if known.
        operation: The ledger record, for hooks that run on an existing operation.
        tool_call_id: The provider's id of the call that proposed it, if any (never a key:
            the same intent may come with another id).
        reporter: Where `report` sends progress; set by the runtime for a running effect
            (None in hooks, reads and contexts built by hand: `report` then does nothing).
    """

    operation_id: str
    idempotency_key: str
    tool: str
    args: Mapping[str, Any]
    attempt: int
    session_id: str
    principal: str
    tenant: str
    deadline_at: float | None = None
    operation: Operation | None = None
    tool_call_id: str | None = None
    reporter: Reporter | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, op: Operation, *, reporter: Reporter | None = None) -> ActionContext:
        """Return the context of ``op`` for its effect or a hook (``operation`` is ``op``)."""
        return cls(
            operation_id=op.operation_id,
            idempotency_key=op.idempotency_key,
            tool=op.tool,
            args=op.args,
            attempt=op.attempt,
            session_id=op.session_id,
            principal=op.principal,
            tenant=op.tenant,
            deadline_at=op.deadline_at,
            operation=op,
            tool_call_id=op.provider_call_id,
            reporter=reporter,
        )

    async def report(self, message: str, **details: Any) -> None:
        """Tell the conversation how the operation is getting on, before its outcome.

        For a long effect: ``await ctx.report("Found a table, confirming it", step=2)``. The
        report is written to the operation's audit trail, then told per the tool's
        ``delivery.intermediate`` (silent by default: the model knows, the bot does not
        speak). It is never told once the outcome is known, and it never fails the effect:
        a report that cannot be written or told is logged and dropped. ``details`` must be
        plain data (anything else is recorded as its text).
        """
        if self.reporter is None:
            return
        try:
            await self.reporter(str(message), details)
        except Exception as exc:  # progress must never turn an effect into a failure
            logger.bind(operation_id=self.operation_id).warning(
                "operation {}: progress report dropped: {}", self.operation_id, exc
            )


_RUNNING: ContextVar[ActionContext | None] = ContextVar("pipecat_actions_running", default=None)


def action_context() -> ActionContext:
    """The context of the operation whose effect runs now, for a handler the runtime routes.

    An `action` effect is given its `ActionContext`; a handler routed through the runtime by
    ``instrument`` or `pipecat_actions.adapters.flows.FlowActions` has the signature Pipecat or
    Flows gives it, and reads it here: ``action_context().idempotency_key`` is the key to send
    to a provider that deduplicates requests.

    Raises:
        RuntimeError: Not inside such a handler's run (e.g. called from Pipecat directly).
    """
    ctx = _RUNNING.get()
    if ctx is None:
        raise RuntimeError(
            "action_context() is only known while the runtime runs a routed handler as an "
            "operation's effect (pipecat_actions.instrument, FlowActions)"
        )
    return ctx


@contextmanager
def running_as(ctx: ActionContext) -> Iterator[None]:
    """Make ``ctx`` what `action_context` returns while a routed handler runs (for adapters)."""
    token = _RUNNING.set(ctx)
    try:
        yield
    finally:
        _RUNNING.reset(token)


class ReconcileState(StrEnum):
    """What the system of record says about an operation."""

    COMMITTED = "committed"
    NOT_FOUND = "not_found"
    PENDING = "pending"


@dataclass(frozen=True, slots=True)
class Reconciliation:
    """The answer of a ``reconcile`` hook.

    Use the constructors: `Reconciliation.committed(result)`, `Reconciliation.not_found()`,
    `Reconciliation.pending()`.
    """

    state: ReconcileState
    result: Any = None

    @classmethod
    def committed(cls, result: Any) -> Reconciliation:
        """The system of record has the operation; ``result`` is what the effect would return."""
        return cls(ReconcileState.COMMITTED, result)

    @classmethod
    def not_found(cls) -> Reconciliation:
        """The system of record has no trace of the operation: it did not happen."""
        return cls(ReconcileState.NOT_FOUND)

    @classmethod
    def pending(cls) -> Reconciliation:
        """The system of record is still working on it, or cannot say yet."""
        return cls(ReconcileState.PENDING)


class CancelOutcome(StrEnum):
    """The answer of a ``cancel`` hook."""

    CANCELLED = "cancelled"
    """The provider confirms nothing happened and nothing will."""
    TOO_LATE = "too_late"
    """The provider had already done it."""
    UNKNOWN = "unknown"
    """The provider cannot say."""


Effect = Callable[..., Awaitable[Any]]
Hook = Callable[[ActionContext], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class ActionDefinition:
    """An effect with its hooks and its argument model; build it with `action`.

    ``app_handler`` is True for an action whose handler Pipecat calls is the application's
    own, routed through the runtime (`pipecat_actions.instrument`,
    `pipecat_actions.adapters.flows`):
    `pipecat_actions.attach` registers no handler for it and `pipecat_actions.tools_schema`
    leaves it out, since the application (or Flows) registers and advertises it.
    ``parameter_descriptions`` are what the tool schema says of each argument whose field
    has no description of its own (`action` reads them from the docstring's ``Args:``).
    """

    name: str
    effect: Effect
    args_model: type[BaseModel]
    description: str
    reconcile: Hook | None = None
    compensate: Hook | None = None
    snapshot: Hook | None = None
    cancel: Hook | None = None
    preconditions: Hook | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    app_handler: bool = False
    parameter_descriptions: Mapping[str, str] = field(default_factory=dict)

    async def run(self, ctx: ActionContext) -> Any:
        """Call the effect with the context and the validated arguments."""
        return await self.effect(ctx, **ctx.args)

    def json_schema(self) -> dict[str, Any]:
        """Return the JSON schema of the arguments (``properties`` and ``required``).

        Self-contained: a nested model or an enum is written out where it is used (a tool
        schema has no ``$defs``).
        """
        return argument_schema(self.args_model, self.parameter_descriptions)


@dataclass(frozen=True)
class Binding:
    """An action together with its policy."""

    action: ActionDefinition
    policy: ToolPolicy


_F = TypeVar("_F", bound=Effect)


@overload
def action(
    fn: Effect,
    *,
    name: str | None = None,
    description: str | None = None,
    reconcile: Hook | None = None,
    compensate: Hook | None = None,
    snapshot: Hook | None = None,
    cancel: Hook | None = None,
    preconditions: Hook | None = None,
) -> ActionDefinition: ...


@overload
def action(
    fn: None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    reconcile: Hook | None = None,
    compensate: Hook | None = None,
    snapshot: Hook | None = None,
    cancel: Hook | None = None,
    preconditions: Hook | None = None,
) -> Callable[[Effect], ActionDefinition]: ...


def action(
    fn: Effect | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    reconcile: Hook | None = None,
    compensate: Hook | None = None,
    snapshot: Hook | None = None,
    cancel: Hook | None = None,
    preconditions: Hook | None = None,
) -> ActionDefinition | Callable[[Effect], ActionDefinition]:
    """Turn an async effect into an `ActionDefinition` (usable bare or with options).

    Args:
        fn: The effect, when used as ``@action`` without parentheses.
        name: The tool name; defaults to the function's name.
        description: What the LLM is told the tool does; defaults to the docstring's summary
            (without its ``Args:``, ``Returns:`` and ``Raises:`` sections, whose ``Args:``
            lines describe the parameters instead).
        reconcile: See the module docstring; the same for the other hooks.
        compensate: Reverses a committed operation.
        snapshot: Captures the before-state.
        cancel: Asks the provider to cancel an operation already sent.
        preconditions: Domain checks before admission.

    Raises:
        ConfigurationError: The effect is not an ``async`` function, or has no name (a
            ``functools.partial``) and none is given; its first parameter cannot take the
            `ActionContext` (it is annotated as a tool argument, or missing); or a parameter
            has no type annotation, one the argument validator cannot handle or describe
            to the LLM, or a default that is not a value of its type. One line, naming the
            action and the parameter.
    """

    def build(effect: Effect) -> ActionDefinition:
        given = name or getattr(effect, "__name__", None)
        if not callable(effect):
            raise ConfigurationError(
                f"action: @action takes an async function, not {type(effect).__name__}"
            )
        if not isinstance(given, str) or not given:
            raise ConfigurationError(
                f"action: the effect ({type(effect).__name__}) has no name of its own; "
                "give the tool one: action(effect, name=...)"
            )
        tool = given
        arguments = arguments_of(effect, tool, context=ActionContext)
        return ActionDefinition(
            name=tool,
            effect=effect,
            args_model=arguments.model,
            description=description or arguments.summary or tool,
            parameter_descriptions=arguments.descriptions,
            reconcile=reconcile,
            compensate=compensate,
            snapshot=snapshot,
            cancel=cancel,
            preconditions=preconditions,
        )

    return build(fn) if fn is not None else build


def open_arguments(name: str) -> type[BaseModel]:
    """The argument model of an application's handler that takes ``params`` only.

    Such a handler (``register_function``, a Flows handler) reads ``params.arguments`` and
    validates them itself; the runtime still reads them as JSON data under the payload cap
    (finite numbers, text keys) and records them.
    """
    return create_model(f"{name}_arguments", __config__=ConfigDict(extra="allow", frozen=True))


class _SignatureArguments(BaseModel):
    """The model of a handler that takes ``**kwargs``: unknown keys pass, with exceptions.

    A key that names a parameter the call cannot fill by keyword (the ``params`` the handler
    is given, a positional-only one) is refused.
    """

    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False)
    reserved: ClassVar[frozenset[str]] = frozenset()

    @model_validator(mode="before")
    @classmethod
    def _refuse_reserved(cls, data: Any) -> Any:
        if isinstance(data, Mapping):
            taken = sorted(cls.reserved.intersection(data))
            if taken:
                raise ValueError(f"{taken[0]} is not an argument of this tool")
        return data


def signature_arguments(function: Callable[..., Any], name: str) -> type[BaseModel]:
    """The argument model of a handler whose arguments are its own parameters.

    A Pipecat direct function (``async def add_note(params: FunctionCallParams, text: str)``)
    is called with the call's ``params`` and each argument as a keyword; a Flows one with its
    ``flow_manager`` first. Its model has one
    field per parameter after the first, with the parameter's annotation (``Any`` without one,
    or when pydantic cannot check the type) and default: an unknown key, a missing one, one
    named like the first parameter, or a value of the wrong type is refused before anything
    runs. With ``**kwargs`` unknown keys are accepted, except the first parameter's name.

    Args:
        function: The handler; its first parameter is the one Pipecat fills (``params``,
            ``flow_manager``). A wrapper made with ``functools.wraps`` is read as the function
            it wraps.
        name: The tool name, for the model's name.

    Returns:
        The model; validating with it gives the keyword arguments the handler accepts.
    """
    known = _SIGNATURE_MODELS.get(function, {}).get(name)
    if known is not None:
        return known
    own = inspect.unwrap(function)  # a wrapper made with functools.wraps: the function's own
    parameters = list(inspect.signature(own).parameters.values())
    try:
        hints = get_type_hints(own)
    except Exception:  # an annotation that names what cannot be found: checked as Any
        hints = {}
    fields: dict[str, Any] = {}
    reserved = {parameters[0].name} if parameters else set()
    extra = False
    for index, parameter in enumerate(parameters[1:]):
        if parameter.kind is parameter.VAR_KEYWORD:
            extra = True
        elif parameter.kind is parameter.POSITIONAL_ONLY:
            reserved.add(parameter.name)
        elif parameter.kind is not parameter.VAR_POSITIONAL:
            hint = _checkable(hints.get(parameter.name, Any))
            fields.update(_field(index, parameter, hint))
    model: type[BaseModel]
    if extra:
        open_model: type[_SignatureArguments] = create_model(
            f"{name}_arguments", __base__=_SignatureArguments, **fields
        )
        open_model.reserved = frozenset(reserved)
        model = open_model
    else:
        model = create_model(
            f"{name}_arguments",
            __config__=ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False),
            **fields,
        )
    _SIGNATURE_MODELS.setdefault(function, {})[name] = model
    return model


_SIGNATURE_MODELS: weakref.WeakKeyDictionary[Any, dict[str, type[BaseModel]]] = (
    weakref.WeakKeyDictionary()
)
"""The models `signature_arguments` made, by function: Pipecat registers a context's direct
functions again on every inference."""


def _checkable(hint: Any) -> Any:
    """``hint`` if pydantic can validate it, else ``Any`` (the handler takes what it is given)."""
    try:
        TypeAdapter(hint)
    except (PydanticUserError, TypeError, ValueError, NameError):
        return Any
    return hint


def _field(index: int, parameter: inspect.Parameter, hint: Any) -> dict[str, Any]:
    """The model field of one parameter, under its own name where pydantic allows it.

    pydantic keeps names starting with ``_`` as private attributes and refuses or shadows its
    own (``model_dump``, ``json``): such a parameter is a field under another name, with its
    own as the alias (validated and dumped by alias).
    """
    default = ... if parameter.default is parameter.empty else parameter.default
    if parameter.name.startswith(("_", "model_")) or hasattr(BaseModel, parameter.name):
        return {f"argument_{index}": (hint, Field(default, alias=parameter.name))}
    return {parameter.name: (hint, default)}
