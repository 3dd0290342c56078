"""Builders of the result gate's tests: an agent wired like the pipeline template, its steps.

Each test builds an `Agent` (the real aggregators, `ActionTurnTracker`, a `ScriptedLLM`, the
`ActionResultGate`) on a runtime of its own with a manual clock, scripts what the model says
(`Agent.will`), and runs frame steps (`Agent.sent`, `closed`, `told_late`, ...). The
``runtime_factory`` fixture (``conftest.py``) builds the booking agent most of them use.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from pipecat.frames.frames import (
    Frame,
    FunctionCallInProgressFrame,
    FunctionCallResultFrame,
    LLMRunFrame,
    UserStoppedSpeakingFrame,
)
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

from pipecat_actions import (
    ActionContext,
    ActionRuntime,
    AllowAll,
    SessionState,
    action,
    attach,
    tools_schema,
)
from pipecat_actions.adapters import ActionResultGate, ActionTurnTracker
from pipecat_actions.policy import load_policy_text
from pipecat_actions.runtime.calls import CONFIRM_TOOL
from pipecat_actions.status import ActionStatus
from pipecat_actions.testing import FakeSystemOfRecord, Say, ScriptedLLM, ToolCalls
from tests.processors._clocked import (
    FLUSH,
    FrameLog,
    ScriptClock,
    Step,
    idle,
    outcome,
    run_script,
    until,
)

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


class HoldInProgress(FrameProcessor):
    """Holds in-progress frames back until released, as an output transport does behind audio."""

    def __init__(self) -> None:
        super().__init__()
        self.held: list[Frame] = []
        self._released = asyncio.Event()

    def release(self) -> None:
        self._released.set()

    def holds(self, frame: Frame) -> bool:
        return isinstance(frame, FunctionCallInProgressFrame)

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if self.holds(frame):
            self.held.append(frame)
            self.create_task(self._later(frame, direction))
            return
        await self.push_frame(frame, direction)

    async def _later(self, frame: Frame, direction: FrameDirection) -> None:
        await self._released.wait()
        await self.push_frame(frame, direction)


class StampUserStopped(FrameProcessor):
    """Records (on the runtime's clock) when the user stopped speaking."""

    def __init__(self, clock: ScriptClock) -> None:
        super().__init__()
        self.clock = clock
        self.stopped_at: float | None = None

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, UserStoppedSpeakingFrame):
            self.stopped_at = self.clock.now()
        await self.push_frame(frame, direction)


class Agent:
    """A booking agent wired like the pipeline template, for one test."""

    def __init__(
        self,
        runtime: ActionRuntime,
        sor: FakeSystemOfRecord,
        clock: ScriptClock,
        script: list[Any],
    ) -> None:
        self.runtime = runtime
        self.sor = sor
        self.clock = clock
        self.session = SessionState(session_id="call-1", principal="alice")
        self.llm = ScriptedLLM(script)
        attach(runtime, self.llm, self.session)
        self.context = LLMContext(
            messages=[{"role": "user", "content": "book a table"}], tools=tools_schema(runtime)
        )
        self.gate = ActionResultGate(runtime, self.session)
        self.log = FrameLog()

    async def run(self, steps: Sequence[Step], *, before_gate: list[FrameProcessor] = ()) -> None:
        """Run the steps, then let the gate finish what they started before the pipeline ends."""
        pair = LLMContextAggregatorPair(self.context)
        await run_script(
            [
                pair.user(),
                ActionTurnTracker(self.session),
                self.llm,
                *before_gate,
                self.gate,
                pair.assistant(),
            ],
            [*steps, lambda: idle(self.gate)],
            observers=[self.log],
        )

    def will(self, *steps: Any) -> None:
        """Script what the model does next, one inference per step (`ScriptedLLM`)."""
        for step in steps:
            self.llm.push_step(step)

    def messages(self) -> list[dict[str, Any]]:
        return [dict(m) for m in self.context.get_messages()]

    def text(self) -> str:
        return json.dumps(self.messages())

    def developer(self) -> list[str]:
        return [m["content"] for m in self.messages() if m.get("role") == "developer"]

    # --- script steps ----------------------------------------------------------------------

    def sent(self, latency_secs: float, times: int = 1) -> Step:
        """Wait until the provider holds ``times`` requests (each waits its latency)."""
        return lambda: self.clock.asked(latency_secs, times)

    def advance(self, secs: float) -> Step:
        async def step() -> None:
            self.clock.advance(secs)

        return step

    def closed(self, *statuses: str, calls: int = 1) -> Step:
        """Wait until ``calls`` tool messages say one of ``statuses`` (the calls were closed)."""

        def check() -> bool:
            told = [_status(content) for content in _tool_messages(self)]
            return sum(status in statuses for status in told) >= calls

        return lambda: until(check, what=f"{calls} calls closed as {statuses}")

    def outcomes(self, count: int = 1) -> Step:
        """Wait until ``count`` operations have their outcome and the gate has acted on it."""

        async def step() -> None:
            await until(
                lambda: _count(self.runtime, count), what=f"{count} operations in the ledger"
            )
            for op in await self.runtime.ledger.list():
                await outcome(self.runtime, op.operation_id)  # the gate has been told
            await idle(self.gate)

        return step

    def delivered(self, count: int) -> Step:
        """Wait until ``count`` outcomes are recorded as delivered (in place or late)."""

        async def check() -> bool:
            ops = await self.runtime.ledger.list()
            return sum(op.delivered_at is not None for op in ops) >= count

        return lambda: until(check, what=f"{count} outcomes delivered")

    def told_late(self, count: int = 1) -> Step:
        """Wait until ``count`` late outcomes are in the context and recorded as delivered."""

        async def check() -> bool:
            ops = await self.runtime.ledger.list()
            delivered = sum(op.delivered_at is not None for op in ops)
            return len(self.developer()) >= count and delivered >= count

        return lambda: until(check, what=f"{count} late outcomes told")


@contextlib.asynccontextmanager
async def agent_on(
    tmp_path: Path,
    policy_text: str,
    actions: list[Any],
    sor: FakeSystemOfRecord,
    clock: ScriptClock,
) -> AsyncIterator[Agent]:
    """An `Agent` on a runtime of its own with ``actions`` under ``policy_text``, closed after."""
    runtime = await ActionRuntime.create(
        load_policy_text(policy_text),
        authorizer=AllowAll(),
        actions=actions,
        ledger_url=f"sqlite:///{tmp_path}/ledger.db",
        clock=clock,
    )
    try:
        yield Agent(runtime, sor, clock, [])
    finally:
        await runtime.close(grace_secs=0)


def _status(content: Any) -> str | None:
    try:
        told = json.loads(content)
    except (TypeError, ValueError):
        return None  # IN_PROGRESS, or Pipecat's CANCELLED
    return told.get("status") if isinstance(told, dict) else None


async def _count(runtime: ActionRuntime, count: int) -> bool:
    return len(await runtime.ledger.list()) >= count


def _tool_messages(agent: Agent) -> list[str]:
    return [m["content"] for m in agent.messages() if m.get("role") == "tool"]


class Tap(FrameProcessor):
    """Records the frames that pass."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: list[Frame] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        self.frames.append(frame)
        await self.push_frame(frame, direction)


def _confirm_the_question(messages: list[Any]) -> ToolCalls:
    """The model's step after the user said yes: confirm_action with the question's token."""
    asked = next(
        json.loads(m["content"])
        for m in messages
        if m.get("role") == "tool" and "awaiting_confirmation" in str(m.get("content"))
    )
    token = {
        "operation_id": asked["operation_id"],
        "confirmation_token": asked["confirmation_token"],
    }
    return ToolCalls([("confirm_action", token)])


def _the_user_says_yes(agent: Agent) -> Step:
    """A script step: the user answers in a new turn (a confirmation counts from a later one)."""

    async def step() -> None:
        agent.session.start_user_turn()

    return step


@contextlib.asynccontextmanager
async def _verbal_cancel_order(tmp_path: Path) -> AsyncIterator[Agent]:
    """An agent whose order cancellation needs the user's yes; the model asks, then confirms."""
    clock = ScriptClock()

    @action
    async def cancel_order(ctx: ActionContext, order_id: str) -> dict[str, Any]:
        """Cancel an order."""
        return {"order_id": order_id, "status": "cancelled"}

    async with agent_on(
        tmp_path,
        "version: 1\ntools:\n  cancel_order:\n    kind: mutation\n"
        "    confirmation: {mode: verbal}\n",
        [cancel_order],
        FakeSystemOfRecord(clock=clock),
        clock,
    ) as agent:
        agent.will(
            ToolCalls([("cancel_order", {"order_id": "o1"})]),
            Say("Shall I cancel order o1?"),
            _confirm_the_question,
            Say("It is cancelled."),
        )
        yield agent


def _in_the_gates_close() -> bool:
    task = asyncio.current_task()
    name = task.get_name() if task is not None else ""
    return name.startswith("ActionResultGate") and "::_close" in name


READ_POLICY = """
version: 1
tools:
  check_availability:
    kind: read
"""


class HoldConfirmResults(HoldInProgress):
    """Holds confirm_action results back until released (they sit behind the bot's audio)."""

    def holds(self, frame: Frame) -> bool:
        return isinstance(frame, FunctionCallResultFrame) and frame.function_name == CONFIRM_TOOL


async def _told_once_though_its_answer_was_held(tmp_path: Path, meanwhile: Any) -> None:
    """Confirm the cancellation, hold the answer back, do ``meanwhile``; it is told once."""
    async with _verbal_cancel_order(tmp_path) as agent:
        hold = HoldConfirmResults()

        async def release() -> None:
            hold.release()

        async def committed() -> bool:
            ops = [o for o in await agent.runtime.ledger.list() if o.tool == "cancel_order"]
            return bool(ops) and ops[0].status is ActionStatus.COMMITTED

        await agent.run(
            [
                LLMRunFrame(),
                agent.closed("awaiting_confirmation"),
                FLUSH,
                _the_user_says_yes(agent),
                LLMRunFrame(),
                lambda: until(lambda: hold.held, what="the confirmation's result held back"),
                lambda: until(committed, what="the cancellation committed"),
                meanwhile,
                lambda: idle(agent.gate),
                release,
                agent.closed("committed"),
                agent.delivered(1),
                FLUSH,
            ],
            before_gate=[hold],
        )
    assert agent.developer() == []
    spoken = [m.get("content") for m in agent.messages() if m.get("role") == "assistant"]
    assert [c for c in spoken if c] == ["Shall I cancel order o1?", "It is cancelled."]
