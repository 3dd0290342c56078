"""The `Ledger` contract for get, list, find_by_key and events, on every backend."""

from __future__ import annotations

import pytest

from pipecat_actions.clock import ManualClock
from pipecat_actions.errors import LedgerError, OperationNotFound
from pipecat_actions.ledger import EventKind, OperationFilter, SqlLedger
from pipecat_actions.status import TERMINAL_STATUSES

from ._support import T0, S, assert_trail_is_contiguous, new_op


async def test_get_of_an_unknown_operation_raises_operation_not_found(ledger: SqlLedger) -> None:
    with pytest.raises(OperationNotFound) as missing:
        await ledger.get("op_nope")

    assert missing.value.operation_id == "op_nope"
    assert isinstance(missing.value, LedgerError)
    assert await ledger.find_by_key("default", "nope") is None


async def _three_sessions(ledger: SqlLedger, clock: ManualClock) -> list[str]:
    """Create three operations ten seconds apart, each differing in every filtered field."""
    ids = []
    specs = [
        ("op_c", "s1", "book_table", "acme", "user:alice", "table:1"),
        ("op_b", "s2", "pay", "acme", "user:bob", "table:2"),
        ("op_a", "s1", "pay", "globex", "user:alice", "table:1"),
    ]
    for op_id, session, tool, tenant, principal, resource in specs:
        # Ids sort in the opposite order of creation: ordering must come from created_at.
        await ledger.admit(
            new_op(
                f"key-{op_id}",
                operation_id=op_id,
                session_id=session,
                tool=tool,
                tenant=tenant,
                principal=principal,
                resource_key=resource,
            )
        )
        ids.append(op_id)
        clock.advance(10)
    return ids


async def test_list_returns_oldest_first(ledger: SqlLedger, clock: ManualClock) -> None:
    ids = await _three_sessions(ledger, clock)

    listed = await ledger.list()

    assert [op.operation_id for op in listed] == ids == ["op_c", "op_b", "op_a"]
    assert [op.created_at for op in listed] == [T0, T0 + 10, T0 + 20]
    assert await ledger.list(None) == listed


async def test_list_newest_first_pages_towards_older_operations(
    ledger: SqlLedger, clock: ManualClock
) -> None:
    await _three_sessions(ledger, clock)

    first = await ledger.list(OperationFilter(newest_first=True, limit=2))
    cursor = (first[-1].created_at, first[-1].operation_id)
    rest = await ledger.list(OperationFilter(newest_first=True, limit=2, after=cursor))
    of_a_tool = await ledger.list(OperationFilter(tool="pay", newest_first=True))

    assert [op.operation_id for op in first] == ["op_a", "op_b"]
    assert [op.operation_id for op in rest] == ["op_c"]
    assert [op.operation_id for op in of_a_tool] == ["op_a", "op_b"]


@pytest.mark.parametrize(
    ("filters", "expected"),
    [
        pytest.param(OperationFilter(session_id="s1"), ["op_c", "op_a"], id="session"),
        pytest.param(OperationFilter(tool="pay"), ["op_b", "op_a"], id="tool"),
        pytest.param(OperationFilter(tenant="acme"), ["op_c", "op_b"], id="tenant"),
        pytest.param(OperationFilter(principal="user:bob"), ["op_b"], id="principal"),
        pytest.param(OperationFilter(resource_key="table:1"), ["op_c", "op_a"], id="resource"),
        pytest.param(OperationFilter(session_id="s1", tool="pay"), ["op_a"], id="combined"),
        pytest.param(OperationFilter(session_id="nobody"), [], id="no-match"),
        pytest.param(OperationFilter(created_from=T0 + 10), ["op_b", "op_a"], id="from"),
        pytest.param(OperationFilter(created_before=T0 + 10), ["op_c"], id="before"),
        pytest.param(
            OperationFilter(created_from=T0 + 5, created_before=T0 + 20), ["op_b"], id="range"
        ),
        pytest.param(OperationFilter(limit=2), ["op_c", "op_b"], id="limit"),
        pytest.param(OperationFilter(tool="pay", limit=1), ["op_b"], id="limit-after-filter"),
    ],
)
async def test_list_filters_by_each_field(
    ledger: SqlLedger, clock: ManualClock, filters: OperationFilter, expected: list[str]
) -> None:
    await _three_sessions(ledger, clock)

    listed = await ledger.list(filters)

    assert [op.operation_id for op in listed] == expected


async def test_list_filters_by_status(ledger: SqlLedger, clock: ManualClock) -> None:
    await _three_sessions(ledger, clock)
    await ledger.transition("op_b", expected=S.ADMITTED, to=S.RUNNING, fence=1, actor="r")
    await ledger.transition("op_a", expected=S.ADMITTED, to=S.CANCELLED, fence=1, actor="r")

    running = await ledger.list(OperationFilter(status=[S.RUNNING]))
    settled = await ledger.list(OperationFilter(status=sorted(TERMINAL_STATUSES)))
    either = await ledger.list(OperationFilter(status=[S.ADMITTED, S.CANCELLED]))
    none = await ledger.list(OperationFilter(status=[S.COMMITTED]))

    assert [op.operation_id for op in running] == ["op_b"]
    assert [op.operation_id for op in settled] == ["op_a"]
    assert [op.operation_id for op in either] == ["op_c", "op_a"]
    assert none == []


async def test_list_filters_undelivered_operations(ledger: SqlLedger, clock: ManualClock) -> None:
    await _three_sessions(ledger, clock)
    await ledger.annotate("op_b", actor="gate", changes={"delivered_at": T0 + 25})

    undelivered = await ledger.list(OperationFilter(undelivered=True))
    delivered = await ledger.list(OperationFilter(undelivered=False))

    assert [op.operation_id for op in undelivered] == ["op_c", "op_a"]
    assert [op.operation_id for op in delivered] == ["op_b"]


async def test_events_are_ordered_and_numbered_without_gaps(
    ledger: SqlLedger, clock: ManualClock
) -> None:
    op = (
        await ledger.admit(new_op("k", status=S.RUNNING, lease_owner="a", lease_secs=1))
    ).operation
    other = (await ledger.admit(new_op("other"))).operation
    clock.advance(5)
    await ledger.annotate(op.operation_id, actor="gate", detail={"n": 1})
    await ledger.annotate(other.operation_id, actor="gate", detail={"n": 2})
    claimed_both = await ledger.claim_stale("b", lease_secs=30, limit=10)
    [claimed] = [c for c in claimed_both if c.operation_id == op.operation_id]
    await ledger.transition(
        op.operation_id, expected=S.RUNNING, to=S.UNKNOWN, fence=claimed.fence, actor="b"
    )
    last = await ledger.transition(
        op.operation_id, expected=S.UNKNOWN, to=S.COMMITTED, fence=claimed.fence, actor="b"
    )

    trail = await ledger.events(op.operation_id)

    assert [e.seq for e in trail] == [1, 2, 3, 4, 5, 6]
    assert [e.kind for e in trail] == [
        EventKind.CREATED,
        EventKind.CREATED,
        EventKind.ANNOTATION,
        EventKind.LEASE_CLAIMED,
        EventKind.TRANSITION,
        EventKind.TRANSITION,
    ]
    assert all(e.operation_id == op.operation_id for e in trail)
    assert [e.at for e in trail] == sorted(e.at for e in trail)
    assert_trail_is_contiguous(last, trail)
    assert [e.seq for e in await ledger.events(other.operation_id)] == [1, 2, 3]


async def test_events_after_a_seq_are_the_rest_of_that_trail_only(ledger: SqlLedger) -> None:
    op = (await ledger.admit(new_op("k", status=S.RUNNING))).operation
    other = (await ledger.admit(new_op("other"))).operation
    for n in range(3):
        await ledger.annotate(op.operation_id, actor="worker", detail={"n": n})
        await ledger.annotate(other.operation_id, actor="worker", detail={"n": n})
    trail = await ledger.events(op.operation_id)

    after = [await ledger.events_after(op.operation_id, seq) for seq in range(len(trail) + 1)]

    assert [[e.seq for e in rest] for rest in after] == [
        [e.seq for e in trail[seq:]] for seq in range(len(trail) + 1)
    ]
    assert after[2] == trail[2:]  # the same events as the whole trail's, other's left out
    assert await ledger.events_after("op_nope", 0) == []
