"""An `Operation` built from a row through its slots is the one its ``__init__`` builds."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipecat_actions.ledger._rows import OPERATION_COLUMNS, operation_from_row
from pipecat_actions.ledger.records import Operation
from pipecat_actions.status import ActionStatus

_VALUE = st.one_of(st.none(), st.text(max_size=8), st.integers(), st.floats(allow_nan=False))


@st.composite
def _rows(draw: st.DrawFn) -> dict[str, Any]:
    row: dict[str, Any] = {name: draw(_VALUE) for name in OPERATION_COLUMNS}
    row["status"] = draw(st.sampled_from(ActionStatus)).value
    row["delivered_status"] = draw(st.none() | st.sampled_from([s.value for s in ActionStatus]))
    row["trail_marks"] = draw(st.integers())  # a column `Operation` does not have
    return row


@given(_rows())
def test_an_operation_from_a_row_equals_the_one_its_init_builds(row: dict[str, Any]) -> None:
    told = row["delivered_status"]
    expected = Operation(
        **{name: row[name] for name in OPERATION_COLUMNS}
        | {
            "status": ActionStatus(row["status"]),
            "delivered_status": None if told is None else ActionStatus(told),
        }
    )

    built = operation_from_row(row)

    assert built == expected
    assert dataclasses.astuple(built) == dataclasses.astuple(expected)
    assert type(built.status) is ActionStatus


def test_an_operation_from_a_row_is_frozen_like_any_other() -> None:
    row = {name: None for name in OPERATION_COLUMNS} | {"status": "RUNNING"}
    built = operation_from_row(row)
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.status = ActionStatus.COMMITTED  # type: ignore[misc]
    assert dataclasses.replace(built, attempt=2).attempt == 2
