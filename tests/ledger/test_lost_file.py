"""A SQLite ledger file that is deleted, replaced, emptied or damaged is noticed, not written past.

Before, after the file was deleted under a running ledger, calls were told "committed" (the
writer's connection kept writing to the unlinked file) and a reopen found none of them; a
truncated file was called retryable, and a reopen of an emptied one silently made a new schema.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from pipecat_actions.admission.authorization import AllowAll
from pipecat_actions.clock import ManualClock
from pipecat_actions.errors import LedgerLost
from pipecat_actions.ledger import SqlLedger
from pipecat_actions.ledger.records import NewOperation
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.testing import capture_logs
from tests.runtime._execution_support import Bookings, booking, new_session, policy
from tests.runtime.test_repeats_after_an_end import fake

POLICY = """
    version: 1
    tools:
      book_table:
        kind: mutation
"""


def new(n: int) -> NewOperation:
    return NewOperation(
        tool="book_table",
        kind="mutation",
        args={"n": n},
        idempotency_key=f"k{n}",
        session_id="s",
        principal="p",
    )


def lose(path: Path, how: str) -> None:
    if how == "deleted":
        path.unlink()
    elif how == "replaced":
        other = path.with_name("other.db")
        shutil.copy(path, other)
        os.replace(other, path)
    elif how == "emptied":
        path.write_bytes(b"")
    else:
        raise AssertionError(how)


@pytest.mark.parametrize("how", ["deleted", "replaced", "emptied"])
async def test_a_ledger_whose_file_is_lost_refuses_every_write_and_read_after(
    tmp_path: Path, how: str
) -> None:
    path = tmp_path / "ledger.db"
    ledger = await SqlLedger.create(f"sqlite:///{path}")
    try:
        kept = await ledger.admit(new(1))
        lose(path, how)
        with capture_logs("ERROR", format="{message}") as logs:
            with pytest.raises(LedgerLost, match=f"was {how}") as lost:
                await ledger.admit(new(2))
            with pytest.raises(LedgerLost):
                await ledger.get(kept.operation.operation_id)
            with pytest.raises(LedgerLost):
                await ledger.admit(new(3))
    finally:
        await ledger.close()

    assert lost.value.retryable is False
    assert str(path) in str(lost.value)
    assert len(logs) == 1, logs  # said once
    assert logs[0].strip() == str(lost.value)  # in one line


async def test_a_runtime_on_a_lost_ledger_refuses_calls_truthfully_and_runs_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.db"
    clock = ManualClock()
    sor = fake(clock)
    runtime = await ActionRuntime.create(
        policy(POLICY),
        authorizer=AllowAll(),
        actions=[Bookings(sor).action()],
        ledger_url=f"sqlite:///{path}",
        clock=clock,
    )
    try:
        first = await runtime.propose("book_table", booking("20:00"), new_session())
        path.unlink()
        told = [
            await runtime.propose("book_table", booking(f"2{n}:00"), new_session())
            for n in range(1, 4)
        ]
    finally:
        await runtime.close()

    assert first["status"] == "committed"
    assert {t["status"] for t in told} == {"refused"}
    assert {t["reason"] for t in told} == {"ledger_error"}
    assert all("did not carry it out" in t["message"] for t in told)
    assert all(str(path) not in t["message"] for t in told)  # no file paths to the model
    assert sor.side_effects["book"] == 1


@pytest.mark.parametrize("how", ["deleted", "emptied"])
async def test_reopening_a_ledger_whose_file_was_lost_is_refused_not_started_anew(
    tmp_path: Path, how: str
) -> None:
    path = tmp_path / "ledger.db"
    ledger = await SqlLedger.create(f"sqlite:///{path}")
    await ledger.admit(new(1))
    await ledger.close()
    lose(path, how)

    with pytest.raises(LedgerLost, match="missing or empty") as refused:
        await SqlLedger.create(f"sqlite:///{path}")

    assert "ledger.db.lock" in str(refused.value)
    assert not path.exists() or path.stat().st_size == 0  # nothing was made in its place
    # The operator's way out, as the message says: remove the marker to start a new ledger.
    (tmp_path / "ledger.db.lock").unlink()
    fresh = await SqlLedger.create(f"sqlite:///{path}")
    try:
        assert await fresh.list() == []
    finally:
        await fresh.close()


async def test_a_damaged_file_is_lost_not_retryable(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    ledger = await SqlLedger.create(f"sqlite:///{path}")
    await ledger.admit(new(1))
    await ledger.close()
    data = path.read_bytes()
    path.write_bytes(b"this is not a database" + data[64:4096])  # header and first page gone

    with pytest.raises(LedgerLost) as refused:
        await SqlLedger.create(f"sqlite:///{path}")

    assert refused.value.retryable is False
    assert "not a usable SQLite database" in str(refused.value)


async def test_a_ledger_opened_for_the_first_time_in_an_empty_file_is_created(
    tmp_path: Path,
) -> None:
    path = tmp_path / "ledger.db"
    path.write_bytes(b"")  # e.g. made by `touch`: no ledger was ever kept here
    ledger = await SqlLedger.create(f"sqlite:///{path}")
    try:
        assert (await ledger.admit(new(1))).created
    finally:
        await ledger.close()
