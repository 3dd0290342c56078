"""The delivery service alone: what is owed, what is recorded as told and heard, handoffs.

`Deliveries` against a ledger in memory (`MemoryLedger`) and a `ManualClock`, with the
runtime's registries built bare around them; one pipeline's `SessionDelivery` speaks through
a fake outlet that keeps what it was told. No runtime, no database, no Pipecat.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

import pytest

from pipecat_actions.actions import ActionContext, Binding, action
from pipecat_actions.clock import ManualClock
from pipecat_actions.errors import LedgerUnavailable
from pipecat_actions.execution.watchdog import Watchdog
from pipecat_actions.ledger import NewOperation, Operation
from pipecat_actions.observability.telemetry import Telemetry
from pipecat_actions.policy import DeliveryMode, load_policy_text
from pipecat_actions.runtime._operations import Operations
from pipecat_actions.runtime.deliveries import Deliveries, Told
from pipecat_actions.runtime.progress import Progress
from pipecat_actions.runtime.supersession import Supersession
from pipecat_actions.session import SessionState
from pipecat_actions.status import ActionStatus
from tests.units._fakes import MemoryLedger

S = ActionStatus

POLICY = """\
version: 1
tools:
  book:
    kind: mutation
  refund:
    kind: mutation
    delivery: {late: interrupt, superseded: silent}
    visible_to: [billing]
  look_up:
    kind: read
"""


@action
async def book(ctx: ActionContext, party: int) -> str:
    return "booked"


@action
async def refund(ctx: ActionContext, amount: int) -> str:
    return "refunded"


@action
async def look_up(ctx: ActionContext, party: int) -> str:
    return "free"


class Outlet:
    """A pipeline as the delivery service sees it: keeps what it was told, runs its tasks."""

    def __init__(self) -> None:
        self.told: list[Told] = []
        self.interrupts = 0
        self.tasks: list[asyncio.Task[Any]] = []

    async def tell(self, told: Told) -> None:
        self.told.append(told)

    async def interrupt(self) -> None:
        self.interrupts += 1

    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coroutine)
        self.tasks.append(task)
        return task

    async def settled(self) -> None:
        """Let every task it ran go as far as it can without the clock moving.

        A watcher of an operation run elsewhere sleeps on the clock until it is told: it is
        left waiting (`stop` ends it).
        """
        for _ in range(50):
            await asyncio.sleep(0)

    async def stop(self) -> None:
        """End the pipeline's tasks, as an adapter does when its pipeline ends."""
        for task in self.tasks:
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(start=1_000.0)


@pytest.fixture
def ledger(clock: ManualClock) -> MemoryLedger:
    return MemoryLedger(clock)


@pytest.fixture
def service(ledger: MemoryLedger, clock: ManualClock) -> Deliveries:
    policies = load_policy_text(POLICY).tools
    bindings = {a.name: Binding(a, policies[a.name]) for a in (book, refund, look_up)}

    async def expire(operation_id: str) -> None:
        raise AssertionError(f"no deadline is armed here ({operation_id})")

    operations = Operations(ledger, Watchdog(clock, expire), actor="runtime:test")
    return Deliveries(
        ledger=ledger,
        bindings=bindings,
        clock=clock,
        telemetry=Telemetry(),
        supersession=Supersession(ledger, bindings),
        operations=operations,
        progress=Progress(ledger=ledger, operations=operations, now=clock.now, actor="test"),
    )


@pytest.fixture
def session() -> SessionState:
    return SessionState(session_id="s1", principal="alice")


async def made(
    ledger: MemoryLedger,
    status: ActionStatus,
    *,
    tool: str = "book",
    told: ActionStatus | None = None,
    heard: bool = False,
    compensates: str | None = None,
) -> Operation:
    """An operation of session s1 at ``status``, told at ``told`` and ``heard`` or not."""
    new = NewOperation(
        tool=tool,
        kind="read" if tool == "look_up" else "mutation",
        args={"party": 2},
        idempotency_key=f"k{len(ledger.rows)}",
        session_id="s1",
        principal="alice",
        status=status,
        compensates=compensates,
        result="done" if status is S.COMMITTED else None,
    )
    if status is S.REJECTED:
        op = await ledger.record_refusal(new)
    elif status in (S.COMMITTED, S.FAILED_FINAL):
        op = await ledger.record_completed(new)
    else:
        op = (await ledger.admit(new)).operation
    if told is not None:
        changes: dict[str, Any] = {"delivered_status": told.value, "delivered_at": 1.0}
        if heard:
            changes["acknowledged_at"] = 2.0
        op = await ledger.annotate(op.operation_id, actor="test", changes=changes)
    return op


async def test_an_outcome_is_owed_until_its_very_status_was_told_and_heard(
    ledger: MemoryLedger, service: Deliveries, clock: ManualClock
) -> None:
    never_told = await made(ledger, S.COMMITTED)
    told_not_heard = await made(ledger, S.COMMITTED, told=S.COMMITTED)
    told_unknown_then_settled = await made(ledger, S.COMMITTED, told=S.UNKNOWN, heard=True)
    await made(ledger, S.COMMITTED, told=S.COMMITTED, heard=True)
    clock.advance(1)

    owed = await service.owed("s1", before=clock.now(), mark=0)

    assert {op.operation_id for op in owed} == {
        never_told.operation_id,
        told_not_heard.operation_id,
        told_unknown_then_settled.operation_id,
    }


async def test_what_is_never_owed_a_refusal_told_at_its_call_a_question_and_a_read(
    ledger: MemoryLedger, service: Deliveries, clock: ManualClock
) -> None:
    await made(ledger, S.REJECTED)
    await made(ledger, S.AWAITING_CONFIRMATION)
    await made(ledger, S.COMMITTED, tool="look_up")
    clock.advance(1)

    assert await service.owed("s1", before=clock.now(), mark=0) == []


async def test_only_what_came_before_the_pipeline_is_owed_to_it(
    ledger: MemoryLedger, service: Deliveries, clock: ManualClock
) -> None:
    earlier = await made(ledger, S.COMMITTED)
    started_at = clock.now()
    clock.advance(1)
    await made(ledger, S.COMMITTED)  # this pipeline's own call: told through its result

    owed = await service.owed("s1", before=started_at, mark=0)

    assert [op.operation_id for op in owed] == [earlier.operation_id]


async def test_a_compensated_operation_is_owed_through_its_compensation_until_that_is_heard(
    ledger: MemoryLedger, service: Deliveries, clock: ManualClock
) -> None:
    original = await made(ledger, S.COMMITTED, told=S.COMMITTED, heard=True)
    original = await ledger.transition(
        original.operation_id, expected=S.COMMITTED, to=S.COMPENSATING, fence=1, actor="t"
    )
    original = await ledger.transition(
        original.operation_id, expected=S.COMPENSATING, to=S.COMPENSATED, fence=1, actor="t"
    )
    undo = await made(ledger, S.COMMITTED, compensates=original.operation_id)
    clock.advance(1)

    owed = await service.owed("s1", before=clock.now(), mark=0)
    assert [op.operation_id for op in owed] == [original.operation_id]

    await ledger.annotate(
        undo.operation_id,
        actor="test",
        changes={"delivered_status": "COMMITTED", "acknowledged_at": clock.now()},
    )
    assert await service.owed("s1", before=clock.now(), mark=0) == []


async def test_a_status_recorded_as_told_is_written_once_and_a_new_status_again(
    ledger: MemoryLedger, service: Deliveries, session: SessionState
) -> None:
    op = await made(ledger, S.COMMITTED)
    writes = len(ledger.writes)

    await service.mark_delivered(op, session=session, late=True)
    await service.mark_delivered(op, session=session, late=True)  # told again, not re-recorded

    recorded = ledger.writes[writes:]
    assert [w.verb for w in recorded] == ["annotate"]
    assert recorded[0].changes is not None
    assert recorded[0].changes["delivered_status"] == "COMMITTED"
    assert recorded[0].changes["acknowledged_at"] is None  # owed a hearing from now on
    assert ledger.rows[op.operation_id]["delivered_status"] == "COMMITTED"


async def test_an_acknowledgement_that_cannot_be_written_does_not_stop_the_others(
    ledger: MemoryLedger, service: Deliveries, session: SessionState, clock: ManualClock
) -> None:
    first = await made(ledger, S.COMMITTED, told=S.COMMITTED)
    second = await made(ledger, S.COMMITTED, told=S.COMMITTED)
    ledger.fail_next.append(LedgerUnavailable("the database is down"))

    await service.mark_acknowledged([first.operation_id, second.operation_id], session=session)

    assert ledger.rows[first.operation_id]["acknowledged_at"] is None
    assert ledger.rows[second.operation_id]["acknowledged_at"] == clock.now()


async def test_a_handoff_briefs_the_new_agent_on_what_is_pending_and_notes_it_on_each(
    ledger: MemoryLedger, service: Deliveries, session: SessionState
) -> None:
    pending = await made(ledger, S.RUNNING)
    await made(ledger, S.COMMITTED)

    brief = await service.handoff(session, "billing")

    assert session.active_agent == "billing"
    assert brief is not None and pending.operation_id in brief["content"]
    noted = [w for w in ledger.writes if w.verb == "annotate"]
    assert [(w.operation_id, w.detail) for w in noted] == [
        (pending.operation_id, {"handoff_to": "billing", "status": "RUNNING"})
    ]


async def test_a_handoff_with_nothing_pending_has_no_brief_and_writes_nothing(
    ledger: MemoryLedger, service: Deliveries, session: SessionState
) -> None:
    await made(ledger, S.COMMITTED)
    writes = len(ledger.writes)

    assert await service.handoff(session, "billing") is None
    assert len(ledger.writes) == writes


async def test_each_tool_is_delivered_and_shown_as_its_policy_says(
    ledger: MemoryLedger, service: Deliveries
) -> None:
    booking = await made(ledger, S.COMMITTED)
    refunded = await made(ledger, S.COMMITTED, tool="refund")

    assert service.mode_for(booking, superseded=False) is DeliveryMode.WHEN_IDLE
    assert service.mode_for(refunded, superseded=False) is DeliveryMode.INTERRUPT
    assert service.mode_for(refunded, superseded=True) is DeliveryMode.SILENT
    assert service.visible(booking, "front_desk")
    assert not service.visible(refunded, "front_desk")
    assert service.visible(refunded, "billing")
    assert service.is_read("look_up") and not service.is_read("book")


async def test_a_new_pipeline_is_told_what_is_owed_once_and_its_hearing_is_recorded(
    ledger: MemoryLedger, service: Deliveries, session: SessionState, clock: ManualClock
) -> None:
    owed = await made(ledger, S.COMMITTED)
    clock.advance(1)
    outlet = Outlet()
    delivery = service.open(session, outlet)

    delivery.start()
    await outlet.settled()

    assert [t.operation.operation_id for t in outlet.told] == [owed.operation_id]
    assert outlet.told[0].run_llm
    assert ledger.rows[owed.operation_id]["delivered_status"] == "COMMITTED"
    assert ledger.rows[owed.operation_id]["acknowledged_at"] is None

    delivery.bot_stopped()  # said to the end
    await outlet.settled()
    assert ledger.rows[owed.operation_id]["acknowledged_at"] == clock.now()
    delivery.close()
    await outlet.stop()

    again = Outlet()
    service.open(session, again).start()
    await again.settled()
    assert again.told == []
    await again.stop()


async def test_an_outcome_owed_while_the_user_speaks_waits_until_nobody_does(
    ledger: MemoryLedger, service: Deliveries, session: SessionState, clock: ManualClock
) -> None:
    owed = await made(ledger, S.COMMITTED)
    clock.advance(1)
    outlet = Outlet()
    delivery = service.open(session, outlet)

    delivery.start()
    session.user_speaking = True  # before the owed outcome is looked up
    await outlet.settled()
    assert outlet.told == []

    session.user_speaking = False
    delivery.release()
    await outlet.settled()
    assert [t.operation.operation_id for t in outlet.told] == [owed.operation_id]
    await outlet.stop()


async def test_a_bot_cut_off_while_saying_an_outcome_leaves_it_unheard(
    ledger: MemoryLedger, service: Deliveries, session: SessionState, clock: ManualClock
) -> None:
    owed = await made(ledger, S.COMMITTED)
    clock.advance(1)
    outlet = Outlet()
    delivery = service.open(session, outlet)
    delivery.start()
    await outlet.settled()

    delivery.interrupted()
    delivery.bot_stopped()
    await outlet.settled()

    assert ledger.rows[owed.operation_id]["acknowledged_at"] is None
    assert [op.operation_id for op in await service.owed("s1", before=clock.now(), mark=0)] == [
        owed.operation_id
    ]
    await outlet.stop()
