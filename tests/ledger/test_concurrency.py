"""Concurrent writers, in one process and in several, never split an operation or its history.

The multi-process tests run `_child.py` in separate interpreters that open their own ledger on
the same database (one SQLite file, or the PostgreSQL test database), wait at a barrier until
all of them are ready, then write at the same moment.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from pipecat_actions.clock import ManualClock
from pipecat_actions.errors import StaleFence, UnexpectedStatus
from pipecat_actions.ledger import EventKind, OperationFilter, SqlLedger
from pipecat_actions.status import ActionStatus

from ._support import assert_trail_is_contiguous, new_op, spawn_children, start_together

S = ActionStatus


async def test_of_fifty_concurrent_identical_transitions_exactly_one_wins(
    ledger: SqlLedger,
) -> None:
    op = (await ledger.admit(new_op("k"))).operation

    outcomes = await asyncio.gather(
        *(
            ledger.transition(
                op.operation_id,
                expected=S.ADMITTED,
                to=S.RUNNING,
                fence=op.fence,
                actor=f"racer-{n}",
            )
            for n in range(50)
        ),
        return_exceptions=True,
    )

    winners = [o for o in outcomes if not isinstance(o, BaseException)]
    losers = [o for o in outcomes if isinstance(o, BaseException)]
    assert len(winners) == 1
    assert len(losers) == 49
    assert all(isinstance(o, UnexpectedStatus) for o in losers), {type(o) for o in losers}
    assert all(o.actual_status == S.RUNNING for o in losers if isinstance(o, UnexpectedStatus))
    stored = await ledger.get(op.operation_id)
    assert stored == winners[0]
    assert (stored.status, stored.attempt, stored.event_seq) == (S.RUNNING, 1, 2)
    trail = await ledger.events(op.operation_id)
    transitions = [e for e in trail if e.kind is EventKind.TRANSITION]
    assert len(transitions) == 1
    assert (transitions[0].from_status, transitions[0].to_status) == (S.ADMITTED, S.RUNNING)
    assert transitions[0].actor.startswith("racer-")
    assert_trail_is_contiguous(stored, trail)


async def test_two_hundred_concurrent_admits_of_one_key_make_one_operation(
    ledger: SqlLedger,
) -> None:
    results = await asyncio.gather(*(ledger.admit(new_op("same-key")) for _ in range(200)))

    ids = {r.operation.operation_id for r in results}
    assert len(ids) == 1
    assert sum(r.created for r in results) == 1
    [stored] = await ledger.list()
    assert stored.operation_id in ids
    trail = await ledger.events(stored.operation_id)
    assert [(e.kind, e.to_status) for e in trail] == [(EventKind.CREATED, S.ADMITTED)]


async def test_concurrent_admits_of_distinct_keys_each_get_their_own_operation(
    ledger: SqlLedger,
) -> None:
    results = await asyncio.gather(*(ledger.admit(new_op(f"key-{n}")) for n in range(100)))

    assert all(r.created for r in results)
    assert len({r.operation.operation_id for r in results}) == 100
    assert len(await ledger.list(OperationFilter(status=[S.ADMITTED]))) == 100


async def test_four_processes_admitting_one_key_concurrently_share_one_operation(
    ledger_url: str, tmp_path: Path
) -> None:
    # The parent creates the schema so the children only race on the admits.
    async with await SqlLedger.create(ledger_url):
        pass
    runs = [["admit-same-key", ledger_url, "shared-key", "50"] for _ in range(4)]

    async with spawn_children(runs, tmp_path) as children:
        await start_together(children)
        reports = [await child.expect("done") for child in children]
        for child in children:
            assert await child.process.wait() == 0, child.stderr()

    assert [r["errors"] for r in reports] == [[], [], [], []]
    ids = {op_id for r in reports for op_id in r["ids"]}
    assert len(ids) == 1
    assert [len(r["ids"]) for r in reports] == [50, 50, 50, 50]
    assert sum(r["created"] for r in reports) == 1
    async with await SqlLedger.create(ledger_url) as ledger:
        stored = await ledger.list()
        assert [op.operation_id for op in stored] == list(ids)
        assert len(await ledger.events(stored[0].operation_id)) == 1


async def test_two_processes_claiming_stale_leases_split_them_without_overlap(
    ledger_url: str, tmp_path: Path
) -> None:
    # Leases that expired an hour ago on the children's system clock.
    past = ManualClock(start=time.time() - 3600)
    async with await SqlLedger.create(ledger_url, clock=past) as ledger:
        leased = {"lease_owner": "dead", "lease_secs": 30}
        await asyncio.gather(*(ledger.admit(new_op(f"stale-{n}", **leased)) for n in range(300)))
        settled = (await ledger.admit(new_op("settled", **leased))).operation
        await ledger.transition(
            settled.operation_id, expected=S.ADMITTED, to=S.CANCELLED, fence=1, actor="dead"
        )
    runs = [["claim", ledger_url, owner, "10"] for owner in ("claimer-a", "claimer-b")]

    async with spawn_children(runs, tmp_path) as children:
        await start_together(children)
        reports = [await child.expect("done") for child in children]
        for child in children:
            assert await child.process.wait() == 0, child.stderr()

    claimed = {
        owner: {op_id: fence for op_id, fence in report["claimed"]}
        for owner, report in zip(("claimer-a", "claimer-b"), reports, strict=True)
    }
    a, b = set(claimed["claimer-a"]), set(claimed["claimer-b"])
    assert a.isdisjoint(b), f"claimed twice: {sorted(a & b)[:5]}"
    async with await SqlLedger.create(ledger_url) as ledger:
        stale = await ledger.list(OperationFilter(status=[S.ADMITTED]))
        assert len(stale) == 300
        assert a | b == {op.operation_id for op in stale}
        for op in stale:
            owner = "claimer-a" if op.operation_id in a else "claimer-b"
            assert (op.lease_owner, op.fence) == (owner, 2)
            assert claimed[owner][op.operation_id] == 2
            trail = await ledger.events(op.operation_id)
            claims = [e for e in trail if e.kind is EventKind.LEASE_CLAIMED]
            assert [(e.actor, e.detail) for e in claims] == [
                (owner, {"previous_owner": "dead", "fence": 2})
            ]
            assert_trail_is_contiguous(op, trail)
        assert (await ledger.get(settled.operation_id)).fence == 1


@pytest.mark.parametrize("tasks", [1, 8])
async def test_concurrent_claimers_in_one_process_never_share_an_operation(
    ledger: SqlLedger, clock: ManualClock, tasks: int
) -> None:
    await asyncio.gather(
        *(ledger.admit(new_op(f"k{n}", lease_owner="dead", lease_secs=1)) for n in range(60))
    )
    clock.advance(5)

    async def drain(owner: str) -> list[str]:
        mine: list[str] = []
        while batch := await ledger.claim_stale(owner, lease_secs=60, limit=7):
            mine.extend(op.operation_id for op in batch)
        return mine

    results = await asyncio.gather(*(drain(f"owner-{n}") for n in range(tasks)))

    every = [op_id for mine in results for op_id in mine]
    assert len(every) == len(set(every)) == 60


async def test_concurrent_admits_after_the_window_release_the_key_once(
    ledger: SqlLedger, clock: ManualClock
) -> None:
    old = (await ledger.admit(new_op("k", idempotency_window_secs=60))).operation
    clock.advance(61)

    results = await asyncio.gather(*(ledger.admit(new_op("k")) for _ in range(30)))

    ids = {r.operation.operation_id for r in results}
    assert len(ids) == 1 and old.operation_id not in ids
    assert sum(r.created for r in results) == 1
    old_trail = await ledger.events(old.operation_id)
    assert [e.kind for e in old_trail] == [EventKind.CREATED, EventKind.KEY_RELEASED]
    assert await ledger.find_by_key("default", "k") == results[0].operation
    assert len(await ledger.list()) == 2


async def test_an_owner_racing_a_claimer_either_writes_before_the_claim_or_is_refused(
    ledger: SqlLedger, clock: ManualClock
) -> None:
    ops = [
        (await ledger.admit(new_op(f"k{n}", lease_owner="old", lease_secs=1))).operation
        for n in range(40)
    ]
    clock.advance(5)

    async def old_owner(op_id: str) -> bool:
        try:
            await ledger.transition(op_id, expected=S.ADMITTED, to=S.RUNNING, fence=1, actor="old")
        except StaleFence:
            return False
        return True

    async def claimer() -> list[str]:
        claimed: list[str] = []
        while batch := await ledger.claim_stale("new", lease_secs=60, limit=3):
            claimed.extend(op.operation_id for op in batch)
        return claimed

    claiming = asyncio.create_task(claimer())
    owner_wins = await asyncio.gather(*(old_owner(op.operation_id) for op in ops))
    claimed = await claiming

    assert sorted(claimed) == sorted(op.operation_id for op in ops)
    for op, owner_won in zip(ops, owner_wins, strict=True):
        stored = await ledger.get(op.operation_id)
        trail = await ledger.events(op.operation_id)
        kinds = [e.kind for e in trail]
        assert stored.fence == 2 and stored.lease_owner == "new"
        if owner_won:
            assert kinds == [EventKind.CREATED, EventKind.TRANSITION, EventKind.LEASE_CLAIMED]
            assert stored.status is S.RUNNING
        else:
            assert kinds == [EventKind.CREATED, EventKind.LEASE_CLAIMED]
            assert stored.status is S.ADMITTED
        assert_trail_is_contiguous(stored, trail)
