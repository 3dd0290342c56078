"""A sheltered task's ledger writes: no task or shield of their own, and still never cut short.

The runtime's task that admits and runs a mutation is stopped only through its `Shelter`: a
cancel asked for while it writes lands once the write returned. Its writes therefore run on the
driver in the task itself; closing the ledger still waits for them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from pipecat_actions._shelter import Shelter, sheltered
from pipecat_actions.clock import ManualClock
from pipecat_actions.ledger import SqlLedger
from pipecat_actions.status import ActionStatus
from tests._waiting import eventually
from tests.ledger._support import new_op

S = ActionStatus


async def _in_shelter(write: Callable[[], Awaitable[Any]], made: asyncio.Future[Shelter]) -> Any:
    made.set_result(Shelter.enter())
    return await write()


async def _tasks_made_during(call: Callable[[], Awaitable[Any]]) -> list[str]:
    loop = asyncio.get_running_loop()
    made: list[str] = []
    previous = loop.get_task_factory()

    def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> asyncio.Task[Any]:
        made.append(getattr(coro, "__qualname__", repr(coro)))
        return asyncio.Task(coro, loop=loop, **kwargs)

    loop.set_task_factory(factory)
    try:
        await call()
    finally:
        loop.set_task_factory(previous)
    return made


@pytest.mark.postgres
async def test_a_cancel_asked_mid_statement_lands_after_the_write_and_keeps_its_connection(
    pg_fresh_url: str,
) -> None:
    async with await SqlLedger.create(pg_fresh_url, clock=ManualClock()) as ledger:
        await ledger.admit(new_op("warm"))  # an idle connection to reuse
        fast = ledger._fast
        assert fast is not None
        conn = fast._idle[-1]
        made: asyncio.Future[Shelter] = asyncio.get_running_loop().create_future()
        task = asyncio.ensure_future(
            _in_shelter(lambda: ledger.admit(new_op("k", operation_id="op_sheltered")), made)
        )
        shelter = await made
        await eventually(lambda: not fast._idle, what="the insert to take its connection")
        shelter.cancel()  # mid-statement: held

        with pytest.raises(asyncio.CancelledError):
            await task

        assert (await ledger.get("op_sheltered")).status is S.ADMITTED
        # Cut short mid-statement, the connection would have been terminated, never reused.
        assert not conn.is_closed()
        assert fast._idle == [conn]


@pytest.mark.postgres
async def test_a_sheltered_write_makes_no_task_and_closing_the_ledger_waits_for_it(
    pg_fresh_url: str,
) -> None:
    ledger = await SqlLedger.create(pg_fresh_url, clock=ManualClock())
    made: asyncio.Future[Shelter] = asyncio.get_running_loop().create_future()
    tasks = await _tasks_made_during(lambda: ledger.admit(new_op("first")))
    assert any("_fast_write" in name for name in tasks)  # an unsheltered caller: handed over

    async def sheltered_admit() -> list[str]:
        return await _tasks_made_during(
            lambda: _in_shelter(lambda: ledger.admit(new_op("k", operation_id="op_k")), made)
        )

    writing = asyncio.ensure_future(sheltered_admit())
    await made
    await ledger.close()  # while the insert is in flight: it lands first

    assert writing.done()
    assert not [name for name in writing.result() if "_fast_write" in name]
    conn = await asyncpg.connect(pg_fresh_url)
    try:
        status = await conn.fetchval("SELECT status FROM pa_operations WHERE operation_id = 'op_k'")
    finally:
        await conn.close()
    assert status == S.ADMITTED.value


async def test_a_sheltered_task_cancelled_while_its_write_is_queued_still_commits_it(
    tmp_path: Path,
) -> None:
    async with await SqlLedger.create(
        f"sqlite:///{tmp_path / 'ledger.db'}", clock=ManualClock()
    ) as ledger:
        made: asyncio.Future[Shelter] = asyncio.get_running_loop().create_future()
        task = asyncio.ensure_future(
            _in_shelter(lambda: ledger.admit(new_op("k", operation_id="op_queued")), made)
        )
        shelter = await made
        await asyncio.sleep(0)  # the write is queued, its commit under way
        shelter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await ledger.get("op_queued")).status is S.ADMITTED


async def test_a_cancel_held_by_a_shelter_refuses_the_next_write_before_it_is_sent(
    tmp_path: Path,
) -> None:
    async with await SqlLedger.create(
        f"sqlite:///{tmp_path / 'ledger.db'}", clock=ManualClock()
    ) as ledger:
        second_tried = asyncio.Event()

        async def two_writes() -> None:
            shelter = Shelter.enter()
            shelter.writing()  # as if a write were under way when the cancel comes
            shelter.cancel()
            assert not shelter.task.cancelled()
            try:
                shelter.wrote()
            except asyncio.CancelledError:
                second_tried.set()
                await ledger.admit(new_op("never", operation_id="op_never"))
                raise

        with pytest.raises(asyncio.CancelledError):
            await asyncio.ensure_future(two_writes())
        assert second_tried.is_set()
        assert await ledger.find_by_key("default", "never") is None


async def test_tasks_a_sheltered_task_starts_are_not_sheltered() -> None:
    async def outer() -> tuple[bool, bool]:
        Shelter.enter()
        inner = asyncio.ensure_future(_is_sheltered())
        return sheltered() is not None, await inner

    assert await asyncio.ensure_future(outer()) == (True, False)
    assert sheltered() is None


async def _is_sheltered() -> bool:
    return sheltered() is not None
