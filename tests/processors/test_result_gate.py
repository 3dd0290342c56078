"""The result gate keeps the context truthful: no false CANCELLED, no lost or stuck result.

Real Pipecat aggregators and LLM tool path (ScriptedLLM), the real runtime and ledger, the
fake system of record counting real bookings. The provider and the runtime run on a manual
clock: a booking commits (and a deadline passes) when the frame script advances it, at the
point of the conversation the test is about.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from pipecat.frames.frames import (
    BotStartedSpeakingFrame,
    EndFrame,
    Frame,
    FunctionCallCancelFrame,
    FunctionCallInProgressFrame,
    FunctionCallResultFrame,
    InterruptionFrame,
    LLMRunFrame,
    TTSSpeakFrame,
    UserStartedSpeakingFrame,
    UserStoppedSpeakingFrame,
)
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

from pipecat_actions import (
    ActionContext,
    ActionRuntime,
    AllowAll,
    Reconciliation,
    SessionState,
    action,
    attach,
    tools_schema,
)
from pipecat_actions.adapters import ActionResultGate, ActionTurnTracker
from pipecat_actions.policy import load_policy_text
from pipecat_actions.runtime.calls import CONFIRM_TOOL
from pipecat_actions.runtime.deliveries import SessionDelivery
from pipecat_actions.status import ActionStatus
from pipecat_actions.testing import FakeSystemOfRecord, Say, ScriptedLLM, ToolCalls, capture_logs
from tests._waiting import guarded
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
from tests.realtime._support import HeldAuthorizer

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


@pytest.fixture
async def runtime_factory(tmp_path: Path) -> AsyncIterator[Any]:
    opened: list[ActionRuntime] = []

    async def make(
        late: str = "in_place",
        latency_secs: float = 0.5,
        visible_to: str = "[]",
        authorizer: Any = None,
    ) -> Agent:
        clock = ScriptClock()
        sor = FakeSystemOfRecord(clock=clock)
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
            authorizer=authorizer or AllowAll(),
            actions=[book_table],
            ledger_url=f"sqlite:///{tmp_path}/ledger-{len(opened)}.db",
            clock=clock,
        )
        opened.append(runtime)
        return Agent(runtime, sor, clock, [])

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
    agent.llm.push_step(ToolCalls([("book_table", BOOK_2100)]))
    agent.llm.push_step(Say("Booked."))
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


async def test_a_late_result_while_the_user_speaks_waits_and_is_delivered_once(
    runtime_factory: Any,
) -> None:
    agent = await runtime_factory(late="when_idle")
    agent.llm.push_step(ToolCalls([("book_table", BOOK_2100)]))
    agent.llm.push_step(Say("Booked."))
    stamp = StampUserStopped(agent.clock)

    async def not_told_yet() -> None:
        (op,) = await agent.runtime.ledger.list()
        assert op.delivered_at is None, "told while the user was speaking"
        assert not agent.developer(), "told while the user was speaking"

    await agent.run(
        [
            LLMRunFrame(),
            agent.sent(0.5),
            InterruptionFrame(),
            agent.closed("running"),
            UserStartedSpeakingFrame(),
            lambda: agent.log.wait_pushed(UserStartedSpeakingFrame, by=agent.gate),
            agent.advance(0.5),  # the booking commits while the user is still speaking
            agent.outcomes(),
            not_told_yet,
            agent.advance(0.2),  # the user goes on a moment
            UserStoppedSpeakingFrame(),
            agent.told_late(),
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

    def superseded() -> bool:
        return any("superseded_by" in content for content in agent.developer())

    async def earlier_committed() -> bool:
        ops = await agent.runtime.ledger.list()
        return any(o.args["time"] == "21:00" and o.status is ActionStatus.COMMITTED for o in ops)

    await agent.run(
        [
            LLMRunFrame(),
            agent.sent(0.5),
            UserStartedSpeakingFrame(),  # "no, make it 21:30": a new user turn
            InterruptionFrame(),
            agent.closed("running"),
            UserStoppedSpeakingFrame(),
            agent.advance(0.2),
            LLMRunFrame(),
            agent.sent(0.5, times=2),  # both bookings are on their way
            agent.advance(0.3),  # the earlier one commits after the user changed it
            lambda: until(earlier_committed, what="the earlier booking committed"),
            agent.advance(0.2),  # then the newer one
            agent.outcomes(2),
            lambda: until(superseded, what="the superseded outcome told"),
            agent.delivered(2),  # the newer one in place
        ]
    )

    ops = sorted(await agent.runtime.ledger.list(), key=lambda o: o.created_at)
    assert [o.args["time"] for o in ops] == ["21:00", "21:30"]
    assert all(o.status is ActionStatus.COMMITTED for o in ops)
    assert agent.sor.side_effects["book"] == 2  # each once: nothing booked blindly again
    late = [m["content"] for m in agent.messages() if m.get("role") == "developer"]
    superseded_told = [c for c in late if ops[0].operation_id in c and "superseded_by" in c]
    assert superseded_told, late
    assert ops[1].operation_id in superseded_told[0]
    assert "21:00" in superseded_told[0] or "bk_" in superseded_told[0]


async def test_a_result_not_visible_to_the_active_agent_waits_for_a_handoff(
    runtime_factory: Any,
) -> None:
    agent = await runtime_factory(visible_to="[host]")
    agent.session.active_agent = "greeter"
    agent.llm.push_step(ToolCalls([("book_table", BOOK_2100)]))
    agent.llm.push_step(Say("Booked."))

    async def hand_off() -> None:
        assert not agent.developer(), "told to an agent that may not see it"
        await agent.gate.handoff("host")

    await agent.run(
        [
            LLMRunFrame(),
            agent.sent(0.5),
            InterruptionFrame(),
            agent.closed("running"),
            agent.advance(0.5),
            agent.outcomes(),  # the booking committed, unseen by the greeter
            hand_off,
            agent.told_late(),
        ]
    )

    developer = agent.developer()
    assert any("committed" in c for c in developer), developer
    (op,) = await agent.runtime.ledger.list()
    assert op.delivered_agent == "host"


async def test_outcomes_of_calls_proposed_together_are_told_in_one_spoken_turn(
    runtime_factory: Any,
) -> None:
    agent = await runtime_factory()
    agent.sor.faults.hang("book")  # the first request to arrive is answered last
    agent.llm.push_step(ToolCalls([("book_table", BOOK_2100), ("book_table", BOOK_2130)]))
    agent.llm.push_step(Say("Both are booked."))

    async def one_told() -> None:
        async def check() -> bool:
            ops = await agent.runtime.ledger.list()
            return [op.status for op in ops].count(ActionStatus.COMMITTED) == 1

        await until(check, what="one of the bookings committed")
        committed = [
            op for op in await agent.runtime.ledger.list() if op.status is ActionStatus.COMMITTED
        ]
        await outcome(agent.runtime, committed[0].operation_id)
        await idle(agent.gate)
        await until(lambda: len(agent.developer()) == 1, what="its outcome in the context")

    async def release_the_other() -> None:
        agent.sor.release_hung()

    await agent.run(
        [
            LLMRunFrame(),
            agent.sent(0.5, times=2),
            InterruptionFrame(),
            agent.closed("running", calls=2),
            agent.advance(0.5),  # one commits; the provider holds the other
            one_told,
            FLUSH,  # whatever its outcome made the model do is done
            release_the_other,
            agent.outcomes(2),
            agent.told_late(2),
            FLUSH,
        ]
    )

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
    clock = ScriptClock()
    sor = FakeSystemOfRecord(clock=clock)
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

    async with agent_on(
        tmp_path,
        "version: 1\ntools:\n  book_table:\n    kind: mutation\n    mode: background\n"
        "    announce: Let me book that for you, one moment.\n",
        [book_table],
        sor,
        clock,
    ) as agent:
        agent.llm.push_step(ToolCalls([("book_table", BOOK_2100)]))
        agent.llm.push_step(Say("Your table is booked."))
        tap = Tap()

        def passed(frame_type: type[Frame]) -> Step:
            return lambda: until(
                lambda: any(isinstance(f, frame_type) for f in tap.frames),
                what=f"{frame_type.__name__} passed",
            )

        await agent.run(
            [
                LLMRunFrame(),
                agent.sent(0.3),
                passed(TTSSpeakFrame),  # announced while the booking runs
                agent.advance(0.3),
                passed(FunctionCallResultFrame),
            ],
            before_gate=[tap],
        )
    spoken = [f.text for f in tap.frames if isinstance(f, TTSSpeakFrame)]
    assert spoken == ["Let me book that for you, one moment."]
    said_at = next(i for i, f in enumerate(tap.frames) if isinstance(f, TTSSpeakFrame))
    result_at = next(i for i, f in enumerate(tap.frames) if isinstance(f, FunctionCallResultFrame))
    assert said_at < result_at
    assert sor.side_effects["book"] == 1


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
        agent.llm.push_step(ToolCalls([("book_table", BOOK_2100)]))
        agent.llm.push_step(Say("Still working on it."))
        agent.llm.push_step(Say("Sorry, it did not go through."))

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


async def test_a_refusal_naming_a_running_booking_does_not_count_as_telling_its_outcome(
    runtime_factory: Any,
) -> None:
    # The party size changes while the 21:00 booking runs: the same intent (its key leaves
    # the party size out) with other details is refused, naming the running booking. Telling
    # that refusal used to mark the booking delivered: when it committed, nobody was told.
    agent = await runtime_factory()
    agent.llm.push_step(ToolCalls([("book_table", BOOK_2100)]))
    agent.llm.push_step(ToolCalls([("book_table", {**BOOK_2100, "party_size": 4})]))
    agent.llm.push_step(Say("Noted."))
    agent.llm.push_step(Say("Booked."))
    await agent.run(
        [
            LLMRunFrame(),
            agent.sent(0.5),
            InterruptionFrame(),  # "make it four of us"
            agent.closed("running"),
            LLMRunFrame(),
            agent.closed("refused"),
            agent.advance(0.5),  # the first booking commits
            agent.outcomes(2),
            agent.told_late(),
        ]
    )

    ops = sorted(await agent.runtime.ledger.list(), key=lambda o: o.created_at)
    booking, refusal = ops
    assert booking.status is ActionStatus.COMMITTED
    assert refusal.status is ActionStatus.REJECTED
    refused = [json.loads(c) for c in _tool_messages(agent) if _status(c) == "refused"]
    assert refused[0]["existing_operation_id"] == booking.operation_id
    assert refused[0]["operation_id"] == refusal.operation_id
    told = [c for c in agent.developer() if booking.operation_id in c]
    assert len(told) == 1 and "committed" in told[0], agent.developer()
    assert booking.delivered_at is not None and booking.delivered_at >= booking.committed_at


async def test_a_new_pipeline_retells_an_outcome_cut_off_while_the_bot_was_speaking(
    runtime_factory: Any,
) -> None:
    # The first pipeline ends while the bot speaks, with a late outcome held until it is
    # idle. The session's next pipeline must tell it; it used to hold it for ever, because
    # "the bot is speaking" was still set on the session by the pipeline that was cut off.
    agent = await runtime_factory(late="when_idle")
    agent.llm.push_step(ToolCalls([("book_table", BOOK_2100)]))
    agent.llm.push_step(Say("Booked."))

    async def held() -> None:
        (op,) = await agent.runtime.ledger.list()
        assert op.status is ActionStatus.COMMITTED and op.delivered_at is None
        assert not agent.developer()

    await agent.run(
        [
            LLMRunFrame(),
            agent.sent(0.5),
            InterruptionFrame(),
            agent.closed("running"),
            BotStartedSpeakingFrame(),  # "one moment..." and the call drops mid-sentence
            lambda: agent.log.wait_pushed(BotStartedSpeakingFrame, by=agent.gate),
            agent.advance(0.5),
            agent.outcomes(),
            held,
        ]
    )
    assert agent.session.bot_speaking  # what the cut-off pipeline left on the session

    agent.gate = ActionResultGate(agent.runtime, agent.session)  # the user calls back
    await agent.run([agent.told_late()])

    (op,) = await agent.runtime.ledger.list()
    told = [c for c in agent.developer() if op.operation_id in c]
    assert len(told) == 1 and "committed" in told[0]
    assert op.delivered_at is not None


async def test_the_start_up_catch_up_never_retells_a_call_of_its_own_pipeline(
    runtime_factory: Any,
) -> None:
    # The gate looks the session's history up when its pipeline starts. When that look-up
    # answered only after a call made right after the start had been told in place, the call
    # was told a second time as an "earlier" outcome (6 of 8 runs on a real clock).
    agent = await runtime_factory()
    agent.llm.push_step(ToolCalls([("book_table", BOOK_2100)]))
    agent.llm.push_step(Say("Booked."))
    ledger = agent.runtime.ledger
    plain_list = ledger.list
    told_in_place = asyncio.Event()
    looked_up: list[int] = []

    async def slow_first_list(*args: Any, **kwargs: Any) -> Any:
        looked_up.append(1)
        if len(looked_up) == 1:  # the gate's history look-up, at its start
            await told_in_place.wait()  # ... answers only after the call was told
        return await plain_list(*args, **kwargs)

    ledger.list = slow_first_list  # type: ignore[method-assign]

    async def release_the_look_up() -> None:
        told_in_place.set()

    await agent.run(
        [
            agent.advance(0.1),  # the user speaks right after the start
            LLMRunFrame(),
            agent.sent(0.5),
            agent.advance(0.5),
            agent.closed("committed"),
            release_the_look_up,
            lambda: until(lambda: _count(agent.runtime, 1), what="the booking"),
        ]
    )
    ledger.list = plain_list  # type: ignore[method-assign]

    (op,) = await agent.runtime.ledger.list()
    assert op.status is ActionStatus.COMMITTED
    assert [_status(c) for c in _tool_messages(agent)] == ["committed"]
    assert agent.developer() == []  # told once, in place


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
        agent.llm.push_step(Say("The note is sent; the booking is still in progress."))
        agent.llm.push_step(Say("(an inference too many)"))

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


async def test_two_bookings_of_one_response_on_one_resource_do_not_supersede_each_other(
    runtime_factory: Any,
) -> None:
    # The model books two tables of one restaurant in one response (a party of twelve):
    # neither request replaces the other, whatever order the ledger inserted them in.
    agent = await runtime_factory()
    agent.llm.push_step(ToolCalls([("book_table", BOOK_2100), ("book_table", BOOK_2130)]))
    agent.llm.push_step(Say("Both tables are booked."))
    await agent.run(
        [
            LLMRunFrame(),
            agent.sent(0.5, times=2),
            agent.advance(0.5),
            agent.closed("committed", calls=2),
            agent.delivered(2),
        ]
    )
    assert "superseded_by" not in agent.text()
    assert agent.developer() == []


@pytest.mark.parametrize("undo", ["undone", "undo_failed", "undo_unknown"])
async def test_a_compensation_of_a_booking_is_told_to_its_conversation(
    tmp_path: Path, undo: str
) -> None:
    # The application undid the booking (the model had offered to): the context still said
    # "booked" and nobody was told; nor when the undo failed and the booking still stood.
    # A compensation has no reconcile hook: when its outcome is unknown (a bug in the hook),
    # it is escalated, and the model is told a person will check, not "it is being checked".
    from pipecat_actions.execution.outcomes import EffectFailed

    clock = ScriptClock()
    sor = FakeSystemOfRecord(clock=clock)
    sor.add_restaurant("r1", tables=3)

    async def undo_it(ctx: ActionContext) -> dict[str, Any]:
        if undo == "undo_failed":
            raise EffectFailed("the restaurant no longer accepts cancellations today")
        if undo == "undo_unknown":
            return {"cancelled": cancellation_reference}  # noqa: F821
        return {"cancelled": True}

    @action(compensate=undo_it)
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
        "version: 1\ntools:\n  book_table:\n    kind: mutation\n",
        [book_table],
        sor,
        clock,
    ) as agent:
        runtime = agent.runtime
        agent.llm.push_step(ToolCalls([("book_table", BOOK_2100)]))
        agent.llm.push_step(Say("Booked. Shall I cancel it?"))
        agent.llm.push_step(Say("Done."))
        undone: list[Any] = []

        async def the_application_undoes_it() -> None:
            (op,) = await runtime.ledger.list()
            undone.append(await runtime.compensate(op.operation_id, actor="app", reason="asked"))

        await agent.run(
            [
                LLMRunFrame(),
                agent.closed("committed"),
                the_application_undoes_it,
                agent.told_late(),
            ]
        )
        original = next(op for op in await runtime.ledger.list() if op.compensates is None)

    (told,) = agent.developer()
    assert original.operation_id in told
    if undo == "undone":
        assert '"compensated"' in told and original.status is ActionStatus.COMPENSATED
    elif undo == "undo_failed":
        assert '"compensation_failed"' in told and "still stands" in told
        assert original.status is ActionStatus.COMMITTED
    else:
        assert '"compensation_unknown"' in told and "a person will check it" in told
        assert "being checked" not in told
        assert original.status is ActionStatus.COMPENSATING and original.escalated_at is not None


async def test_a_background_action_waiting_for_approval_is_announced_too(
    tmp_path: Path,
) -> None:
    # The announce line was skipped when the call went to a person: the user heard nothing
    # until the model spoke about the pending approval.
    clock = ScriptClock()
    sor = FakeSystemOfRecord(clock=clock)

    @action
    async def refund(ctx: ActionContext, amount_cents: int) -> dict[str, Any]:
        """Refund a deposit."""
        return {"refunded_cents": amount_cents}

    async with agent_on(
        tmp_path,
        "version: 1\ntools:\n  refund:\n    kind: mutation\n    mode: background\n"
        "    announce: I am passing that to a colleague, one moment.\n"
        "    confirmation: {mode: approval, approvers: [ops]}\n",
        [refund],
        sor,
        clock,
    ) as agent:
        agent.llm.push_step(ToolCalls([("refund", {"amount_cents": 500})]))
        agent.llm.push_step(Say("A colleague will approve it shortly."))
        tap = Tap()
        await agent.run(
            [
                LLMRunFrame(),
                lambda: until(
                    lambda: any(isinstance(f, FunctionCallResultFrame) for f in tap.frames),
                    what="the awaiting-approval result",
                ),
            ],
            before_gate=[tap],
        )
    spoken = [f.text for f in tap.frames if isinstance(f, TTSSpeakFrame)]
    assert spoken == ["I am passing that to a colleague, one moment."]
    said_at = next(i for i, f in enumerate(tap.frames) if isinstance(f, TTSSpeakFrame))
    result_at = next(i for i, f in enumerate(tap.frames) if isinstance(f, FunctionCallResultFrame))
    assert said_at < result_at
    (result,) = [f.result for f in tap.frames if isinstance(f, FunctionCallResultFrame)]
    assert result["status"] == "awaiting_approval"


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
        agent.llm.push_step(ToolCalls([("cancel_order", {"order_id": "o1"})]))
        agent.llm.push_step(Say("Shall I cancel order o1?"))
        agent.llm.push_step(_confirm_the_question)
        agent.llm.push_step(Say("It is cancelled."))
        yield agent


def _in_the_gates_close() -> bool:
    task = asyncio.current_task()
    name = task.get_name() if task is not None else ""
    return name.startswith("ActionResultGate") and "::_close" in name


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
    agent.llm.push_step(ToolCalls([("book_table", BOOK_2100)]))
    agent.llm.push_step(Say("It is booked."))
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


READ_POLICY = """
version: 1
tools:
  check_availability:
    kind: read
"""


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


async def test_a_background_action_confirmed_by_the_user_is_announced_when_it_starts(
    tmp_path: Path,
) -> None:
    # The announce line was skipped for a verbally confirmed background action, and the
    # confirmation held the conversation until the refund's outcome.
    clock = ScriptClock()
    sor = FakeSystemOfRecord(clock=clock)

    @action
    async def refund(ctx: ActionContext, amount_cents: int) -> dict[str, Any]:
        """Refund a deposit."""
        await clock.sleep(0.5)
        return {"refunded_cents": amount_cents}

    async with agent_on(
        tmp_path,
        "version: 1\ntools:\n  refund:\n    kind: mutation\n    mode: background\n"
        "    announce: Refunding that now, one moment.\n"
        "    confirmation: {mode: verbal}\n",
        [refund],
        sor,
        clock,
    ) as agent:
        agent.llm.push_step(ToolCalls([("refund", {"amount_cents": 500})]))
        agent.llm.push_step(Say("Shall I refund five euros?"))
        agent.llm.push_step(_confirm_the_question)
        agent.llm.push_step(Say("It is on its way."))
        tap = Tap()

        def results() -> list[Any]:
            return [f.result for f in tap.frames if isinstance(f, FunctionCallResultFrame)]

        await agent.run(
            [
                LLMRunFrame(),
                lambda: until(lambda: len(results()) == 1, what="the confirmation question"),
                FLUSH,
                _the_user_says_yes(agent),
                LLMRunFrame(),
                lambda: until(lambda: len(results()) == 2, what="the confirmation's answer"),
                lambda: clock.asked(0.5),
                agent.advance(0.5),
                agent.told_late(),
            ],
            before_gate=[tap],
        )
    spoken = [f.text for f in tap.frames if isinstance(f, TTSSpeakFrame)]
    assert spoken == ["Refunding that now, one moment."]
    said_at = next(i for i, f in enumerate(tap.frames) if isinstance(f, TTSSpeakFrame))
    answered_at = [i for i, f in enumerate(tap.frames) if isinstance(f, FunctionCallResultFrame)][1]
    assert said_at < answered_at
    assert results()[1]["status"] == "admitted"
    assert any("committed" in told for told in agent.developer())


async def test_a_verbally_confirmed_action_is_told_once_by_the_confirmations_result(
    tmp_path: Path,
) -> None:
    # The outcome reaches the runtime's listeners before the confirm_action result reaches
    # the gate: it was told twice (a developer message, then the result), with an extra
    # inference.
    async with _verbal_cancel_order(tmp_path) as agent:
        await agent.run(
            [
                LLMRunFrame(),
                agent.closed("awaiting_confirmation"),
                FLUSH,
                _the_user_says_yes(agent),
                LLMRunFrame(),
                agent.closed("committed"),
                agent.delivered(1),
                FLUSH,
            ]
        )
        (op,) = [o for o in await agent.runtime.ledger.list() if o.tool == "cancel_order"]
    assert op.status is ActionStatus.COMMITTED
    assert agent.developer() == []  # told once, by the confirmation's result
    assert [
        m.get("content")
        for m in agent.messages()
        if m.get("role") == "assistant" and m.get("content")
    ] == [
        "Shall I cancel order o1?",
        "It is cancelled.",
    ]


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


async def test_a_confirmed_outcome_heard_by_the_runtime_first_is_still_told_once_in_place(
    tmp_path: Path,
) -> None:
    # The same as above with the race made certain: the gate hears the outcome from the
    # runtime, and does all it does with it, before the confirm_action result comes.
    await _told_once_though_its_answer_was_held(tmp_path, FLUSH)


async def test_a_catch_up_that_reads_a_confirmed_outcome_late_does_not_tell_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Seen once under load: the catch-up the question's result started ("awaiting
    # confirmation": has it moved already?) read the ledger only after the user's yes, the
    # commit and the confirm_action answer, and told the outcome as a late message while the
    # answer was still on its way to the gate, which then told it again in place.
    read = asyncio.Event()
    catch_up = SessionDelivery._catch_up

    async def _catch_up(self: SessionDelivery, operation_id: str, shown: str | None) -> None:
        await read.wait()
        await catch_up(self, operation_id, shown)

    async def read_now() -> None:
        read.set()

    monkeypatch.setattr(SessionDelivery, "_catch_up", _catch_up)
    await _told_once_though_its_answer_was_held(tmp_path, read_now)


async def test_a_barge_in_while_the_call_is_being_admitted_closes_it_with_what_admission_made(
    runtime_factory: Any,
) -> None:
    # Admission runs on when Pipecat cancels the wait: the booking it admits goes on, so the
    # call is closed with its real state (never "nothing was done"), and its outcome follows.
    held = HeldAuthorizer()
    agent = await runtime_factory(authorizer=held)
    agent.llm.push_step(ToolCalls([("book_table", BOOK_2100)]))
    agent.llm.push_step(Say("It is booked."))

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


async def test_a_pipeline_that_ends_while_its_owed_look_up_still_reads_leaves_no_task_behind(
    runtime_factory: Any,
) -> None:
    # The look-up of what the session is owed runs when the pipeline starts; a pipeline that
    # ends first (a very short call, a busy database) stops it: it only reads, and what it
    # would have told stays owed in the ledger.
    agent = await runtime_factory()
    ledger = agent.runtime.ledger
    plain_list = ledger.list
    reading = asyncio.Event()

    async def stuck_list(*args: Any, **kwargs: Any) -> Any:
        reading.set()
        await asyncio.Event().wait()  # never answers

    async def look_up_started() -> None:
        await guarded(reading.wait(), what="the owed look-up to start")

    ledger.list = stuck_list  # type: ignore[method-assign]
    try:
        with capture_logs("WARNING") as warned:
            pair = LLMContextAggregatorPair(agent.context)
            # Not agent.run: that waits for the gate to be idle, which it never is here.
            await run_script(
                [
                    pair.user(),
                    ActionTurnTracker(agent.session),
                    agent.llm,
                    agent.gate,
                    pair.assistant(),
                ],
                [look_up_started],
            )
    finally:
        ledger.list = plain_list  # type: ignore[method-assign]

    assert not [line for line in warned if "dangling" in line]


async def test_an_outcome_a_repeated_call_waits_for_is_told_by_that_call_and_not_again_late(
    runtime_factory: Any,
) -> None:
    # The user talks over the booking (its call is closed as running); the model repeats the
    # call, which joins the booking and waits for it. When it commits, the repeat's result says
    # so in place: the first call's late telling would say it a second time.
    agent = await runtime_factory(late="when_idle")
    agent.llm.push_step(ToolCalls([("book_table", BOOK_2100)]))
    agent.llm.push_step(ToolCalls([("book_table", BOOK_2100)]))
    agent.llm.push_step(Say("Your table is booked."))
    await agent.run(
        [
            LLMRunFrame(),
            agent.sent(0.5),
            InterruptionFrame(),
            agent.closed("running"),
            LLMRunFrame(),  # the model answers the user's turn by repeating the call
            lambda: until(
                lambda: agent.runtime.operation_for_call("call_2") is not None,
                what="the repeat to join the booking",
            ),
            agent.advance(0.5),
            agent.closed("committed"),
            agent.delivered(1),
        ]
    )

    assert [_status(content) for content in _tool_messages(agent)] == ["running", "committed"]
    assert agent.developer() == []  # no "Outcome of an earlier book_table request"
    assert agent.sor.side_effects["book"] == 1
