"""OpenTelemetry spans of real runs, read from the SDK's in-memory exporter.

Admission, each attempt, reconciliation and delivery get a span with the correlation ids and
a hash of the idempotency key, never the key or the arguments; with Pipecat's tracing on,
they are children of Pipecat's turn spans.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from pipecat.frames.frames import InterruptionFrame
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
from pipecat_actions.clock import ManualClock
from pipecat_actions.observability import enable_tracing, key_hash
from pipecat_actions.policy import load_policy_text
from pipecat_actions.status import ActionStatus
from pipecat_actions.testing import (
    Call,
    FakeSystemOfRecord,
    FakeTTS,
    Push,
    Say,
    ScriptedLLM,
    ToolCalls,
    UserSays,
    run_conversation,
)
from tests.observability.test_metrics import POLICY, actions, fake
from tests.processors._clocked import ScriptClock, operation, until
from tests.runtime._execution_support import Bookings, booking, new_session, running

IDS = ("session_id", "turn_id", "tool_call_id", "operation_id", "idempotency_key_hash")


def _ours(spans: Any) -> list[ReadableSpan]:
    return [s for s in spans if s.name.startswith("pipecat_actions.")]


def _leaks(span: ReadableSpan, secrets: list[str]) -> list[str]:
    text = json.dumps(dict(span.attributes or {}))
    return [secret for secret in secrets if secret in text]


async def test_admission_attempt_and_reconciliation_spans_carry_ids_and_only_a_key_hash(
    ledger_url: str, clock: ManualClock
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    sor = fake(clock, honours_idempotency_keys=False)
    sor.faults.lose_response_after_commit("book")
    async with running(POLICY, actions(Bookings(sor)), ledger_url=ledger_url, clock=clock) as rt:
        enable_tracing(rt, provider)
        told = await rt.propose("book_table", booking(), new_session(), tool_call_id="call-7")
        op = await rt.ledger.get(told["operation_id"])

    spans = _ours(exporter.get_finished_spans())
    assert [s.name for s in spans] == [
        "pipecat_actions.admission",
        "pipecat_actions.attempt",
        "pipecat_actions.reconciliation",
    ]
    admission, attempt, reconciliation = spans
    for span in spans:
        attributes = span.attributes or {}
        assert attributes["pipecat_actions.session_id"] == "call-1"
        assert attributes["pipecat_actions.turn_id"] == "0"
        assert attributes["pipecat_actions.tool_call_id"] == "call-7"
        assert attributes["pipecat_actions.operation_id"] == op.operation_id
        assert attributes["pipecat_actions.idempotency_key_hash"] == key_hash(op.idempotency_key)
        assert _leaks(span, [op.idempotency_key, "alice", "2030-05-01", "21:00"]) == []
    assert (admission.attributes or {})["pipecat_actions.admission"] == "admitted"
    assert (attempt.attributes or {})["pipecat_actions.attempt"] == 1
    assert attempt.status.status_code is trace.StatusCode.ERROR  # the answer was lost
    assert (reconciliation.attributes or {})["pipecat_actions.status"] == "COMMITTED"
    # Without Pipecat's turns, the operation's spans are children of its admission.
    for child in (attempt, reconciliation):
        assert child.parent is not None
        assert child.parent.span_id == admission.context.span_id


@pytest.fixture(scope="module")
def global_exporter() -> Iterator[InMemorySpanExporter]:
    """The exporter of the global tracer provider, which Pipecat's turn spans use."""
    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.shutdown()


async def test_with_pipecat_tracing_on_the_spans_are_children_of_its_turn_spans(
    tmp_path: Path, global_exporter: InMemorySpanExporter
) -> None:
    global_exporter.clear()
    clock = ScriptClock()
    sor = FakeSystemOfRecord(clock=clock)
    sor.add_restaurant("r1", tables=3)
    sor.faults.set_latency(0.6)

    @action
    async def book_table(
        ctx: ActionContext, restaurant_id: str, date: str, time: str, party_size: int
    ) -> dict[str, Any]:
        """Book a table."""
        made = await sor.book(
            restaurant_id, date, time, party_size, "Ada", idempotency_key=ctx.idempotency_key
        )
        return {"booking_id": made.booking_id}

    runtime = await ActionRuntime.create(
        load_policy_text(
            "version: 1\ntools:\n  book_table:\n    kind: mutation\n"
            "    deadline_secs: 5\n    delivery: {late: in_place}\n"
        ),
        authorizer=AllowAll(),
        actions=[book_table],
        ledger_url=f"sqlite:///{tmp_path}/ledger.db",
        clock=clock,
    )
    try:
        assert runtime.telemetry.tracer is None  # off until the pipeline's tracing turns it on
        session = SessionState(session_id="call-1", principal="alice")
        llm = ScriptedLLM(
            [ToolCalls([("book_table", booking())]), Say("Still booking."), Say("It is booked.")]
        )
        attach(runtime, llm, session)
        context = LLMContext(messages=[], tools=tools_schema(runtime))

        def closed_running() -> bool:
            return any(
                m.get("role") == "tool" and "running" in str(m.get("content"))
                for m in context.get_messages()
            )

        async def commit_late() -> None:
            clock.advance(0.6)  # the provider answers after the call was closed
            await operation(runtime, "book_table", ActionStatus.COMMITTED)

        async def delivered_late() -> bool:
            (op,) = await runtime.ledger.list()
            return op.delivered_at is not None

        await run_conversation(
            [
                UserSays("Book a table at nine"),
                Call(lambda: clock.asked(0.6)),  # the booking is on its way
                # An interruption ends the handler's wait; the gate tells it is running.
                Push([InterruptionFrame()]),
                Call(lambda: until(closed_running, what="the call closed as running")),
                Call(commit_late),
                Call(lambda: until(delivered_late, what="the late outcome told")),
            ],
            llm=llm,
            tts=FakeTTS(secs_per_char=0.03),
            context=context,
            after_user_aggregator=[ActionTurnTracker(session)],
            before_assistant_aggregator=[ActionResultGate(runtime, session)],
            enable_tracing=True,
        )
        (op,) = await runtime.ledger.list()
    finally:
        await runtime.close(grace_secs=0)

    spans = global_exporter.get_finished_spans()
    turns = {s.context.span_id: s for s in spans if s.name == "turn"}
    ours = _ours(spans)
    names = [s.name for s in ours]
    assert "pipecat_actions.admission" in names
    assert "pipecat_actions.attempt" in names
    assert "pipecat_actions.delivery" in names
    for span in ours:
        assert span.parent is not None, span.name
        assert span.parent.span_id in turns, span.name
        assert span.context.trace_id == turns[span.parent.span_id].context.trace_id
        assert (span.attributes or {})["pipecat_actions.operation_id"] == op.operation_id
        assert _leaks(span, [op.idempotency_key, "2030-05-01"]) == []
    admission = next(s for s in ours if s.name == "pipecat_actions.admission")
    late = [
        s
        for s in ours
        if s.name == "pipecat_actions.delivery" and (s.attributes or {}).get("pipecat_actions.late")
    ]
    assert late, names
    assert admission.parent is not None
    assert (turns[admission.parent.span_id].attributes or {})["turn.number"] == 1
