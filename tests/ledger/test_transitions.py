"""The `Ledger` contract for transition and annotate, on every backend."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from pipecat_actions.clock import ManualClock
from pipecat_actions.errors import (
    IllegalTransition,
    OperationNotFound,
    StaleFence,
    UnexpectedStatus,
)
from pipecat_actions.ledger import CHANGEABLE_FIELDS, EventKind, SqlLedger
from pipecat_actions.status import ActionStatus

from ._support import T0, S, assert_trail_is_contiguous, event_rows, new_op, snapshot

# --- transition --------------------------------------------------------------------------------


async def test_transitions_through_the_whole_machine_leave_an_exact_audit_trail(
    ledger: SqlLedger, clock: ManualClock
) -> None:
    op = (await ledger.admit(new_op("k", operation_id="op_1"))).operation
    steps: list[tuple[ActionStatus, ActionStatus, dict[str, Any] | None]] = [
        (S.ADMITTED, S.RUNNING, None),
        (S.RUNNING, S.FAILED_RETRYABLE, {"error": "503"}),
        (S.FAILED_RETRYABLE, S.RUNNING, {"retry": 1}),
        (S.RUNNING, S.UNKNOWN, {"error": "timeout after send"}),
        (S.UNKNOWN, S.COMMITTED, {"reconciled": True}),
        (S.COMMITTED, S.COMPENSATING, None),
        (S.COMPENSATING, S.COMPENSATED, {"by": "op_2"}),
    ]
    seen: list[Any] = []
    for index, (src, dst, detail) in enumerate(steps, start=1):
        clock.advance(10)
        op = await ledger.transition(
            "op_1", expected=src, to=dst, fence=1, actor=f"runtime:{index}", detail=detail
        )
        assert op.status is dst and op.event_seq == index + 1
        assert op.updated_at == T0 + 10 * index
        seen.append(op)

    first_run, failed, second_run, unknown, committed, compensating, compensated = seen
    assert (first_run.attempt, first_run.started_at, first_run.sent_at) == (1, T0 + 10, T0 + 10)
    assert first_run.finished_at is None
    assert failed.attempt == 1 and failed.finished_at is None
    # The second attempt counts, is sent again, and keeps the first start time.
    assert (second_run.attempt, second_run.started_at, second_run.sent_at) == (
        2,
        T0 + 10,
        T0 + 30,
    )
    assert unknown.attempt == 2 and unknown.finished_at is None and unknown.committed_at is None
    assert committed.committed_at == committed.finished_at == T0 + 50
    assert compensating.committed_at == T0 + 50
    assert compensated.finished_at == T0 + 70
    assert compensated.committed_at == T0 + 50
    assert await ledger.get("op_1") == compensated

    trail = await ledger.events("op_1")
    assert event_rows(trail) == [
        (1, EventKind.CREATED, S.REQUESTED, S.ADMITTED, "runtime", None),
        *(
            (index + 1, EventKind.TRANSITION, src, dst, f"runtime:{index}", detail)
            for index, (src, dst, detail) in enumerate(steps, start=1)
        ),
    ]
    assert [e.at for e in trail] == [T0 + 10 * i for i in range(len(steps) + 1)]
    assert all(e.operation_id == "op_1" for e in trail)
    assert_trail_is_contiguous(compensated, trail)


async def test_terminal_transition_stamps_finished_at(
    ledger: SqlLedger, clock: ManualClock
) -> None:
    op = (await ledger.admit(new_op("k"))).operation
    clock.advance(3)

    cancelled = await ledger.transition(
        op.operation_id, expected=S.ADMITTED, to=S.CANCELLED, fence=1, actor="runtime"
    )

    assert cancelled.finished_at == T0 + 3
    assert cancelled.committed_at is None and cancelled.attempt == 0


async def test_illegal_transition_is_refused_and_nothing_is_written(
    ledger: SqlLedger, clock: ManualClock
) -> None:
    op = (await ledger.admit(new_op("k"))).operation
    before = await snapshot(ledger, op.operation_id)
    clock.advance(1)

    with pytest.raises(IllegalTransition) as refused:
        await ledger.transition(
            op.operation_id, expected=S.ADMITTED, to=S.COMMITTED, fence=1, actor="runtime"
        )

    assert (refused.value.from_status, refused.value.to_status) == (S.ADMITTED, S.COMMITTED)
    assert await snapshot(ledger, op.operation_id) == before


async def test_transition_from_a_status_the_operation_left_is_refused_and_nothing_is_written(
    ledger: SqlLedger, clock: ManualClock
) -> None:
    op = (await ledger.admit(new_op("k"))).operation
    before = await snapshot(ledger, op.operation_id)
    clock.advance(1)

    with pytest.raises(UnexpectedStatus) as refused:
        await ledger.transition(
            op.operation_id, expected=S.RUNNING, to=S.COMMITTED, fence=1, actor="runtime"
        )

    assert refused.value.operation_id == op.operation_id
    assert refused.value.actual_status == S.ADMITTED
    assert refused.value.expected_status == S.RUNNING
    assert await snapshot(ledger, op.operation_id) == before


async def test_transition_under_another_fence_is_refused_and_nothing_is_written(
    ledger: SqlLedger, clock: ManualClock
) -> None:
    op = (await ledger.admit(new_op("k"))).operation
    before = await snapshot(ledger, op.operation_id)
    clock.advance(1)

    with pytest.raises(StaleFence) as refused:
        await ledger.transition(
            op.operation_id, expected=S.ADMITTED, to=S.RUNNING, fence=0, actor="runtime"
        )

    assert (refused.value.given_fence, refused.value.actual_fence) == (0, 1)
    assert refused.value.actual_status == S.ADMITTED
    assert await snapshot(ledger, op.operation_id) == before


async def test_transition_of_an_unknown_operation_is_refused(ledger: SqlLedger) -> None:
    with pytest.raises(OperationNotFound) as refused:
        await ledger.transition(
            "op_missing", expected=S.ADMITTED, to=S.RUNNING, fence=1, actor="runtime"
        )

    assert refused.value.operation_id == "op_missing"
    assert await ledger.events("op_missing") == []
    assert await ledger.list() == []


async def test_unknown_change_fields_are_refused_and_nothing_is_written(
    ledger: SqlLedger, clock: ManualClock
) -> None:
    op = (await ledger.admit(new_op("k"))).operation
    before = await snapshot(ledger, op.operation_id)
    clock.advance(1)

    for forbidden in ({"status": "COMMITTED"}, {"fence": 9}, {"args_json": "{}"}, {"attempt": 5}):
        with pytest.raises(ValueError, match="cannot change"):
            await ledger.transition(
                op.operation_id,
                expected=S.ADMITTED,
                to=S.RUNNING,
                fence=1,
                actor="runtime",
                changes={"error": "fine", **forbidden},
            )
        with pytest.raises(ValueError, match="cannot change"):
            await ledger.annotate(op.operation_id, actor="runtime", changes=forbidden)

    assert await snapshot(ledger, op.operation_id) == before


async def test_allowed_changes_are_applied_with_the_transition_and_json_is_canonical(
    ledger: SqlLedger, clock: ManualClock
) -> None:
    op = (await ledger.admit(new_op("k"))).operation
    clock.advance(1)

    running = await ledger.transition(
        op.operation_id,
        expected=S.ADMITTED,
        to=S.RUNNING,
        fence=1,
        actor="runtime",
        changes={
            "before_state": {"tables": [7, 8], "at": "21:00"},
            "deadline_at": T0 + 120,
            "provider_call_id": "call-9",
            "sent_at": T0 + 0.5,
        },
    )
    committed = await ledger.transition(
        op.operation_id,
        expected=S.RUNNING,
        to=S.COMMITTED,
        fence=1,
        actor="runtime",
        changes={"result": {"booking": "B-1", "amount": 12.5}, "error": None},
    )

    assert running.before_state_json == '{"at":"21:00","tables":[7,8]}'
    assert running.before_state == {"tables": [7, 8], "at": "21:00"}
    assert (running.deadline_at, running.provider_call_id) == (T0 + 120, "call-9")
    assert running.sent_at == T0 + 0.5
    assert committed.result_json == '{"amount":12.5,"booking":"B-1"}'
    assert committed.result == {"booking": "B-1", "amount": 12.5}
    assert committed.before_state == running.before_state
    assert await ledger.get(op.operation_id) == committed


@pytest.mark.parametrize(
    "changes",
    [
        pytest.param({"result": {"ids": {1, 2}}}, id="set-result"),
        pytest.param({"before_state": {"price": math.nan}}, id="nan-before-state"),
    ],
)
async def test_unencodable_json_changes_are_refused_and_nothing_is_written(
    ledger: SqlLedger, changes: dict[str, Any]
) -> None:
    op = (await ledger.admit(new_op("k", status=S.RUNNING))).operation
    before = await snapshot(ledger, op.operation_id)

    with pytest.raises((TypeError, ValueError)):
        await ledger.transition(
            op.operation_id, expected=S.RUNNING, to=S.COMMITTED, fence=1, actor="r", changes=changes
        )
    with pytest.raises((TypeError, ValueError)):
        await ledger.annotate(op.operation_id, actor="r", changes=changes)

    assert await snapshot(ledger, op.operation_id) == before


def test_changeable_fields_are_exactly_the_documented_ones() -> None:
    assert set(CHANGEABLE_FIELDS) == {
        "result",
        "before_state",
        "error",
        "deadline_at",
        "sent_at",
        "delivered_at",
        "delivered_agent",
        "acknowledged_at",
        "delivered_status",
        "escalated_at",
        "provider_call_id",
        "model_response_id",
    }


async def test_unencodable_transition_detail_is_refused_and_nothing_is_written(
    ledger: SqlLedger, clock: ManualClock
) -> None:
    # The Ledger promises a row change and its audit event commit together or not at all.
    op = (await ledger.admit(new_op("k"))).operation
    before = await snapshot(ledger, op.operation_id)
    clock.advance(1)

    with pytest.raises((TypeError, ValueError)):
        await asyncio.wait_for(
            ledger.transition(
                op.operation_id,
                expected=S.ADMITTED,
                to=S.RUNNING,
                fence=1,
                actor="runtime",
                detail={"latency": math.nan},
            ),
            5,
        )

    assert await snapshot(ledger, op.operation_id) == before


async def test_unencodable_annotation_detail_is_refused_and_the_ledger_keeps_working(
    ledger: SqlLedger,
) -> None:
    op = (await ledger.admit(new_op("k"))).operation
    before = await snapshot(ledger, op.operation_id)

    with pytest.raises((TypeError, ValueError)):
        await asyncio.wait_for(
            ledger.annotate(op.operation_id, actor="runtime", detail={"tags": {"a", "b"}}), 5
        )

    assert await snapshot(ledger, op.operation_id) == before
    later = await asyncio.wait_for(ledger.admit(new_op("k2")), 5)
    assert later.created is True


# --- annotate ----------------------------------------------------------------------------------


async def test_annotate_records_changes_and_an_event_without_moving_the_status(
    ledger: SqlLedger, clock: ManualClock
) -> None:
    op = (await ledger.admit(new_op("k", status=S.RUNNING))).operation
    clock.advance(4)

    annotated = await ledger.annotate(
        op.operation_id,
        actor="gate",
        detail={"policy": "in_place"},
        changes={"delivered_at": T0 + 4, "delivered_agent": "concierge"},
    )

    assert annotated.status is S.RUNNING
    assert (annotated.delivered_at, annotated.delivered_agent) == (T0 + 4, "concierge")
    assert (annotated.event_seq, annotated.updated_at, annotated.attempt) == (3, T0 + 4, 1)
    assert annotated.fence == op.fence
    assert event_rows(await ledger.events(op.operation_id))[-1] == (
        3,
        EventKind.ANNOTATION,
        S.RUNNING,
        S.RUNNING,
        "gate",
        {"policy": "in_place"},
    )


async def test_annotate_with_matching_expected_status_and_fence_is_applied(
    ledger: SqlLedger,
) -> None:
    op = (await ledger.admit(new_op("k"))).operation

    annotated = await ledger.annotate(
        op.operation_id,
        actor="watchdog",
        changes={"escalated_at": T0},
        expected=S.ADMITTED,
        fence=1,
    )

    assert annotated.escalated_at == T0
    assert annotated.event_seq == 2


@pytest.mark.parametrize(
    ("guard", "refusal"),
    [
        pytest.param({"expected": S.RUNNING}, UnexpectedStatus, id="expected"),
        pytest.param({"fence": 7}, StaleFence, id="fence"),
        pytest.param({"expected": S.ADMITTED, "fence": 2}, StaleFence, id="both-fence-stale"),
    ],
)
async def test_annotate_with_a_losing_guard_is_refused_and_nothing_is_written(
    ledger: SqlLedger, guard: dict[str, Any], refusal: type[Exception]
) -> None:
    op = (await ledger.admit(new_op("k"))).operation
    before = await snapshot(ledger, op.operation_id)

    with pytest.raises(refusal):
        await ledger.annotate(op.operation_id, actor="gate", changes={"delivered_at": T0}, **guard)

    assert await snapshot(ledger, op.operation_id) == before


async def test_a_stale_owner_is_told_its_fence_is_stale_even_after_the_status_moved(
    ledger: SqlLedger, clock: ManualClock
) -> None:
    op = (await ledger.admit(new_op("k", lease_owner="old", lease_secs=5))).operation
    clock.advance(10)
    [claimed] = await ledger.claim_stale("new", lease_secs=30, limit=10)
    await ledger.transition(
        op.operation_id, expected=S.ADMITTED, to=S.RUNNING, fence=claimed.fence, actor="new"
    )

    with pytest.raises(StaleFence):
        await ledger.transition(
            op.operation_id, expected=S.ADMITTED, to=S.RUNNING, fence=1, actor="old"
        )


async def test_annotate_of_an_unknown_operation_is_refused(ledger: SqlLedger) -> None:
    with pytest.raises(OperationNotFound):
        await ledger.annotate("op_missing", actor="gate", changes={"delivered_at": T0})

    assert await ledger.events("op_missing") == []


async def test_failed_compensation_keeps_the_original_commit_time(
    ledger: SqlLedger, clock: ManualClock
) -> None:
    op = (await ledger.admit(new_op(status=S.RUNNING))).operation
    committed = await ledger.transition(
        op.operation_id, expected=S.RUNNING, to=S.COMMITTED, fence=op.fence, actor="t"
    )
    clock.advance(60)
    await ledger.transition(
        op.operation_id, expected=S.COMMITTED, to=S.COMPENSATING, fence=op.fence, actor="t"
    )
    clock.advance(60)
    back = await ledger.transition(
        op.operation_id, expected=S.COMPENSATING, to=S.COMMITTED, fence=op.fence, actor="t"
    )
    assert back.committed_at == committed.committed_at
    assert back.finished_at == clock.now()
