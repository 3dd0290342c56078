"""The gate closes a call Pipecat cancelled with its operation's real state, never CANCELLED.

Barge-ins, Pipecat's timeout, a cancel that overtakes its in-progress frame (#5779), an end
right after a barge-in, a ledger that cannot be read, a read stopped with its handler, a call
still being admitted. Real aggregators, runtime and ledger; the provider on a manual clock
(`tests.processors._gate`).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from pipecat.frames.frames import (
    EndFrame,
    FunctionCallCancelFrame,
    FunctionCallResultFrame,
    InterruptionFrame,
    LLMRunFrame,
)

from pipecat_actions import (
    ActionContext,
    Reconciliation,
    action,
)
from pipecat_actions.status import ActionStatus
from pipecat_actions.testing import FakeSystemOfRecord, Say, ToolCalls
from tests._waiting import guarded
from tests.processors._clocked import (
    FLUSH,
    ScriptClock,
    idle,
    until,
)
from tests.processors._gate import (
    BOOK_2100,
    READ_POLICY,
    HoldInProgress,
    _in_the_gates_close,
    _status,
    _tool_messages,
    agent_on,
)
from tests.realtime._support import HeldAuthorizer


async def test_barge_in_while_the_booking_runs_never_tells_the_model_cancelled(
    runtime_factory: Any,
) -> None:
    agent = await runtime_factory()
    agent.will(ToolCalls([("book_table", BOOK_2100)]), Say("Your table is booked."))
    await agent.run(
        [
            LLMRunFrame(),
            agent.sent(0.5),
            InterruptionFrame(),
            agent.closed("running"),
            agent.advance(0.5),  # the booking commits after the barge-in
            agent.told_late(),
        ]
    )

    assert "CANCELLED" not in agent.text()
    (tool,) = _tool_messages(agent)
    assert json.loads(tool)["status"] == "running"
    developer = [m for m in agent.messages() if m.get("role") == "developer"]
    assert len(developer) == 1
    assert '\\"status\\": \\"committed\\"' in json.dumps(developer[0]["content"])
    assert agent.sor.side_effects["book"] == 1
    (op,) = await agent.runtime.ledger.list()
    assert op.status is ActionStatus.COMMITTED
    assert op.delivered_at is not None


async def test_a_cancel_that_overtakes_its_in_progress_frame_leaves_no_call_in_progress(
    runtime_factory: Any,
) -> None:
    agent = await runtime_factory()
    agent.will(ToolCalls([("book_table", BOOK_2100)]), Say("Booked."))
    hold = HoldInProgress()

    async def release() -> None:
        hold.release()

    await agent.run(
        [
            LLMRunFrame(),
            agent.sent(0.5),
            lambda: until(lambda: hold.held, what="the in-progress frame held back"),
            InterruptionFrame(),
            # The cancel reaches the gate while its in-progress frame is still held back, and
            # the gate has done all it does with it before that frame comes.
            lambda: agent.log.wait_pushed(FunctionCallCancelFrame, by=hold),
            FLUSH,
            lambda: idle(agent.gate),
            release,
            agent.closed("running", "committed"),
            agent.advance(0.5),
            agent.outcomes(),
        ],
        before_gate=[hold],
    )

    tools = _tool_messages(agent)
    assert tools
    assert "IN_PROGRESS" not in agent.text()
    assert "CANCELLED" not in agent.text()
    assert json.loads(tools[0])["status"] in {"running", "committed"}
    assert agent.sor.side_effects["book"] == 1


async def test_a_result_past_pipecats_timeout_is_bounded_by_the_watchdog_and_told_truthfully(
    tmp_path: Path,
) -> None:
    clock = ScriptClock()
    sor = FakeSystemOfRecord(clock=clock)
    sor.add_restaurant("r1", tables=3)
    sor.faults.set_latency(5.0)  # the provider never answers in time

    async def find(ctx: ActionContext) -> Reconciliation:
        found = sor.find_by_idempotency_key(ctx.idempotency_key)
        return Reconciliation.committed({"found": True}) if found else Reconciliation.not_found()

    @action(reconcile=find)
    async def book_table(
        ctx: ActionContext, restaurant_id: str, date: str, time: str, party_size: int
    ) -> dict[str, Any]:
        """Book a table."""
        booking = await sor.book(
            restaurant_id, date, time, party_size, "Ada", idempotency_key=ctx.idempotency_key
        )
        return {"booking_id": booking.booking_id}

    async with agent_on(
        tmp_path,
        # This provider forgets a request its client left (commit horizon 0): once the
        # watchdog stopped the effect, no trace of it is the truth.
        "version: 1\ntools:\n  book_table:\n    kind: mutation\n"
        "    timeout_secs: 1.0\n    deadline_secs: 1.5\n"
        "    reconciliation: {commit_horizon_secs: 0}\n",
        [book_table],
        sor,
        clock,
    ) as agent:
        runtime = agent.runtime
        agent.will(
            ToolCalls([("book_table", BOOK_2100)]),
            Say("Still working on it."),
            Say("Sorry, it did not go through."),
        )

        def failed_told() -> bool:
            return any("failed_final" in content for content in agent.developer())

        await agent.run(
            [
                LLMRunFrame(),
                agent.sent(5.0),
                # Pipecat's own timeout ends the wait (real time: 1 s, a margin for admission
                # to finish first; a cancel that overtakes admission is told as CANCELLED).
                agent.closed("running"),
                agent.advance(1.5),  # the deadline passes; the provider has not answered
                agent.outcomes(),
                lambda: until(failed_told, what="the watchdog's outcome told"),
            ]
        )
        (op,) = await runtime.ledger.list()

    assert "CANCELLED" not in agent.text()
    (tool,) = _tool_messages(agent)
    assert json.loads(tool)["status"] == "running"  # Pipecat's timeout only ended the wait
    assert "interrupted" not in json.loads(tool)["message"]  # nobody interrupted anything
    assert op.status is ActionStatus.FAILED_FINAL  # the watchdog, then the system of record
    assert op.finished_at is not None
    assert op.finished_at == op.deadline_at  # at its deadline, not when the provider answers
    late = [m["content"] for m in agent.messages() if m.get("role") == "developer"]
    # Possibly "unknown, being checked" first (told at the deadline), then what the system of
    # record said; never anything else.
    assert 1 <= len(late) <= 2
    assert "failed_final" in late[-1]
    assert all("committed" not in m and "cancelled" not in m for m in late)
    assert sor.side_effects["book"] == 0


async def test_a_call_of_a_group_closed_by_its_timeout_waits_for_the_group_before_inference(
    tmp_path: Path,
) -> None:
    # Two calls proposed together; Pipecat's timeout ends the wait for one while the other
    # still runs. The gate used to copy the timeout's run_llm onto its truthful result,
    # bypassing the aggregator's group rule: one inference for that call and one for the
    # group. Now only the group's end makes the bot speak.
    clock = ScriptClock()
    sor = FakeSystemOfRecord(clock=clock)
    sor.add_restaurant("r1", tables=3)
    sor.faults.set_latency(60.0)  # the booking outlives Pipecat's 1 s wait

    @action
    async def book_table(
        ctx: ActionContext, restaurant_id: str, date: str, time: str, party_size: int
    ) -> dict[str, Any]:
        """Book a table."""
        booking = await sor.book(
            restaurant_id, date, time, party_size, "Ada", idempotency_key=ctx.idempotency_key
        )
        return {"booking_id": booking.booking_id}

    @action
    async def send_note(ctx: ActionContext, text: str) -> dict[str, Any]:
        """Send a note to the restaurant."""
        await clock.sleep(2.0)
        return {"sent": text}

    async with agent_on(
        tmp_path,
        "version: 1\ntools:\n  book_table:\n    kind: mutation\n    timeout_secs: 1.0\n"
        "    deadline_secs: 600\n  send_note:\n    kind: mutation\n    deadline_secs: 600\n",
        [book_table, send_note],
        sor,
        clock,
    ) as agent:
        agent.llm.push_step(
            ToolCalls([("book_table", BOOK_2100), ("send_note", {"text": "window seat"})])
        )
        agent.will(
            Say("The note is sent; the booking is still in progress."),
            Say("(an inference too many)"),
        )

        await agent.run(
            [
                LLMRunFrame(),
                agent.sent(60.0),
                agent.closed("running"),  # Pipecat's timeout ended the booking's wait
                lambda: idle(agent.gate),
                FLUSH,
                agent.advance(2.0),  # the note is sent: the group is done
                agent.closed("committed"),
                lambda: until(lambda: agent.llm.inferences >= 2, what="the group's inference"),
                FLUSH,
            ]
        )

    assert agent.llm.inferences == 2  # the proposal, then one for the whole group
    assert "an inference too many" not in agent.text()


async def test_an_end_right_after_a_barge_in_reaches_the_aggregator_after_the_truthful_close(
    runtime_factory: Any,
) -> None:
    # The pipeline ends (the user hung up) right after a barge-in cancelled the wait for a
    # running booking, while the gate still reads the booking's state to close the call. The
    # EndFrame used to overtake the close: the context ended with Pipecat's IN_PROGRESS.
    agent = await runtime_factory()
    agent.llm.push_step(ToolCalls([("book_table", BOOK_2100)]))
    ledger = agent.runtime.ledger
    plain_get = ledger.get
    reading, answer = asyncio.Event(), asyncio.Event()

    async def slow_close_read(operation_id: str) -> Any:
        if _in_the_gates_close():
            reading.set()
            await answer.wait()
        return await plain_get(operation_id)

    async def slow_reads() -> None:
        ledger.get = slow_close_read  # type: ignore[method-assign]

    async def answer_the_read() -> None:
        answer.set()

    await agent.run(
        [
            LLMRunFrame(),
            agent.sent(0.5),
            slow_reads,
            InterruptionFrame(),
            lambda: until(reading.is_set, what="the gate reading the booking"),
            EndFrame(),
            lambda: agent.log.wait_pushed(EndFrame, by=agent.llm),
            answer_the_read,
        ]
    )
    ledger.get = plain_get  # type: ignore[method-assign]

    (tool,) = _tool_messages(agent)
    assert _status(tool) == "running", tool
    ends = [p for p in agent.log.pushes if isinstance(p.frame, EndFrame) and p.source is agent.gate]
    results = [
        i
        for i, p in enumerate(agent.log.pushes)
        if isinstance(p.frame, FunctionCallResultFrame) and p.source is agent.gate
    ]
    assert ends and results
    assert results[0] < agent.log.pushes.index(ends[0])


async def test_a_ledger_failure_closing_a_cancelled_call_says_neither_in_progress_nor_cancelled(
    runtime_factory: Any,
) -> None:
    agent = await runtime_factory()
    agent.will(ToolCalls([("book_table", BOOK_2100)]), Say("It is booked."))
    ledger = agent.runtime.ledger
    plain_get = ledger.get

    async def failing_close_read(operation_id: str) -> Any:
        if _in_the_gates_close():
            raise ConnectionError("database unavailable")
        return await plain_get(operation_id)

    async def failing_reads() -> None:
        ledger.get = failing_close_read  # type: ignore[method-assign]

    await agent.run(
        [
            LLMRunFrame(),
            agent.sent(0.5),
            failing_reads,
            InterruptionFrame(),
            agent.closed("unknown"),
            agent.advance(0.5),  # the booking commits; the runtime tells the gate
            agent.told_late(),
        ]
    )
    ledger.get = plain_get  # type: ignore[method-assign]

    assert "CANCELLED" not in agent.text() and "IN_PROGRESS" not in agent.text()
    (tool,) = _tool_messages(agent)
    assert "was not stopped" in json.loads(tool)["message"]
    (late,) = agent.developer()
    assert "committed" in late
    assert agent.sor.side_effects["book"] == 1


@pytest.mark.parametrize("overtakes", [True, False], ids=["cancel-overtakes", "in-order"])
async def test_a_read_stopped_by_a_barge_in_is_closed_with_a_result_never_left_in_progress(
    tmp_path: Path, overtakes: bool
) -> None:
    # A read has no operation behind it while it runs: the gate used to pass Pipecat's cancel
    # on, and when that cancel had overtaken the in-progress frame it overtook it again in the
    # aggregator's queue (a system frame): the tool message stayed IN_PROGRESS.
    clock = ScriptClock()
    sor = FakeSystemOfRecord(clock=clock)

    @action
    async def check_availability(ctx: ActionContext, restaurant_id: str) -> dict[str, Any]:
        """Check which tables are free."""
        await clock.sleep(0.5)
        return {"free": 3}

    async with agent_on(tmp_path, READ_POLICY, [check_availability], sor, clock) as agent:
        agent.llm.push_step(ToolCalls([("check_availability", {"restaurant_id": "r1"})]))
        hold = HoldInProgress()
        if not overtakes:
            hold.release()

        async def release() -> None:
            hold.release()

        await agent.run(
            [
                LLMRunFrame(),
                lambda: clock.asked(0.5),
                InterruptionFrame(),
                lambda: agent.log.wait_pushed(FunctionCallCancelFrame, by=hold),
                FLUSH,
                lambda: idle(agent.gate),
                release,
                lambda: until(lambda: bool(_tool_messages(agent)), what="the tool message"),
                agent.closed("cancelled"),
            ],
            before_gate=[hold],
        )

    (tool,) = _tool_messages(agent)
    assert json.loads(tool)["status"] == "cancelled"
    assert "nothing was changed" in json.loads(tool)["message"]
    assert "IN_PROGRESS" not in agent.text()


async def test_a_barge_in_while_the_call_is_being_admitted_closes_it_with_what_admission_made(
    runtime_factory: Any,
) -> None:
    # Admission runs on when Pipecat cancels the wait: the booking it admits goes on, so the
    # call is closed with its real state (never "nothing was done"), and its outcome follows.
    held = HeldAuthorizer()
    agent = await runtime_factory(authorizer=held)
    agent.will(ToolCalls([("book_table", BOOK_2100)]), Say("It is booked."))

    async def admission_asks() -> None:
        await guarded(held.asked.wait(), what="admission to ask the authorizer")

    async def release_once_cancelled() -> None:
        llm: Any = agent.llm
        await until(lambda: not llm._function_call_tasks, what="Pipecat to cancel the wait")
        held.release()

    await agent.run(
        [
            LLMRunFrame(),
            admission_asks,
            InterruptionFrame(),
            release_once_cancelled,
            agent.closed("running", "admitted"),
            agent.sent(0.5),
            agent.advance(0.5),
            agent.told_late(),
        ]
    )

    (tool,) = _tool_messages(agent)
    assert _status(tool) in ("running", "admitted")
    assert "not_started" not in agent.text() and "CANCELLED" not in agent.text()
    (late,) = agent.developer()
    assert "committed" in late
    assert agent.sor.side_effects["book"] == 1
