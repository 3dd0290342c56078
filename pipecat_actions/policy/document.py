"""A policy file as written, how its ``defaults:`` merge under each tool, and the merged set.

`PolicyFile` is the document as written; `PolicySet` is the merged result a runtime uses.

``defaults:`` and every entry under ``tools:`` are *patches*: the same settings as
`ToolPolicy`, each optional, with the same per-field checks. A tool's merged settings are its
defaults overlaid by its own entry; nested settings (``retry``, ``limits``, ...) merge key by
key, so a tool that sets only ``retry.initial_backoff_secs`` keeps the default
``retry.max_attempts``. Cross-field rules are checked on the merged settings only.
"""

from __future__ import annotations

__all__ = [
    "CURRENT_VERSION",
    "SUPPORTED_VERSIONS",
    "PolicyFile",
    "PolicySet",
    "ToolPolicyPatch",
    "merge_settings",
    "nested_model_type",
]

import functools
import types
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    GetPydanticSchema,
    create_model,
)

from pipecat_actions.policy.fields import ToolName
from pipecat_actions.policy.model import ToolPolicy

CURRENT_VERSION = 2
"""The policy format this release writes (`pipecat-actions policy migrate`) and checks in full.

Version 2 is version 1 without two shapes 0.1.0 accepted: ``confirmation.mode: approval``
with nobody named to approve, and (checked when the runtime starts) an entry for a tool with
no action behind it. A version 1 file with either still loads, with a one-line warning each,
for this release (docs/upgrading.md, CHANGELOG.md); version 2 refuses them."""

SUPPORTED_VERSIONS = (1, 2)
"""The policy format versions this release reads."""


def nested_model_type(annotation: object) -> type[BaseModel] | None:
    """Return the model a field holds (``RetryPolicy`` for ``RetryPolicy | None``), if any.

    Args:
        annotation: A field's annotation, as pydantic stores it in ``model_fields``.

    Returns:
        The pydantic model class, or None when the field holds a plain value.
    """
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (Union, types.UnionType):
        models = [arg for arg in get_args(annotation) if nested_model_type(arg) is not None]
        if len(models) == 1:
            return nested_model_type(models[0])
    return None


@functools.cache
def _patch_model(model: type[BaseModel]) -> type[BaseModel]:
    """Build the twin of ``model`` in which every field is optional and defaults to unset.

    Field checks travel with the field (they are ``Annotated`` metadata); model validators do
    not, because cross-field rules only make sense once defaults are merged in.
    """
    fields: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        nested = nested_model_type(info.annotation)
        annotation: Any = _patch_model(nested) if nested is not None else info.annotation
        if info.metadata:
            annotation = Annotated[(annotation, *info.metadata)]
        fields[name] = (annotation | None, Field(default=None, description=info.description))
    patch: type[BaseModel] = create_model(
        f"{model.__name__}Patch",
        __config__=model.model_config,
        __doc__=f"`{model.__name__}` with every setting optional, to merge over defaults.",
        __module__=__name__,
        **fields,
    )
    return patch


_NESTED_FIELDS = frozenset(
    name
    for name, info in ToolPolicy.model_fields.items()
    if nested_model_type(info.annotation) is not None
)

ToolPolicyPatch = Annotated[
    BaseModel,
    GetPydanticSchema(lambda _source, handler: handler.generate_schema(_patch_model(ToolPolicy))),
]
"""The settings of one ``tools:`` entry or of ``defaults:``: a `ToolPolicy`, every key optional."""


def merge_settings(defaults: Mapping[str, Any], entry: Mapping[str, Any]) -> dict[str, Any]:
    """Overlay a tool's own settings on the file's defaults.

    Args:
        defaults: The settings under ``defaults:``.
        entry: The settings under ``tools.<name>:``.

    Returns:
        The merged settings: ``entry`` wins; nested settings (``retry``, ``limits``,
        ``idempotency``, ``delivery``, ``confirmation``, ``compensation``) merge key by key.
        Lists and ``limits.degrade_result`` are replaced whole, never concatenated.
    """
    merged = dict(defaults)
    for key, value in entry.items():
        base = merged.get(key)
        if key in _NESTED_FIELDS and isinstance(base, Mapping) and isinstance(value, Mapping):
            merged[key] = {**base, **value}
        else:
            merged[key] = value
    return merged


def _check_version(value: int) -> int:
    if value not in SUPPORTED_VERSIONS:
        raise ValueError(
            f"unsupported policy version {value}: this pipecat_actions reads versions "
            f"{' and '.join(map(str, SUPPORTED_VERSIONS))} (the current one is "
            f"{CURRENT_VERSION})"
        )
    return value


class PolicyFile(BaseModel):
    """A policy file as written, before ``defaults:`` are merged under each tool.

    Validating one checks every setting on its own (types, allowed values, unknown keys);
    `PolicySet` holds the merged, cross-checked result.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    version: Annotated[int, AfterValidator(_check_version)] = Field(
        description=(
            "The policy format version: 2, the current one; 1 is read for one more release, "
            "with a warning for each shape version 2 refuses."
        ),
    )
    defaults: ToolPolicyPatch | None = Field(
        default=None,
        description=(
            "Settings shared by every tool; a tool's own settings win, key by key inside "
            "nested settings such as retry."
        ),
    )
    tools: dict[ToolName, ToolPolicyPatch] = Field(
        min_length=1,
        description="Each tool the bot may call, by the name the model calls it, with its policy.",
    )

    def names(self) -> tuple[str, ...]:
        """Return the tool names, in file order."""
        return tuple(self.tools)

    def merged_settings(self) -> dict[str, dict[str, Any]]:
        """Return every tool's settings merged over ``defaults:``, in file order.

        The same as `settings_for` of each name, with ``defaults:`` read out of its model once
        rather than once per tool: the tools share its values (read them, never change them).
        """
        defaults = {} if self.defaults is None else self.defaults.model_dump(exclude_unset=True)
        return {
            name: merge_settings(defaults, entry.model_dump(exclude_unset=True))
            for name, entry in self.tools.items()
        }

    def settings_for(self, name: str) -> dict[str, Any]:
        """Return a tool's settings merged over ``defaults:``, before cross-field checks.

        Args:
            name: A tool name from `names`.

        Returns:
            The merged settings, ready for ``ToolPolicy.model_validate``.

        Raises:
            KeyError: The file has no tool of that name.
        """
        defaults = {} if self.defaults is None else self.defaults.model_dump(exclude_unset=True)
        return merge_settings(defaults, self.tools[name].model_dump(exclude_unset=True))


@dataclass(frozen=True, eq=False, slots=True)
class PolicySet(Mapping[str, ToolPolicy]):
    """The merged policy of every tool of one policy file, by tool name.

    Attributes:
        tools: Tool name to its merged, checked policy, in file order (read-only).
        source: Where the policies came from: a file path, or ``"<string>"``.
        version: The file's format version (`SUPPORTED_VERSIONS`).
        deprecations: One line for each deprecated shape the file holds (a version 1 file
            only), already logged as a warning when it was loaded.
    """

    tools: Mapping[str, ToolPolicy]
    source: str = "<string>"
    version: int = CURRENT_VERSION
    deprecations: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        object.__setattr__(self, "tools", types.MappingProxyType(dict(self.tools)))

    def __getitem__(self, name: str) -> ToolPolicy:
        try:
            return self.tools[name]
        except KeyError:
            known = ", ".join(self.tools) or "none"
            raise KeyError(
                f"no policy for tool {name!r} in {self.source} (tools: {known})"
            ) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self.tools)

    def __len__(self) -> int:
        return len(self.tools)

    def __contains__(self, name: object) -> bool:
        return name in self.tools

    def __repr__(self) -> str:
        return f"PolicySet(source={self.source!r}, tools={list(self.tools)!r})"

    def names(self) -> tuple[str, ...]:
        """Return the tool names, in file order."""
        return tuple(self.tools)

    def durable_names(self) -> tuple[str, ...]:
        """Return the names of the tools a DBOS worker runs (``execution: durable``), in order."""
        return tuple(name for name, tool in self.tools.items() if tool.is_durable)
