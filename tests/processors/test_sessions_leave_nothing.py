"""A session's pipeline that ended leaves nothing of it in the runtime (issue 34, item 4).

One process holds many sessions at once, each in its own pipeline, for as long as it runs: what
the runtime keeps per session (its outcome and progress listeners, the calls it is answering,
its tracing context) must go when the session's pipeline ends, and nothing in the runtime may
keep the pipeline's objects (processors, LLM, context) alive, not even the tasks that write
its last delivery records after it ended (they keep the `SessionState` until their writes
return). Only the bounded memories of the most recent calls remain
(`pipecat_actions/_recent.py`), each capped whatever the number of sessions.
"""

from __future__ import annotations

import asyncio
import gc
import json
import weakref
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from pipecat.frames.frames import LLMRunFrame
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair

from pipecat_actions import (
    ActionContext,
    ActionRuntime,
    AllowAll,
    SessionState,
    action,
    attach,
    tools_schema,
)
from pipecat_actions.adapters import ActionResultGate, ActionStatusReporter, ActionTurnTracker
from pipecat_actions.adapters.pipeline import check_placement
from pipecat_actions.clock import ManualClock
from pipecat_actions.policy import load_policy_text
from pipecat_actions.runtime._operations import RECENT_CALLS, RECENT_TOLD
from pipecat_actions.testing import Say, ScriptedLLM, ToolCalls
from tests.processors._clocked import run_script, until

POLICY = """
version: 1
tools:
  book:
    kind: mutation
    on_duplicate: allow
"""
SESSIONS = 12
CALLS = 3


@action
async def book(ctx: ActionContext, n: int) -> dict[str, Any]:
    """Book."""
    return {"booking_id": f"bk_{n}"}


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[ActionRuntime]:
    opened = await ActionRuntime.create(
        load_policy_text(POLICY),
        authorizer=AllowAll(),
        actions=[book],
        ledger_url=f"sqlite:///{tmp_path}/l.db",
        clock=ManualClock(),
    )
    yield opened
    await opened.close()


def per_session_state(runtime: ActionRuntime) -> dict[str, int]:
    """How many entries the runtime's per-session structures hold now."""
    operations = runtime._operations
    return {
        "outcome listeners": len(operations._listeners),
        "progress listeners": len(runtime._progress._listeners),
        "calls being answered": len(operations._answering),
        "operations tracked": len(operations._tracked),
        "tracing contexts": len(runtime.telemetry._turns),
    }


async def _session(
    runtime: ActionRuntime,
    n: int,
    sessions: list[weakref.ref[Any]],
    pipelines: list[weakref.ref[Any]],
) -> list[dict[str, Any]]:
    """One session's pipeline of the template's stages, making `CALLS` chained calls."""
    session = SessionState(session_id=f"s-{n}", principal=f"p-{n}")
    script = [ToolCalls([("book", {"n": n * CALLS + i})]) for i in range(CALLS)] + [Say("done")]
    llm = ScriptedLLM(script)
    context = LLMContext(messages=[{"role": "user", "content": "go"}], tools=tools_schema(runtime))
    pair = LLMContextAggregatorPair(context)
    attach(runtime, llm, session)
    stages = [
        pair.user(),
        ActionTurnTracker(session),
        llm,
        ActionStatusReporter(runtime, session),
        ActionResultGate(runtime, session),
        pair.assistant(),
    ]
    check_placement(stages)
    sessions.append(weakref.ref(session))
    pipelines.extend(weakref.ref(o) for o in [llm, context, *stages])

    def results() -> list[dict[str, Any]]:
        contents = [m["content"] for m in context.get_messages() if m["role"] == "tool"]
        return [json.loads(c) for c in contents if c != "IN_PROGRESS"]  # Pipecat's placeholder

    await run_script(
        stages,
        [LLMRunFrame(), lambda: until(lambda: len(results()) == CALLS, what=f"s-{n}'s results")],
    )
    return results()


async def test_sessions_whose_pipelines_ended_leave_no_per_session_state(
    runtime: ActionRuntime,
) -> None:
    before = per_session_state(runtime)
    sessions: list[weakref.ref[Any]] = []
    pipelines: list[weakref.ref[Any]] = []

    told = await asyncio.gather(
        *(_session(runtime, n, sessions, pipelines) for n in range(SESSIONS))
    )

    assert [[r["status"] for r in results] for results in told] == [["committed"] * CALLS] * (
        SESSIONS
    )
    await runtime.flush()
    assert per_session_state(runtime) == before

    # Nothing keeps an ended pipeline, not even the tasks still writing its last delivery
    # records (they hold only the session and what they write).
    gc.collect()
    alive = [type(o).__name__ for o in (ref() for ref in pipelines) if o is not None]
    assert alive == [], f"kept after their pipelines ended: {alive}"

    def sessions_let_go() -> bool:
        gc.collect()
        return all(ref() is None for ref in sessions)

    await until(sessions_let_go, what="the ended sessions let go once their records are written")
    # What remains is bounded however many sessions a process serves.
    assert len(runtime._operations._answered) <= RECENT_TOLD
    assert len(runtime._operations._calls) <= RECENT_CALLS
