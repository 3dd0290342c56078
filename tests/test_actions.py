"""``@action`` explains itself: what it refuses, in one line, and what the LLM is told of a tool.

An effect that cannot work is refused when it is decorated, naming the action and the
parameter; the tool's description is its docstring's summary, and each ``Args:`` line
describes its parameter.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, Field

from pipecat_actions import (
    ActionContext,
    ActionRuntime,
    AllowAll,
    ConfigurationError,
    action,
    tools_schema,
)
from pipecat_actions.policy import load_policy_text
from pipecat_actions.session import SessionState


def _refusal(effect: Callable[..., Any]) -> str:
    """The message ``@action`` refuses ``effect`` with: a ConfigurationError of one line."""
    with pytest.raises(ConfigurationError) as refused:
        action(effect)
    message = str(refused.value)
    assert "\n" not in message, message
    return message


# --- the context parameter -------------------------------------------------------------------


async def _arguments_only(city: str) -> dict[str, Any]:
    """The weather in a city (the context parameter is missing)."""
    return {}


async def _context_last(city: str, ctx: ActionContext) -> dict[str, Any]:
    """The context comes after the tool's argument."""
    return {}


async def _keyword_only(*, city: str) -> dict[str, Any]:
    """Only keyword parameters: nothing receives the context."""
    return {}


async def _variadic(*args: Any) -> dict[str, Any]:
    """Nothing but positional varargs."""
    return {}


@pytest.mark.parametrize(
    ("effect", "named"),
    [
        (_arguments_only, "city"),
        (_context_last, "city"),
        (_keyword_only, "city"),
        (_variadic, "args"),
    ],
    ids=["arguments-only", "context-last", "keyword-only", "varargs"],
)
def test_an_effect_whose_first_parameter_cannot_take_the_context_is_refused_naming_it(
    effect: Callable[..., Any], named: str
) -> None:
    message = _refusal(effect)
    assert message.startswith(f"action {effect.__name__}: ")
    assert "ActionContext" in message
    assert named in message
    assert "ctx: ActionContext" in message  # what to write instead


def test_an_effect_with_no_parameter_at_all_is_refused_saying_what_it_lacks() -> None:
    async def ping() -> dict[str, Any]:
        return {}

    message = _refusal(ping)
    assert message.startswith("action ping: ")
    assert "ctx: ActionContext" in message


def test_a_context_parameter_unannotated_or_typed_any_is_accepted() -> None:
    async def plain(ctx, city: str) -> dict[str, Any]:
        return {}

    async def loose(ctx: Any, city: str) -> dict[str, Any]:
        return {}

    for effect in (plain, loose):
        assert set(action(effect).json_schema()["properties"]) == {"city"}


# --- parameter types -------------------------------------------------------------------------


class Thing:
    """A class pydantic knows nothing about."""


class Node(BaseModel):
    """A type that refers to itself."""

    children: list[Node] = []


async def _arbitrary_class(ctx: ActionContext, thing: Thing) -> dict[str, Any]:
    return {}


async def _callable(ctx: ActionContext, on_done: Callable[[int], int]) -> dict[str, Any]:
    return {}


async def _a_type(ctx: ActionContext, kind: type) -> dict[str, Any]:
    return {}


async def _recursive(ctx: ActionContext, tree: Node) -> dict[str, Any]:
    return {}


async def _unresolvable(ctx: ActionContext, when: NoSuchType) -> dict[str, Any]:  # noqa: F821
    return {}


@pytest.mark.parametrize(
    ("effect", "parameter"),
    [
        (_arbitrary_class, "thing"),
        (_callable, "on_done"),  # validated, but no JSON schema: it used to fail at tools_schema
        (_a_type, "kind"),
        (_recursive, "tree"),  # its schema is a $ref into $defs the tool schema drops
        (_unresolvable, "when"),
    ],
    ids=["arbitrary-class", "callable", "type", "recursive-model", "unresolvable-name"],
)
def test_a_parameter_type_the_validator_cannot_handle_is_refused_at_decoration_naming_it(
    effect: Callable[..., Any], parameter: str
) -> None:
    message = _refusal(effect)
    assert message.startswith(f"action {effect.__name__}: ")
    assert f"parameter {parameter}" in message


def test_a_default_that_is_not_a_value_of_its_type_is_refused_at_decoration_naming_it() -> None:
    async def book(ctx: ActionContext, party_size: int = "two") -> dict[str, Any]:  # type: ignore[assignment]
        return {}

    message = _refusal(book)
    assert message.startswith("action book: parameter party_size: its default 'two'")


def test_defaults_of_their_type_are_accepted_an_enum_as_its_value_too() -> None:
    async def book(
        ctx: ActionContext,
        seating: Seating = "terrace",  # type: ignore[assignment]
        note: str | None = None,
        size: Annotated[int, Field(ge=1)] = 2,
        tags: list[str] = [],  # noqa: B006
    ) -> dict[str, Any]:
        return {}

    assert set(action(book).json_schema()["properties"]) == {"seating", "note", "size", "tags"}


def test_what_is_not_a_named_async_function_is_refused_in_one_line() -> None:
    async def book(ctx: ActionContext, party_size: int) -> dict[str, Any]:
        return {}

    assert "not int" in _refusal(42)  # type: ignore[arg-type]
    assert "action(effect, name=...)" in _refusal(functools.partial(book))
    assert action(functools.partial(book), name="book").name == "book"


async def test_parameters_named_like_pydantics_own_are_offered_checked_and_passed(
    tmp_path: Path,
) -> None:
    handed: list[dict[str, Any]] = []

    # pydantic keeps _names as private attributes and model_config for itself.
    @action
    async def note(
        ctx: ActionContext, _ref: int, model_config: str, json: str = "x"
    ) -> dict[str, Any]:
        """Add a note."""
        handed.append({"_ref": _ref, "model_config": model_config, "json": json})
        return {}

    assert set(note.json_schema()["properties"]) == {"_ref", "model_config", "json"}
    runtime = await ActionRuntime.create(
        load_policy_text("version: 1\ntools:\n  note:\n    kind: mutation\n"),
        authorizer=AllowAll(),
        actions=[note],
        ledger_url=f"sqlite:///{tmp_path}/l.db",
    )
    try:
        done = await runtime.propose(
            "note", {"_ref": 7, "model_config": "a"}, SessionState("s", principal="alice")
        )
        refused = await runtime.propose(
            "note", {"_ref": "7", "model_config": "a"}, SessionState("t", principal="alice")
        )
        unknown = await runtime.propose(
            "note", {"_ref": 7, "model_config": "a", "x": 1}, SessionState("u", principal="a")
        )
    finally:
        await runtime.close()
    assert done["status"] == "committed", done
    assert (refused["reason"], unknown["reason"]) == ("invalid_arguments", "invalid_arguments")
    assert "_ref" in refused["message"]
    assert handed == [{"_ref": 7, "model_config": "a", "json": "x"}]


class Seating(StrEnum):
    INSIDE = "inside"
    TERRACE = "terrace"


class Guest(BaseModel):
    """A guest of the party."""

    name: str
    allergies: list[str] = []


def test_an_enum_or_a_nested_model_is_described_inline_without_dangling_references() -> None:
    @action
    async def book_table(
        ctx: ActionContext, seating: Seating, guests: list[Guest]
    ) -> dict[str, Any]:
        """Book a table."""
        return {}

    schema = book_table.json_schema()
    assert "$ref" not in json.dumps(schema)
    assert schema["properties"]["seating"]["enum"] == ["inside", "terrace"]
    assert set(schema["properties"]["guests"]["items"]["properties"]) == {"name", "allergies"}
    assert schema["required"] == ["seating", "guests"]


def test_constraints_given_with_annotated_are_kept_by_the_validator() -> None:
    @action
    async def book_table(
        ctx: ActionContext, party_size: Annotated[int, Field(ge=1, le=12)]
    ) -> dict[str, Any]:
        """Book a table."""
        return {}

    assert book_table.json_schema()["properties"]["party_size"]["maximum"] == 12
    with pytest.raises(ValueError, match="less than or equal to 12"):
        book_table.args_model.model_validate({"party_size": 40})


# --- what the LLM is told ----------------------------------------------------------------


@action
async def book_table(ctx: ActionContext, time: str, party_size: int = 2) -> dict[str, Any]:
    """Book a table and return its reference.

    The table is held for fifteen minutes.

    Args:
        ctx: The operation (never shown to the model).
        time: The time of the booking, HH:MM.
        party_size: How many people come,
            at most twelve.

    Returns:
        The booking reference.

    Raises:
        EffectFailed: The restaurant is full.
    """
    return {}


def test_the_tool_description_is_the_docstring_summary_without_its_sections() -> None:
    assert book_table.description == (
        "Book a table and return its reference.\n\nThe table is held for fifteen minutes."
    )


def test_each_args_line_describes_its_parameter_to_the_llm() -> None:
    properties = book_table.json_schema()["properties"]
    assert properties["time"]["description"] == "The time of the booking, HH:MM."
    assert properties["party_size"]["description"] == "How many people come, at most twelve."
    assert set(properties) == {"time", "party_size"}  # the context is no argument


def test_a_field_description_wins_over_the_docstring() -> None:
    @action
    async def book(
        ctx: ActionContext,
        time: Annotated[str, Field(description="HH:MM, 24-hour clock")],
        party_size: int = Field(2, description="Guests, the caller included"),
        note: str = "",
    ) -> dict[str, Any]:
        """Book.

        Args:
            time: The time.
            party_size: How many.
            note: Anything the restaurant should know.
        """
        return {}

    properties = book.json_schema()["properties"]
    assert properties["time"]["description"] == "HH:MM, 24-hour clock"
    assert properties["party_size"]["description"] == "Guests, the caller included"
    assert properties["note"]["description"] == "Anything the restaurant should know."


def test_a_description_given_to_action_wins_over_the_docstring() -> None:
    @action(description="Reserve a table.")
    async def book(ctx: ActionContext, time: str) -> dict[str, Any]:
        """Book.

        Args:
            time: The time.
        """
        return {}

    assert book.description == "Reserve a table."
    assert book.json_schema()["properties"]["time"]["description"] == "The time."


async def test_the_tools_schema_carries_the_summary_and_the_parameter_descriptions(
    tmp_path: Path,
) -> None:
    runtime = await ActionRuntime.create(
        load_policy_text("version: 1\ntools:\n  book_table:\n    kind: mutation\n"),
        authorizer=AllowAll(),
        actions=[book_table],
        ledger_url=f"sqlite:///{tmp_path}/l.db",
    )
    try:
        (schema,) = tools_schema(runtime).standard_tools
    finally:
        await runtime.close()
    assert "Args:" not in schema.description and "Returns:" not in schema.description
    assert schema.description.startswith("Book a table and return its reference.")
    assert schema.properties["time"]["description"] == "The time of the booking, HH:MM."
