"""What is owed, and when it was first heard: one definition for the runtime and the operator.

A read is answered in its call or not at all: its record, written after the answer, carries
no delivery, and nobody is owed it. `undelivered`, `stats` (``committed_undelivered``) and
`ActionRuntime.undelivered` list only what someone is owed and was never told: a mutation. The
conversation's own debts (`Deliveries.owed`) follow the same definition.

``acknowledged_at`` is the first hearing of the status told: a later call that joined the
operation and was told it again is an audit event of its own, and moves neither the time nor
`stats`' commit-to-acknowledgement figure. Everything runs on the manual clock.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Coroutine
from typing import Any

import pytest

from pipecat_actions.actions import ActionContext, action
from pipecat_actions.clock import ManualClock
from pipecat_actions.ledger import NewOperation, Operation
from pipecat_actions.ledger.records import EventKind
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.runtime.deliveries import SessionDelivery, Told
from pipecat_actions.status import ActionStatus
from tests.runtime._execution_support import new_session, running

S = ActionStatus
T0 = 1_900_000_000.0
POLICY = """
version: 1
tools:
  order_status:
    kind: read
  refill:
    kind: mutation
    idempotency: {key_fields: [rx]}
"""


@action
async def order_status(ctx: ActionContext, rx: str) -> dict[str, Any]:
    """Where a refill stands."""
    return {"rx": rx, "status": "ready"}


@action
async def refill(ctx: ActionContext, rx: str) -> dict[str, Any]:
    """Refill a prescription."""
    return {"rx": rx, "refill_id": f"rf-{rx}"}


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    from pipecat_actions.cli import main

    assert main(list(argv)) == 0
    return capsys.readouterr().out


async def test_a_read_the_caller_heard_is_owed_to_nobody_a_mutation_never_told_is(
    ledger_url: str, clock: ManualClock, capsys: pytest.CaptureFixture[str]
) -> None:
    async with running(POLICY, [order_status, refill], ledger_url=ledger_url, clock=clock) as rt:
        session = new_session()
        heard = await rt.propose("order_status", {"rx": "RX-1"}, session)  # the caller's answer
        done = await rt.propose("refill", {"rx": "RX-1"}, session)  # its telling not recorded
        await rt.flush()  # the read's record, written after its answer
        by_runtime = await rt.undelivered()
        owed = await rt.deliveries.owed(session.session_id, before=clock.now(), mark=0)

    listed = await asyncio.to_thread(_cli, capsys, "undelivered", "--ledger", ledger_url, "--json")
    stats = json.loads(
        await asyncio.to_thread(_cli, capsys, "stats", "--ledger", ledger_url, "--json")
    )

    assert heard["status"] == done["status"] == "committed"
    assert [r["operation_id"] for r in json.loads(listed)] == [done["operation_id"]]
    assert [op.operation_id for op in by_runtime] == [done["operation_id"]]
    assert [op.operation_id for op in owed] == [done["operation_id"]]
    assert stats["tools"]["order_status"]["by_status"] == {"COMMITTED": 1}
    assert stats["tools"]["order_status"]["committed_undelivered"] == 0
    assert stats["tools"]["refill"]["committed_undelivered"] == 1


class _Outlet:
    """An `Outlet` that keeps what it is told and runs the service's tasks."""

    def __init__(self) -> None:
        self.told: list[Told] = []
        self.tasks: set[asyncio.Task[Any]] = set()

    async def tell(self, told: Told) -> None:
        self.told.append(told)

    async def interrupt(self) -> None:
        pass

    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coroutine)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        return task

    async def settled(self) -> None:
        while work := [t for t in self.tasks if t.get_coro().__name__ != "_watch"]:  # type: ignore[union-attr]
            await asyncio.gather(*work)

    def stop(self) -> None:
        for task in self.tasks:
            task.cancel()


async def _heard(delivery: SessionDelivery, outlet: _Outlet) -> None:
    """The bot says what it was told and finishes without being cut off."""
    delivery.session.bot_speaking = True
    delivery.session.bot_speaking = False
    delivery.bot_stopped()
    await outlet.settled()


async def _committed_elsewhere(rt: ActionRuntime, session_id: str) -> Operation:
    new = NewOperation(
        tool="refill",
        kind="mutation",
        args={"rx": "RX-7"},
        idempotency_key="refill|RX-7",
        session_id=session_id,
        principal="alice",
        status=S.RUNNING,
    )
    op = (await rt.ledger.admit(new)).operation
    return await rt.ledger.transition(
        op.operation_id,
        expected=S.RUNNING,
        to=S.COMMITTED,
        fence=op.fence,
        actor="worker:elsewhere",
        changes={"result": {"refill_id": "rf-7"}},
    )


async def test_the_first_hearing_counts_and_a_join_heard_later_is_a_fact_of_its_own(
    ledger_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    clock = ManualClock(start=T0)
    async with running(POLICY, [order_status, refill], ledger_url=ledger_url, clock=clock) as rt:
        session = new_session()
        op = await _committed_elsewhere(rt, session.session_id)
        outlet = _Outlet()
        delivery = rt.deliveries.open(session, outlet)
        delivery.start()  # a pipeline of the session starts: it is told the refill
        await outlet.settled()
        clock.advance(0.4)
        await _heard(delivery, outlet)  # heard to the end 0.4 s after the commit
        first = await rt.ledger.get(op.operation_id)
        # 263 s later the user asks again; the repeat joins the operation and is answered
        # with its outcome in place, and heard.
        clock.advance(263.0)
        rt.deliveries.operations.note_answered(first, session.session_id)
        delivery.told_in_place(op.operation_id)
        await outlet.settled()
        await _heard(delivery, outlet)
        delivery.close()
        outlet.stop()
        after = await rt.ledger.get(op.operation_id)
        trail = await rt.ledger.events(op.operation_id)
        in_process = rt.metrics.snapshot()["tools"]["refill"]["commit_to_acknowledged_secs"]

    stats = json.loads(
        await asyncio.to_thread(_cli, capsys, "stats", "--ledger", ledger_url, "--json")
    )

    assert [t.content.get("status") for t in outlet.told] == ["committed"]
    assert first.acknowledged_at == T0 + 0.4
    assert after.acknowledged_at == T0 + 0.4  # the first hearing stands
    assert after.delivered_status is S.COMMITTED
    hearings = [
        e.at
        for e in trail
        if e.kind is EventKind.ANNOTATION and (e.detail or {}).get("acknowledged")
    ]
    assert hearings == [T0 + 0.4, T0 + 263.4]  # the join's hearing, recorded as its own fact
    spread = stats["tools"]["refill"]["commit_to_acknowledged"]
    assert (spread["count"], spread["max_secs"], spread["p50_secs"]) == (1, 0.4, 0.4)
    assert in_process["count"] == 1
