"""The crash checker fails when it should: each of its rules catches the fault it is there for.

The matrix only proves something if its checker can fail. Each test builds, in a real ledger
and a real provider file, the state a faulty recovery would leave, and expects the checker to
name it; the first test shows a sound state passing, with its escalation listed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from pipecat_actions.clock import ManualClock
from pipecat_actions.ledger import NewOperation, Operation, OperationFilter, SqlLedger
from pipecat_actions.status import ActionStatus
from tests._file_system_of_record import FileSystemOfRecord
from tests.crash._checker import Verdict, check, gather

S = ActionStatus


class World:
    """A ledger and a provider, and shortcuts to put operations in a given state."""

    def __init__(self, ledger: SqlLedger, sor: FileSystemOfRecord) -> None:
        self.ledger = ledger
        self.sor = sor

    async def running(self, ref: str, *, tool: str = "book", **extra: Any) -> Operation:
        admitted = await self.ledger.admit(
            NewOperation(
                tool=tool,
                kind="mutation",
                args={"ref": ref},
                idempotency_key=f"key-{ref}" if tool == "book" else f"compensate|{ref}",
                session_id="call-crash",
                principal="alice",
                status=S.RUNNING,
                lease_owner="child",
                **extra,
            )
        )
        return admitted.operation

    async def move(self, op: Operation, to: S, **changes: Any) -> Operation:
        current = await self.ledger.get(op.operation_id)
        return await self.ledger.transition(
            op.operation_id,
            expected=current.status,
            to=to,
            fence=current.fence,
            actor="test",
            changes=changes or None,
        )

    async def committed(self, ref: str, *, effects: int = 1) -> Operation:
        op = await self.running(ref)
        rows = [self.sor.commit(op.idempotency_key, "book", {"ref": ref}) for _ in range(effects)]
        return await self.move(op, S.COMMITTED, result={"row": rows[0] if rows else None})

    async def escalated_unknown(self, ref: str) -> Operation:
        op = await self.move(await self.running(ref), S.UNKNOWN)
        return await self.ledger.annotate(
            op.operation_id,
            actor="test",
            detail={"escalated": "no reconcile hook"},
            changes={"escalated_at": 1.0},
        )

    async def verdict(
        self, acks: list[dict[str, Any]] | None = None, *, gate: bool = False, listed: bool = True
    ) -> Verdict:
        undelivered = await self.ledger.list(
            OperationFilter(status=[S.COMMITTED], undelivered=True)
        )
        evidence = await gather(
            self.ledger,
            self.sor,
            acks or [],
            undelivered=undelivered if listed else [],
            gate=gate,
        )
        return check(evidence)


@pytest.fixture
async def world(tmp_path: Path) -> AsyncIterator[World]:
    ledger = await SqlLedger.create(f"sqlite:///{tmp_path / 'ledger.db'}", clock=ManualClock())
    try:
        yield World(ledger, FileSystemOfRecord(tmp_path / "sor.db"))
    finally:
        await ledger.close()


async def test_a_sound_recovery_passes_and_its_escalated_unknown_is_listed(world: World) -> None:
    booked = await world.committed("o1")
    note = await world.escalated_unknown("o2")
    failed = await world.move(await world.running("o3"), S.FAILED_FINAL, error="not found")

    verdict = await world.verdict(
        [
            {"event": "admitted", "ref": "o1", "operation_id": booked.operation_id},
            {"event": "told", "operation_id": booked.operation_id, "status": "committed"},
            {"event": "told", "operation_id": note.operation_id, "status": "unknown"},
            {"event": "told", "operation_id": failed.operation_id, "status": "running"},
        ]
    )

    assert verdict.problems == []
    assert verdict.escalated == [
        f"{note.operation_id} (book o2) UNKNOWN: no reconcile hook",
    ]
    assert verdict.statuses == {"COMMITTED": 1, "UNKNOWN": 1, "FAILED_FINAL": 1}


async def test_an_operation_left_running_is_reported(world: World) -> None:
    left = await world.running("o1")

    verdict = await world.verdict()

    assert verdict.problems == [
        f"{left.operation_id} (book o1) is still RUNNING after the recovery window"
    ]


async def test_a_second_side_effect_for_one_key_is_reported(world: World) -> None:
    op = await world.committed("o1", effects=2)

    verdict = await world.verdict()

    assert verdict.problems == [f"{op.operation_id} (book o1) is COMMITTED with 2 side effects"]


async def test_a_committed_operation_whose_side_effect_is_missing_is_reported(
    world: World,
) -> None:
    op = await world.committed("o1", effects=0)

    verdict = await world.verdict()

    assert f"{op.operation_id} (book o1) is COMMITTED with 0 side effects" in verdict.problems


async def test_a_failed_operation_that_did_happen_is_reported(world: World) -> None:
    op = await world.running("o1")
    world.sor.commit(op.idempotency_key, "book", {"ref": "o1"})
    await world.move(op, S.FAILED_FINAL, error="reconciled wrongly")

    verdict = await world.verdict()

    assert verdict.problems == [
        f"{op.operation_id} (book o1) is FAILED_FINAL but made 1 side effects"
    ]


async def test_a_side_effect_of_an_operation_the_ledger_lost_is_reported(world: World) -> None:
    world.sor.commit("key-lost", "book", {"ref": "o9"})

    verdict = await world.verdict()

    assert verdict.problems == ["1 side effect(s) under key 'key-lost', unknown to the ledger"]


async def test_an_acknowledged_operation_missing_from_the_ledger_is_reported(
    world: World,
) -> None:
    ack = {"event": "admitted", "ref": "o1", "operation_id": "op_gone"}

    verdict = await world.verdict([ack])

    assert verdict.problems == [f"admitted op_gone ({ack}) is not in the ledger"]


async def test_an_outcome_told_before_the_ledger_had_it_is_reported(world: World) -> None:
    op = await world.move(await world.running("o1"), S.FAILED_FINAL, error="x")

    verdict = await world.verdict(
        [{"event": "told", "operation_id": op.operation_id, "status": "committed"}]
    )

    assert verdict.problems == [
        f"{op.operation_id} (book o1) was told COMMITTED before the ledger had it",
        f"{op.operation_id} (book o1) was told COMMITTED and ended FAILED_FINAL, which does not "
        "follow from it",
    ]


async def test_a_committed_result_the_undelivered_query_misses_is_reported(world: World) -> None:
    op = await world.committed("o1")

    verdict = await world.verdict(listed=False)

    assert verdict.problems == [
        f"{op.operation_id} (book o1) is COMMITTED, undelivered and not listed as such"
    ]


async def test_a_delivery_recorded_without_a_gate_is_reported(world: World) -> None:
    op = await world.committed("o1")
    await world.ledger.annotate(op.operation_id, actor="test", changes={"delivered_at": 2.0})

    verdict = await world.verdict()

    assert verdict.problems == [
        f"{op.operation_id} (book o1) is marked delivered but nothing delivered it"
    ]


async def test_an_original_left_compensating_is_pending_unless_escalated_with_its_compensation(
    world: World,
) -> None:
    original = await world.move(await world.committed("o1"), S.COMPENSATING)
    compensation = await world.running(
        original.operation_id, tool="book.compensate", compensates=original.operation_id
    )
    await world.move(compensation, S.UNKNOWN)

    stuck = await world.verdict()
    await world.ledger.annotate(
        compensation.operation_id,
        actor="test",
        detail={"escalated": "no reconcile hook"},
        changes={"escalated_at": 1.0},
    )
    await world.ledger.annotate(
        original.operation_id,
        actor="test",
        detail={"escalated": "its compensation is unknown"},
        changes={"escalated_at": 1.0},
    )
    handed_over = await world.verdict()

    name = f"{original.operation_id} (book o1)"
    assert f"{name} is still COMPENSATING after the recovery window" in stuck.problems
    assert handed_over.problems == []
    assert f"{name} COMPENSATING: its compensation is unknown" in handed_over.escalated
