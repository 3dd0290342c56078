"""What the user hears, end to end: real aggregators, FakeTTS, a real output transport.

The runtime, the tracker and the gate sit where the template puts them; user turns go through
the real user aggregator and barge-ins are VAD starts while the bot speaks. The system of
record and the runtime run on a manual clock, so a booking is sent, committed or left unsent
at the point of the conversation the script says (``Call`` steps), whatever the machine's
speed; only Pipecat's own playback and turn timing are real.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pipecat.processors.aggregators.llm_context import LLMContext

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
from pipecat_actions.status import ActionStatus
from pipecat_actions.testing import (
    BargeIn,
    Call,
    FakeSystemOfRecord,
    FakeTransport,
    FakeTTS,
    Say,
    ScriptedLLM,
    ToolCalls,
    UserSays,
    run_conversation,
)
from tests.processors._clocked import ScriptClock, operation, until

pytestmark = pytest.mark.timeout(30)

BOOK = {"restaurant_id": "r1", "date": "2030-05-01", "time": "21:00", "party_size": 2}


class Booking:
    """The booking tool on a fake system of record, both on a manual clock."""

    def __init__(self, runtime: ActionRuntime, sor: FakeSystemOfRecord, clock: ScriptClock):
        self.runtime = runtime
        self.sor = sor
        self.clock = clock

    def reaches(self, *statuses: ActionStatus) -> Call:
        """Wait until the booking is in one of ``statuses``."""

        async def step() -> None:
            await operation(self.runtime, "book_table", *statuses)

        return Call(step)

    def sent(self, latency_secs: float) -> Call:
        """Wait until the provider holds the request (it waits its latency on the clock)."""
        return Call(lambda: self.clock.asked(latency_secs))

    def answers(self, latency_secs: float, status: ActionStatus = ActionStatus.COMMITTED) -> Call:
        """Let the provider's latency pass, then wait for the outcome in the ledger."""

        async def step() -> None:
            self.clock.advance(latency_secs)
            await operation(self.runtime, "book_table", status)

        return Call(step)


@pytest.fixture
async def booking_runtime(tmp_path: Path) -> AsyncIterator[Any]:
    opened: list[ActionRuntime] = []

    async def make(policy: str, latency_secs: float) -> Booking:
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
            return {"booking_id": booking.booking_id}

        runtime = await ActionRuntime.create(
            load_policy_text("version: 1\ntools:\n  book_table:\n" + policy),
            authorizer=AllowAll(),
            actions=[book_table],
            ledger_url=f"sqlite:///{tmp_path}/ledger-{len(opened)}.db",
            clock=clock,
        )
        opened.append(runtime)
        return Booking(runtime, sor, clock)

    yield make
    for runtime in opened:
        await runtime.close(grace_secs=0)


class Talk:
    """One conversation with the template's processors around the booking runtime."""

    def __init__(self, booking: Booking, script: list[Any]) -> None:
        self.runtime = booking.runtime
        self.session = SessionState(session_id="call-1", principal="alice")
        self.llm = ScriptedLLM(script)
        attach(self.runtime, self.llm, self.session)
        self.context = LLMContext(messages=[], tools=tools_schema(self.runtime))
        self.transport = FakeTransport()

    async def run(self, steps: list[Any]) -> Any:
        return await run_conversation(
            steps,
            llm=self.llm,
            tts=FakeTTS(secs_per_char=0.03),
            transport=self.transport,
            context=self.context,
            after_user_aggregator=[ActionTurnTracker(self.session)],
            before_assistant_aggregator=[ActionResultGate(self.runtime, self.session)],
        )

    def heard(self, text: str) -> Call:
        """Wait until the user has heard ``text`` to its end."""
        return Call(lambda: until(lambda: text in self.transport.output().heard_texts, what=text))

    def told(self, status: str) -> Call:
        """Wait until the context has the tool call's result with ``status``."""

        def check() -> bool:
            return _tool_statuses(list(self.context.get_messages())) == [status]

        return Call(lambda: until(check, what=f"the tool result {status} in the context"))


def _tool_statuses(messages: list[Any]) -> list[str | None]:
    statuses: list[str | None] = []
    for m in messages:
        if m.get("role") != "tool":
            continue
        try:
            statuses.append(json.loads(m["content"]).get("status"))
        except (TypeError, ValueError, AttributeError):
            statuses.append(None)  # IN_PROGRESS, or an async tool's "started" note
    return statuses


async def test_barge_in_during_a_background_booking_the_user_hears_it_is_booked_never_cancelled(
    booking_runtime: Any,
) -> None:
    booking = await booking_runtime(
        "    kind: mutation\n    mode: background\n"
        "    announce: Let me book that for you, it takes a moment.\n",
        latency_secs=0.6,
    )
    talk = Talk(
        booking, [ToolCalls([("book_table", BOOK)]), Say("Hm?"), Say("Your table is booked.")]
    )

    async def acknowledged() -> bool:
        (op,) = await booking.runtime.ledger.list()
        return op.acknowledged_at is not None

    result = await talk.run(
        [
            UserSays("Book a table at nine"),
            booking.sent(0.6),
            BargeIn("Wait", after_secs=0.1),  # over the announcement, the booking still running
            booking.answers(0.6),
            Call(lambda: until(acknowledged, what="the outcome heard to the end")),
        ]
    )
    heard = " ".join(result.heard_texts).lower()
    assert "cancel" not in heard
    assert "cancel" not in json.dumps(result.context_messages).lower()
    assert result.heard_texts[0].startswith("Let me book that for you")
    assert "[interrupted]" in result.heard_texts[0]
    (op,) = await booking.runtime.ledger.list()
    assert op.status is ActionStatus.COMMITTED
    assert op.delivered_at is not None
    assert op.acknowledged_at is not None  # the bot then finished a turn uninterrupted
    assert op.acknowledged_at >= op.delivered_at
    assert booking.sor.side_effects["book"] == 1


async def test_barge_in_before_the_booking_is_sent_cancels_it_and_the_model_is_told_so(
    booking_runtime: Any,
) -> None:
    booking = await booking_runtime(
        "    kind: mutation\n    admit_when: turn_confirmed\n"
        "    on_interruption: cancel_if_not_started\n",
        latency_secs=0.1,
    )
    talk = Talk(
        booking,
        [
            ToolCalls([("book_table", BOOK)], say="I will book a table for two at nine tonight."),
            Say("Okay, I have not booked anything."),
        ],
    )
    result = await talk.run(
        [
            UserSays("Book a table at nine"),
            booking.reaches(ActionStatus.ADMITTED),  # held until the reply ends uninterrupted
            BargeIn("No wait", after_secs=0.1),
            booking.reaches(ActionStatus.CANCELLED),
            booking.answers(0.1, ActionStatus.CANCELLED),  # a request sent anyway would commit
            talk.heard("Okay, I have not booked anything."),
        ]
    )
    (op,) = await booking.runtime.ledger.list()
    assert op.status is ActionStatus.CANCELLED
    assert booking.sor.side_effects["book"] == 0
    tool_messages = [m for m in result.context_messages if m.get("role") == "tool"]
    assert [json.loads(m["content"])["status"] for m in tool_messages] == ["cancelled"]
    assert "Okay, I have not booked anything." in result.heard_texts


async def test_barge_in_after_the_booking_committed_the_model_reads_committed(
    booking_runtime: Any,
) -> None:
    booking = await booking_runtime("    kind: mutation\n", latency_secs=0.05)
    talk = Talk(
        booking,
        [
            ToolCalls(
                [("book_table", BOOK)], say="Booking a table for two at nine tonight, one moment."
            ),
            Say("Sorry, go on."),
            Say("Anything else?"),
        ],
    )
    result = await talk.run(
        [
            UserSays("Book a table at nine"),
            booking.sent(0.05),
            booking.answers(0.05),  # committed while the bot is still speaking
            BargeIn("Also", after_secs=0.1),
            talk.told("committed"),
        ]
    )
    (op,) = await booking.runtime.ledger.list()
    assert op.status is ActionStatus.COMMITTED
    assert op.committed_at is not None
    tool_messages = [m for m in result.context_messages if m.get("role") == "tool"]
    assert [json.loads(m["content"])["status"] for m in tool_messages] == ["committed"]
    assert "cancel" not in json.dumps(result.context_messages).lower()
    assert "cancel" not in " ".join(result.heard_texts).lower()
    assert result.heard_texts[0].endswith("[interrupted]")
    assert booking.sor.side_effects["book"] == 1
