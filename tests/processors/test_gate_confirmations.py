"""Announcements and confirmations: said when an action starts, and an outcome told once.

A background action's announcement (also when it waits for approval, or for the user's yes),
and the outcome of a verbally confirmed action told once by the confirmation's result,
whatever the races around it. Real aggregators, runtime and ledger (`tests.processors._gate`).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from pipecat.frames.frames import (
    Frame,
    FunctionCallResultFrame,
    LLMRunFrame,
    TTSSpeakFrame,
)

from pipecat_actions import (
    ActionContext,
    action,
)
from pipecat_actions.runtime.deliveries import SessionDelivery
from pipecat_actions.status import ActionStatus
from pipecat_actions.testing import FakeSystemOfRecord, Say, ToolCalls
from tests.processors._clocked import (
    FLUSH,
    ScriptClock,
    Step,
    until,
)
from tests.processors._gate import (
    BOOK_2100,
    Tap,
    _confirm_the_question,
    _the_user_says_yes,
    _told_once_though_its_answer_was_held,
    _verbal_cancel_order,
    agent_on,
)


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
        agent.will(ToolCalls([("book_table", BOOK_2100)]), Say("Your table is booked."))
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
        agent.will(
            ToolCalls([("refund", {"amount_cents": 500})]),
            Say("A colleague will approve it shortly."),
        )
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
        agent.will(
            ToolCalls([("refund", {"amount_cents": 500})]),
            Say("Shall I refund five euros?"),
            _confirm_the_question,
            Say("It is on its way."),
        )
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
