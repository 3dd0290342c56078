"""Arguments are admitted as JSON says them: strict types, finite numbers, at any depth.

A model sends JSON. A parameter typed ``int`` takes the JSON number ``2`` and nothing else
(not ``true``, ``"2"`` or ``2.0``), unless the tool's policy sets ``coerce_arguments``; types JSON
has no notation for (dates, datetimes, enums, UUIDs) come as their JSON text. Non-finite numbers
(``NaN``, ``Infinity``, ``1e999``) and numbers of more than 4300 digits are refused wherever they
are, free-form fields included. Every refusal is a REJECTED row with the reason, and the effect
never runs.
"""

from __future__ import annotations

import asyncio
import datetime
import decimal
import itertools
import json
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from enum import IntEnum, StrEnum
from pathlib import Path
from typing import Any, Literal

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel

from pipecat_actions.actions import ActionContext, ActionDefinition, action
from pipecat_actions.admission.authorization import AllowAll
from pipecat_actions.clock import ManualClock
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.session import SessionState
from pipecat_actions.status import ActionStatus

from ._admission_support import assert_refusal_audited, policy, sqlite_url

S = ActionStatus


class Colour(StrEnum):
    RED = "red"
    BLUE = "blue"


class Level(IntEnum):
    LOW = 1
    HIGH = 2


class Seat(BaseModel):
    row: int
    window: bool = False


class Gauge(BaseModel):
    ratio: float  # a user's model: pydantic allows NaN in it by default


VALID: dict[str, Any] = {
    "party_size": 2,
    "deposit": 20.5,
    "day": "2026-12-03",
    "at": "2026-12-03T20:30:00+01:00",
    "colour": "red",
    "seat": {"row": 3},
    "tags": ["quiet", "window"],
    "note": None,
    "ref": "12345678-1234-5678-1234-567812345678",
    "prefs": {"diet": ["vegan"], "level": 2, "ratio": 0.5},
    "accessible": False,
}


class Reservations:
    """The actions of these tests, counting what they were handed."""

    def __init__(self) -> None:
        self.handed: list[dict[str, Any]] = []

    def actions(self) -> list[ActionDefinition]:
        handed = self.handed

        @action
        async def reserve(
            ctx: ActionContext,
            party_size: int,
            deposit: float,
            day: datetime.date,
            at: datetime.datetime,
            colour: Colour,
            seat: Seat,
            tags: list[str],
            accessible: bool,
            note: str | None = None,
            ref: uuid.UUID | None = None,
            prefs: dict[str, Any] | None = None,
        ) -> dict[str, Any]:
            """Reserve a table."""
            handed.append(dict(ctx.args))
            return {"reserved": True}

        @action
        async def store(ctx: ActionContext, label: str, data: Any) -> dict[str, Any]:
            """Store free-form data."""
            handed.append(dict(ctx.args))
            return {"stored": True}

        @action
        async def choose(
            ctx: ActionContext,
            size: Literal[1, 2],
            level: Level,
            seats: list[Seat],
            amount: decimal.Decimal | None = None,
        ) -> dict[str, Any]:
            """Choose a size, a level and seats."""
            handed.append(dict(ctx.args))
            return {"chosen": True}

        return [reserve, store, choose]


TOOLS = """
  reserve:
    kind: mutation
    on_duplicate: allow
  choose:
    kind: mutation
    on_duplicate: allow
  store:
    kind: mutation
    on_duplicate: allow
"""
COERCING = TOOLS.replace("on_duplicate: allow", "on_duplicate: allow\n    coerce_arguments: true")


@asynccontextmanager
async def running(
    ledger_url: str, tools: str = TOOLS
) -> AsyncIterator[tuple[ActionRuntime, Reservations]]:
    reservations = Reservations()
    runtime = await ActionRuntime.create(
        policy(tools),
        authorizer=AllowAll(),
        actions=reservations.actions(),
        ledger_url=ledger_url,
        clock=ManualClock(),
    )
    try:
        yield runtime, reservations
    finally:
        await runtime.close(grace_secs=0)


def _forms(arguments: dict[str, Any]) -> list[Any]:
    """The arguments as Pipecat hands them (a dict) and as JSON text."""
    return [arguments, json.dumps(arguments)]


async def test_json_typed_arguments_are_admitted_and_stored_in_their_json_form(
    ledger_url: str,
) -> None:
    async with running(ledger_url) as (runtime, reservations):
        for number, arguments in enumerate(_forms(VALID)):
            result = await runtime.propose(
                "reserve", arguments, SessionState(f"s{number}", principal="alice")
            )

            assert result["status"] == "committed", result
            op = await runtime.ledger.get(result["operation_id"])
            assert op.args["at"] == "2026-12-03T20:30:00+01:00"
            assert op.args["seat"] == {"row": 3, "window": False}
        assert len(reservations.handed) == 2


WRONG_TYPES = {
    "bool for int": {"party_size": True},
    "text for int": {"party_size": "2"},
    "2.0 for int": {"party_size": 2.0},
    "fraction for int": {"party_size": 2.5},
    "null for int": {"party_size": None},
    "text for float": {"deposit": "20.5"},
    "bool for float": {"deposit": False},
    "number for date": {"day": 20261203},
    "datetime text for date": {"day": "2026-12-03T10:00"},
    "not a date": {"day": "tomorrow"},
    "number for datetime": {"at": 1_800_000_000},
    "enum name not value": {"colour": "RED"},
    "text for nested int": {"seat": {"row": "3"}},
    "text for nested model": {"seat": "3"},
    "number in a text list": {"tags": ["quiet", 1]},
    "text for list": {"tags": "quiet"},
    "number for optional text": {"note": 5},
    "number for bool": {"accessible": 0},
    "text for bool": {"accessible": "false"},
    "not a uuid": {"ref": "12345"},
    "unknown key": {"extra": 1},
}


@pytest.mark.parametrize("change", list(WRONG_TYPES.values()), ids=list(WRONG_TYPES))
async def test_a_value_of_another_json_type_is_refused_and_nothing_runs(
    ledger_url: str, change: dict[str, Any]
) -> None:
    async with running(ledger_url) as (runtime, reservations):
        for number, arguments in enumerate(_forms({**VALID, **change})):
            result = await runtime.propose(
                "reserve", arguments, SessionState(f"s{number}", principal="alice")
            )

            await assert_refusal_audited(runtime, result, "invalid_arguments")
            assert next(iter(change)) in result["message"]
        assert reservations.handed == []


CHOICE: dict[str, Any] = {"size": 1, "level": 2, "seats": [{"row": 1}]}
MISCHOSEN = {
    "true for a whole-number literal": {"size": True},
    "1.0 for a whole-number literal": {"size": 1.0},
    "true for an int enum": {"level": True},
    "2.0 for an int enum": {"level": 2.0},
    "unknown key in a nested model": {"seats": [{"row": 1}, {"row": 2, "vip": True}]},
}


@pytest.mark.parametrize("change", list(MISCHOSEN.values()), ids=list(MISCHOSEN))
async def test_literals_enums_and_nested_models_are_as_strict_as_plain_types(
    ledger_url: str, change: dict[str, Any]
) -> None:
    async with running(ledger_url) as (runtime, reservations):
        for number, arguments in enumerate(_forms({**CHOICE, **change})):
            result = await runtime.propose(
                "choose", arguments, SessionState(f"s{number}", principal="alice")
            )

            await assert_refusal_audited(runtime, result, "invalid_arguments")
            assert next(iter(change)) in result["message"], result
        assert reservations.handed == []


@pytest.mark.parametrize(
    "amount", ["1" * 4301, "1e999999999", "1e-999999"], ids=["digits", "exponent", "tiny"]
)
async def test_a_decimal_of_more_than_4300_digits_or_such_an_exponent_is_refused(
    ledger_url: str, amount: str
) -> None:
    async with running(ledger_url) as (runtime, reservations):
        kept = await runtime.propose(
            "choose", {**CHOICE, "amount": "12.50"}, SessionState("ok", principal="alice")
        )
        result = await runtime.propose(
            "choose", {**CHOICE, "amount": amount}, SessionState("s", principal="alice")
        )

        assert kept["status"] == "committed", kept
        await assert_refusal_audited(runtime, result, "invalid_arguments")
        assert "amount: a number of more than 4300 digits" in result["message"], result
        assert len(reservations.handed) == 1


async def test_a_key_given_twice_in_json_text_is_refused(ledger_url: str) -> None:
    async with running(ledger_url) as (runtime, reservations):
        result = await runtime.propose(
            "choose",
            '{"size": 1, "level": 1, "seats": [{"row": 1, "row": 9}]}',
            SessionState("s", principal="alice"),
        )

        await assert_refusal_audited(runtime, result, "invalid_arguments")
        assert "'row' is given twice" in result["message"], result
        assert reservations.handed == []


@pytest.mark.parametrize(
    "change",
    [{"party_size": True}, {"deposit": False}, {"accessible": 1}, {"seat": {"row": True}}],
    ids=["true for int", "false for float", "1 for bool", "true for a nested int"],
)
async def test_coercion_never_makes_a_number_of_a_boolean_or_the_reverse(
    ledger_url: str, change: dict[str, Any]
) -> None:
    async with running(ledger_url, COERCING) as (runtime, reservations):
        result = await runtime.propose(
            "reserve", {**VALID, **change}, SessionState("s", principal="alice")
        )

        await assert_refusal_audited(runtime, result, "invalid_arguments")
        assert next(iter(change)) in result["message"], result
        assert reservations.handed == []


async def test_coercion_makes_no_nan_from_text_in_a_nested_model(ledger_url: str) -> None:
    async with running(ledger_url, COERCING) as (runtime, reservations):
        result = await runtime.propose(
            "choose",
            {**CHOICE, "seats": [{"row": 1, "window": False}, {"row": "2"}]},
            SessionState("ok", principal="alice"),
        )
        assert result["status"] == "committed", result

        @action
        async def measure(ctx: ActionContext, gauge: Gauge) -> dict[str, Any]:
            """Measure."""
            reservations.handed.append(dict(ctx.args))
            return {}

        measuring = await ActionRuntime.create(
            policy("  measure:\n    kind: mutation\n    coerce_arguments: true\n"),
            authorizer=AllowAll(),
            actions=[measure],
            ledger_url=ledger_url,
            clock=ManualClock(),
        )
        try:
            refused = await measuring.propose(
                "measure", {"gauge": {"ratio": "NaN"}}, SessionState("x", principal="alice")
            )
            await assert_refusal_audited(measuring, refused, "invalid_arguments")
            assert "gauge.ratio" in refused["message"] and "finite" in refused["message"]
        finally:
            await measuring.close(grace_secs=0)
        assert len(reservations.handed) == 1


async def test_a_missing_required_argument_is_refused(ledger_url: str) -> None:
    arguments = {key: value for key, value in VALID.items() if key != "day"}
    async with running(ledger_url) as (runtime, reservations):
        result = await runtime.propose("reserve", arguments, SessionState("s", principal="a"))

        await assert_refusal_audited(runtime, result, "invalid_arguments")
        assert "day" in result["message"]
        assert reservations.handed == []


async def test_a_policy_that_asks_for_coercion_converts_what_it_can(ledger_url: str) -> None:
    lax = {**VALID, "party_size": "2", "deposit": "20.5", "accessible": "false"}
    async with running(ledger_url, COERCING) as (runtime, reservations):
        for number, arguments in enumerate([*_forms(lax), {**VALID, "party_size": 2.0}]):
            result = await runtime.propose(
                "reserve", arguments, SessionState(f"s{number}", principal="alice")
            )

            assert result["status"] == "committed", result
            op = await runtime.ledger.get(result["operation_id"])
            assert (op.args["party_size"], op.args["accessible"]) == (2, False)
        refused = await runtime.propose(
            "reserve", {**VALID, "party_size": "two"}, SessionState("x", principal="alice")
        )
        await assert_refusal_audited(runtime, refused, "invalid_arguments")
        assert len(reservations.handed) == 3


@pytest.mark.parametrize("tools", [TOOLS, COERCING], ids=["strict", "coercing"])
async def test_non_finite_numbers_in_free_form_fields_are_refused_and_recorded(
    ledger_url: str, tools: str
) -> None:
    texts = ["NaN", "Infinity", "-Infinity", "1e999", "-1e999"]
    values = [float("nan"), float("inf"), float("-inf")]
    calls: list[Any] = [
        *(f'{{"label": "x", "data": {{"deep": [1, {{"x": {text}}}]}}}}' for text in texts),
        *({"label": "x", "data": {"deep": [1, {"x": value}]}} for value in values),
        *({**VALID, "prefs": {"ratio": value}} for value in values),
    ]
    async with running(ledger_url, tools) as (runtime, reservations):
        for number, arguments in enumerate(calls):
            tool = "store" if "label" in arguments else "reserve"
            result = await runtime.propose(
                tool, arguments, SessionState(f"s{number}", principal="alice")
            )

            op = await assert_refusal_audited(runtime, result, "invalid_arguments")
            assert "finite" in result["message"], result
            assert "deep[1].x" in result["message"] or "prefs.ratio" in result["message"]
            assert op.args  # what was proposed is kept for the audit
        assert reservations.handed == []


@pytest.mark.parametrize(
    "arguments",
    [
        '{"label": "x", "data": ' + "9" * 5000 + "}",
        '{"label": "x", "data": [-' + "9" * 5000 + "]}",
        {"label": "x", "data": [10**5000]},
        {"label": "x", "data": {"n": -(10**4300)}},
    ],
    ids=["text", "negative-text-in-list", "mapping", "mapping-4301-digits"],
)
async def test_a_whole_number_of_more_than_4300_digits_is_refused_not_a_crash(
    ledger_url: str, arguments: Any
) -> None:
    async with running(ledger_url) as (runtime, reservations):
        result = await runtime.propose("store", arguments, SessionState("s", principal="alice"))

        await assert_refusal_audited(runtime, result, "invalid_arguments")
        assert "4300 digits" in result["message"]
        assert reservations.handed == []


async def test_a_whole_number_of_4300_digits_is_still_json(tmp_path: Path) -> None:
    async with running(sqlite_url(tmp_path)) as (runtime, _):
        result = await runtime.propose(
            "store", {"label": "x", "data": 10**4299}, SessionState("s", principal="alice")
        )

        assert result["status"] == "committed", result


# --- properties ----------------------------------------------------------------------------

_finite = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
_json = st.recursive(
    _finite,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=10,
)
_non_finite = st.sampled_from([float("nan"), float("inf"), float("-inf")])


@st.composite
def _with_one_non_finite(draw: Callable[..., Any]) -> Any:
    """A JSON value with a non-finite number planted at a random place, at any depth."""
    value = draw(_json)
    planted = draw(_non_finite)
    path: list[Any] = []
    holder: Any = value
    while isinstance(holder, list | dict) and holder and draw(st.booleans()):
        key = draw(
            st.sampled_from(list(range(len(holder))) if isinstance(holder, list) else list(holder))
        )
        path.append(key)
        if not isinstance(holder[key], list | dict):
            break
        holder = holder[key]
    if isinstance(holder, list):
        holder.insert(draw(st.integers(0, len(holder))), planted)
    elif isinstance(holder, dict):
        holder[draw(st.text(max_size=5))] = planted
    else:
        return [value, {"x": planted}]
    return value


def _run_property(
    tmp_path: Path, tools: str, check: Callable[[ActionRuntime, Reservations, Any], Any]
) -> None:
    reservations = Reservations()
    with asyncio.Runner() as runner:
        runtime = runner.run(
            ActionRuntime.create(
                policy(tools),
                authorizer=AllowAll(),
                actions=reservations.actions(),
                ledger_url=sqlite_url(tmp_path),
                clock=ManualClock(),
            )
        )
        try:
            check(runtime, reservations, runner)
        finally:
            runner.run(runtime.close(grace_secs=0))


def test_any_non_finite_number_at_any_depth_is_refused_in_either_form(tmp_path: Path) -> None:
    numbers = itertools.count()

    def check(runtime: ActionRuntime, reservations: Reservations, runner: Any) -> None:
        @settings(
            max_examples=100,
            deadline=None,
            database=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
        )
        @given(data=_with_one_non_finite(), as_text=st.booleans())
        def refused(data: Any, as_text: bool) -> None:
            arguments: Any = {"label": "x", "data": data}
            if as_text:
                arguments = json.dumps(arguments)  # NaN, Infinity, -Infinity tokens
            session = SessionState(f"p{next(numbers)}", principal="alice")
            result = runner.run(runtime.propose("store", arguments, session))
            runner.run(assert_refusal_audited(runtime, result, "invalid_arguments"))
            assert reservations.handed == []

        refused()

    _run_property(tmp_path, COERCING, check)


def _json_type_fits(kind: str, value: Any) -> bool:
    """What strict JSON typing accepts for a parameter of ``kind``."""
    if kind == "int":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "float":
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == "bool":
        return isinstance(value, bool)
    return value is None or isinstance(value, str)  # ``note: str | None``


def test_a_scalar_parameter_takes_exactly_the_json_values_of_its_type(tmp_path: Path) -> None:
    numbers = itertools.count()
    fields = {"int": "party_size", "float": "deposit", "bool": "accessible", "str": "note"}

    def check(runtime: ActionRuntime, reservations: Reservations, runner: Any) -> None:
        @settings(max_examples=150, deadline=None, database=None)
        @given(kind=st.sampled_from(list(fields)), value=_json)
        def typed(kind: str, value: Any) -> None:
            session = SessionState(f"t{next(numbers)}", principal="alice")
            arguments = {**VALID, fields[kind]: value}
            result = runner.run(runtime.propose("reserve", arguments, session))
            if _json_type_fits(kind, value):
                assert result["status"] == "committed", (kind, value, result)
                if kind != "str":  # text is stored with its surrounding spaces stripped
                    op = runner.run(runtime.ledger.get(result["operation_id"]))
                    assert op.args[fields[kind]] == value
            else:
                runner.run(assert_refusal_audited(runtime, result, "invalid_arguments"))

        typed()

    _run_property(tmp_path, TOOLS, check)
