"""``compensation.automatic`` and ``compensation.tool`` do what the policy reference says.

"Book 21:00", then, in a later user turn, "no, make it 21:30". With ``automatic: true`` the
runtime undoes the 21:00 booking itself once 21:30 has committed (with the action's compensate
hook, as a linked operation, audited), without holding up the 21:30 result, once only however
the triggers race; the conversation is told (through a real pipeline and the result gate).
With ``automatic: false`` nothing is undone and the model is told the real state and the tool
it may call to undo it. A policy asking for an automatic undo of an action that has no hook is
refused when the action is registered.

The runtime, the ledger (SQLite file or PostgreSQL) and the fake system of record are real;
the provider answers when the test advances the manual clock.
"""

from __future__ import annotations

import asyncio
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from pipecat.frames.frames import LLMRunFrame, UserStartedSpeakingFrame, UserStoppedSpeakingFrame

from pipecat_actions import ActionContext, action
from pipecat_actions.admission.authorization import AllowAll
from pipecat_actions.clock import ManualClock
from pipecat_actions.errors import ConfigurationError
from pipecat_actions.ledger import (
    ForwardingLedger,
    Ledger,
    Operation,
    OperationEvent,
    OperationFilter,
    SqlLedger,
)
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.testing import FakeSystemOfRecord, Say, ToolCalls
from tests.processors._clocked import ScriptClock, until
from tests.processors._gate import BOOK_2100, BOOK_2130, agent_on
from tests.runtime._execution_support import (
    Bookings,
    booking,
    eventually,
    guarded,
    new_session,
    policy,
    reaches,
    running,
    transitions,
)
from tests.runtime._execution_support import S as Status

AUTOMATIC = """
    version: 1
    tools:
      book_table:
        kind: mutation
        idempotency: {key_fields: [restaurant_id, date, time]}
        resource: "table:{restaurant_id}:{date}"
        deadline_secs: 30
        compensation: {automatic: true}
"""

AUTOMATIC_WITH_TOOL = """
    version: 1
    tools:
      book_table:
        kind: mutation
        idempotency: {key_fields: [restaurant_id, date, time]}
        resource: "table:{restaurant_id}:{date}"
        deadline_secs: 30
        compensation: {automatic: true, tool: cancel_booking}
      cancel_booking:
        kind: mutation
"""

ASKED = """
    version: 1
    tools:
      book_table:
        kind: mutation
        idempotency: {key_fields: [restaurant_id, date, time]}
        resource: "table:{restaurant_id}:{date}"
        deadline_secs: 30
        compensation: {tool: cancel_booking, automatic: false}
      cancel_booking:
        kind: mutation
"""


def fake(clock: ManualClock) -> FakeSystemOfRecord:
    sor = FakeSystemOfRecord(clock=clock)
    sor.add_restaurant("r1", tables=3)
    return sor


def compensations_of(ops: list[Operation], operation_id: str) -> list[Operation]:
    return [op for op in ops if op.compensates == operation_id]


async def test_a_superseded_committed_booking_is_undone_when_the_newer_one_commits(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = fake(clock)
    sor.faults.set_latency(1.0, kind="cancel")  # the undo waits for the clock
    bookings = Bookings(sor)
    async with running(
        AUTOMATIC, [bookings.action(compensate=True)], ledger_url=ledger_url, clock=clock
    ) as runtime:
        session = new_session()
        nine = await runtime.propose("book_table", booking("21:00"), session)
        assert nine["status"] == "committed"
        session.start_user_turn()  # "no, make it half past nine"

        half_past = await runtime.propose("book_table", booking("21:30"), session)
        # The newer call's result did not wait for the undo, which is still with the provider.
        assert half_past["status"] == "committed"
        assert "superseded_by" not in half_past
        await eventually(lambda: sor.calls["cancel"] == 1, what="the undo to reach the provider")
        running_undo = compensations_of(await runtime.ledger.list(), nine["operation_id"])
        assert [op.status for op in running_undo] == [Status.RUNNING]

        clock.advance(1.0)
        original = await reaches(runtime, nine["operation_id"], Status.COMPENSATED)
        newer = await runtime.ledger.get(half_past["operation_id"])
        [compensation] = compensations_of(await runtime.ledger.list(), nine["operation_id"])
        trail = await runtime.ledger.events(nine["operation_id"])

    assert compensation.status is Status.COMMITTED
    assert newer.status is Status.COMMITTED
    assert transitions(trail)[-3:] == [Status.COMMITTED, Status.COMPENSATING, Status.COMPENSATED]
    compensating = next(e for e in trail if e.to_status is Status.COMPENSATING)
    assert compensating.actor == runtime.actor
    assert compensating.detail is not None
    assert half_past["operation_id"] in compensating.detail["reason"]
    assert compensating.detail["compensation"] == compensation.operation_id
    assert original.result is not None
    assert sor.get_booking(original.result["booking_id"]).status == "cancelled"
    assert newer.result is not None
    assert sor.get_booking(newer.result["booking_id"]).status == "confirmed"
    assert sor.side_effects["cancel"] == 1


@pytest.mark.parametrize("undo_tool", [None, "cancel_booking"], ids=["no_tool", "with_tool"])
async def test_an_earlier_booking_that_commits_after_the_newer_one_is_undone_when_it_commits(
    ledger_url: str, clock: ManualClock, undo_tool: str | None
) -> None:
    sor = fake(clock)
    bookings = Bookings(sor)
    policy_text = AUTOMATIC if undo_tool is None else AUTOMATIC_WITH_TOOL
    # The undo tool the policy names for the model is an action of the app.
    undo = [] if undo_tool is None else [action(name=undo_tool)(_cancel_booking)]
    async with running(
        policy_text, [bookings.action(compensate=True), *undo], ledger_url=ledger_url, clock=clock
    ) as runtime:
        session = new_session()
        sor.faults.set_latency(5.0, kind="book")  # the nine o'clock booking is slow
        nine = asyncio.ensure_future(runtime.propose("book_table", booking("21:00"), session))
        await eventually(lambda: sor.calls["book"] == 1, what="21:00 to reach the provider")
        sor.faults.set_latency(1.0, kind="book")
        session.start_user_turn()
        half_past = asyncio.ensure_future(runtime.propose("book_table", booking("21:30"), session))
        await eventually(lambda: sor.calls["book"] == 2, what="21:30 to reach the provider")

        clock.advance(1.0)  # 21:30 commits first: 21:00 is still running, nothing to undo
        newer = await guarded(half_past, what="the 21:30 result")
        assert newer["status"] == "committed"
        nine_op = next(op for op in await runtime.ledger.list() if op.args["time"] == "21:00")
        assert nine_op.status is Status.RUNNING
        assert compensations_of(await runtime.ledger.list(), nine_op.operation_id) == []

        clock.advance(4.0)  # then 21:00 commits: it is undone as soon as it has
        told = await guarded(nine, what="the 21:00 result")
        original = await reaches(runtime, nine_op.operation_id, Status.COMPENSATED)
        [compensation] = compensations_of(await runtime.ledger.list(), nine_op.operation_id)

    assert told["status"] == "committed"
    assert told["superseded_by"] == newer["operation_id"]
    assert "undoes it automatically" in told["note"]
    assert "offer to undo it only if told that the undo failed" in told["note"]
    # Named when the policy names one (in case the undo fails); the hook undoes it either way.
    assert told.get("undo_tool") == undo_tool
    assert compensation.status is Status.COMMITTED
    assert original.result is not None
    assert sor.get_booking(original.result["booking_id"]).status == "cancelled"
    assert sor.side_effects == {"book": 2, "cancel": 1}


class HeldSupersessionReads(ForwardingLedger):
    """The real ledger; the reads of a session's operations on a resource wait for each other.

    Only the automatic compensation's look-up reads a session's operations by resource (the
    calls here are proposed without waiting, so no result is rendered). Such a read starts
    once ``expected`` of them, across every ledger sharing ``arrived`` and ``read``, have been
    asked for (so both commits are written), and returns once all of them have read (so no
    compensation has started yet): both triggers see both bookings committed.
    """

    def __init__(
        self, inner: Ledger, arrived: list[object], read: list[object], expected: int
    ) -> None:
        super().__init__(inner)
        self.arrived = arrived
        self.read = read
        self.expected = expected
        self.seen: list[list[tuple[str, Status]]] = []

    async def list(self, f: OperationFilter | None = None) -> list[Operation]:
        if f is None or f.resource_key is None:
            return await super().list(f)
        self.arrived.append(f)
        await eventually(lambda: len(self.arrived) >= self.expected, what="both triggers")
        found = await super().list(f)
        self.seen.append([(op.args["time"], op.status) for op in found])
        self.read.append(f)
        await eventually(lambda: len(self.read) >= self.expected, what="both look-ups read")
        return found


@pytest.mark.parametrize("processes", [1, 2], ids=["one_process", "two_processes"])
async def test_the_two_triggers_racing_undo_the_superseded_booking_once(
    ledger_url: str, clock: ManualClock, processes: int
) -> None:
    # The newer booking's commit (looking back) and the earlier one's (looking forward) land
    # together: both see a committed booking superseded by a committed one. In two processes
    # (one ran each booking) only the ledger can keep them from undoing it twice.
    sor = fake(clock)
    sor.faults.set_latency(1.0, kind="book")
    bookings = Bookings(sor)
    hook = bookings.action(compensate=True)
    arrived: list[object] = []
    read: list[object] = []
    ledgers = [
        HeldSupersessionReads(
            await SqlLedger.create(ledger_url, clock=clock), arrived, read, expected=2
        )
        for _ in range(processes)
    ]
    runtimes = [
        await ActionRuntime.create(
            policy(AUTOMATIC),
            authorizer=AllowAll(),
            actions=[hook],
            ledger=ledger,
            clock=clock,
            owner=f"bot-{n}",
        )
        for n, ledger in enumerate(ledgers)
    ]
    try:
        sessions = [new_session() for _ in runtimes]
        first, second = runtimes[0], runtimes[-1]
        nine = await first.propose("book_table", booking("21:00"), sessions[0], wait=False)
        sessions[-1].user_turn = sessions[0].user_turn + 1  # "no, make it half past nine"
        later = await second.propose("book_table", booking("21:30"), sessions[-1], wait=False)
        await eventually(lambda: sor.calls["book"] == 2, what="both bookings sent")

        clock.advance(1.0)  # both commit at the same instant
        original = await reaches(first, nine["operation_id"], Status.COMPENSATED)
        for runtime in runtimes:
            await runtime.close()
        ops = await first.ledger.list()
    finally:
        for runtime in runtimes:
            await runtime.close()
        for ledger in ledgers:
            await ledger.close()

    seen = [looked for ledger in ledgers for looked in ledger.seen]
    assert len(seen) == 2
    assert all(
        sorted(looked) == [("21:00", Status.COMMITTED), ("21:30", Status.COMMITTED)]
        for looked in seen
    ), seen
    [compensation] = compensations_of(ops, nine["operation_id"])
    assert compensation.status is Status.COMMITTED
    assert original.status is Status.COMPENSATED
    assert next(op for op in ops if op.operation_id == later["operation_id"]).status is (
        Status.COMMITTED
    )
    assert len(bookings.seen["compensate"]) == 1
    assert sor.side_effects == {"book": 2, "cancel": 1}


async def test_an_undo_asked_by_the_application_at_the_same_time_is_joined_not_repeated(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = fake(clock)
    sor.faults.set_latency(1.0, kind="cancel")
    bookings = Bookings(sor)
    async with running(
        AUTOMATIC, [bookings.action(compensate=True)], ledger_url=ledger_url, clock=clock
    ) as runtime:
        session = new_session()
        nine = await runtime.propose("book_table", booking("21:00"), session)
        session.start_user_turn()
        await runtime.propose("book_table", booking("21:30"), session)
        await eventually(lambda: sor.calls["cancel"] == 1, what="the automatic undo to start")

        asked = asyncio.ensure_future(
            runtime.compensate(nine["operation_id"], actor="user:alice", reason="cancel it")
        )
        clock.advance(1.0)
        joined = await guarded(asked, what="the application's undo")
        original = await reaches(runtime, nine["operation_id"], Status.COMPENSATED)
        [compensation] = compensations_of(await runtime.ledger.list(), nine["operation_id"])

    assert joined.operation_id == compensation.operation_id
    assert original.status is Status.COMPENSATED
    assert len(bookings.seen["compensate"]) == 1
    assert sor.side_effects["cancel"] == 1


class TrailReads(ForwardingLedger):
    """The real ledger, counting the reads of each operation's audit trail that returned."""

    def __init__(self, inner: Ledger) -> None:
        super().__init__(inner)
        self.trail_reads: Counter[str] = Counter()

    async def events(self, operation_id: str) -> list[OperationEvent]:
        trail = await super().events(operation_id)
        self.trail_reads[operation_id] += 1
        return trail


async def test_an_undo_that_failed_is_not_tried_again_by_a_later_booking(
    ledger: SqlLedger, ledger_url: str, clock: ManualClock
) -> None:
    # 21:00 is superseded by 21:30 and its undo fails (the restaurant refuses): it stands, and
    # the conversation is told so. A third booking (22:00) does not try to undo it again.
    sor = fake(clock)
    bookings = Bookings(sor)
    trails = TrailReads(ledger)
    async with running(
        AUTOMATIC,
        [bookings.action(compensate=True)],
        ledger_url=ledger_url,
        clock=clock,
        ledger=trails,
    ) as runtime:
        session = new_session()
        nine = await runtime.propose("book_table", booking("21:00"), session)
        nine_id = nine["operation_id"]
        sor.faults.fail_after_send("cancel")  # once
        session.start_user_turn()
        half_past = await runtime.propose("book_table", booking("21:30"), session)
        [failed] = await _compensations_ending(runtime, nine_id, 1)
        assert failed.status is Status.FAILED_FINAL
        await reaches(runtime, nine_id, Status.COMMITTED)
        assert trails.trail_reads[nine_id] == 1  # looked at before its one undo

        session.start_user_turn()
        ten = await runtime.propose("book_table", booking("22:00"), session)
        # 21:30 (now superseded and committed) is undone; 21:00 is looked at and left alone.
        await reaches(runtime, half_past["operation_id"], Status.COMPENSATED)
        await eventually(lambda: trails.trail_reads[nine_id] == 2, what="21:00 looked at again")
        ops = await runtime.ledger.list()
        original = await runtime.ledger.get(nine_id)

    assert ten["status"] == "committed"
    assert original.status is Status.COMMITTED
    assert [op.status for op in compensations_of(ops, nine_id)] == [Status.FAILED_FINAL]
    assert [op.status for op in compensations_of(ops, half_past["operation_id"])] == [
        Status.COMMITTED
    ]
    assert sor.side_effects["cancel"] == 1


async def _compensations_ending(
    runtime: ActionRuntime, operation_id: str, count: int
) -> list[Operation]:
    """Wait until ``count`` compensations of ``operation_id`` have a final outcome."""
    found: list[Operation] = []

    async def check() -> bool:
        linked = compensations_of(await runtime.ledger.list(), operation_id)
        found[:] = [op for op in linked if op.status in (Status.COMMITTED, Status.FAILED_FINAL)]
        return len(found) >= count

    await eventually(check, what=f"{count} compensations of {operation_id} to end")
    return found


async def test_without_automatic_nothing_is_undone_and_the_model_is_told_the_undo_tool(
    ledger_url: str, clock: ManualClock
) -> None:
    sor = fake(clock)
    bookings = Bookings(sor)
    cancel_booking = action(name="cancel_booking")(_cancel_booking)
    async with running(
        ASKED,
        [bookings.action(compensate=True), cancel_booking],
        ledger_url=ledger_url,
        clock=clock,
    ) as runtime:
        session = new_session()
        sor.faults.set_latency(5.0, kind="book")
        nine = asyncio.ensure_future(runtime.propose("book_table", booking("21:00"), session))
        await eventually(lambda: sor.calls["book"] == 1, what="21:00 to reach the provider")
        sor.faults.set_latency(0.0, kind="book")
        session.start_user_turn()
        half_past = await runtime.propose("book_table", booking("21:30"), session)
        clock.advance(5.0)
        told = await guarded(nine, what="the 21:00 result")
        again = await runtime.propose("book_table", booking("21:00"), session)  # joins it
        ops = await runtime.ledger.list()

    assert half_past["status"] == "committed"
    # The real state: it went through, a newer request replaced it, and how to undo it.
    for result in (told, again):
        assert result["status"] == "committed"
        assert result["superseded_by"] == half_past["operation_id"]
        assert result["undo_tool"] == "cancel_booking"
        assert "offer to undo it with cancel_booking" in result["note"]
        assert result["note"].startswith("The user changed this request afterwards")
    assert [op for op in ops if op.compensates is not None] == []
    assert {op.status for op in ops if op.tool == "book_table"} == {Status.COMMITTED}
    assert sor.side_effects == {"book": 2}


async def _cancel_booking(ctx: ActionContext, booking_id: str) -> dict[str, Any]:
    """Cancel a booking."""
    return {"cancelled": booking_id}


async def test_automatic_without_a_compensate_hook_is_refused_at_register(
    ledger_url: str, clock: ManualClock
) -> None:
    bookings = Bookings(fake(clock))
    with pytest.raises(ConfigurationError) as refused:
        async with running(
            AUTOMATIC, [bookings.action(compensate=False)], ledger_url=ledger_url, clock=clock
        ):
            pass
    message = str(refused.value)
    assert "book_table" in message
    assert "compensation.automatic" in message
    assert "compensate hook" in message


def test_automatic_needs_no_undo_tool_for_the_model() -> None:
    loaded = policy(AUTOMATIC)["book_table"]
    assert loaded.compensation is not None
    assert loaded.compensation.automatic is True
    assert loaded.compensation.tool is None


async def test_the_conversation_is_told_when_the_superseded_booking_is_undone(
    tmp_path: Path,
) -> None:
    # Through a real pipeline: 21:00 is booked and told; the user changes it to 21:30, which
    # is booked and told; the runtime then undoes 21:00 and the result gate tells the model,
    # so the bot can say so. Without it the context says two tables are booked.
    clock = ScriptClock()
    sor = FakeSystemOfRecord(clock=clock)
    sor.add_restaurant("r1", tables=3)

    async def undo(ctx: ActionContext) -> dict[str, Any]:
        assert ctx.operation is not None and ctx.operation.result is not None
        cancelled = await sor.cancel(ctx.operation.result["booking_id"])
        return {"booking_id": cancelled.booking_id, "status": cancelled.status}

    @action(compensate=undo)
    async def book_table(
        ctx: ActionContext, restaurant_id: str, date: str, time: str, party_size: int
    ) -> dict[str, Any]:
        """Book a table."""
        made = await sor.book(
            restaurant_id, date, time, party_size, "Ada", idempotency_key=ctx.idempotency_key
        )
        return {"booking_id": made.booking_id, "time": made.time}

    async with agent_on(tmp_path, textwrap.dedent(AUTOMATIC), [book_table], sor, clock) as agent:
        agent.llm.push_step(ToolCalls([("book_table", BOOK_2100)]))
        agent.llm.push_step(Say("Your table at nine is booked."))
        agent.llm.push_step(ToolCalls([("book_table", BOOK_2130)]))
        agent.llm.push_step(Say("Your table at half past nine is booked."))
        agent.llm.push_step(Say("And I cancelled the nine o'clock one."))

        def undone_told() -> bool:
            return any('"compensated"' in content for content in agent.developer())

        async def original_settled() -> bool:
            # The original is settled (COMPENSATING → COMPENSATED) right after its
            # compensation's outcome is told: wait for that, not for a moment.
            ops = await agent.runtime.ledger.list()
            return any(
                op.compensates is None
                and op.args["time"] == "21:00"
                and op.status is Status.COMPENSATED
                for op in ops
            )

        await agent.run(
            [
                LLMRunFrame(),
                agent.closed("committed"),
                UserStartedSpeakingFrame(),  # "no, make it half past nine": a new user turn
                UserStoppedSpeakingFrame(),
                LLMRunFrame(),
                agent.closed("committed", calls=2),
                lambda: until(undone_told, what="the undo told to the conversation"),
                lambda: until(original_settled, what="the 21:00 booking settled as compensated"),
            ]
        )
        ops = await agent.runtime.ledger.list()

    nine = next(op for op in ops if op.compensates is None and op.args["time"] == "21:00")
    half_past = next(op for op in ops if op.compensates is None and op.args["time"] == "21:30")
    [compensation] = compensations_of(ops, nine.operation_id)
    assert nine.status is Status.COMPENSATED
    assert half_past.status is Status.COMMITTED
    assert compensation.status is Status.COMMITTED
    [told] = [c for c in agent.developer() if '"compensated"' in c]
    assert nine.operation_id in told and compensation.operation_id in told
    assert "was undone" in told
    assert sor.side_effects == {"book": 2, "cancel": 1}
