"""What a conversation is owed is durable, and the delivery service tells it without any frame.

The service is driven here as a speech-to-speech or Flows adapter would drive it: an `Outlet`
that records what it is told, events reported by hand. The ledger is real (SQLite and
PostgreSQL); operations are written into it as another process (a worker, an operator's
reconcile) would leave them.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any

import pytest

from pipecat_actions.actions import ActionContext, action
from pipecat_actions.clock import ManualClock
from pipecat_actions.ledger import NewOperation, Operation, SqlLedger
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.runtime.deliveries import WATCH_SECS, SessionDelivery, Told
from pipecat_actions.session import SessionState
from pipecat_actions.status import ActionStatus
from tests.runtime._execution_support import booking, eventually, new_session, running

S = ActionStatus
POLICY = """
version: 1
tools:
  book_table:
    kind: mutation
    idempotency: {key_fields: [restaurant_id, date, time]}
    resource: "table:{restaurant_id}:{date}"
    delivery: {late: in_place}
"""


@action
async def book_table(
    ctx: ActionContext, restaurant_id: str, date: str, time: str, party_size: int
) -> dict[str, Any]:
    """Book a table (never called here: the operations are written as another process would)."""
    raise AssertionError("not run in these tests")


_OUTLETS: list[Recorder] = []


@pytest.fixture(autouse=True)
async def _pipelines_end() -> AsyncIterator[None]:
    """Each test's pipelines end with it: their watchers stop."""
    yield
    while _OUTLETS:
        _OUTLETS.pop().stop()


class Recorder:
    """An `Outlet` that keeps what it is told, and runs the service's tasks."""

    def __init__(self) -> None:
        _OUTLETS.append(self)
        self.told: list[Told] = []
        self.interruptions = 0
        self.tasks: set[asyncio.Task[Any]] = set()

    async def tell(self, told: Told) -> None:
        self.told.append(told)

    async def interrupt(self) -> None:
        self.interruptions += 1

    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def settled(self) -> None:
        """Wait for the service's work (not its watchers, which run as long as it does)."""
        while work := [t for t in self.tasks if t.get_coro().__name__ != "_watch"]:  # type: ignore[union-attr]
            await asyncio.gather(*work)

    def stop(self) -> None:
        for task in self.tasks:
            task.cancel()

    def statuses(self) -> list[str]:
        return [told.content.get("status", "?") for told in self.told]


@pytest.fixture
async def runtime(ledger_url: str) -> AsyncIterator[ActionRuntime]:
    async with running(POLICY, [book_table], ledger_url=ledger_url) as runtime:
        yield runtime


async def _booked_elsewhere(
    runtime: ActionRuntime,
    session: SessionState,
    *path: ActionStatus,
    time: str = "21:00",
    start: ActionStatus = S.RUNNING,
) -> Operation:
    """A booking of ``session`` that another process ran through ``path``."""
    ledger = runtime.ledger
    new = NewOperation(
        tool="book_table",
        kind="mutation",
        args=booking(time),
        idempotency_key=f"book|{time}",
        session_id=session.session_id,
        principal=session.principal,
        status=start,
    )
    if start is S.REJECTED:
        return await ledger.record_refusal(new)
    op = (await ledger.admit(new)).operation
    for to in path:
        op = await _moved_elsewhere(runtime, op, to)
    return op


async def _moved_elsewhere(
    runtime: ActionRuntime,
    op: Operation,
    to: ActionStatus,
    *,
    actor: str = "worker:elsewhere",
    result: Any = None,
) -> Operation:
    """``op`` moved on to ``to`` by another process (a commit records ``result``)."""
    committed = {"result": result or {"booking_id": "bk_1"}} if to is S.COMMITTED else None
    return await runtime.ledger.transition(
        op.operation_id, expected=op.status, to=to, fence=op.fence, actor=actor, changes=committed
    )


async def _pipeline(
    runtime: ActionRuntime, session: SessionState
) -> tuple[SessionDelivery, Recorder]:
    """A new pipeline of ``session`` starts: what is it told from before?"""
    outlet = Recorder()
    delivery = runtime.deliveries.open(session, outlet)
    delivery.start()
    await outlet.settled()
    return delivery, outlet


async def _heard(delivery: SessionDelivery, outlet: Recorder) -> None:
    """The bot says what it was told and finishes without being cut off."""
    delivery.session.bot_speaking = True
    delivery.session.bot_speaking = False
    delivery.bot_stopped()
    await outlet.settled()


async def test_an_outcome_reached_while_nobody_listened_is_told_to_the_next_pipeline_once(
    runtime: ActionRuntime,
) -> None:
    session = new_session()
    op = await _booked_elsewhere(runtime, session, S.COMMITTED)

    first, outlet = await _pipeline(runtime, session)
    assert outlet.statuses() == ["committed"]
    assert outlet.told[0].run_llm and op.operation_id in outlet.told[0].text
    await _heard(first, outlet)
    first.close()

    told = await runtime.ledger.get(op.operation_id)
    assert told.delivered_status is S.COMMITTED and told.acknowledged_at is not None
    _, again = await _pipeline(runtime, session)
    assert again.told == []  # told and heard: owed nothing any more


async def test_told_but_cut_off_before_it_was_heard_is_told_again_by_the_next_pipeline(
    runtime: ActionRuntime,
) -> None:
    session = new_session()
    await _booked_elsewhere(runtime, session, S.COMMITTED)

    first, outlet = await _pipeline(runtime, session)
    assert outlet.statuses() == ["committed"]
    first.interrupted()  # the user barged in while the bot said it
    first.bot_stopped()
    await outlet.settled()
    first.close()

    _, again = await _pipeline(runtime, session)
    assert again.statuses() == ["committed"]


async def test_an_unknown_told_and_heard_then_settled_elsewhere_is_owed_its_settled_outcome(
    runtime: ActionRuntime,
) -> None:
    # The conversation heard "not yet known, being checked"; a worker's reconciliation then
    # found the booking made while no pipeline of the session ran. Heard was about UNKNOWN:
    # the next pipeline still owes the user "it is booked".
    session = new_session()
    op = await _booked_elsewhere(runtime, session, S.UNKNOWN)
    first, outlet = await _pipeline(runtime, session)
    assert outlet.statuses() == ["unknown"]
    await _heard(first, outlet)
    first.close()
    heard = await runtime.ledger.get(op.operation_id)
    assert heard.delivered_status is S.UNKNOWN and heard.acknowledged_at is not None

    await _moved_elsewhere(runtime, heard, S.COMMITTED, actor="worker:reconcile")

    second, again = await _pipeline(runtime, session)
    assert again.statuses() == ["committed"]
    await _heard(second, again)
    settled = await runtime.ledger.get(op.operation_id)
    assert settled.delivered_status is S.COMMITTED and settled.acknowledged_at is not None


async def test_a_refusal_told_at_the_call_is_never_owed_to_a_later_pipeline(
    runtime: ActionRuntime,
) -> None:
    session = new_session()
    refused = await _booked_elsewhere(runtime, session, start=S.REJECTED)
    assert refused.delivered_status is None

    _, outlet = await _pipeline(runtime, session)
    assert outlet.told == []


async def test_an_outcome_is_told_through_the_outlet_when_it_comes_and_calls_of_a_group_together(
    runtime: ActionRuntime,
) -> None:
    # An adapter reports two calls proposed together as closed before their outcome; the
    # first outcome goes in silently, the second makes the model answer about both.
    session = new_session()
    outlet = Recorder()
    delivery = runtime.deliveries.open(session, outlet)
    delivery.listen()
    nine = await _booked_elsewhere(runtime, session, time="21:00")
    half = await _booked_elsewhere(runtime, session, time="21:30")
    delivery.await_outcome(nine.operation_id, group="g1")
    delivery.await_outcome(half.operation_id, group="g1")

    for op in (nine, half):
        committed = await _moved_elsewhere(
            runtime, op, S.COMMITTED, result={"booking_id": op.operation_id}
        )
        delivery.on_outcome(committed)  # as the runtime's listener is called
        await outlet.settled()

    assert [told.run_llm for told in outlet.told] == [False, True]
    assert [told.operation.operation_id for told in outlet.told] == [
        nine.operation_id,
        half.operation_id,
    ]
    delivery.close()
    await eventually(
        lambda: _all_delivered(runtime, [nine.operation_id, half.operation_id]),
        what="both deliveries recorded",
    )


async def _all_delivered(runtime: ActionRuntime, ids: list[str]) -> bool:
    ops = [await runtime.ledger.get(operation_id) for operation_id in ids]
    return all(op.delivered_status is S.COMMITTED for op in ops)


@contextlib.asynccontextmanager
async def _no_notices(self: SqlLedger, operation_id: str) -> AsyncIterator[asyncio.Event | None]:
    yield None  # a ledger that cannot tell its waiters: they re-read on their pause


@pytest.mark.parametrize("notices", [True, False], ids=["woken_by_notice", "polling"])
async def test_an_awaited_outcome_settled_by_another_process_is_told_while_the_pipeline_runs(
    ledger_url: str, notices: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This process's listeners hear only what it runs. The booking is another process's
    # (it was told "being checked" from the ledger); its reconciliation there must still
    # reach this conversation: on the ledger's notice of it, the clock never moving (the
    # watcher's pause never ends); or, on a ledger that gives no notices, at its next re-read.
    if not notices:
        monkeypatch.setattr(SqlLedger, "notices", _no_notices)
    clock = ManualClock()
    async with running(POLICY, [book_table], ledger_url=ledger_url, clock=clock) as runtime:
        session = new_session()
        op = await _booked_elsewhere(runtime, session, S.UNKNOWN)
        delivery, outlet = await _pipeline(runtime, session)
        assert outlet.statuses() == ["unknown"]
        async with await SqlLedger.create(ledger_url, clock=clock) as elsewhere:
            await elsewhere.transition(
                op.operation_id,
                expected=S.UNKNOWN,
                to=S.COMMITTED,
                fence=op.fence,
                actor="worker:reconcile",
                changes={"result": {"booking_id": "bk_1"}},
            )
        if not notices:
            assert outlet.statuses() == ["unknown"]  # nothing re-read before its time
            clock.advance(WATCH_SECS)
        await eventually(lambda: len(outlet.told) == 2, what="the settled outcome told")
        assert outlet.statuses() == ["unknown", "committed"]
        delivery.close()


async def test_a_result_told_in_place_is_recorded_as_told_even_if_the_operation_moved_on(
    runtime: ActionRuntime,
) -> None:
    # The call was answered "committed"; before its delivery is recorded, another process
    # starts compensating it. The record says what the conversation was told (COMMITTED),
    # not what a read would find: the compensation is still owed, and told.
    session = new_session()
    delivery, outlet = await _pipeline(runtime, session)
    op = await _booked_elsewhere(runtime, session, S.COMMITTED)
    runtime.deliveries.operations.note_answered(op, session.session_id)  # the call's answer
    await _moved_elsewhere(runtime, op, S.COMPENSATING)
    delivery.told_in_place(op.operation_id)
    await outlet.settled()
    recorded = await runtime.ledger.get(op.operation_id)
    owed = await runtime.deliveries.owed(session.session_id, before=1e12, mark=0)
    delivery.close()
    assert outlet.told == []  # told in place, by the call's result
    assert recorded.delivered_status is S.COMMITTED
    assert [o.operation_id for o in owed] == [op.operation_id]


async def test_a_call_seen_admitted_and_running_now_is_not_told_until_its_outcome(
    runtime: ActionRuntime,
) -> None:
    # A confirmed background action answers "admitted" and is running by the time the
    # result reaches the pipeline. That change of status is no outcome: telling it gave the
    # model an "outcome" saying running (and an inference), before the real one.
    session = new_session()
    outlet = Recorder()
    delivery = runtime.deliveries.open(session, outlet)
    delivery.listen()
    op = await _booked_elsewhere(runtime, session)  # RUNNING

    delivery.expect(op.operation_id, shown="admitted")
    await outlet.settled()
    assert outlet.told == []

    delivery.on_outcome(await _moved_elsewhere(runtime, op, S.COMMITTED))
    await outlet.settled()
    assert outlet.statuses() == ["committed"]
    delivery.close()


async def test_a_call_of_another_conversation_answered_with_the_outcome_does_not_mute_it_here(
    runtime: ActionRuntime,
) -> None:
    # The same caller repeated the request from a second conversation, whose call was
    # answered "committed" there. This conversation still waits to be told: it is.
    session = new_session()
    outlet = Recorder()
    delivery = runtime.deliveries.open(session, outlet)
    delivery.listen()
    op = await _booked_elsewhere(runtime, session)  # RUNNING
    delivery.expect(op.operation_id, shown="running")
    await outlet.settled()

    committed = await _moved_elsewhere(runtime, op, S.COMMITTED)
    runtime.deliveries.operations.note_answered(committed, "call-2")  # the other conversation
    delivery.on_outcome(committed)
    await outlet.settled()
    delivery.close()

    assert outlet.statuses() == ["committed"]
