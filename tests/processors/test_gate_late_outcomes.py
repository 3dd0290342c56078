"""What the conversation is owed reaches it once, late or in place, and only truthfully.

Late outcomes while the user speaks, superseded bookings, handoffs, calls proposed together,
a new pipeline of the session, compensations, refusals that name a running booking, a
repeated call. Real aggregators, runtime and ledger; the provider on a manual clock
(`tests.processors._gate`).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from pipecat.frames.frames import (
    BotStartedSpeakingFrame,
    InterruptionFrame,
    LLMRunFrame,
    UserStartedSpeakingFrame,
    UserStoppedSpeakingFrame,
)
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair

from pipecat_actions import (
    ActionContext,
    action,
)
from pipecat_actions.adapters import ActionResultGate, ActionTurnTracker
from pipecat_actions.status import ActionStatus
from pipecat_actions.testing import FakeSystemOfRecord, Say, ToolCalls, capture_logs
from tests._waiting import guarded
from tests.processors._clocked import (
    FLUSH,
    ScriptClock,
    idle,
    outcome,
    run_script,
    until,
)
from tests.processors._gate import (
    BOOK_2100,
    BOOK_2130,
    StampUserStopped,
    _count,
    _status,
    _tool_messages,
    agent_on,
)


async def test_a_late_result_while_the_user_speaks_waits_and_is_delivered_once(
    runtime_factory: Any,
) -> None:
    agent = await runtime_factory(late="when_idle")
    agent.will(ToolCalls([("book_table", BOOK_2100)]), Say("Booked."))
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
    agent.will(
        ToolCalls([("book_table", BOOK_2100)]),
        ToolCalls([("book_table", BOOK_2130)]),
        Say("Done."),
        Say("Done."),
    )

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
    agent.will(ToolCalls([("book_table", BOOK_2100)]), Say("Booked."))

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
    agent.will(
        ToolCalls([("book_table", BOOK_2100), ("book_table", BOOK_2130)]), Say("Both are booked.")
    )

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


async def test_a_refusal_naming_a_running_booking_does_not_count_as_telling_its_outcome(
    runtime_factory: Any,
) -> None:
    # The party size changes while the 21:00 booking runs: the same intent (its key leaves
    # the party size out) with other details is refused, naming the running booking. Telling
    # that refusal used to mark the booking delivered: when it committed, nobody was told.
    agent = await runtime_factory()
    agent.will(
        ToolCalls([("book_table", BOOK_2100)]),
        ToolCalls([("book_table", {**BOOK_2100, "party_size": 4})]),
        Say("Noted."),
        Say("Booked."),
    )
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
    agent.will(ToolCalls([("book_table", BOOK_2100)]), Say("Booked."))

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
    agent.will(ToolCalls([("book_table", BOOK_2100)]), Say("Booked."))
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


async def test_two_bookings_of_one_response_on_one_resource_do_not_supersede_each_other(
    runtime_factory: Any,
) -> None:
    # The model books two tables of one restaurant in one response (a party of twelve):
    # neither request replaces the other, whatever order the ledger inserted them in.
    agent = await runtime_factory()
    agent.will(
        ToolCalls([("book_table", BOOK_2100), ("book_table", BOOK_2130)]),
        Say("Both tables are booked."),
    )
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
        agent.will(
            ToolCalls([("book_table", BOOK_2100)]), Say("Booked. Shall I cancel it?"), Say("Done.")
        )
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
    agent.will(
        ToolCalls([("book_table", BOOK_2100)]),
        ToolCalls([("book_table", BOOK_2100)]),
        Say("Your table is booked."),
    )
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
