"""RTVI clients hear the truth: a booking that goes on is never reported to them as cancelled.

The pipeline template (`build_pipeline`) runs in a real Pipecat worker with Pipecat's own RTVI
processor and observer, as ``PipelineWorker`` adds them by default; what a client would be sent
is read from the transport messages the RTVI processor pushes. Real aggregators and LLM tool
path (ScriptedLLM), the real runtime and ledger, the fake system of record; the provider and
the runtime run on a manual clock, so a booking commits (and a deadline passes) when the script
says.
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
    FunctionCallInProgressFrame,
    FunctionCallResultFrame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMRunFrame,
    OutputTransportMessageUrgentFrame,
    TextFrame,
)
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.frameworks.rtvi.frames import RTVIServerMessageFrame
from pipecat.processors.frameworks.rtvi.observer import (
    RTVIFunctionCallReportLevel,
    RTVIObserverParams,
)
from pipecat.processors.frameworks.rtvi.processor import RTVIProcessor
from pipecat.services.llm_service import FunctionCallParams
from pipecat.tests.utils import run_test

from pipecat_actions import (
    ActionContext,
    ActionRuntime,
    AllowAll,
    EffectFailed,
    Reconciliation,
    SessionState,
    action,
    tools_schema,
)
from pipecat_actions.adapters import ActionStatusReporter, rtvi_observer_params
from pipecat_actions.adapters.pipeline import build_pipeline
from pipecat_actions.adapters.status_reporter import MAX_MESSAGE_CHARS
from pipecat_actions.approvals import Approver
from pipecat_actions.execution.executor import ReconcileSchedule
from pipecat_actions.policy import load_policy_text
from pipecat_actions.status import ActionStatus
from pipecat_actions.testing import FakeSystemOfRecord, Say, ScriptedLLM, ToolCalls
from tests._waiting import HANG_GUARD_SECS, eventually
from tests.processors._clocked import (
    FrameLog,
    ScriptClock,
    Step,
    idle,
    operation,
    run_script,
    until,
)

BOOK = {"restaurant_id": "r1", "date": "2030-05-01", "time": "21:00", "party_size": 2}
POLICY = """
version: 1
tools:
  book_table:
    kind: mutation
    idempotency: {key_fields: [restaurant_id, date, time]}
    deadline_secs: 5
%(extra)s"""


class Bot:
    """The booking agent of the pipeline template, with what an RTVI client would be sent."""

    def __init__(self, runtime: ActionRuntime, sor: FakeSystemOfRecord, clock: ScriptClock):
        self.runtime = runtime
        self.sor = sor
        self.clock = clock
        self.session = SessionState(session_id="call-1", principal="alice")
        self.llm = ScriptedLLM([])
        self.context = LLMContext(
            messages=[{"role": "user", "content": "book a table"}], tools=tools_schema(runtime)
        )
        self.log = FrameLog()

    async def run(self, steps: Sequence[Step], *, rtvi: RTVIObserverParams) -> None:
        """Run the template's pipeline through the steps, with Pipecat's RTVI set up by ``rtvi``."""
        pipeline, gate = build_pipeline(
            runtime=self.runtime, session=self.session, llm=self.llm, context=self.context
        )
        (reporter,) = [p for p in pipeline.processors if isinstance(p, ActionStatusReporter)]
        await run_script(
            [pipeline],
            [*steps, lambda: idle(gate), lambda: idle(reporter)],
            observers=[self.log],
            rtvi=rtvi,
        )

    # --- what the client is sent -----------------------------------------------------------

    def client(self) -> list[dict[str, Any]]:
        """Every RTVI message sent to the client, in order."""
        return [
            push.frame.message
            for push in self.log.pushes
            if isinstance(push.source, RTVIProcessor)
            and isinstance(push.frame, OutputTransportMessageUrgentFrame)
        ]

    def action_status(self, tool_call_id: str | None = None) -> list[dict[str, Any]]:
        """Our ``action-status`` server messages (of one call), in order."""
        return [
            m["data"]
            for m in self.client()
            if m.get("type") == "server-message"
            and m["data"].get("type") == "action-status"
            and (tool_call_id is None or m["data"]["tool_call_id"] == tool_call_id)
        ]

    def statuses(self, tool_call_id: str) -> list[tuple[str, str]]:
        return [(m["event"], m["status"]) for m in self.action_status(tool_call_id)]

    def function_call_reports(self) -> list[dict[str, Any]]:
        """Pipecat's own ``llm-function-call-*`` messages."""
        return [m for m in self.client() if m.get("type", "").startswith("llm-function-call")]

    def stopped_as_cancelled(self, tool_call_id: str) -> list[dict[str, Any]]:
        return [
            m
            for m in self.function_call_reports()
            if m["type"] == "llm-function-call-stopped"
            and m["data"].get("tool_call_id") == tool_call_id
            and m["data"].get("cancelled") is True
        ]

    # --- script steps ----------------------------------------------------------------------

    def told(self, tool_call_id: str, status: str, event: str | None = None) -> Step:
        """Wait until the client was sent ``status`` (on ``event``) for the call."""

        def check() -> bool:
            return any(
                s == status and (event is None or e == event)
                for e, s in self.statuses(tool_call_id)
            )

        return lambda: eventually(
            check, what=lambda: f"{status} of {tool_call_id}: {self.client()}"
        )

    def sent(self, latency_secs: float) -> Step:
        """Wait until the provider holds the request (it answers after its latency)."""
        return lambda: self.clock.asked(latency_secs)

    def advance(self, secs: float) -> Step:
        async def step() -> None:
            self.clock.advance(secs)

        return step


@contextlib.asynccontextmanager
async def bot_on(
    tmp_path: Path,
    *,
    extra_policy: str = "",
    effect: Any = None,
    reconcile: Any = None,
    schedule: ReconcileSchedule | None = None,
    latency_secs: float = 0.5,
) -> AsyncIterator[Bot]:
    """A `Bot` whose ``book_table`` books on a fake system of record (or runs ``effect``)."""
    clock = ScriptClock()
    sor = FakeSystemOfRecord(clock=clock)
    sor.add_restaurant("r1", tables=3)
    sor.faults.set_latency(latency_secs)

    async def book(ctx: ActionContext, **args: Any) -> dict[str, Any]:
        booking = await sor.book(
            args["restaurant_id"],
            args["date"],
            args["time"],
            args["party_size"],
            "Ada",
            idempotency_key=ctx.idempotency_key,
        )
        return {"booking_id": booking.booking_id}

    run = effect or book

    @action(reconcile=reconcile)
    async def book_table(
        ctx: ActionContext, restaurant_id: str, date: str, time: str, party_size: int
    ) -> dict[str, Any]:
        """Book a table."""
        return await run(
            ctx, restaurant_id=restaurant_id, date=date, time=time, party_size=party_size
        )

    runtime = await ActionRuntime.create(
        load_policy_text(POLICY % {"extra": extra_policy}),
        authorizer=AllowAll(),
        actions=[book_table],
        ledger_url=f"sqlite:///{tmp_path}/ledger.db",
        clock=clock,
        schedule=schedule,
    )
    try:
        yield Bot(runtime, sor, clock)
    finally:
        await runtime.close(grace_secs=0)


# --- a wait that ends while the booking goes on ---------------------------------------------


@pytest.mark.parametrize("cause", ["barge_in", "timeout"])
async def test_a_booking_that_goes_on_after_its_wait_ended_is_told_running_then_committed(
    tmp_path: Path, cause: str
) -> None:
    # Pipecat's own timeout runs on real time: a second, a margin for admission to finish
    # first (a cancel that overtakes admission is told as "requested", not yet known).
    extra = "    timeout_secs: 1.0\n" if cause == "timeout" else ""
    async with bot_on(tmp_path, extra_policy=extra) as bot:
        bot.llm.push_step(ToolCalls([("book_table", BOOK)], ids=["call_1"]))
        bot.llm.push_step(Say("Your table is booked."))
        ended = "wait_interrupted" if cause == "barge_in" else "wait_timed_out"
        await bot.run(
            [
                LLMRunFrame(),
                bot.told("call_1", "requested", "proposed"),
                bot.sent(0.5),
                *([InterruptionFrame()] if cause == "barge_in" else []),
                bot.told("call_1", "running", ended),
                bot.advance(0.5),  # the booking commits after the wait ended
                bot.told("call_1", "committed"),
            ],
            rtvi=rtvi_observer_params(bot.runtime),
        )
        (op,) = await bot.runtime.ledger.list()

    assert bot.stopped_as_cancelled("call_1") == []
    assert bot.function_call_reports() == []  # the runtime's tools are ours to report
    assert bot.statuses("call_1") == [
        ("proposed", "requested"),
        (ended, "running"),
        ("changed", "committed"),
    ]
    told = bot.action_status("call_1")
    assert [m["operation_id"] for m in told] == [None, op.operation_id, op.operation_id]
    assert {m["tool"] for m in told} == {"book_table"}
    assert told[1]["message"] == "book_table is in progress; the outcome will follow."
    assert told[2]["message"] == "Done: book_table succeeded."
    assert all("result" not in m and "arguments" not in m for m in told)  # no values sent
    assert op.status is ActionStatus.COMMITTED
    assert bot.sor.side_effects["book"] == 1


async def test_pipecats_own_rtvi_reports_tell_the_client_that_same_booking_was_cancelled(
    tmp_path: Path,
) -> None:
    # Why `rtvi_observer_params` exists: with Pipecat's default observer parameters the client
    # is told "cancelled" for the booking that then commits (it still gets our messages too).
    async with bot_on(tmp_path) as bot:
        bot.llm.push_step(ToolCalls([("book_table", BOOK)], ids=["call_1"]))
        bot.llm.push_step(Say("Your table is booked."))
        await bot.run(
            [
                LLMRunFrame(),
                bot.told("call_1", "requested", "proposed"),
                bot.sent(0.5),
                InterruptionFrame(),
                bot.told("call_1", "running"),
                bot.advance(0.5),
                bot.told("call_1", "committed"),
            ],
            rtvi=RTVIObserverParams(),
        )
        (op,) = await bot.runtime.ledger.list()

    assert op.status is ActionStatus.COMMITTED
    assert len(bot.stopped_as_cancelled("call_1")) == 1


async def test_a_tool_the_runtime_does_not_own_keeps_pipecats_own_reports(tmp_path: Path) -> None:
    async with bot_on(tmp_path) as bot:

        async def weather(params: FunctionCallParams) -> None:
            await asyncio.Event().wait()  # until Pipecat cancels it

        bot.llm.register_function("get_weather", weather)
        bot.llm.push_step(ToolCalls([("get_weather", {"city": "Paris"})], ids=["call_w"]))
        bot.llm.push_step(Say("Never mind."))

        def in_progress() -> bool:
            return any(
                m["type"] == "llm-function-call-in-progress"
                and m["data"].get("tool_call_id") == "call_w"
                for m in bot.function_call_reports()
            )

        await bot.run(
            [
                LLMRunFrame(),
                lambda: until(in_progress, what="Pipecat's in-progress report"),
                InterruptionFrame(),
                lambda: until(
                    lambda: bot.stopped_as_cancelled("call_w"), what="Pipecat's stopped report"
                ),
            ],
            rtvi=rtvi_observer_params(bot.runtime),
        )

    assert len(bot.stopped_as_cancelled("call_w")) == 1
    assert bot.action_status() == []  # not ours: nothing of ours about it


# --- outcomes told as they are --------------------------------------------------------------


async def test_a_failed_booking_is_told_failed_in_a_bounded_message(tmp_path: Path) -> None:
    huge = "the provider says: " + "x" * 5_000

    async def refused(ctx: ActionContext, **args: Any) -> dict[str, Any]:
        raise EffectFailed(huge)

    async with bot_on(tmp_path, effect=refused) as bot:
        bot.llm.push_step(ToolCalls([("book_table", BOOK)], ids=["call_1"]))
        bot.llm.push_step(Say("Sorry, that did not work."))
        await bot.run(
            [LLMRunFrame(), bot.told("call_1", "failed_final")],
            rtvi=rtvi_observer_params(bot.runtime),
        )
        (op,) = await bot.runtime.ledger.list()

    assert op.status is ActionStatus.FAILED_FINAL
    assert op.error is not None and len(op.error) > MAX_MESSAGE_CHARS  # the bound matters
    assert bot.statuses("call_1") == [("proposed", "requested"), ("changed", "failed_final")]
    failed = bot.action_status("call_1")[-1]
    assert failed["message"].startswith("book_table did not happen: EffectFailed: the provider")
    assert len(failed["message"]) == MAX_MESSAGE_CHARS
    assert failed["message"].endswith("…")
    assert len(json.dumps(failed)) < 2 * MAX_MESSAGE_CHARS
    assert bot.function_call_reports() == []


async def test_an_unknown_outcome_is_told_unknown_then_committed_when_it_is_known(
    tmp_path: Path,
) -> None:
    async def cannot_tell(ctx: ActionContext) -> Reconciliation:
        return Reconciliation.pending()

    async with bot_on(
        tmp_path,
        reconcile=cannot_tell,
        schedule=ReconcileSchedule(initial_secs=0.0, max_probes=1, probe_timeout_secs=60.0),
        latency_secs=0.0,
    ) as bot:
        # Still working at the deadline, and it books once it is let go.
        bot.sor.faults.hang("book", ignore_cancellation=True)
        bot.llm.push_step(ToolCalls([("book_table", BOOK)], ids=["call_1"]))
        bot.llm.push_step(Say("I am checking."))
        bot.llm.push_step(Say("It is booked."))

        async def provider_finishes() -> None:
            bot.sor.release_hung()

        await bot.run(
            [
                LLMRunFrame(),
                lambda: operation(bot.runtime, "book_table", ActionStatus.RUNNING),
                lambda: until(lambda: bot.sor.calls["book"] == 1, what="the booking sent"),
                bot.advance(5.0),  # the deadline: nobody can tell whether it happened
                bot.told("call_1", "unknown"),
                provider_finishes,
                bot.told("call_1", "committed"),
            ],
            rtvi=rtvi_observer_params(bot.runtime),
        )
        (op,) = await bot.runtime.ledger.list()

    assert op.status is ActionStatus.COMMITTED
    assert [s for _, s in bot.statuses("call_1")] == ["requested", "unknown", "committed"]
    assert "not yet known" in bot.action_status("call_1")[1]["message"]
    assert bot.function_call_reports() == []
    assert bot.sor.side_effects["book"] == 1


@pytest.mark.parametrize("decision", ["approve", "reject"])
async def test_a_booking_waiting_for_approval_is_told_waiting_then_the_decision(
    tmp_path: Path, decision: str
) -> None:
    async with bot_on(
        tmp_path,
        extra_policy="    confirmation: {mode: approval, approvers: [ann]}\n",
        latency_secs=0.0,
    ) as bot:
        bot.llm.push_step(ToolCalls([("book_table", BOOK)], ids=["call_1"]))
        bot.llm.push_step(Say("A manager will look at it."))

        async def decide() -> None:
            (op,) = await bot.runtime.ledger.list()
            if decision == "approve":
                await bot.runtime.approve(
                    op.operation_id,
                    approver=Approver("ann", tenants={"default"}),
                    reason="ok",
                    args_hash=op.args_hash,
                )
            else:
                await bot.runtime.reject(
                    op.operation_id,
                    approver=Approver("ann", tenants={"default"}),
                    reason="fully booked",
                )

        final = "committed" if decision == "approve" else "rejected"
        await bot.run(
            [
                LLMRunFrame(),
                bot.told("call_1", "awaiting_approval"),
                decide,
                bot.told("call_1", final),
            ],
            rtvi=rtvi_observer_params(bot.runtime),
        )

    assert bot.statuses("call_1") == [
        ("proposed", "requested"),
        ("changed", "awaiting_approval"),
        ("changed", final),
    ]
    assert bot.function_call_reports() == []


# --- the parameters and the frame contract --------------------------------------------------


async def test_the_observer_parameters_turn_off_pipecats_reports_of_the_runtimes_tools_only(
    tmp_path: Path,
) -> None:
    async with bot_on(tmp_path) as bot:
        mine = RTVIObserverParams(
            function_call_report_level={
                "*": RTVIFunctionCallReportLevel.NAME,
                "book_table": RTVIFunctionCallReportLevel.FULL,
            }
        )
        params = rtvi_observer_params(bot.runtime, mine)

    disabled = RTVIFunctionCallReportLevel.DISABLED
    assert params.function_call_report_level == {
        "*": RTVIFunctionCallReportLevel.NAME,
        "book_table": disabled,
        "confirm_action": disabled,
        "cancel_book_table": disabled,  # the runtime's own cancel_<tool>, reported by it
    }
    assert mine.function_call_report_level["book_table"] is RTVIFunctionCallReportLevel.FULL


async def test_frames_pass_unchanged_in_order_and_none_waits_for_the_ledger(
    tmp_path: Path,
) -> None:
    async with bot_on(tmp_path) as bot:
        stalled = asyncio.Event()

        async def never(*_: Any, **__: Any) -> Any:
            # Longer than anything takes; a read awaited in process_frame fails the frame then.
            await asyncio.wait_for(stalled.wait(), HANG_GUARD_SECS)

        ledger: Any = bot.runtime.ledger
        ledger.get = never
        progress = FunctionCallInProgressFrame(
            function_name="book_table", tool_call_id="c1", arguments=BOOK
        )
        result = FunctionCallResultFrame(
            function_name="book_table",
            tool_call_id="c1",
            arguments=BOOK,
            result={"status": "committed", "operation_id": "op_x", "message": "Done."},
        )
        sent = [progress, TextFrame(text="Booked."), result, LLMFullResponseEndFrame()]
        down, _ = await run_test(
            ActionStatusReporter(bot.runtime, bot.session),
            frames_to_send=sent,
            start_timeout=HANG_GUARD_SECS,
        )
        stalled.set()

    passed = [f for f in down if not isinstance(f, RTVIServerMessageFrame)]
    assert [id(f) for f in passed] == [id(f) for f in sent]  # the same objects, in order
    told = [f.data for f in down if isinstance(f, RTVIServerMessageFrame)]
    assert [(m["event"], m["status"]) for m in told] == [("proposed", "requested")]


async def test_a_policy_tool_registered_later_is_left_to_the_reporter_too(tmp_path: Path) -> None:
    # Flows (FlowActions) and instrument() register their tools after the worker and its
    # RTVI observer are made: the policy names them before that.
    runtime = await ActionRuntime.create(
        load_policy_text("version: 1\ntools:\n  book_table:\n    kind: mutation\n"),
        authorizer=AllowAll(),
        routed=["book_table"],
        ledger_url=f"sqlite:///{tmp_path}/later.db",
    )
    try:
        levels = rtvi_observer_params(runtime).function_call_report_level
    finally:
        await runtime.close()

    assert "book_table" not in runtime.bindings
    assert levels["book_table"] is RTVIFunctionCallReportLevel.DISABLED


# --- calls about another call's operation ---------------------------------------------------

CANCELLABLE = "    mode: background\n    cancellable_by_llm: true\n"


@pytest.mark.parametrize("commits", ["after_the_cancel", "before_the_cancel_is_read"])
async def test_after_a_cancel_the_booking_keeps_its_own_call_and_the_cancel_gets_its_own_answer(
    tmp_path: Path, commits: str
) -> None:
    # No cancel hook: the cancel cannot stop a booking already sent, and its answer says so
    # (news to the client). The booking's later statuses are the booking call's, never the
    # cancel call's; the cancel call gets one message of its own, with its answer.
    async with bot_on(tmp_path, extra_policy=CANCELLABLE) as bot:
        bot.llm.push_step(ToolCalls([("book_table", BOOK)], ids=["call_book"]))
        bot.llm.push_step(ToolCalls([("cancel_book_table", {})], ids=["call_cancel"]))
        bot.llm.push_step(Say("I could not stop it; it goes on."))
        bot.llm.push_step(Say("It is booked."))

        async def answered() -> None:
            await eventually(
                lambda: bot.action_status("call_cancel"),
                what=lambda: f"the cancel's answer: {bot.client()}",
            )

        steps: list[Step] = [LLMRunFrame(), bot.sent(0.5), LLMRunFrame()]
        if commits == "after_the_cancel":
            steps += [answered, bot.advance(0.5)]
        else:
            steps += [bot.advance(0.5), answered]
        await bot.run(
            [*steps, bot.told("call_book", "committed")], rtvi=rtvi_observer_params(bot.runtime)
        )
        (op,) = await bot.runtime.ledger.list()

    assert op.status is ActionStatus.COMMITTED
    booking = bot.action_status("call_book")
    assert booking[-1]["status"] == "committed"
    assert {m["tool"] for m in booking} == {"book_table"}
    (cancel,) = bot.action_status("call_cancel")
    assert cancel["event"] == "answered"
    assert cancel["tool"] == "cancel_book_table"
    assert cancel["operation_id"] == op.operation_id
    assert cancel["status"] != "cancelled"
    assert bot.function_call_reports() == []
