"""The `Ledger` contract for claim_stale and renew_lease, on every backend."""

from __future__ import annotations

import asyncio

import asyncpg
import pytest

from pipecat_actions.clock import ManualClock
from pipecat_actions.errors import StaleFence
from pipecat_actions.ledger import EventKind, SqlLedger
from tests._waiting import eventually, guarded

from ._support import T0, S, new_op, snapshot


async def test_claim_stale_takes_expired_and_unowned_operations_but_not_live_or_settled_ones(
    ledger: SqlLedger, clock: ManualClock
) -> None:
    expired = (await ledger.admit(new_op("a", lease_owner="old", lease_secs=30))).operation
    clock.advance(1)
    unowned = (await ledger.admit(new_op("b", status=S.RUNNING))).operation
    clock.advance(1)
    settled = (await ledger.admit(new_op("c", lease_owner="old", lease_secs=30))).operation
    await ledger.transition(
        settled.operation_id, expected=S.ADMITTED, to=S.CANCELLED, fence=1, actor="old"
    )
    committed = (
        await ledger.admit(new_op("d", status=S.RUNNING, lease_owner="old", lease_secs=30))
    ).operation
    await ledger.transition(
        committed.operation_id, expected=S.RUNNING, to=S.COMMITTED, fence=1, actor="old"
    )
    clock.set(T0 + 60)
    live = (await ledger.admit(new_op("e", lease_owner="alive", lease_secs=30))).operation
    settled_before = await snapshot(ledger, settled.operation_id)
    live_before = await snapshot(ledger, live.operation_id)

    claimed = await ledger.claim_stale("new", lease_secs=45, limit=100)

    assert [op.operation_id for op in claimed] == [expired.operation_id, unowned.operation_id]
    for op, previous in zip(claimed, ["old", None], strict=True):
        assert (op.lease_owner, op.lease_expires_at, op.fence) == ("new", T0 + 60 + 45, 2)
        assert await ledger.get(op.operation_id) == op
        last = (await ledger.events(op.operation_id))[-1]
        assert (last.seq, last.kind, last.from_status, last.to_status, last.actor) == (
            op.event_seq,
            EventKind.LEASE_CLAIMED,
            op.status,
            op.status,
            "new",
        )
        assert last.detail == {"previous_owner": previous, "fence": 2}
        assert last.at == T0 + 60
    assert await snapshot(ledger, settled.operation_id) == settled_before
    assert await snapshot(ledger, live.operation_id) == live_before
    assert (await ledger.get(committed.operation_id)).fence == 1
    # The new leases are live: nothing is left to claim.
    assert await ledger.claim_stale("third", lease_secs=45, limit=100) == []


async def test_after_a_claim_the_previous_owner_is_refused_and_the_new_one_proceeds(
    ledger: SqlLedger, clock: ManualClock
) -> None:
    op = (
        await ledger.admit(new_op("k", status=S.RUNNING, lease_owner="old", lease_secs=5))
    ).operation
    clock.advance(6)
    [claimed] = await ledger.claim_stale("new", lease_secs=30, limit=1)
    before = await snapshot(ledger, op.operation_id)

    with pytest.raises(StaleFence) as refused:
        await ledger.transition(
            op.operation_id, expected=S.RUNNING, to=S.COMMITTED, fence=op.fence, actor="old"
        )
    assert (refused.value.given_fence, refused.value.actual_fence) == (1, 2)
    with pytest.raises(StaleFence):
        await ledger.annotate(op.operation_id, actor="old", fence=op.fence, detail={"late": 1})
    assert await snapshot(ledger, op.operation_id) == before

    done = await ledger.transition(
        op.operation_id, expected=S.RUNNING, to=S.UNKNOWN, fence=claimed.fence, actor="new"
    )
    assert done.status is S.UNKNOWN and done.fence == 2


async def test_each_claim_raises_the_fence_by_one(ledger: SqlLedger, clock: ManualClock) -> None:
    op = (await ledger.admit(new_op("k", lease_owner="w0", lease_secs=10))).operation
    fences = [op.fence]
    for owner in ("w1", "w2", "w3"):
        clock.advance(11)
        [claimed] = await ledger.claim_stale(owner, lease_secs=10, limit=5)
        fences.append(claimed.fence)

    assert fences == [1, 2, 3, 4]
    previous = [
        e.detail["previous_owner"]
        for e in await ledger.events(op.operation_id)
        if e.kind is EventKind.LEASE_CLAIMED
    ]
    assert previous == ["w0", "w1", "w2"]


async def test_a_pass_of_claims_takes_each_stale_operation_once_within_its_limit(
    ledger: SqlLedger, clock: ManualClock
) -> None:
    ids = []
    for n in range(5):
        ids.append(
            (
                await ledger.admit(new_op(f"k{n}", lease_owner="dead", lease_secs=1))
            ).operation.operation_id
        )
        clock.advance(1)
    clock.advance(10)

    # No id left out: a claimed operation is the claimer's with a live lease, out of reach.
    batches = [
        [op.operation_id for op in await ledger.claim_stale("new", lease_secs=60, limit=2)]
        for _ in range(4)
    ]

    assert [len(batch) for batch in batches] == [2, 2, 1, 0]
    assert sorted(op_id for batch in batches for op_id in batch) == sorted(ids)


async def test_a_pass_of_claims_takes_its_own_expired_leases_once_and_not_its_live_ones(
    ledger: SqlLedger, clock: ManualClock
) -> None:
    mine = [
        (await ledger.admit(new_op(f"m{n}", lease_owner="me", lease_secs=5))).operation
        for n in range(3)
    ]
    clock.advance(10)
    live = (await ledger.admit(new_op("live", lease_owner="me", lease_secs=60))).operation
    for n, owner in enumerate(["a-before", "z-after"]):  # sorted before and after "me"
        await ledger.admit(new_op(f"o{n}", lease_owner=owner, lease_secs=5))
    clock.advance(10)

    taken = []
    while batch := await ledger.claim_stale("me", lease_secs=60, limit=2):
        taken.extend(batch)

    assert len(taken) == 5 == len({op.operation_id for op in taken})
    assert {op.operation_id for op in mine} < {op.operation_id for op in taken}
    assert live.operation_id not in {op.operation_id for op in taken}
    assert {op.fence for op in taken} == {2}


async def test_an_operation_another_transaction_holds_is_still_claimed_in_the_same_pass(
    ledger: SqlLedger, ledger_url: str, clock: ManualClock
) -> None:
    if ledger_url.startswith("sqlite"):
        pytest.skip("SQLite runs one writer at a time: no claim passes over a held row")
    ids = [
        (await ledger.admit(new_op(f"k{n}", lease_owner="dead", lease_secs=1))).operation
        for n in range(7)
    ]
    clock.advance(10)
    held = ids[0].operation_id
    other = await asyncpg.connect(ledger_url)
    holding = other.transaction()
    await holding.start()
    # Like a claimer (or a killed process whose transaction the server has not ended yet).
    await other.execute("SELECT 1 FROM pa_operations WHERE operation_id = $1 FOR UPDATE", held)

    async def one_pass() -> list[str]:
        taken: list[str] = []
        while batch := await ledger.claim_stale("new", lease_secs=60, limit=3):
            taken.extend(op.operation_id for op in batch)
        return taken

    async def waits_for_a_row_lock() -> bool:
        return bool(
            await other.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                " AND wait_event_type = 'Lock'"
            )
        )

    claiming = asyncio.ensure_future(one_pass())
    try:
        await eventually(
            lambda: claiming.done() or waits_for_a_row_lock(),
            what="the pass to end, or to wait for the held row",
        )
        # Batches passed it by while there were others; the pass has not ended without it.
        assert not claiming.done()
    finally:
        await holding.rollback()
        await other.close()
    taken = await guarded(claiming, what="the pass")

    assert sorted(taken) == sorted(op.operation_id for op in ids)
    assert (await ledger.get(held)).lease_owner == "new"


async def test_claim_stale_takes_waiting_and_retrying_operations_too(
    ledger: SqlLedger, clock: ManualClock
) -> None:
    waiting = (await ledger.admit(new_op("a", status=S.AWAITING_APPROVAL))).operation
    retrying = (await ledger.admit(new_op("b", status=S.RUNNING))).operation
    await ledger.transition(
        retrying.operation_id, expected=S.RUNNING, to=S.FAILED_RETRYABLE, fence=1, actor="r"
    )
    rejected = await ledger.record_refusal(new_op("c"))

    claimed = await ledger.claim_stale("new", lease_secs=60, limit=10)

    assert {op.operation_id for op in claimed} == {waiting.operation_id, retrying.operation_id}
    assert (await ledger.get(rejected.operation_id)).fence == 1


async def test_renew_lease_extends_only_the_owners_unsettled_operations(
    ledger: SqlLedger, clock: ManualClock
) -> None:
    mine = (await ledger.admit(new_op("a", lease_owner="me", lease_secs=10))).operation
    mine_running = (await ledger.admit(new_op("b", status=S.RUNNING, lease_owner="me"))).operation
    mine_done = (await ledger.admit(new_op("c", status=S.RUNNING, lease_owner="me"))).operation
    await ledger.transition(
        mine_done.operation_id, expected=S.RUNNING, to=S.COMMITTED, fence=1, actor="me"
    )
    theirs = (await ledger.admit(new_op("d", lease_owner="them", lease_secs=10))).operation
    unowned = (await ledger.admit(new_op("e"))).operation
    untouched = {
        op_id: await snapshot(ledger, op_id)
        for op_id in (mine_done.operation_id, theirs.operation_id, unowned.operation_id)
    }
    clock.advance(8)

    renewed = await ledger.renew_lease("me", lease_secs=100)

    assert renewed == 2
    for op in (mine, mine_running):
        after = await ledger.get(op.operation_id)
        assert (after.lease_owner, after.lease_expires_at, after.fence) == ("me", T0 + 108, 1)
    for op_id, before in untouched.items():
        assert await snapshot(ledger, op_id) == before
    assert await ledger.renew_lease("nobody", lease_secs=100) == 0
    # Renewed leases are live at the time the old ones would have expired.
    clock.advance(50)
    claimed = await ledger.claim_stale("thief", lease_secs=10, limit=10)
    assert {op.operation_id for op in claimed} == {theirs.operation_id, unowned.operation_id}


async def test_renew_and_claim_leave_out_the_operations_named(
    ledger: SqlLedger, clock: ManualClock
) -> None:
    ops = [
        (await ledger.admit(new_op(key, lease_owner="me", lease_secs=10))).operation
        for key in ("a", "b", "c")
    ]
    a, b, c = (op.operation_id for op in ops)
    clock.advance(5)
    # The owner cannot settle a: its lease is left to run out; b and c are renewed.
    assert await ledger.renew_lease("me", lease_secs=10, except_ids=[a]) == 2
    clock.advance(6)
    assert [
        op.operation_id for op in await ledger.claim_stale("other", lease_secs=10, limit=10)
    ] == [a]
    clock.advance(11)
    # A claimer that cannot run b leaves it for another; a, claimed by "other", expired too.
    claimed = await ledger.claim_stale("third", lease_secs=10, limit=10, except_ids=[b])
    assert {op.operation_id for op in claimed} == {a, c}
    assert (await ledger.get(b)).lease_owner == "me"
