"""`ToolResult`: the typed answer of a call, still the plain dict the model and Pipecat read."""

from __future__ import annotations

import copy
import json

import pytest

from pipecat_actions.results import ToolResult, refusal_result, render
from pipecat_actions.status import TERMINAL_STATUSES, ActionStatus


# REQUESTED is the reporter's word before admission; no operation is ever rendered in it.
@pytest.mark.parametrize("status", [s for s in ActionStatus if s is not ActionStatus.REQUESTED])
def test_every_rendered_status_reads_back_as_the_same_action_status(status: ActionStatus) -> None:
    result = render(status, tool="book_table", operation_id="op_1", reconcilable=True)
    assert result.status is status
    assert result.said == status.value.lower()
    assert result.operation_id == "op_1"
    assert result.final is (status in TERMINAL_STATUSES)
    assert not result.refused


def test_a_refusal_has_no_status_of_the_machine_and_says_it_was_refused() -> None:
    result = refusal_result("No such table.", code="validation")
    assert result.refused and result.status is None and result.operation_id is None
    assert result.message == "No such table."


def test_it_stays_the_dict_on_the_wire() -> None:
    result = render(ActionStatus.COMMITTED, tool="t", operation_id="op", value={"id": 7})
    plain = {"status": "committed", "operation_id": "op", "message": "Done: t succeeded.",
             "result": {"id": 7}}  # fmt: skip
    assert result == plain
    assert json.loads(result.to_json()) == plain == json.loads(json.dumps(result))
    assert copy.deepcopy(result) == plain and type(copy.deepcopy(result)) is ToolResult


def test_an_applications_own_result_is_wrapped_without_claiming_a_status() -> None:
    own = ToolResult.of({"status": "booked", "table": 4})
    assert own.said == "booked" and own.status is None and not own.final
    assert ToolResult.of("a plain string") == {} and ToolResult.of(None).said is None
    already = render(ActionStatus.UNKNOWN, tool="t", operation_id="op")
    assert ToolResult.of(already) is already
