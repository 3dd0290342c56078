"""Writes that arrive together are committed together, and one bad write sinks only itself.

On SQLite every write of a process goes through one connection that commits the waiting writes
as a group (one transaction). A refusal, a database error or a bad argument in one of them
must fail that write alone: the others commit and their callers get their results. The same
bursts run on PostgreSQL (one transaction per write) so both backends answer alike.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import AsyncIterator, Awaitable
from pathlib import Path
from typing import Any

import pytest

from pipecat_actions.clock import ManualClock
from pipecat_actions.errors import (
    IdempotencyMismatch,
    LedgerError,
    UnexpectedStatus,
)
from pipecat_actions.ledger import AdmitResult, SqlLedger
from pipecat_actions.status import ActionStatus

from ._support import assert_trail_is_contiguous, new_op, snapshot

S = ActionStatus
HANG_GUARD_SECS = 60.0
"""Bound on a burst that commits at once when the ledger is right: only a stall gets there."""


def _kinds(outcomes: list[Any]) -> Counter[str]:
    return Counter("ok" if not isinstance(o, BaseException) else type(o).__name__ for o in outcomes)


async def _assert_committed(ledger: SqlLedger, operation_ids: list[str]) -> None:
    for op_id in operation_ids:
        op = await ledger.get(op_id)
        assert_trail_is_contiguous(op, await ledger.events(op_id))


async def test_refusals_in_a_burst_do_not_fail_the_other_writes(ledger: SqlLedger) -> None:
    held = (await ledger.admit(new_op("held"))).operation
    moved = (await ledger.admit(new_op("moved", status=S.RUNNING))).operation
    held_before = await snapshot(ledger, held.operation_id)
    moved_before = await snapshot(ledger, moved.operation_id)

    writes: list[Awaitable[object]] = []
    for n in range(30):
        if n % 6 == 1:  # same key, other arguments
            writes.append(ledger.admit(new_op("held", args={"n": n})))
        elif n % 6 == 4:  # lost compare-and-set
            writes.append(
                ledger.transition(
                    moved.operation_id, expected=S.ADMITTED, to=S.RUNNING, fence=1, actor="x"
                )
            )
        else:
            writes.append(ledger.admit(new_op(f"fresh-{n}")))
    outcomes = await asyncio.gather(*writes, return_exceptions=True)

    assert _kinds(outcomes) == {"ok": 20, "IdempotencyMismatch": 5, "UnexpectedStatus": 5}
    for n, outcome in enumerate(outcomes):
        if n % 6 == 1:
            assert isinstance(outcome, IdempotencyMismatch)
        elif n % 6 == 4:
            assert isinstance(outcome, UnexpectedStatus)
        else:
            assert isinstance(outcome, AdmitResult) and outcome.created
    fresh = [o.operation.operation_id for o in outcomes if isinstance(o, AdmitResult)]
    await _assert_committed(ledger, fresh)
    assert len(await ledger.list()) == 22
    assert await snapshot(ledger, held.operation_id) == held_before
    assert await snapshot(ledger, moved.operation_id) == moved_before


async def test_a_database_error_in_a_burst_fails_only_that_write(ledger: SqlLedger) -> None:
    existing = (await ledger.admit(new_op("existing", operation_id="op_taken"))).operation
    before = await snapshot(ledger, existing.operation_id)

    writes: list[Awaitable[object]] = [ledger.admit(new_op(f"fresh-{n}")) for n in range(10)]
    # An operation id that is taken (primary key) and a compensation of an operation that does
    # not exist (foreign key) break their own transaction in the database.
    writes.insert(3, ledger.record_refusal(new_op("dup", operation_id="op_taken")))
    writes.insert(7, ledger.admit(new_op("orphan", compensates="op_does_not_exist")))
    outcomes = await asyncio.gather(*writes, return_exceptions=True)

    assert isinstance(outcomes[3], LedgerError), outcomes[3]
    assert isinstance(outcomes[7], LedgerError), outcomes[7]
    good = [o for i, o in enumerate(outcomes) if i not in (3, 7) and isinstance(o, AdmitResult)]
    assert len(good) == 10 and all(o.created for o in good), outcomes
    await _assert_committed(ledger, [o.operation.operation_id for o in good])
    assert await ledger.find_by_key("default", "orphan") is None
    assert await snapshot(ledger, existing.operation_id) == before
    assert len(await ledger.list()) == 11


async def test_a_write_with_unencodable_detail_fails_alone_and_writes_nothing(
    ledger: SqlLedger,
) -> None:
    target = (await ledger.admit(new_op("target"))).operation
    before = await snapshot(ledger, target.operation_id)

    writes: list[Awaitable[object]] = [ledger.admit(new_op(f"fresh-{n}")) for n in range(10)]
    writes.insert(
        5,
        ledger.transition(
            target.operation_id,
            expected=S.ADMITTED,
            to=S.RUNNING,
            fence=1,
            actor="x",
            detail={"ratio": math.nan},
        ),
    )
    outcomes = await asyncio.wait_for(
        asyncio.gather(*writes, return_exceptions=True), HANG_GUARD_SECS
    )

    assert isinstance(outcomes[5], TypeError | ValueError), outcomes[5]
    good = [o for i, o in enumerate(outcomes) if i != 5 and isinstance(o, AdmitResult)]
    assert len(good) == 10 and all(o.created for o in good), outcomes
    assert await snapshot(ledger, target.operation_id) == before


async def test_a_write_whose_detail_is_not_json_does_not_stall_the_writes_behind_it(
    ledger: SqlLedger,
) -> None:
    target = (await ledger.admit(new_op("target"))).operation

    writes: list[Awaitable[object]] = [ledger.admit(new_op(f"fresh-{n}")) for n in range(10)]
    writes.insert(2, ledger.annotate(target.operation_id, actor="x", detail={"ids": {1, 2}}))
    outcomes = await asyncio.wait_for(
        asyncio.gather(*writes, return_exceptions=True), HANG_GUARD_SECS
    )

    assert isinstance(outcomes[2], TypeError | ValueError), outcomes[2]
    assert _kinds(outcomes)["ok"] == 10
    later = await asyncio.wait_for(ledger.admit(new_op("later")), HANG_GUARD_SECS)
    assert later.created is True


async def test_a_burst_admitting_one_key_twice_binds_it_once(ledger: SqlLedger) -> None:
    outcomes = await asyncio.gather(
        ledger.admit(new_op("k", operation_id="op_one")),
        ledger.admit(new_op("other")),
        ledger.admit(new_op("k", operation_id="op_two")),
        ledger.admit(new_op("k", operation_id="op_three", args={"different": True})),
        return_exceptions=True,
    )

    first, other, second, mismatch = outcomes
    assert not isinstance(other, BaseException) and other.created
    assert len(await ledger.list()) == 2
    if not ledger.url.startswith("sqlite"):
        # PostgreSQL runs the burst on several pooled connections: any of the three may win
        # the key, and the others then join it or are refused for their other details.
        same, different = [first, second], mismatch
        created = [o for o in (*same, different) if not isinstance(o, BaseException) and o.created]
        assert len(created) == 1, outcomes
        holder = created[0].operation
        if holder.operation_id == "op_three":
            assert all(isinstance(o, IdempotencyMismatch) for o in same), outcomes
            assert {o.operation_id for o in same if isinstance(o, IdempotencyMismatch)} == {
                "op_three"
            }
        else:
            joined = [o for o in same if o is not created[0]]
            assert [o.operation for o in joined if not isinstance(o, BaseException)] == [holder]
            assert isinstance(different, IdempotencyMismatch), outcomes
            assert different.operation_id == holder.operation_id
        return
    # SQLite's single writer commits a burst in the order it was handed over.
    assert not isinstance(first, BaseException) and first.created
    assert not isinstance(second, BaseException) and not second.created
    assert second.operation == first.operation
    assert isinstance(mismatch, IdempotencyMismatch)
    assert mismatch.operation_id == "op_one"


@pytest.fixture
async def sqlite_ledger(tmp_path: Path, clock: ManualClock) -> AsyncIterator[SqlLedger]:
    ledger = await SqlLedger.create(f"sqlite:///{tmp_path / 'ledger.db'}", clock=clock)
    try:
        yield ledger
    finally:
        await ledger.close()


async def test_a_queued_write_commits_even_when_its_caller_is_cancelled(
    sqlite_ledger: SqlLedger,
) -> None:
    # Once handed to the writer, a write is not undone by its caller giving up (barge-in).
    task = asyncio.create_task(sqlite_ledger.admit(new_op("k", operation_id="op_cancelled")))
    await asyncio.sleep(0)  # let the task queue its write
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # Writes commit in order: once a later one returned, the earlier one is settled.
    await sqlite_ledger.admit(new_op("after"))

    stored = await sqlite_ledger.get("op_cancelled")
    assert stored.status is S.ADMITTED
    assert await sqlite_ledger.find_by_key("default", "k") == stored
