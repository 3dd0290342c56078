"""The `Ledger` contract for admit, record_refusal and idempotency windows, on every backend."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import pytest

from pipecat_actions.clock import ManualClock
from pipecat_actions.errors import (
    IdempotencyMismatch,
    IllegalTransition,
    LedgerIntegrityError,
    OperationNotFound,
)
from pipecat_actions.ledger import EventKind, SqlLedger, hash_arguments
from pipecat_actions.status import ActionStatus

from ._support import T0, S, event_rows, new_op, snapshot

ARGS = new_op().args


# --- admit -------------------------------------------------------------------------------------


async def test_admit_creates_an_admitted_operation_with_one_creation_event(
    ledger: SqlLedger, clock: ManualClock
) -> None:
    result = await ledger.admit(
        new_op("k", operation_id="op_first", resource_key="table:7", turn_id="turn-3")
    )

    assert result.created is True
    op = result.operation
    assert op.operation_id == "op_first"
    assert (op.status, op.attempt, op.fence, op.event_seq) == (S.ADMITTED, 0, 1, 1)
    assert op.args == ARGS
    assert op.args_json == '{"party":2,"restaurant":"Chez Test","time":"21:00"}'
    assert op.args_hash == hash_arguments(ARGS)
    assert (op.tenant, op.idempotency_key, op.key_expires_at) == ("default", "k", T0 + 86_400)
    assert (op.resource_key, op.turn_id) == ("table:7", "turn-3")
    assert op.created_at == op.updated_at == op.admitted_at == T0
    assert op.sent_at is op.started_at is op.finished_at is op.committed_at is None
    assert await ledger.get("op_first") == op
    assert event_rows(await ledger.events("op_first")) == [
        (1, EventKind.CREATED, S.REQUESTED, S.ADMITTED, "runtime", None)
    ]


async def test_same_key_and_arguments_returns_the_existing_operation_and_writes_nothing(
    ledger: SqlLedger, clock: ManualClock
) -> None:
    first = (await ledger.admit(new_op("k", operation_id="op_first"))).operation
    clock.advance(5)
    # Same intent proposed again: other call id, other operation id, keys in another order.
    reordered = dict(reversed(list(ARGS.items())))
    again = await ledger.admit(
        new_op("k", operation_id="op_second", args=reordered, provider_call_id="call-2")
    )

    assert again.created is False
    assert again.operation == first
    assert await ledger.list() == [first]
    assert len(await ledger.events("op_first")) == 1
    with pytest.raises(OperationNotFound):
        await ledger.get("op_second")


async def test_same_key_returns_the_operation_in_its_current_status(ledger: SqlLedger) -> None:
    op = (await ledger.admit(new_op("k"))).operation
    running = await ledger.transition(
        op.operation_id, expected=S.ADMITTED, to=S.RUNNING, fence=1, actor="runtime"
    )

    again = await ledger.admit(new_op("k"))

    assert again.created is False
    assert again.operation == running


async def test_same_key_different_arguments_is_refused_and_changes_nothing(
    ledger: SqlLedger, clock: ManualClock
) -> None:
    op = (await ledger.admit(new_op("k", operation_id="op_first"))).operation
    before = await snapshot(ledger, op.operation_id)
    clock.advance(1)
    other_args = {**ARGS, "time": "21:30"}

    with pytest.raises(IdempotencyMismatch) as refused:
        await ledger.admit(new_op("k", operation_id="op_second", args=other_args))

    assert refused.value.operation_id == "op_first"
    assert (refused.value.tenant, refused.value.idempotency_key) == ("default", "k")
    assert refused.value.expected_args_hash == hash_arguments(ARGS)
    assert refused.value.given_args_hash == hash_arguments(other_args)
    assert refused.value.retryable is False
    assert await snapshot(ledger, op.operation_id) == before
    assert await ledger.list() == [before[0]]
    assert await ledger.events("op_second") == []


async def test_idempotency_keys_are_isolated_per_tenant(ledger: SqlLedger) -> None:
    acme = await ledger.admit(new_op("shared-key", tenant="acme"))
    globex = await ledger.admit(new_op("shared-key", tenant="globex", args={"other": True}))

    assert acme.created is True and globex.created is True
    assert acme.operation.operation_id != globex.operation.operation_id
    assert await ledger.find_by_key("acme", "shared-key") == acme.operation
    assert await ledger.find_by_key("globex", "shared-key") == globex.operation
    assert await ledger.find_by_key("default", "shared-key") is None
    again = await ledger.admit(new_op("shared-key", tenant="acme"))
    assert again.created is False and again.operation == acme.operation


async def test_key_within_its_window_stays_bound(ledger: SqlLedger, clock: ManualClock) -> None:
    op = (await ledger.admit(new_op("k", idempotency_window_secs=60))).operation
    clock.advance(59.5)

    assert await ledger.find_by_key("default", "k") == op
    with pytest.raises(IdempotencyMismatch):
        await ledger.admit(new_op("k", args={"different": 1}))
    assert (await ledger.admit(new_op("k"))).operation == op


async def test_key_whose_window_passed_is_released_audited_and_bound_to_the_new_operation(
    ledger: SqlLedger, clock: ManualClock
) -> None:
    old = (
        await ledger.admit(new_op("k", operation_id="op_old", idempotency_window_secs=60))
    ).operation
    clock.advance(61)

    assert await ledger.find_by_key("default", "k") is None
    # Other arguments are no mismatch any more: the key is free.
    fresh = await ledger.admit(
        new_op("k", operation_id="op_new", args={"time": "22:00"}, idempotency_window_secs=60)
    )

    assert fresh.created is True
    assert fresh.operation.key_expires_at == T0 + 61 + 60
    assert await ledger.find_by_key("default", "k") == fresh.operation
    old_after, old_trail = await snapshot(ledger, "op_old")
    assert old_after.status is S.ADMITTED
    assert old_after.event_seq == 2
    assert old_after.idempotency_key == "k"
    assert event_rows(old_trail[:1]) == [
        (1, EventKind.CREATED, S.REQUESTED, S.ADMITTED, "runtime", None)
    ]
    released = old_trail[1]
    assert (released.seq, released.kind, released.from_status, released.to_status) == (
        2,
        EventKind.KEY_RELEASED,
        S.ADMITTED,
        S.ADMITTED,
    )
    assert released.at == T0 + 61
    assert released.actor == "ledger"
    assert released.detail["key_expires_at"] == old.key_expires_at
    # The new binding behaves like any other: same arguments return it, others are refused.
    assert (await ledger.admit(new_op("k", args={"time": "22:00"}))).operation == fresh.operation
    with pytest.raises(IdempotencyMismatch):
        await ledger.admit(new_op("k"))


async def test_find_by_key_and_admit_agree_at_the_exact_end_of_the_window(
    ledger: SqlLedger, clock: ManualClock
) -> None:
    old = (await ledger.admit(new_op("k", idempotency_window_secs=60))).operation
    clock.advance(60)

    found = await ledger.find_by_key("default", "k")
    again = await ledger.admit(new_op("k"))

    if found is None:
        assert again.created is True and again.operation.operation_id != old.operation_id
    else:
        assert again.created is False and again.operation == found


async def test_admit_straight_to_running_audits_both_steps_and_starts_attempt_one(
    ledger: SqlLedger,
) -> None:
    result = await ledger.admit(
        new_op("k", status=S.RUNNING, lease_owner="worker-a", lease_secs=30, actor="runtime:a")
    )

    op = result.operation
    assert (op.status, op.attempt, op.event_seq) == (S.RUNNING, 1, 2)
    assert op.admitted_at == op.started_at == op.sent_at == T0
    assert (op.lease_owner, op.lease_expires_at) == ("worker-a", T0 + 30)
    assert op.finished_at is None
    assert event_rows(await ledger.events(op.operation_id)) == [
        (1, EventKind.CREATED, S.REQUESTED, S.ADMITTED, "runtime:a", None),
        (2, EventKind.CREATED, S.ADMITTED, S.RUNNING, "runtime:a", None),
    ]


@pytest.mark.parametrize("waiting", [S.AWAITING_APPROVAL, S.AWAITING_CONFIRMATION])
async def test_admit_into_a_waiting_status_then_approval_admits_it(
    ledger: SqlLedger, clock: ManualClock, waiting: ActionStatus
) -> None:
    op = (await ledger.admit(new_op("k", status=waiting, detail={"policy": "ask"}))).operation
    assert (op.status, op.attempt, op.admitted_at, op.event_seq) == (waiting, 0, None, 1)
    clock.advance(30)

    admitted = await ledger.transition(
        op.operation_id, expected=waiting, to=S.ADMITTED, fence=1, actor="approver:bob"
    )

    assert admitted.admitted_at == T0 + 30
    assert event_rows(await ledger.events(op.operation_id)) == [
        (1, EventKind.CREATED, S.REQUESTED, waiting, "runtime", {"policy": "ask"}),
        (2, EventKind.TRANSITION, waiting, S.ADMITTED, "approver:bob", None),
    ]


@pytest.mark.parametrize(
    "status",
    sorted(set(S) - {S.ADMITTED, S.RUNNING} - {S.AWAITING_APPROVAL, S.AWAITING_CONFIRMATION}),
)
async def test_admit_refuses_a_status_a_new_operation_cannot_start_in(
    ledger: SqlLedger, status: ActionStatus
) -> None:
    with pytest.raises((ValueError, IllegalTransition)):
        await ledger.admit(new_op("k", status=status))

    assert await ledger.list() == []
    assert await ledger.find_by_key("default", "k") is None


@pytest.mark.parametrize(
    "args",
    [
        pytest.param({"seats": {1, 2}}, id="set"),
        pytest.param({"price": math.nan}, id="nan"),
        pytest.param({"price": math.inf}, id="infinity"),
        pytest.param({"when": object()}, id="object"),
    ],
)
async def test_unencodable_arguments_are_refused_clearly_and_nothing_is_written(
    ledger: SqlLedger, args: dict[str, Any]
) -> None:
    with pytest.raises((TypeError, ValueError)):
        await ledger.admit(new_op("k", args=args))

    assert await ledger.list() == []
    assert await ledger.find_by_key("default", "k") is None
    # The ledger is still usable afterwards.
    assert (await ledger.admit(new_op("k"))).created is True


async def test_unencodable_creation_detail_is_refused_and_nothing_is_written(
    ledger: SqlLedger,
) -> None:
    # The Ledger promises a row change and its audit event commit together or not at all.
    with pytest.raises((TypeError, ValueError)):
        await asyncio.wait_for(ledger.admit(new_op("k", detail={"score": math.nan})), 5)

    assert await ledger.list() == []
    assert await ledger.find_by_key("default", "k") is None


# --- record_refusal ----------------------------------------------------------------------------


async def test_record_refusal_is_audited_and_does_not_bind_the_key(
    ledger: SqlLedger, clock: ManualClock
) -> None:
    refused = await ledger.record_refusal(
        new_op("k", operation_id="op_refused", error="not authorized", actor="admission")
    )

    assert refused.status is S.REJECTED
    assert refused.finished_at == T0
    assert refused.error == "not authorized"
    assert refused.args == ARGS
    assert event_rows(await ledger.events("op_refused")) == [
        (1, EventKind.CREATED, S.REQUESTED, S.REJECTED, "admission", None)
    ]
    assert await ledger.find_by_key("default", "k") is None
    clock.advance(1)
    admitted = await ledger.admit(new_op("k", operation_id="op_admitted"))
    assert admitted.created is True
    assert admitted.operation.operation_id == "op_admitted"
    # Refusing the same key again still records, and still leaves the binding alone.
    await ledger.record_refusal(new_op("k", operation_id="op_refused_again"))
    assert await ledger.find_by_key("default", "k") == admitted.operation
    assert [op.operation_id for op in await ledger.list()] == [
        "op_refused",
        "op_admitted",
        "op_refused_again",
    ]


async def test_record_refusal_with_unencodable_arguments_still_records(ledger: SqlLedger) -> None:
    refused = await ledger.record_refusal(new_op("k", args={"seats": {1, 2}, "price": math.nan}))

    assert refused.status is S.REJECTED
    stored = await ledger.get(refused.operation_id)
    assert stored == refused
    assert "unencodable_arguments" in stored.args
    assert len(await ledger.events(refused.operation_id)) == 1
    assert await ledger.find_by_key("default", "k") is None


async def test_same_key_and_arguments_for_another_tool_is_a_mismatch(ledger: SqlLedger) -> None:
    first = (await ledger.admit(new_op("shared-key"))).operation
    with pytest.raises(IdempotencyMismatch) as info:
        await ledger.admit(new_op("shared-key", tool="cancel_booking"))
    assert info.value.operation_id == first.operation_id
    assert await snapshot(ledger, first.operation_id) == (
        first,
        await ledger.events(first.operation_id),
    )


async def test_duplicate_operation_id_is_an_integrity_error_that_is_not_retryable(
    ledger: SqlLedger,
) -> None:
    first = (await ledger.admit(new_op("key-a"))).operation
    with pytest.raises(LedgerIntegrityError) as info:
        await ledger.admit(new_op("key-b", operation_id=first.operation_id))
    assert info.value.retryable is False
    assert await ledger.find_by_key("default", "key-b") is None


async def test_compensating_an_unknown_operation_is_an_integrity_error(ledger: SqlLedger) -> None:
    with pytest.raises(LedgerIntegrityError):
        await ledger.admit(new_op("key-c", compensates="op_does_not_exist"))
