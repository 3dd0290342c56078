"""The `Ledger` lifecycle: close, async with, unusable URLs and unreachable databases."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from pipecat_actions.clock import ManualClock
from pipecat_actions.errors import (
    LedgerConfigurationError,
    LedgerError,
    LedgerUnavailable,
)
from pipecat_actions.ledger import OperationFilter, SqlLedger
from pipecat_actions.ledger.engine import LedgerSettings
from pipecat_actions.testing.logs import capture_logs

from ._support import S, assert_trail_is_contiguous, new_op

HANG_GUARD_SECS = 60.0
"""Bound on a wait that returns at once when the ledger is right: only a hang gets there."""


async def test_a_closed_ledger_refuses_every_call_as_unavailable(
    ledger_url: str, clock: ManualClock
) -> None:
    opened = await SqlLedger.create(ledger_url, clock=clock)
    op = (await opened.admit(new_op("k"))).operation
    await opened.close()
    await opened.close()  # closing twice is harmless

    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "admit": lambda: opened.admit(new_op("k2")),
        "record_refusal": lambda: opened.record_refusal(new_op("k3")),
        "transition": lambda: opened.transition(
            op.operation_id, expected=S.ADMITTED, to=S.RUNNING, fence=1, actor="r"
        ),
        "annotate": lambda: opened.annotate(op.operation_id, actor="r"),
        "get": lambda: opened.get(op.operation_id),
        "find_by_key": lambda: opened.find_by_key("default", "k"),
        "list": lambda: opened.list(),
        "events": lambda: opened.events(op.operation_id),
        "claim_stale": lambda: opened.claim_stale("o", lease_secs=1, limit=1),
        "renew_lease": lambda: opened.renew_lease("o", lease_secs=1),
    }
    not_refused = []
    for name, call in calls.items():
        try:
            await asyncio.wait_for(call(), HANG_GUARD_SECS)
        except LedgerUnavailable:
            continue
        except Exception as exc:
            not_refused.append(f"{name}: {type(exc).__name__}: {exc}")
        else:
            not_refused.append(f"{name}: succeeded")
    assert not_refused == []

    async with await SqlLedger.create(ledger_url, clock=clock) as reopened:
        assert [o.operation_id for o in await reopened.list()] == [op.operation_id]


async def test_closing_with_writes_in_flight_settles_each_write_one_way_or_the_other(
    ledger_url: str, clock: ManualClock
) -> None:
    opened = await SqlLedger.create(ledger_url, clock=clock)
    writes = [asyncio.create_task(opened.admit(new_op(f"k{n}"))) for n in range(200)]
    await asyncio.sleep(0)  # the first writes reach the database

    await asyncio.wait_for(opened.close(), HANG_GUARD_SECS)
    done, hanging = await asyncio.wait(writes, timeout=HANG_GUARD_SECS)

    assert hanging == set()
    refused = [t.exception() for t in done if t.exception() is not None]
    assert all(isinstance(e, LedgerUnavailable) for e in refused), refused
    acknowledged = {t.result().operation.operation_id for t in done if t.exception() is None}
    async with await SqlLedger.create(ledger_url, clock=clock) as reopened:
        stored = await reopened.list()
        # Acknowledged writes are all there; refused ones left nothing behind.
        assert {op.operation_id for op in stored} == acknowledged
        for op in stored:
            assert_trail_is_contiguous(op, await reopened.events(op.operation_id))


async def test_closing_lands_every_write_whose_caller_left_before_the_close(
    ledger_url: str, clock: ManualClock
) -> None:
    # Issue 34: callers cancelled after handing their writes over (a barge-in, a benchmark's
    # end), then the ledger closed: the writes still waiting for a turn were refused by the
    # closed ledger, and nobody heard it ("Task exception was never retrieved").
    loop = asyncio.get_running_loop()
    unretrieved: list[dict[str, object]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _, context: unretrieved.append(context))
    try:
        opened = await SqlLedger.create(
            ledger_url, clock=clock, settings=LedgerSettings(pool_size=1)
        )
        callers = [asyncio.create_task(opened.admit(new_op(f"k{n}"))) for n in range(30)]
        await asyncio.sleep(0)  # each caller has handed its write over
        for caller in callers:
            caller.cancel()
        await asyncio.gather(*callers, return_exceptions=True)
        assert all(caller.cancelled() for caller in callers)

        await asyncio.wait_for(opened.close(), HANG_GUARD_SECS)
        gc.collect()  # an unretrieved task exception is reported when the task is collected
    finally:
        loop.set_exception_handler(previous)

    assert unretrieved == []
    async with await SqlLedger.create(ledger_url, clock=clock) as reopened:
        stored = await reopened.list(OperationFilter(limit=100))
        assert sorted(op.idempotency_key for op in stored) == sorted(f"k{n}" for n in range(30))
        for op in stored:
            assert_trail_is_contiguous(op, await reopened.events(op.operation_id))


async def test_a_write_that_fails_after_its_caller_left_is_reported(
    ledger_url: str, clock: ManualClock
) -> None:
    opened = await SqlLedger.create(ledger_url, clock=clock)
    try:
        op = (await opened.admit(new_op("k"))).operation
        with capture_logs(level="WARNING") as lines:
            # A second operation under the first one's id: the database refuses the insert,
            # and its caller is gone before the answer.
            caller = asyncio.create_task(opened.admit(new_op("k2", operation_id=op.operation_id)))
            await asyncio.sleep(0)
            caller.cancel()
            await asyncio.gather(caller, return_exceptions=True)
            await asyncio.wait_for(opened.close(), HANG_GUARD_SECS)
    finally:
        await opened.close()

    reported = [line for line in lines if "a write whose caller had left failed" in line]
    assert len(reported) == 1, lines
    assert "LedgerIntegrityError" in reported[0]


async def test_async_with_closes_the_ledger(ledger_url: str, clock: ManualClock) -> None:
    async with await SqlLedger.create(ledger_url, clock=clock) as opened:
        await opened.admit(new_op("k"))

    with pytest.raises(LedgerUnavailable):
        await opened.list()


@pytest.mark.parametrize(
    "url",
    [
        pytest.param("mysql://user:hunter2@db.example/ledger", id="mysql"),
        pytest.param("sqlite://", id="sqlite-memory-default"),
        pytest.param("sqlite:///:memory:", id="sqlite-memory"),
        pytest.param("sqlite+aiosqlite:///file::memory:?cache=shared", id="sqlite-memory-uri"),
        pytest.param("::: not a url :::", id="garbage"),
        pytest.param("http://user:hunter2@example.com/ledger", id="http"),
    ],
)
async def test_create_refuses_an_unusable_url_with_a_configuration_error(url: str) -> None:
    with pytest.raises(LedgerConfigurationError) as refused:
        await SqlLedger.create(url)

    assert "hunter2" not in str(refused.value)
    assert refused.value.retryable is False


async def test_create_on_a_sqlite_path_that_cannot_exist_raises_a_ledger_error(
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")

    with pytest.raises(LedgerError):
        await SqlLedger.create(f"sqlite:///{blocker / 'sub' / 'ledger.db'}")


async def test_create_on_a_file_that_is_not_a_database_raises_a_ledger_error(
    tmp_path: Path,
) -> None:
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a SQLite database, not at all " * 100)

    with pytest.raises(LedgerError):
        await SqlLedger.create(f"sqlite:///{garbage}")


def _causes(exc: BaseException) -> list[BaseException]:
    """``exc`` and the exceptions it was raised from (or during), outermost first."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


@pytest.mark.postgres
async def test_unreachable_postgres_is_reported_as_unavailable_at_the_first_refusal() -> None:
    # Nothing moves this clock: a ledger that retried, or waited before reporting, would
    # wait on it (every wait of the ledger goes through its clock) and hang until the guard.
    clock = ManualClock()

    with pytest.raises(LedgerUnavailable) as unavailable:
        await asyncio.wait_for(
            SqlLedger.create("postgresql://postgres@127.0.0.1:1/ledger", clock=clock),
            HANG_GUARD_SECS,
        )

    # What is reported is the refused connection itself, not a later give-up.
    assert any(isinstance(c, ConnectionRefusedError) for c in _causes(unavailable.value))
    assert clock.sleepers == 0
    assert unavailable.value.retryable is True
    assert "127.0.0.1:1" in str(unavailable.value)


@pytest.mark.postgres
async def test_missing_postgres_database_is_reported_as_unavailable() -> None:
    with pytest.raises(LedgerUnavailable):
        await SqlLedger.create("postgresql://postgres@127.0.0.1:5432/pa_no_such_database_xyz")
