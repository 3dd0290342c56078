"""What a result costs the ledger on its way through the pipeline template, and its record.

A call's own writes are its admission and its outcome; its result then reaches the context
through the tracker, the status reporter and the gate, and the delivery is recorded once. None
of them reads the operation back: the runtime answered the call with the record it just wrote,
and the delivery record is made from that (what the conversation was told).

The pipeline records the delivery in a task of its own that it does not wait for: the result is
in the context at once, the write follows. A runtime closed right then must not cut that write
off (the next pipeline of the session would tell the outcome again): `ActionRuntime.flush`, and
so `close`, waits for it. That test waits on no clock: the held write is let go either by the
close waiting for it (logged) or by the close going on without it (it lets go of its life), and
the order of the two says which happened.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

from loguru import logger
from pipecat.frames.frames import LLMRunFrame
from pipecat.processors.aggregators.llm_context import LLMContext

from pipecat_actions import (
    ActionContext,
    ActionRuntime,
    AllowAll,
    SessionState,
    action,
    tools_schema,
)
from pipecat_actions.adapters.pipeline import build_pipeline
from pipecat_actions.clock import ManualClock
from pipecat_actions.ledger import ForwardingLedger, Ledger, SqlLedger
from pipecat_actions.policy import load_policy_text
from pipecat_actions.status import ActionStatus
from pipecat_actions.testing import Say, ScriptedLLM, ToolCalls
from tests.processors._clocked import idle, run_script, until

POLICY = """
version: 1
tools:
  book:
    kind: mutation
    on_duplicate: allow
"""


class CountingLedger(ForwardingLedger):
    """Counts every ledger call the runtime and the processors make, by method."""

    def __init__(self, inner: Ledger) -> None:
        super().__init__(inner)
        self.calls: Counter[str] = Counter()

    def __getattribute__(self, name: str) -> Any:
        found = super().__getattribute__(name)
        if name in _METHODS:

            async def counted(*args: Any, **kwargs: Any) -> Any:
                self.calls[name] += 1
                return await found(*args, **kwargs)

            return counted
        return found


_METHODS = {
    "admit",
    "transition",
    "annotate",
    "get",
    "find_by_key",
    "list",
    "events",
    "record_completed",
    "record_refusal",
}


@action
async def book(ctx: ActionContext, n: int) -> dict[str, Any]:
    """Book."""
    return {"booking_id": f"bk_{n}"}


async def test_committed_results_pass_the_template_with_no_ledger_read_and_one_delivery_write(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    ledger = CountingLedger(await SqlLedger.create(f"sqlite:///{tmp_path}/l.db", clock=clock))
    runtime = await ActionRuntime.create(
        load_policy_text(POLICY), authorizer=AllowAll(), actions=[book], ledger=ledger, clock=clock
    )
    try:
        session = SessionState(session_id="s1", principal="alice")
        llm = ScriptedLLM(
            [ToolCalls([("book", {"n": 1})]), ToolCalls([("book", {"n": 2})]), Say("done")]
        )
        context = LLMContext(messages=[{"role": "user", "content": "go"}])
        context.set_tools(tools_schema(runtime))
        pipeline, gate = build_pipeline(runtime=runtime, session=session, llm=llm, context=context)

        def results() -> list[dict[str, Any]]:
            tool = [m["content"] for m in context.get_messages() if m["role"] == "tool"]
            return [json.loads(c) for c in tool if c.startswith("{")]  # not IN_PROGRESS

        async def both_told() -> None:
            await until(lambda: len(results()) == 2, what="both results in the context")
            await idle(gate)

        ledger.calls.clear()
        await run_script([pipeline], [LLMRunFrame(), both_told])
        await runtime.flush()
        calls = dict(ledger.calls)
        ops = await ledger.inner.list()
    finally:
        await runtime.close(grace_secs=0)
        await ledger.inner.close()

    assert [r["status"] for r in results()] == ["committed", "committed"]
    assert {op.delivered_status for op in ops} == {ActionStatus.COMMITTED}
    # Per call: admitted (as RUNNING), committed, delivery recorded. The one list is the
    # pipeline's start asking what the session is still owed. No read of an operation.
    assert calls == {"list": 1, "admit": 2, "transition": 2, "annotate": 2}, calls


class HeldDeliveries(ForwardingLedger):
    """Holds the delivery record until `release` is set; notes the order of what happened."""

    def __init__(self, inner: Ledger) -> None:
        super().__init__(inner)
        self.entered = asyncio.Event()
        self.release = asyncio.Event()
        self.order: list[str] = []

    async def annotate(self, operation_id: str, **kwargs: Any) -> Any:
        if "delivered" not in (kwargs.get("detail") or {}):
            return await self.inner.annotate(operation_id, **kwargs)
        self.entered.set()
        await self.release.wait()
        written = await self.inner.annotate(operation_id, **kwargs)
        self.order.append("delivery recorded")
        return written

    async def release_life(self, owner: str, **kwargs: Any) -> Any:
        self.order.append("life let go")
        self.release.set()  # the close went on without the record: let it go, too late
        return await self.inner.release_life(owner, **kwargs)


async def test_a_runtime_closed_while_a_delivery_is_being_recorded_waits_for_the_record(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    inner = await SqlLedger.create(f"sqlite:///{tmp_path}/l.db", clock=clock)
    ledger = HeldDeliveries(inner)
    runtime = await ActionRuntime.create(
        load_policy_text(POLICY), authorizer=AllowAll(), actions=[book], ledger=ledger, clock=clock
    )
    waited: list[str] = []

    def on_log(message: Any) -> None:
        if "audit write" in message.record["message"]:
            waited.append(message.record["message"])
            ledger.release.set()  # the close is waiting for it: let it be written

    sink = logger.add(on_log, level="DEBUG")
    try:
        session = SessionState(session_id="s1", principal="alice")
        llm = ScriptedLLM([ToolCalls([("book", {"n": 1})]), Say("done")])
        context = LLMContext(messages=[{"role": "user", "content": "go"}])
        context.set_tools(tools_schema(runtime))
        pipeline, _gate = build_pipeline(runtime=runtime, session=session, llm=llm, context=context)

        async def recording() -> None:
            await until(lambda: ledger.entered.is_set(), what="the delivery record under way")

        await run_script([pipeline], [LLMRunFrame(), recording])
        await runtime.close(grace_secs=0)
        ledger.order.append("closed")
        [op] = await inner.list()
    finally:
        logger.remove(sink)
        await inner.close()

    told = [json.loads(m["content"]) for m in context.get_messages() if m["role"] == "tool"]
    assert [t["status"] for t in told] == ["committed"]
    assert ledger.order == ["delivery recorded", "life let go", "closed"]
    assert waited  # the close said what it waited for
    assert op.delivered_status is ActionStatus.COMMITTED
