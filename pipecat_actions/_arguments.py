"""An action's arguments, read from its effect: the model that validates them, what the LLM sees.

Everything here runs when ``@action`` runs, so an effect that cannot work is refused there, in
one line that names the action (and the parameter), never first at ``tools_schema()``, at the
provider, or when the first call arrives:

* The first parameter receives the `ActionContext`: a positional parameter, unannotated or
  annotated with a type an `ActionContext` is (``ctx: ActionContext``). An effect whose first
  parameter is one of the tool's arguments (``city: str``) is refused, since that argument
  would receive the context and the LLM would be offered one argument too few.
* Every other parameter is a plain named one whose type annotation pydantic can validate and
  describe in JSON schema (``Annotated[int, Field(ge=1)]`` keeps its constraints). A nested
  model or an enum is described inline: the tool schema has no ``$defs`` for its ``$ref`` to
  point into; a type that refers to itself cannot be described so, and is refused. A
  default must be a value of the parameter's type. A parameter named as pydantic keeps names
  for itself (``_ref``, ``model_config``) is a field under another name with its own as the
  alias, so it is offered, validated and passed like any other.
* The docstring's summary (its first line and the paragraphs after it, without the ``Args:``,
  ``Returns:`` and ``Raises:`` sections) is the tool's description, and each ``Args:`` line the
  description of its parameter, as Pipecat's direct functions read them (``docstring_parser``).
  A pydantic ``Field(description=...)`` on a parameter wins over its ``Args:`` line.
"""

from __future__ import annotations

__all__ = ["Arguments", "argument_schema", "arguments_of"]

import inspect
import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, get_type_hints

import docstring_parser
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, create_model
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from pipecat_actions.errors import ConfigurationError

_CONFIG = ConfigDict(extra="forbid", str_strip_whitespace=True, frozen=True, allow_inf_nan=False)
"""What an action's arguments allow: no unknown keys, no NaN or infinity, stripped strings."""

_REF_PREFIX = "#/$defs/"


@dataclass(frozen=True)
class Arguments:
    """What `arguments_of` read from an effect.

    Attributes:
        model: Validates the LLM's arguments (unknown keys, wrong types, NaN are refused).
        summary: The docstring's summary, the tool's description unless one is given.
        descriptions: Each parameter's ``Args:`` line, by parameter name.
    """

    model: type[BaseModel]
    summary: str | None
    descriptions: Mapping[str, str]


def arguments_of(effect: Callable[..., Any], name: str, *, context: type[Any]) -> Arguments:
    """Read the arguments of the action ``name`` from ``effect`` (see the module docstring).

    Args:
        effect: The effect; its first parameter receives an instance of ``context``.
        name: The tool name, for messages.
        context: The context class (`ActionContext`).

    Raises:
        ConfigurationError: The effect is not async, its first parameter cannot receive the
            context, or a parameter cannot be validated or described; one line.
    """
    if not inspect.iscoroutinefunction(effect):
        raise ConfigurationError(f"action {name}: the effect must be an async function")
    try:
        parameters = list(inspect.signature(effect).parameters.values())
    except (TypeError, ValueError) as exc:
        raise ConfigurationError(
            f"action {name}: the effect's parameters cannot be read: {_first_line(exc)}"
        ) from None
    if not parameters:
        raise ConfigurationError(
            f"action {name}: the effect takes no parameters; its first parameter receives the "
            f"{context.__name__} (ctx: {context.__name__})"
        )
    _check_context(effect, name, parameters[0], context)
    docstring = _parse_docstring(effect)
    fields: dict[str, Any] = {}
    for parameter in parameters[1:]:
        if parameter.kind not in (parameter.POSITIONAL_OR_KEYWORD, parameter.KEYWORD_ONLY):
            raise ConfigurationError(
                f"action {name}: parameter {parameter.name} must be a plain named parameter"
            )
        hint = _hint(effect, name, parameter)
        if hint is inspect.Parameter.empty:
            raise ConfigurationError(
                f"action {name}: parameter {parameter.name} needs a type annotation"
            )
        default = ... if parameter.default is parameter.empty else parameter.default
        field = _field(len(fields), parameter.name, hint, default)
        _check_field(name, parameter.name, field)
        fields.update(field)
    try:
        model: type[BaseModel] = create_model(f"{name}_arguments", __config__=_CONFIG, **fields)
        argument_schema(model, {})
    except ConfigurationError:
        raise
    except Exception as exc:  # each field passed alone: what fails is their combination
        raise ConfigurationError(
            f"action {name}: its arguments cannot be validated and described together: "
            f"{_first_line(exc)}"
        ) from None
    named = {parameter.name for parameter in parameters[1:]}
    descriptions = {
        param.arg_name: " ".join(param.description.split())
        for param in docstring.params
        if param.arg_name in named and param.description
    }
    summary = (docstring.description or "").strip() or None
    return Arguments(model=model, summary=summary, descriptions=descriptions)


def argument_schema(model: type[BaseModel], descriptions: Mapping[str, str]) -> dict[str, Any]:
    """The ``properties`` and ``required`` of the tool schema of ``model``'s arguments.

    References into ``$defs`` are resolved in place; a parameter whose field has no
    description of its own gets its ``descriptions`` line.

    Raises:
        ConfigurationError: A type refers to itself (it cannot be described without ``$defs``).
    """
    schema = model.model_json_schema()
    defs = schema.get("$defs", {})
    properties: dict[str, Any] = {}
    for key, prop in schema.get("properties", {}).items():
        resolved = _resolve(prop, defs, frozenset())
        field = model.model_fields.get(key)
        if key in descriptions and (field is None or field.description is None):
            resolved = {**resolved, "description": descriptions[key]}
        properties[key] = resolved
    return {"properties": properties, "required": list(schema.get("required", []))}


def _check_context(
    effect: Callable[..., Any], name: str, first: inspect.Parameter, context: type[Any]
) -> None:
    """Refuse a first parameter that cannot receive the context (one of the tool's arguments)."""
    wanted = f"add a first parameter `ctx: {context.__name__}` before the tool's arguments"
    if first.kind not in (first.POSITIONAL_ONLY, first.POSITIONAL_OR_KEYWORD):
        raise ConfigurationError(
            f"action {name}: the first parameter receives the {context.__name__}, but "
            f"{first.name} is not positional; {wanted}"
        )
    if first.annotation is inspect.Parameter.empty:
        return
    try:
        hint = _resolved(effect, first.name, first.annotation)
    except Exception:
        # Often an import under TYPE_CHECKING: the name is all there is to go by.
        text = first.annotation if isinstance(first.annotation, str) else ""
        if text.rpartition(".")[2] == context.__name__:
            return
        hint = first.annotation
    if hint is Any or (
        isinstance(hint, type) and (issubclass(hint, context) or issubclass(context, hint))
    ):
        return
    shown = hint if isinstance(hint, str) else getattr(hint, "__name__", repr(hint))
    raise ConfigurationError(
        f"action {name}: the first parameter receives the {context.__name__}, but it is "
        f"{first.name}: {shown}, which looks like an argument of the tool; {wanted}"
    )


def _hint(effect: Callable[..., Any], name: str, parameter: inspect.Parameter) -> Any:
    """The resolved annotation of one parameter (``Annotated`` kept), or ``Parameter.empty``."""
    if parameter.annotation is inspect.Parameter.empty:
        return inspect.Parameter.empty
    try:
        return _resolved(effect, parameter.name, parameter.annotation)
    except Exception as exc:
        raise ConfigurationError(
            f"action {name}: the type annotation of parameter {parameter.name} "
            f"({parameter.annotation}) cannot be resolved: {_first_line(exc)}"
        ) from None


def _resolved(effect: Callable[..., Any], parameter: str, annotation: Any) -> Any:
    """``annotation`` resolved in ``effect``'s globals, alone (another one failing is no matter)."""
    target = inspect.unwrap(effect)
    probe = types.FunctionType(_empty.__code__, getattr(target, "__globals__", {}))
    probe.__annotations__ = {parameter: annotation}
    return get_type_hints(probe, include_extras=True)[parameter]


def _empty() -> None:
    """Lends its code object to `_resolved`'s probe."""


def _field(index: int, parameter: str, hint: Any, default: Any) -> dict[str, Any]:
    """The model field of one parameter, under its own name where pydantic allows it.

    pydantic keeps names starting with ``_`` as private attributes (never validated nor
    offered to the LLM) and takes ``model_config`` and its own methods' names for itself: such
    a parameter is a field under another name, with its own as the alias (validated and
    dumped by alias, so the effect gets it under its own name).
    """
    if parameter.startswith(("_", "model_")) or hasattr(BaseModel, parameter):
        return {f"argument_{index}": (hint, Field(default, alias=parameter))}
    return {parameter: (hint, default)}


def _check_field(name: str, parameter: str, field: dict[str, Any]) -> None:
    """Refuse a parameter pydantic cannot validate or describe, or with a default of another type.

    A default that is not a value of its type would be handed to the effect whenever the LLM
    leaves the argument out. The message names the action and the parameter.
    """
    ((hint, default),) = field.values()
    try:
        probe = create_model(f"{name}_{parameter}", __config__=_CONFIG, **field)
        argument_schema(probe, {})
    except ConfigurationError as exc:
        raise ConfigurationError(f"action {name}: parameter {parameter}: {exc}") from None
    except Exception as exc:  # pydantic's errors come in several classes, each multi-line
        shown = getattr(hint, "__name__", None) or repr(hint)
        raise ConfigurationError(
            f"action {name}: parameter {parameter} has a type the argument validator cannot "
            f"handle ({shown}): {_first_line(exc)}"
        ) from None
    value = default.default if isinstance(default, FieldInfo) else default
    if value is ... or value is PydanticUndefined:
        return
    try:
        TypeAdapter(hint).validate_python(value)
    except ValidationError as exc:
        message = exc.errors(include_url=False)[0]["msg"] if exc.error_count() else str(exc)
        raise ConfigurationError(
            f"action {name}: parameter {parameter}: its default {_shown_default(value)} is not "
            f"a value of its type ({message}); give it a default of its type, or make the "
            "type optional"
        ) from None


def _shown_default(value: Any) -> str:
    try:
        text = repr(value)
    except Exception:
        text = type(value).__name__
    return text if len(text) <= 40 else f"{text[:40]}…"


def _resolve(node: Any, defs: Mapping[str, Any], seen: frozenset[str]) -> Any:
    """``node`` with every ``$ref`` into ``defs`` replaced by what it refers to."""
    if isinstance(node, list):
        return [_resolve(item, defs, seen) for item in node]
    if not isinstance(node, dict):
        return node
    ref = node.get("$ref")
    if isinstance(ref, str) and ref.startswith(_REF_PREFIX):
        key = ref[len(_REF_PREFIX) :]
        if key in seen:
            raise ConfigurationError(
                f"its type {key} refers to itself, which a tool schema cannot describe"
            )
        if key not in defs:
            raise ConfigurationError(f"its schema refers to {ref}, which it does not define")
        target = _resolve(defs[key], defs, seen | {key})
        rest = {k: _resolve(v, defs, seen) for k, v in node.items() if k != "$ref"}
        return {**target, **rest}
    return {key: _resolve(value, defs, seen) for key, value in node.items()}


def _parse_docstring(effect: Callable[..., Any]) -> docstring_parser.Docstring:
    text = inspect.getdoc(effect) or ""
    try:
        return docstring_parser.parse(text)
    except docstring_parser.ParseError:
        # Not a docstring it can read: all of it is the summary; no parameter is described.
        docstring = docstring_parser.Docstring()
        docstring.short_description = text
        return docstring


def _first_line(exc: BaseException) -> str:
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[0] if lines else 'no message'}"
