"""Restart: operations cut off by a dead process are finished from the ledger and the provider.

A child process (``_runtime_child.py``) runs a real runtime and is SIGKILLed while its effects
are in flight; the system of record is a SQLite file that outlives it. Fresh runtimes on the
same ledger, whose clock is past the dead owner's leases, then `recover` every operation to a
terminal status or an escalated UNKNOWN, without a second side effect for any key.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from pipecat_actions.clock import ManualClock
from pipecat_actions.ledger.records import EventKind
from pipecat_actions.testing import FakeSystemOfRecord
from tests.runtime._execution_support import (
    RECOVERY_HOLDS,
    RECOVERY_PLAN,
    RECOVERY_POLICY,
    Bookings,
    FileSystemOfRecord,
    booking,
    file_actions,
    gather_all,
    guarded,
    is_settled,
    new_session,
    reaches,
    running,
    runtime_child,
    transitions,
)
from tests.runtime._execution_support import S as Status


async def test_operations_cut_off_by_sigkill_are_settled_by_the_next_runtimes(
    ledger_url: str, tmp_path: Path
) -> None:
    sor_path = tmp_path / "system-of-record.db"
    FileSystemOfRecord(sor_path)
    admitted: dict[str, str] = {}  # slot or note text -> operation id
    held: dict[str, str] = {}  # name -> phase reached when killed
    async with runtime_child(ledger_url, sor_path, tmp_path) as child:
        ready = await child.read()
        assert ready["event"] == "ready", ready
        while len(admitted) < len(RECOVERY_PLAN) or len(held) < len(RECOVERY_HOLDS):
            line = await child.read()
            if line["event"] == "admitted":
                admitted[next(iter(line["args"].values()))] = line["operation_id"]
            elif line["event"] == "effect":
                held[line["name"]] = line["phase"]
        child.process.send_signal(signal.SIGKILL)
        assert await guarded(child.process.wait(), what="the killed child to end") == (
            -signal.SIGKILL
        )
    assert held == {
        "a1": "committed",
        "a2": "committed",
        "b1": "sent",
        "b2": "sent",
        "n1": "committed",
    }

    sor = FileSystemOfRecord(sor_path)
    before = sor.effects_by_key()
    clock = ManualClock(time.time() + 60)  # the child's 2 s leases are long expired
    actions = file_actions(sor)
    async with (
        running(
            RECOVERY_POLICY, actions, ledger_url=ledger_url, clock=clock, recover=False
        ) as first,
        running(
            RECOVERY_POLICY, actions, ledger_url=ledger_url, clock=clock, recover=False
        ) as second,
    ):
        left = {op.operation_id: op.status for op in await first.ledger.list()}
        claimed_first, claimed_second = await gather_all(first.recover(), second.recover())
        owner = {op.operation_id: first for op in claimed_first}
        owner.update({op.operation_id: second for op in claimed_second})
        finals = {
            op_id: await guarded(owner[op_id].wait(op_id), what=f"the recovery of {op_id}")
            for op_id in owner
        }
        ops = {op.operation_id: op for op in await first.ledger.list()}
        trails = {op_id: await first.ledger.events(op_id) for op_id in ops}
    after = sor.effects_by_key()

    # What the kill left behind: five operations sent (RUNNING), one never started.
    assert left == {
        op_id: Status.ADMITTED if name == "c1" else Status.RUNNING
        for name, op_id in admitted.items()
    }
    # Each operation was claimed by exactly one of the two runtimes.
    assert not {op.operation_id for op in claimed_first} & {
        op.operation_id for op in claimed_second
    }
    assert set(owner) == set(admitted.values())
    assert set(finals) == set(ops)

    by_name = {name: ops[op_id] for name, op_id in admitted.items()}
    for name in ("a1", "a2"):  # committed before the kill: reconciled, never resent
        op = by_name[name]
        assert op.status is Status.COMMITTED, (name, op.status)
        assert op.result == {"row": sor.find(op.idempotency_key)}
        assert op.attempt == 1
        assert transitions(trails[op.operation_id]) == [Status.UNKNOWN, Status.COMMITTED]
    for name in ("b1", "b2"):  # sent but never committed: the provider has no trace
        op = by_name[name]
        assert op.status is Status.FAILED_FINAL, (name, op.status)
        assert transitions(trails[op.operation_id]) == [Status.UNKNOWN, Status.FAILED_FINAL]
    note = by_name["n1"]  # committed, but nothing can check it: a person must look
    assert note.status is Status.UNKNOWN
    assert note.escalated_at is not None
    # Admitted, still waiting for the user's turn to end: the user never let it go, so the
    # new owner cancels it as not sent instead of making it (issue 12, B7).
    later = by_name["c1"]
    assert later.status is Status.CANCELLED
    assert later.attempt == 0
    assert later.sent_at is None
    assert all(is_settled(op) for op in ops.values()), {
        o.operation_id: o.status for o in ops.values()
    }

    for op_id, trail in trails.items():
        [claim] = [e for e in trail if e.kind is EventKind.LEASE_CLAIMED]
        assert claim.detail["previous_owner"] == ready["owner"]
        assert claim.actor == owner[op_id].owner
    assert before == {by_name[name].idempotency_key: 1 for name in ("a1", "a2", "n1")}
    assert after == {by_name[name].idempotency_key: 1 for name in ("a1", "a2", "n1")}
    assert max(after.values()) <= 1


async def test_a_deadline_set_before_a_restart_still_fires_after_it(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = FakeSystemOfRecord(clock=clock)
    sor.add_restaurant("r1", tables=3)
    approval = """
        version: 1
        tools:
          book_table:
            kind: mutation
            confirmation: {mode: approval, approvers: [ops], expires_after_secs: 120}
    """
    action = Bookings(sor).action()
    async with running(
        approval, [action], ledger_url=ledger_url, clock=clock, lease_secs=30.0
    ) as before:
        told = await before.propose("book_table", booking(), new_session())
        op_id = told["operation_id"]
        assert told["status"] == "awaiting_approval"
    # The first runtime is gone without settling it; its lease runs out.
    clock.advance(31)
    async with running(
        approval, [action], ledger_url=ledger_url, clock=clock, lease_secs=30.0
    ) as after:
        held = await after.ledger.get(op_id)
        clock.advance(88)
        assert (await after.ledger.get(op_id)).status is Status.AWAITING_APPROVAL
        clock.advance(1)
        expired = await reaches(after, op_id, Status.EXPIRED)
        trail = await after.ledger.events(op_id)

    assert held.lease_owner == after.owner
    assert expired.status is Status.EXPIRED
    assert trail[-1].actor == "watchdog"
    assert sor.calls["book"] == 0
