"""A runtime takes over a gone owner's operations at once: the lease is the last line only.

A child process runs a real runtime with an hour-long lease and is SIGKILLed with bookings in
flight. The process that comes after does not wait for that hour: the dead owner registered its
life with the ledger and held a lock for as long as it lived (a PostgreSQL session advisory
lock; on SQLite, ``flock`` on a file beside the ledger); that lock is free, so its operations
are claimed (fenced) and reconciled now. Nothing here waits on the clock: an hour-long lease
that is still valid is what makes the order of events the proof.
"""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from pipecat_actions.errors import ConfigurationError
from pipecat_actions.ledger import SqlLedger
from tests.runtime._execution_support import (
    RECOVERY_HOLDS,
    RECOVERY_POLICY,
    FileSystemOfRecord,
    file_actions,
    guarded,
    new_session,
    reaches,
    running,
    runtime_child,
)
from tests.runtime._execution_support import S as Status

HOUR = 3600.0


async def killed_child(
    ledger_url: str, sor_path: Path, workdir: Path, *, owner: str | None = None
) -> dict[str, str]:
    """Run the child with an hour-long lease until its effects hold, SIGKILL it.

    Returns:
        Slot or note text → operation id.
    """
    admitted: dict[str, str] = {}
    held: dict[str, str] = {}
    async with runtime_child(ledger_url, sor_path, workdir, lease_secs=HOUR, owner=owner) as child:
        ready = await child.read()
        assert ready["event"] == "ready", ready
        while len(admitted) < 6 or len(held) < len(RECOVERY_HOLDS):
            line = await child.read()
            if line["event"] == "admitted":
                admitted[next(iter(line["args"].values()))] = line["operation_id"]
            elif line["event"] == "effect":
                held[line["name"]] = line["phase"]
        child.process.send_signal(signal.SIGKILL)
        assert await guarded(child.process.wait(), what="the killed child to end") == (
            -signal.SIGKILL
        )
    return admitted


async def test_a_runtime_started_after_a_crash_takes_over_at_once_and_tells_the_repeat(
    ledger_url: str, tmp_path: Path
) -> None:
    sor_path = tmp_path / "system-of-record.db"
    FileSystemOfRecord(sor_path)
    admitted = await killed_child(ledger_url, sor_path, tmp_path)
    sor = FileSystemOfRecord(sor_path)
    async with running(
        RECOVERY_POLICY, file_actions(sor), ledger_url=ledger_url, lease_secs=HOUR
    ) as restarted:
        # Straight after `create`: the dead owner's hour-long leases are already ours.
        owners = {op.operation_id: op.lease_owner for op in await restarted.ledger.list()}
        booked = await reaches(restarted, admitted["a1"], Status.COMMITTED)
        # The user says it again in the same conversation: it joins the booking and hears it.
        told = await restarted.propose(
            "book_slot", {"slot": "a1"}, new_session("call-child"), tool_call_id="again"
        )
        # b1 is reconciled on its own: a1's commit says nothing about how far b1 has got.
        settled = await reaches(restarted, admitted["b1"], Status.FAILED_FINAL, Status.COMMITTED)

    assert set(owners.values()) == {restarted.owner}
    assert booked.result == {"row": sor.find(booked.idempotency_key)}
    assert told["status"] == "committed"
    assert told["operation_id"] == admitted["a1"]
    assert sor.effects_by_key()[booked.idempotency_key] == 1
    assert settled.status is Status.FAILED_FINAL  # sent, never committed


async def test_a_repeat_that_joins_a_gone_owners_operation_starts_its_reconciliation(
    ledger_url: str, tmp_path: Path
) -> None:
    sor_path = tmp_path / "system-of-record.db"
    FileSystemOfRecord(sor_path)
    sor = FileSystemOfRecord(sor_path)
    # Already running when the child dies: its own start found nothing to take over, and its
    # hour-long heartbeat does not come round during the test.
    async with running(
        RECOVERY_POLICY, file_actions(sor), ledger_url=ledger_url, lease_secs=HOUR
    ) as survivor:
        admitted = await killed_child(ledger_url, sor_path, tmp_path)
        before = await survivor.ledger.get(admitted["a1"])
        told = await survivor.propose(
            "book_slot", {"slot": "a1"}, new_session("call-child"), tool_call_id="again"
        )
        after = await survivor.ledger.get(admitted["a1"])
        untouched = await survivor.ledger.get(admitted["a2"])

    assert before.status is Status.RUNNING and before.lease_owner != survivor.owner
    assert told["status"] == "committed"
    assert told["operation_id"] == admitted["a1"]
    assert after.lease_owner == survivor.owner and after.fence == before.fence + 1
    # Taking one over takes over what its gone owner held: the same order of events.
    assert untouched.lease_owner == survivor.owner


async def test_a_restart_under_the_same_owner_name_takes_over_its_predecessors_work(
    ledger_url: str, tmp_path: Path
) -> None:
    sor_path = tmp_path / "system-of-record.db"
    FileSystemOfRecord(sor_path)
    admitted = await killed_child(ledger_url, sor_path, tmp_path, owner="bot-1")
    sor = FileSystemOfRecord(sor_path)
    async with running(
        RECOVERY_POLICY, file_actions(sor), ledger_url=ledger_url, lease_secs=HOUR, owner="bot-1"
    ) as restarted:
        claimed = {op.operation_id: op.fence for op in await restarted.ledger.list()}
        booked = await reaches(restarted, admitted["a1"], Status.COMMITTED)

    assert all(fence == 2 for fence in claimed.values())  # claimed anew, not renewed as its own
    assert booked.status is Status.COMMITTED


async def test_a_live_owners_operations_are_never_taken_before_their_lease(
    ledger_url: str, tmp_path: Path
) -> None:
    sor = FileSystemOfRecord(tmp_path / "system-of-record.db")
    holds: dict[str, str] = {"a1": "before"}
    async with (
        running(
            RECOVERY_POLICY,
            file_actions(sor, holds=holds),
            ledger_url=ledger_url,
            lease_secs=HOUR,
        ) as alive,
        running(
            RECOVERY_POLICY, file_actions(sor), ledger_url=ledger_url, lease_secs=HOUR
        ) as other,
    ):
        told = await alive.propose("book_slot", {"slot": "a1"}, new_session(), wait=False)
        await reaches(alive, told["operation_id"], Status.RUNNING)
        claimed = await other.recover()
        gone = await other.ledger.gone_owners(besides=other.owner)
        repeat = await other.propose("book_slot", {"slot": "a1"}, new_session(), wait=False)
        op = await other.ledger.get(told["operation_id"])

    assert claimed == [] and gone == []
    assert repeat["operation_id"] == told["operation_id"]
    assert op.lease_owner == alive.owner and op.fence == 1


async def test_an_owner_name_a_live_runtime_holds_is_refused(
    ledger_url: str, tmp_path: Path
) -> None:
    sor = FileSystemOfRecord(tmp_path / "system-of-record.db")
    async with running(RECOVERY_POLICY, file_actions(sor), ledger_url=ledger_url, owner="bot-1"):
        with pytest.raises(ConfigurationError, match="in use by another runtime that is alive"):
            async with running(
                RECOVERY_POLICY, file_actions(sor), ledger_url=ledger_url, owner="bot-1"
            ):
                pass


async def test_an_owner_that_never_registered_is_left_to_its_lease(
    ledger_url: str, tmp_path: Path
) -> None:
    # Written by a runtime that held no life here (an older version, say): nobody can tell
    # whether it lives, so only its lease running out hands its operations over.
    ledger = await SqlLedger.create(ledger_url)
    try:
        from pipecat_actions.ledger.records import NewOperation

        result = await ledger.admit(
            NewOperation(
                tool="book_slot",
                kind="mutation",
                args={"slot": "z9"},
                idempotency_key="z9",
                session_id="s",
                principal="alice",
                lease_owner="old-version",
                lease_secs=HOUR,
            )
        )
        gone = await ledger.gone_owners(besides="me")
        claimed = await ledger.claim_stale("me", lease_secs=30, limit=10)
    finally:
        await ledger.close()

    assert result.created
    assert gone == [] and claimed == []


async def test_a_clean_close_unregisters_and_a_close_that_leaves_work_does_not(
    ledger_url: str, tmp_path: Path
) -> None:
    sor = FileSystemOfRecord(tmp_path / "system-of-record.db")
    holds: dict[str, Any] = {"a1": "before"}
    async with running(
        RECOVERY_POLICY, file_actions(sor), ledger_url=ledger_url, lease_secs=HOUR
    ) as watcher:
        async with running(
            RECOVERY_POLICY,
            file_actions(sor, holds=holds),
            ledger_url=ledger_url,
            lease_secs=HOUR,
        ) as leaving:
            told = await leaving.propose("book_slot", {"slot": "a1"}, new_session(), wait=False)
            await reaches(leaving, told["operation_id"], Status.RUNNING)
            await leaving.close(grace_secs=0)  # leaves the held booking unfinished
        gone = await watcher.ledger.gone_owners(besides=watcher.owner)
        claimed = await watcher.recover()
        async with running(
            RECOVERY_POLICY, file_actions(sor), ledger_url=ledger_url, lease_secs=HOUR
        ) as clean:
            pass
        after_clean = await watcher.ledger.gone_owners(besides=watcher.owner)

    assert gone == [leaving.owner]
    assert [op.operation_id for op in claimed] == [told["operation_id"]]
    assert clean.owner not in after_clean
