"""A record of what a conversation was told is written before a clean close lets go.

A pipeline records a call's delivery (and later its hearing) in a task of its own that it does
not wait for: the result is in the context at once, the write follows. A runtime closed right
then must not cut that write off: the ledger would say the outcome was never told, and the
next pipeline of the session would tell it again. `ActionRuntime.flush` (and so `close`) waits
for those records. Nothing here waits on the clock: the held write is let go either by the
close waiting for it (logged) or by the close going on without it (it lets go of its life), and
the order of the two says which happened.
"""

from __future__ import annotations

import asyncio
import json
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
from tests.processors._clocked import run_script, until

POLICY = """
version: 1
tools:
  book:
    kind: mutation
    on_duplicate: allow
"""


@action
async def book(ctx: ActionContext, n: int) -> dict[str, Any]:
    """Book."""
    return {"booking_id": f"bk_{n}"}


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
        if "delivery record" in message.record["message"]:
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
