"""The policy reference, generated from the models' field descriptions.

``python -m pipecat_actions.policy.reference`` prints it as Markdown; docs/policies.md holds a
copy between markers, and a test keeps the two equal (so the reference never drifts from the
code).
"""

from __future__ import annotations

__all__ = ["policy_reference"]

import enum
import types
import typing
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from pipecat_actions.policy.model import ToolPolicy


def _type_name(annotation: Any) -> str:
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _type_name(typing.get_args(annotation)[0])
    if origin in (types.UnionType, typing.Union):
        names = [_type_name(a) for a in typing.get_args(annotation) if a is not type(None)]
        return " or ".join(names) + (
            " or null" if type(None) in typing.get_args(annotation) else ""
        )
    if origin in (list, tuple, typing.Sequence):
        return "list"
    if origin in (dict, typing.Mapping):
        return "mapping"
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return " \\| ".join(member.value for member in annotation)
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    return getattr(annotation, "__name__", str(annotation))


def _default(field: Any) -> str:
    if field.is_required():
        return "required"
    if field.default_factory is dict:
        return "empty"
    if field.default_factory is not None:
        return "see below"
    value = field.default
    if value is PydanticUndefined or value is None:
        return "none"
    if isinstance(value, enum.Enum):
        return f"`{value.value}`"
    if isinstance(value, tuple | list) and not value:
        return "empty"
    return f"`{value}`"


def _section(model: type[BaseModel], prefix: str, out: list[str]) -> None:
    nested: list[tuple[str, type[BaseModel]]] = []
    out.append("| key | type | default | meaning |")
    out.append("|---|---|---|---|")
    for name, field in model.model_fields.items():
        annotation = field.annotation
        inner = [a for a in typing.get_args(annotation) if isinstance(a, type)]
        sub = (
            annotation
            if isinstance(annotation, type) and issubclass(annotation, BaseModel)
            else (next((a for a in inner if issubclass(a, BaseModel)), None))
        )
        if sub is not None:
            nested.append((name, sub))
        description = " ".join((field.description or "").split())
        out.append(
            f"| `{prefix}{name}` | {_type_name(annotation)} | {_default(field)} | {description} |"
        )
    for name, sub in nested:
        out.append("")
        out.append(f"### `{prefix}{name}`")
        out.append("")
        _section(sub, f"{prefix}{name}.", out)


def policy_reference() -> str:
    """Return the Markdown reference of a tool's policy keys."""
    out = [
        "Every key of a tool entry (under `tools.<name>`, or under `defaults` for all tools).",
        "",
    ]
    _section(ToolPolicy, "", out)
    return "\n".join(out) + "\n"


if __name__ == "__main__":  # pragma: no cover
    print(policy_reference(), end="")
