"""`canonical_json` calls the C encoder itself: its text and its errors are the encoder's."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipecat_actions.ledger.records import canonical_json

REFERENCE = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
).encode

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_canonical_text_and_refusals_are_the_json_encoders(value: Any) -> None:
    try:
        expected = REFERENCE(value)
    except ValueError as exc:  # NaN or infinity
        with pytest.raises(ValueError, match=str(exc)):
            canonical_json(value)
        return
    assert canonical_json(value) == expected


def _circular() -> dict[str, Any]:
    loop: dict[str, Any] = {}
    loop["self"] = loop
    return loop


@pytest.mark.parametrize(
    "value",
    [{"a": object()}, {"a": {1, 2}}, {(1, 2): 3}, {1: 2, "a": 3}, {"a": math.nan}, _circular()],
)
def test_what_json_cannot_hold_is_refused_as_the_encoder_refuses_it(value: Any) -> None:
    with pytest.raises((TypeError, ValueError)) as expected:
        REFERENCE(value)
    with pytest.raises(expected.type, match=None) as got:
        canonical_json(value)
    assert str(got.value) == str(expected.value)
    # The encoder of a call that failed is not reused: a later call is not misled by it.
    assert canonical_json({"self": {"n": 1}}) == '{"self":{"n":1}}'
