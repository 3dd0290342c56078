"""What the user hears, end to end: real aggregators, FakeTTS, a real output transport.

The runtime, the tracker and the gate sit where the template puts them; user turns go through
the real user aggregator and barge-ins are VAD starts while the bot speaks.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pipecat.processors.aggregators.llm_context import LLMContext

from pipecat_actions import ActionContext, ActionRuntime, AllowAll, SessionState, action
from pipecat_actions.policy import load_policy_text
from pipecat_actions.processors import ActionResultGate, ActionTurnTracker
from pipecat_actions.status import ActionStatus
from pipecat_actions.testing import (
    BargeIn,
    FakeSystemOfRecord,
    FakeTTS,
    Say,
    ScriptedLLM,
    ToolCalls,
    UserSays,
    Wait,
    run_conversation,
)

pytestmark = pytest.mark.timeout(30)

BOOK = {"restaurant_id": "r1", "date": "2030-05-01", "time": "21:00", "party_size": 2}


@pytest.fixture
async def booking_runtime(tmp_path: Path) -> AsyncIterator[Any]:
    opened: list[ActionRuntime] = []

    async def make(policy: str, latency_secs: float) -> tuple[ActionRuntime, FakeSystemOfRecord]:
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
            return {"booking_id": booking.booking_id}

        runtime = await ActionRuntime.create(
            load_policy_text("version: 1\ntools:\n  book_table:\n" + policy),
            authorizer=AllowAll(),
            actions=[book_table],
            ledger_url=f"sqlite:///{tmp_path}/ledger-{len(opened)}.db",
        )
        opened.append(runtime)
        return runtime, sor

    yield make
    for runtime in opened:
        await runtime.close(grace_secs=0)


async def _converse(runtime: ActionRuntime, script: list[Any], steps: list[Any]) -> Any:
    session = SessionState(session_id="call-1", principal="alice")
    llm = ScriptedLLM(script)
    runtime.attach(llm, session)
    context = LLMContext(messages=[], tools=runtime.tools_schema())
    result = await run_conversation(
        steps,
        llm=llm,
        tts=FakeTTS(secs_per_char=0.03),
        context=context,
        after_user_aggregator=[ActionTurnTracker(session)],
        before_assistant_aggregator=[ActionResultGate(runtime, session)],
    )
    return result


async def test_barge_in_during_a_background_booking_the_user_hears_it_is_booked_never_cancelled(
    booking_runtime: Any,
) -> None:
    runtime, sor = await booking_runtime(
        "    kind: mutation\n    mode: background\n"
        "    announce: Let me book that for you, it takes a moment.\n",
        latency_secs=0.6,
    )
    result = await _converse(
        runtime,
        [ToolCalls([("book_table", BOOK)]), Say("Hm?"), Say("Your table is booked.")],
        [UserSays("Book a table at nine"), BargeIn("Wait", after_secs=0.3), Wait(1.2)],
    )
    heard = " ".join(result.heard_texts).lower()
    assert "cancel" not in heard
    assert "cancel" not in json.dumps(result.context_messages).lower()
    assert result.heard_texts[0].startswith("Let me book that for you")
    assert "[interrupted]" in result.heard_texts[0]
    (op,) = await runtime.ledger.list()
    assert op.status is ActionStatus.COMMITTED
    assert op.delivered_at is not None
    assert op.acknowledged_at is not None  # the bot then finished a turn uninterrupted
    assert op.acknowledged_at >= op.delivered_at
    assert sor.side_effects["book"] == 1


async def test_barge_in_before_the_booking_is_sent_cancels_it_and_the_model_is_told_so(
    booking_runtime: Any,
) -> None:
    runtime, sor = await booking_runtime(
        "    kind: mutation\n    admit_when: turn_confirmed\n"
        "    on_interruption: cancel_if_not_started\n",
        latency_secs=0.1,
    )
    result = await _converse(
        runtime,
        [
            ToolCalls([("book_table", BOOK)], say="I will book a table for two at nine tonight."),
            Say("Okay, I have not booked anything."),
        ],
        [UserSays("Book a table at nine"), BargeIn("No wait", after_secs=0.3), Wait(0.8)],
    )
    (op,) = await runtime.ledger.list()
    assert op.status is ActionStatus.CANCELLED
    assert sor.side_effects["book"] == 0
    tool_messages = [m for m in result.context_messages if m.get("role") == "tool"]
    assert [json.loads(m["content"])["status"] for m in tool_messages] == ["cancelled"]
    assert "Okay, I have not booked anything." in result.heard_texts


async def test_barge_in_after_the_booking_committed_the_model_reads_committed(
    booking_runtime: Any,
) -> None:
    runtime, sor = await booking_runtime("    kind: mutation\n", latency_secs=0.05)
    result = await _converse(
        runtime,
        [
            ToolCalls([("book_table", BOOK)], say="Booking a table for two at nine tonight."),
            Say("Sorry, go on."),
            Say("Anything else?"),
        ],
        [UserSays("Book a table at nine"), BargeIn("Also", after_secs=0.5), Wait(0.8)],
    )
    (op,) = await runtime.ledger.list()
    assert op.status is ActionStatus.COMMITTED
    assert op.committed_at is not None
    tool_messages = [m for m in result.context_messages if m.get("role") == "tool"]
    assert [json.loads(m["content"])["status"] for m in tool_messages] == ["committed"]
    assert "cancel" not in json.dumps(result.context_messages).lower()
    assert "cancel" not in " ".join(result.heard_texts).lower()
    assert result.heard_texts[0].endswith("[interrupted]")
    assert sor.side_effects["book"] == 1
