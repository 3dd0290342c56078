"""The result gate keeps the context truthful: no false CANCELLED, no lost or stuck result.

Real Pipecat aggregators and LLM tool path (ScriptedLLM), the real runtime and ledger, the
fake system of record counting real bookings.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pipecat.frames.frames import (
    Frame,
    FunctionCallInProgressFrame,
    FunctionCallResultFrame,
    InterruptionFrame,
    LLMRunFrame,
    TTSSpeakFrame,
    UserStartedSpeakingFrame,
    UserStoppedSpeakingFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.tests.utils import SleepFrame, run_test

from pipecat_actions import (
    ActionContext,
    ActionRuntime,
    AllowAll,
    Reconciliation,
    SessionState,
    action,
)
from pipecat_actions.policy import load_policy_text
from pipecat_actions.processors import ActionResultGate, ActionTurnTracker
from pipecat_actions.status import ActionStatus
from pipecat_actions.testing import FakeSystemOfRecord, Say, ScriptedLLM, ToolCalls

POLICY = """
version: 1
tools:
  book_table:
    kind: mutation
    idempotency: {key_fields: [restaurant_id, date, time]}
    resource: "table:{restaurant_id}:{date}"
    deadline_secs: 5
    delivery: {late: %(late)s, superseded: %(late)s}
    visible_to: %(visible_to)s
"""
BOOK_2100 = {"restaurant_id": "r1", "date": "2030-05-01", "time": "21:00", "party_size": 2}
BOOK_2130 = {**BOOK_2100, "time": "21:30"}


class DelayInProgress(FrameProcessor):
    """Holds in-progress frames back, as an output transport does behind playing audio."""

    def __init__(self, secs: float) -> None:
        super().__init__()
        self.secs = secs

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, FunctionCallInProgressFrame):
            self.create_task(self._later(frame, direction))
            return
        await self.push_frame(frame, direction)

    async def _later(self, frame: Frame, direction: FrameDirection) -> None:
        await asyncio.sleep(self.secs)
        await self.push_frame(frame, direction)


class StampUserStopped(FrameProcessor):
    """Records (wall clock, as the runtime's) when the user stopped speaking."""

    def __init__(self) -> None:
        super().__init__()
        self.stopped_at: float | None = None

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, UserStoppedSpeakingFrame):
            self.stopped_at = time.time()
        await self.push_frame(frame, direction)


class Agent:
    """A booking agent wired like the pipeline template, for one test."""

    def __init__(self, runtime: ActionRuntime, sor: FakeSystemOfRecord, script: list[Any]) -> None:
        self.runtime = runtime
        self.sor = sor
        self.session = SessionState(session_id="call-1", principal="alice")
        self.llm = ScriptedLLM(script)
        runtime.attach(self.llm, self.session)
        self.context = LLMContext(
            messages=[{"role": "user", "content": "book a table"}], tools=runtime.tools_schema()
        )
        self.gate = ActionResultGate(runtime, self.session)

    async def run(self, frames: list[Frame], *, before_gate: list[FrameProcessor] = ()) -> None:
        pair = LLMContextAggregatorPair(self.context)
        pipeline = Pipeline(
            [
                pair.user(),
                ActionTurnTracker(self.session),
                self.llm,
                *before_gate,
                self.gate,
                pair.assistant(),
            ]
        )
        await run_test(pipeline, frames_to_send=frames)

    def messages(self) -> list[dict[str, Any]]:
        return [dict(m) for m in self.context.get_messages()]

    def text(self) -> str:
        return json.dumps(self.messages())


@pytest.fixture
async def runtime_factory(tmp_path: Path) -> AsyncIterator[Any]:
    opened: list[ActionRuntime] = []

    async def make(
        late: str = "in_place", latency_secs: float = 0.5, visible_to: str = "[]"
    ) -> Agent:
        sor = FakeSystemOfRecord()
        sor.add_restaurant("r1", tables=3)
        sor.faults.set_latency(latency_secs)

        @action
        async def book_table(
            ctx: ActionContext, restaurant_id: str, date: str, time: str, party_size: int
        ) -> dict[str, Any]:
            """Book a table."""
            booking = await sor.book(
                restaurant_id, date, time, party_size, "Ada", idempotency_key=ctx.idempotency_key
            )
            return {"booking_id": booking.booking_id, "time": booking.time}

        runtime = await ActionRuntime.create(
            load_policy_text(POLICY % {"late": late, "visible_to": visible_to}),
            authorizer=AllowAll(),
            actions=[book_table],
            ledger_url=f"sqlite:///{tmp_path}/ledger-{len(opened)}.db",
        )
        opened.append(runtime)
        return Agent(runtime, sor, [])

    yield make
    for runtime in opened:
        await runtime.close(grace_secs=0)


def _tool_messages(agent: Agent) -> list[str]:
    return [m["content"] for m in agent.messages() if m.get("role") == "tool"]


async def test_barge_in_while_the_booking_runs_never_tells_the_model_cancelled(
    runtime_factory: Any,
) -> None:
    agent = await runtime_factory()
    agent.llm.push_step(ToolCalls([("book_table", BOOK_2100)]))
    agent.llm.push_step(Say("Your table is booked."))
    await agent.run([LLMRunFrame(), SleepFrame(sleep=0.2), InterruptionFrame(), SleepFrame(1.0)])

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
    agent.llm.push_step(ToolCalls([("book_table", BOOK_2100)]))
    agent.llm.push_step(Say("Booked."))
    await agent.run(
        [LLMRunFrame(), SleepFrame(sleep=0.1), InterruptionFrame(), SleepFrame(1.2)],
        before_gate=[DelayInProgress(0.3)],
    )

    tools = _tool_messages(agent)
    assert tools
    assert "IN_PROGRESS" not in agent.text()
    assert "CANCELLED" not in agent.text()
    assert json.loads(tools[0])["status"] in {"running", "committed"}
    assert agent.sor.side_effects["book"] == 1


async def test_a_late_result_while_the_user_speaks_waits_and_is_delivered_once(
    runtime_factory: Any,
) -> None:
    agent = await runtime_factory(late="when_idle")
    agent.llm.push_step(ToolCalls([("book_table", BOOK_2100)]))
    agent.llm.push_step(Say("Booked."))
    stamp = StampUserStopped()
    await agent.run(
        [
            LLMRunFrame(),
            SleepFrame(sleep=0.2),
            InterruptionFrame(),
            UserStartedSpeakingFrame(),
            SleepFrame(sleep=0.7),  # the booking commits while the user is still speaking
            UserStoppedSpeakingFrame(),
            SleepFrame(sleep=0.5),
        ],
        before_gate=[stamp],
    )

    developer = [m for m in agent.messages() if m.get("role") == "developer"]
    assert len(developer) == 1
    (op,) = await agent.runtime.ledger.list()
    assert op.status is ActionStatus.COMMITTED
    assert op.delivered_at is not None
    assert op.committed_at is not None
    assert stamp.stopped_at is not None
    assert op.committed_at < stamp.stopped_at <= op.delivered_at


async def test_the_earlier_booking_committing_after_the_user_changed_it_is_told_as_superseded(
    runtime_factory: Any,
) -> None:
    agent = await runtime_factory()
    agent.llm.push_step(ToolCalls([("book_table", BOOK_2100)]))
    agent.llm.push_step(ToolCalls([("book_table", BOOK_2130)]))
    agent.llm.push_step(Say("Done."))
    agent.llm.push_step(Say("Done."))
    await agent.run(
        [
            LLMRunFrame(),
            SleepFrame(sleep=0.2),
            InterruptionFrame(),  # "no, make it 21:30"
            LLMRunFrame(),
            SleepFrame(sleep=1.5),
        ]
    )

    ops = sorted(await agent.runtime.ledger.list(), key=lambda o: o.created_at)
    assert [o.args["time"] for o in ops] == ["21:00", "21:30"]
    assert all(o.status is ActionStatus.COMMITTED for o in ops)
    assert agent.sor.side_effects["book"] == 2  # each once: nothing booked blindly again
    late = [m["content"] for m in agent.messages() if m.get("role") == "developer"]
    superseded = [c for c in late if ops[0].operation_id in c and "superseded_by" in c]
    assert superseded, late
    assert ops[1].operation_id in superseded[0]
    assert "21:00" in superseded[0] or "bk_" in superseded[0]


async def test_a_result_not_visible_to_the_active_agent_waits_for_a_handoff(
    runtime_factory: Any,
) -> None:
    agent = await runtime_factory(visible_to="[host]")
    agent.session.active_agent = "greeter"
    agent.llm.push_step(ToolCalls([("book_table", BOOK_2100)]))
    agent.llm.push_step(Say("Booked."))

    async def hand_off_later() -> None:
        await asyncio.sleep(1.0)  # the booking committed at ~0.5 s, unseen by the greeter
        assert not [m for m in agent.messages() if m.get("role") == "developer"]
        await agent.gate.handoff("host")

    handoff = asyncio.ensure_future(hand_off_later())
    await agent.run([LLMRunFrame(), SleepFrame(sleep=0.2), InterruptionFrame(), SleepFrame(1.4)])
    await handoff

    developer = [m["content"] for m in agent.messages() if m.get("role") == "developer"]
    assert any("committed" in c for c in developer), developer
    (op,) = await agent.runtime.ledger.list()
    assert op.delivered_agent == "host"


async def test_outcomes_of_calls_proposed_together_are_told_in_one_spoken_turn(
    runtime_factory: Any,
) -> None:
    agent = await runtime_factory()
    agent.llm.push_step(ToolCalls([("book_table", BOOK_2100), ("book_table", BOOK_2130)]))
    agent.llm.push_step(Say("Both are booked."))
    await agent.run([LLMRunFrame(), SleepFrame(sleep=0.2), InterruptionFrame(), SleepFrame(1.2)])

    late = [m for m in agent.messages() if m.get("role") == "developer"]
    assert len(late) == 2
    assert agent.sor.side_effects["book"] == 2
    # One inference for the proposal, one for both outcomes together (not one each).
    assert agent.llm.inferences == 2


class Tap(FrameProcessor):
    """Records the frames that pass."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: list[Frame] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        self.frames.append(frame)
        await self.push_frame(frame, direction)


async def test_a_background_action_is_announced_when_it_starts_without_claiming_an_outcome(
    tmp_path: Path,
) -> None:
    sor = FakeSystemOfRecord()
    sor.add_restaurant("r1", tables=3)
    sor.faults.set_latency(0.3)

    @action
    async def book_table(
        ctx: ActionContext, restaurant_id: str, date: str, time: str, party_size: int
    ) -> dict[str, Any]:
        """Book a table."""
        booking = await sor.book(
            restaurant_id, date, time, party_size, "Ada", idempotency_key=ctx.idempotency_key
        )
        return {"booking_id": booking.booking_id}

    runtime = await ActionRuntime.create(
        load_policy_text(
            "version: 1\ntools:\n  book_table:\n    kind: mutation\n    mode: background\n"
            "    announce: Let me book that for you, one moment.\n"
        ),
        authorizer=AllowAll(),
        actions=[book_table],
        ledger_url=f"sqlite:///{tmp_path}/ledger.db",
    )
    try:
        agent = Agent(runtime, sor, [])
        agent.llm.push_step(ToolCalls([("book_table", BOOK_2100)]))
        agent.llm.push_step(Say("Your table is booked."))
        tap = Tap()
        await agent.run([LLMRunFrame(), SleepFrame(sleep=0.8)], before_gate=[tap])
    finally:
        await runtime.close(grace_secs=0)
    spoken = [f.text for f in tap.frames if isinstance(f, TTSSpeakFrame)]
    assert spoken == ["Let me book that for you, one moment."]
    said_at = next(i for i, f in enumerate(tap.frames) if isinstance(f, TTSSpeakFrame))
    result_at = next(i for i, f in enumerate(tap.frames) if isinstance(f, FunctionCallResultFrame))
    assert said_at < result_at
    assert sor.side_effects["book"] == 1


async def test_a_result_past_pipecats_timeout_is_bounded_by_the_watchdog_and_told_truthfully(
    tmp_path: Path,
) -> None:
    sor = FakeSystemOfRecord()
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

    runtime = await ActionRuntime.create(
        load_policy_text(
            "version: 1\ntools:\n  book_table:\n    kind: mutation\n"
            "    timeout_secs: 0.2\n    deadline_secs: 0.6\n"
        ),
        authorizer=AllowAll(),
        actions=[book_table],
        ledger_url=f"sqlite:///{tmp_path}/ledger.db",
    )
    try:
        agent = Agent(runtime, sor, [])
        agent.llm.push_step(ToolCalls([("book_table", BOOK_2100)]))
        agent.llm.push_step(Say("Still working on it."))
        agent.llm.push_step(Say("Sorry, it did not go through."))
        await agent.run([LLMRunFrame(), SleepFrame(sleep=1.5)])
        (op,) = await runtime.ledger.list()
    finally:
        await runtime.close(grace_secs=0)

    assert "CANCELLED" not in agent.text()
    (tool,) = _tool_messages(agent)
    assert json.loads(tool)["status"] == "running"  # Pipecat's timeout only ended the wait
    assert op.status is ActionStatus.FAILED_FINAL  # the watchdog, then the system of record
    assert op.finished_at is not None
    assert op.finished_at - op.created_at < 1.2
    late = [m["content"] for m in agent.messages() if m.get("role") == "developer"]
    # Possibly "unknown, being checked" first (told at the deadline), then what the system of
    # record said; never anything else.
    assert 1 <= len(late) <= 2
    assert "failed_final" in late[-1]
    assert all("committed" not in m and "cancelled" not in m for m in late)
    assert sor.side_effects["book"] == 0
