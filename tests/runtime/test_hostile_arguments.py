"""Hostile arguments: whatever the model sends, admission answers with a result and audits it.

Three promises, checked on generated and on hand-picked payloads:

* no crash: every call returns a dict result with a ``status``;
* nothing invalid is executed: an effect only ever receives arguments that validate strictly
  against its tool's schema;
* every refusal is audited: the ledger holds a REJECTED row with the reason.

The generated payloads stay within JSON as the standard defines it (finite numbers, moderate
depth); non-finite numbers and pathological depth have hand-picked tests of their own below.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipecat_actions.clock import ManualClock
from pipecat_actions.ledger import OperationFilter
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.session import SessionState
from pipecat_actions.status import ActionStatus

from ._admission_support import (
    OwnBookingsOnly,
    Restaurant,
    assert_refusal_audited,
    policy,
    running,
    sqlite_url,
)

S = ActionStatus
CAP_BYTES = 8192

TOOLS = f"""
  book_table:
    kind: mutation
    max_payload_bytes: {CAP_BYTES}
  cancel_booking:
    kind: mutation
    resource: "booking:{{booking_id}}"
    max_payload_bytes: {CAP_BYTES}
  search_tables:
    kind: read
    max_payload_bytes: {CAP_BYTES}
  add_tip:
    kind: mutation
    max_payload_bytes: {CAP_BYTES}
  set_preferences:
    kind: mutation
    max_payload_bytes: {CAP_BYTES}
  invite_guests:
    kind: mutation
    max_payload_bytes: {CAP_BYTES}
"""
TOOL_NAMES = tuple(policy(TOOLS).names())

# --- generated payloads ------------------------------------------------------------------

_huge_ints = st.sampled_from([2**63, -(2**63) - 1, 10**100, -(10**300), 10**4299])
_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | _huge_ints
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=30)
    | st.sampled_from(["", " ", "\x00", "\u202e", "'; DROP TABLE pa_operations; --", "{}"])
)
_json_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)


def _fitting(prop: dict[str, Any]) -> st.SearchStrategy[Any]:
    """Values of the type a schema property asks for (not necessarily meaningful ones)."""
    if "anyOf" in prop:
        return st.one_of(*(_fitting(option) for option in prop["anyOf"]))
    kind = prop.get("type")
    if kind == "string":
        return st.text(max_size=40) | st.sampled_from(
            ["trattoria", "2030-05-01", "20:00", "bk_0001", " bk_0001\t"]
        )
    if kind == "integer":
        return st.integers(min_value=-3, max_value=12) | _huge_ints
    if kind == "number":
        return st.floats(allow_nan=False, allow_infinity=False) | st.integers()
    if kind == "null":
        return st.none()
    if kind == "array":
        return st.lists(_fitting(prop.get("items", {})), max_size=4)
    if kind == "object":
        return st.dictionaries(st.text(max_size=8), _json_values, max_size=4)
    return _json_values


@st.composite
def _hostile_calls(draw: Callable[..., Any], schemas: dict[str, dict[str, Any]]) -> Any:
    tool = draw(st.sampled_from([*TOOL_NAMES, "no_such_tool"]))
    payload: dict[Any, Any] = {}
    for name, prop in schemas.get(tool, {}).items():
        choice = draw(st.sampled_from(["fitting", "fitting", "anything", "missing"]))
        if choice == "fitting":
            payload[name] = draw(_fitting(prop))
        elif choice == "anything":
            payload[name] = draw(_json_values)
    if draw(st.booleans()):
        payload.update(draw(st.dictionaries(st.text(max_size=12), _json_values, max_size=2)))
    form = draw(st.sampled_from(["mapping", "mapping", "text", "cut_text", "not_object", "junk"]))
    if form == "mapping":
        return tool, payload
    text = json.dumps(payload, ensure_ascii=draw(st.booleans()))
    if form == "text":
        return tool, text
    if form == "cut_text":
        return tool, text[: draw(st.integers(min_value=0, max_value=max(len(text) - 1, 0)))]
    if form == "not_object":
        return tool, json.dumps(draw(_json_values.filter(lambda v: not isinstance(v, dict))))
    return tool, draw(st.text(max_size=60))


def test_generated_hostile_payloads_never_crash_never_run_unvalidated_and_are_audited(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    restaurant = Restaurant(clock)
    schemas = {name: restaurant.definition(name).json_schema()["properties"] for name in TOOL_NAMES}
    numbers = itertools.count()
    with asyncio.Runner() as runner:
        runtime = runner.run(
            ActionRuntime.create(
                policy(TOOLS),
                authorizer=OwnBookingsOnly({"bk_0001": "alice"}),
                actions=restaurant.actions(TOOL_NAMES),
                ledger_url=sqlite_url(tmp_path),
                clock=clock,
            )
        )
        try:

            @settings(
                max_examples=100,
                deadline=None,
                database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
            )
            @given(call=_hostile_calls(schemas))
            def check(call: tuple[str, Any]) -> None:
                tool, arguments = call
                session = SessionState(f"hostile-{next(numbers)}", principal="alice")
                result = runner.run(runtime.propose(tool, arguments, session))
                runner.run(_check_outcome(runtime, session, result))
                assert restaurant.unvalidated() == []

            check()
        finally:
            runner.run(runtime.close(grace_secs=0))
    assert restaurant.unvalidated() == []


async def _check_outcome(
    runtime: ActionRuntime, session: SessionState, result: dict[str, Any]
) -> None:
    assert isinstance(result, dict), result
    assert isinstance(result.get("status"), str), result
    assert result.get("message"), result
    if result["status"] != "refused":
        return
    rows = await runtime.ledger.list(
        OperationFilter(session_id=session.session_id, status=[S.REJECTED])
    )
    assert len(rows) == 1, (result, rows)
    trail = await runtime.ledger.events(rows[0].operation_id)
    assert trail[-1].detail["reason"] == result["reason"], (result, trail[-1])
    assert rows[0].error


# --- hand-picked payloads ----------------------------------------------------------------


def _nested_dict(depth: int) -> dict[str, Any]:
    root: dict[str, Any] = {}
    current = root
    for _ in range(depth):
        current["a"] = {}
        current = current["a"]
    return root


def _nested_text(depth: int) -> str:
    return '{"a":' * depth + "{}" + "}" * depth


@pytest.mark.parametrize("tool", ["set_preferences", "book_table"])
@pytest.mark.parametrize("form", ["mapping", "text"])
@pytest.mark.parametrize("depth", [300, 900, 10_000])
async def test_deeply_nested_arguments_never_crash_admission(
    tmp_path: Path, clock: ManualClock, tool: str, form: str, depth: int
) -> None:
    restaurant = Restaurant(clock)
    # A cap large enough that every depth is parsed, not refused for its size.
    roomy = TOOLS.replace(str(CAP_BYTES), "200000")
    async with running(roomy, restaurant, ledger_url=sqlite_url(tmp_path), clock=clock) as rt:
        session = SessionState("call-1", principal="alice")
        field = "preferences" if tool == "set_preferences" else "restaurant_id"
        base = (
            {"booking_id": "bk_0001"}
            if tool == "set_preferences"
            else {"date": "2030-05-01", "time": "20:00", "party_size": 2}
        )
        if form == "mapping":
            arguments: Any = {**base, field: _nested_dict(depth)}
        else:
            arguments = json.dumps(base)[:-1] + f', "{field}": ' + _nested_text(depth) + "}"

        result = await rt.propose(tool, arguments, session)

        assert isinstance(result, dict), result
        assert result["status"] in {"refused", "committed"}, result
        if result["status"] == "refused":
            await assert_refusal_audited(rt, result, "invalid_arguments")
        assert restaurant.unvalidated() == []


@pytest.mark.parametrize(
    "arguments",
    [
        '{"booking_id": "bk_0001", "percent": NaN}',
        '{"booking_id": "bk_0001", "percent": Infinity}',
        '{"booking_id": "bk_0001", "percent": -Infinity}',
        '{"booking_id": "bk_0001", "percent": 1e999}',
        {"booking_id": "bk_0001", "percent": float("nan")},
        {"booking_id": "bk_0001", "percent": float("inf")},
    ],
    ids=["NaN", "Infinity", "-Infinity", "1e999", "nan-float", "inf-float"],
)
async def test_non_finite_numbers_are_refused_as_invalid_arguments(
    tmp_path: Path, clock: ManualClock, arguments: Any
) -> None:
    restaurant = Restaurant(clock)
    async with running(TOOLS, restaurant, ledger_url=sqlite_url(tmp_path), clock=clock) as rt:
        session = SessionState("call-1", principal="alice")

        result = await rt.propose("add_tip", arguments, session)

        await assert_refusal_audited(rt, result, "invalid_arguments")
        assert restaurant.received == []
        assert restaurant.effects["add_tip"] == 0


@pytest.mark.parametrize("form", ["mapping", "text"])
async def test_oversized_arguments_are_refused_unread_and_audited(
    ledger_url: str, clock: ManualClock, form: str
) -> None:
    restaurant = Restaurant(clock)
    async with running(TOOLS, restaurant, ledger_url=ledger_url, clock=clock) as rt:
        session = SessionState("call-1", principal="alice")
        for tool in TOOL_NAMES:
            payload = {"booking_id": "bk_0001", "note": "é" * CAP_BYTES}
            arguments: Any = payload if form == "mapping" else json.dumps(payload)

            result = await rt.propose(tool, arguments, session)

            op = await assert_refusal_audited(rt, result, "payload_too_large")
            assert op.tool == tool
            assert op.args["oversized_arguments_bytes"] > CAP_BYTES
            assert str(CAP_BYTES) in result["message"]
        assert restaurant.received == []


HOSTILE_IDS = {
    "nul": "bk_0001\x00",
    "long": "bk_" + "9" * 3000,
    "control": "bk_\x1b[2J\x07",
    "bidi": "bk_\u202e1000",
    "emoji": "bk_" + "\U0001f600" * 300,
}


@pytest.mark.parametrize("hostile", list(HOSTILE_IDS.values()), ids=list(HOSTILE_IDS))
async def test_hostile_identifiers_in_a_resource_are_refused_or_run_without_crashing(
    ledger_url: str, clock: ManualClock, hostile: str
) -> None:
    restaurant = Restaurant(clock)
    authorizer = OwnBookingsOnly({"bk_0001": "alice", hostile: "alice"})
    async with running(
        TOOLS, restaurant, ledger_url=ledger_url, clock=clock, authorizer=authorizer
    ) as rt:
        alice = SessionState("call-a", principal="alice")
        mallory = SessionState("call-m", principal="mallory")

        refused = await rt.propose("cancel_booking", {"booking_id": hostile}, mallory)
        admitted = await rt.propose("cancel_booking", {"booking_id": hostile}, alice)

        await assert_refusal_audited(rt, refused, "not_authorized")
        assert isinstance(admitted, dict), admitted
        assert admitted["status"] in {"failed_final", "refused"}, admitted
        if admitted["status"] == "failed_final":
            op = await rt.ledger.get(admitted["operation_id"])
            assert op.args["booking_id"] == hostile
        assert restaurant.sor.side_effects["cancel"] == 0
        assert restaurant.unvalidated() == []


async def test_a_lone_surrogate_in_json_text_is_refused_and_audited(
    ledger_url: str, clock: ManualClock
) -> None:
    restaurant = Restaurant(clock)
    async with running(TOOLS, restaurant, ledger_url=ledger_url, clock=clock) as rt:
        session = SessionState("call-1", principal="alice")

        result = await rt.propose("cancel_booking", '{"booking_id": "bk_\\ud800"}', session)

        await assert_refusal_audited(rt, result, "invalid_arguments")
        assert restaurant.received == []
