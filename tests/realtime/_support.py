"""A restaurant agent on a real speech-to-speech service, against a fake provider on 127.0.0.1.

`openai_agent` / `gemini_agent` build the pipeline with `build_pipeline` (the realtime layout
and adapter), the real Pipecat service pointed at `FakeRealtimeServer` / `FakeGeminiServer`,
the runtime on a SQLite ledger, and booking actions on a `FakeSystemOfRecord` that waits its
latency on a `ScriptClock`: a booking is at the provider until the test advances the clock.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipecat.frames.frames import (
    EndFrame,
    Frame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMRunFrame,
)
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.llm_service import LLMService
from pipecat.workers.runner import WorkerRunner

from pipecat_actions import ActionRuntime, Decision, build_pipeline, tools_schema
from pipecat_actions.adapters import ActionResultGate
from pipecat_actions.ledger import Operation
from pipecat_actions.session import SessionState
from pipecat_actions.testing import FakeSystemOfRecord
from tests._waiting import guarded
from tests.processors._clocked import ScriptClock, until
from tests.runtime._execution_support import Bookings, new_session, policy, running

LATENCY = 0.5
"""How long the provider takes to commit a booking, on the script's clock."""

POLICY = """
    version: 1
    tools:
      book_table:
        kind: mutation
      book_or_cancel:
        kind: mutation
        on_interruption: request_cancel
      book_when_settled:
        kind: mutation
        admit_when: turn_confirmed
      book_in_background:
        kind: mutation
        mode: background
      book_after_a_yes:
        kind: mutation
        mode: background
        confirmation: {mode: verbal}
      book_silently:
        kind: mutation
        delivery: {late: silent}
      book_urgently:
        kind: mutation
        delivery: {late: interrupt}
      book_in_background_silently:
        kind: mutation
        mode: background
        delivery: {late: silent}
      book_in_background_urgently:
        kind: mutation
        mode: background
        delivery: {late: interrupt}
      book_with_a_short_wait:
        kind: mutation
        timeout_secs: 0.2
"""
"""``book_with_a_short_wait``: Pipecat's own timeout (real time) ends the wait long before the
provider, which waits on the script's clock, answers."""

TOOLS = (
    "book_table",
    "book_or_cancel",
    "book_when_settled",
    "book_in_background",
    "book_after_a_yes",
    "book_silently",
    "book_urgently",
    "book_in_background_silently",
    "book_in_background_urgently",
    "book_with_a_short_wait",
)


def booking(time: str = "21:00", party_size: int = 2) -> dict[str, Any]:
    """The arguments of a booking call."""
    return {"restaurant_id": "r1", "date": "2030-05-01", "time": time, "party_size": party_size}


@dataclass
class Agent:
    """One running realtime conversation and what it acts on."""

    runtime: ActionRuntime
    session: SessionState
    llm: LLMService
    context: LLMContext
    gate: ActionResultGate
    worker: PipelineWorker
    sor: FakeSystemOfRecord
    clock: ScriptClock

    async def at_the_provider(self, times: int = 1) -> None:
        """Wait until ``times`` booking requests are held by the provider (sent, not answered)."""
        await self.clock.asked(LATENCY, times)

    def commit(self) -> None:
        """Let the provider answer the requests it holds."""
        self.clock.advance(LATENCY)

    async def operation(self, tool: str) -> Operation:
        """The one operation of ``tool``, once the ledger has it."""
        return await self._the_operation(tool, lambda op: True, f"one operation of {tool}")

    async def settled(self, tool: str, *statuses: Any) -> Operation:
        """Wait until the operation of ``tool`` is in one of ``statuses``."""
        return await self._the_operation(
            tool, lambda op: op.status in statuses, f"{tool} to reach {statuses}"
        )

    async def delivered(self, tool: str) -> Operation:
        """Wait until the outcome of ``tool``'s operation is recorded as told."""
        return await self._the_operation(
            tool,
            lambda op: op.delivered_status is op.status,
            f"the outcome of {tool} to be recorded as told",
        )

    async def _the_operation(
        self, tool: str, ready: Callable[[Operation], bool], what: str
    ) -> Operation:
        """Wait until ``tool`` has exactly one operation and it is ``ready``; return it."""
        seen: list[Operation] = []

        async def check() -> bool:
            seen[:] = [op for op in await self.runtime.ledger.list() if op.tool == tool]
            return len(seen) == 1 and ready(seen[0])

        await until(check, what=what)
        return seen[0]

    def side_effects(self) -> int:
        """How many bookings the provider committed."""
        return int(self.sor.side_effects.get("book", 0))

    def context_text(self) -> str:
        """The local context, as text."""
        return json.dumps(self.context.get_messages(), default=str)


@dataclass
class Restaurant:
    """The runtime and what it books on, outliving any one pipeline."""

    runtime: ActionRuntime
    sor: FakeSystemOfRecord
    clock: ScriptClock


class HeldAuthorizer:
    """Allows every call, once `release` is called: an admission that takes its time."""

    def __init__(self) -> None:
        self.asked = asyncio.Event()
        self._released = asyncio.Event()

    def release(self) -> None:
        self._released.set()

    async def authorize(self, request: Any) -> Decision:
        self.asked.set()
        await self._released.wait()
        return Decision.allow()


@asynccontextmanager
async def restaurant(
    tmp_path: Path, *, policy_text: str = POLICY, authorizer: Any = None
) -> AsyncIterator[Restaurant]:
    """The runtime on a SQLite ledger in ``tmp_path``, with the booking actions."""
    clock = ScriptClock()
    sor = FakeSystemOfRecord(clock=clock)
    sor.add_restaurant("r1", tables=3)
    sor.faults.set_latency(LATENCY)
    bookings = Bookings(sor)
    actions = [bookings.action(name=name, cancel=name == "book_or_cancel") for name in TOOLS]
    ledger_url = f"sqlite:///{tmp_path / 'ledger.db'}"
    if authorizer is None:
        async with running(policy_text, actions, ledger_url=ledger_url, clock=clock) as runtime:
            yield Restaurant(runtime, sor, clock)
        return
    runtime = await ActionRuntime.create(
        policy(policy_text),
        authorizer=authorizer,
        actions=actions,
        ledger_url=ledger_url,
        clock=clock,
    )
    try:
        yield Restaurant(runtime, sor, clock)
    finally:
        await runtime.close()


@asynccontextmanager
async def agent_on(
    llm: LLMService,
    tmp_path: Path,
    *,
    policy_text: str = POLICY,
    session_id: str = "call-1",
    authorizer: Any = None,
    transport: Any = None,
) -> AsyncIterator[Agent]:
    """Run the realtime restaurant agent on ``llm`` (already pointed at a fake provider)."""
    async with (
        restaurant(tmp_path, policy_text=policy_text, authorizer=authorizer) as place,
        running_pipeline(place, llm, session_id=session_id, transport=transport) as agent,
    ):
        yield agent


@asynccontextmanager
async def running_pipeline(
    place: Restaurant,
    llm: LLMService,
    *,
    session_id: str = "call-1",
    transport: Any = None,
    run_first: bool = True,
) -> AsyncIterator[Agent]:
    """Run one pipeline of the session on ``llm`` until the test is done with it.

    ``run_first``: the pipeline asks for the model's first response as it starts (else the
    test does, when it likes: a bot that waits for its client, say).
    """
    runtime, sor, clock = place.runtime, place.sor, place.clock
    session = new_session(session_id)
    context = LLMContext(
        messages=[{"role": "user", "content": "I'd like a table tonight."}],
        tools=tools_schema(runtime),
    )
    pipeline, gate = build_pipeline(
        runtime=runtime, session=session, llm=llm, context=context, transport=transport
    )
    worker = PipelineWorker(
        pipeline, enable_rtvi=False, cancel_on_idle_timeout=False, idle_timeout_secs=None
    )
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    task = asyncio.ensure_future(runner.run())
    try:
        if run_first:
            await worker.queue_frame(LLMRunFrame())
        yield Agent(runtime, session, llm, context, gate, worker, sor, clock)
        await worker.queue_frame(EndFrame())
        await guarded(asyncio.shield(task), what="the pipeline to end")
    finally:
        if not task.done():
            await worker.cancel(reason="the test is over")
            await task


def status_of(text: str) -> str | None:
    """The ``status`` of a JSON tool output (None if it is not a JSON object)."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value.get("status") if isinstance(value, dict) else None


class HeldEnds(FrameProcessor):
    """Where the output transport is: holds each response's end frame until `release`.

    As a real output transport plays a response's audio before the end frame behind it passes.
    """

    def __init__(self) -> None:
        super().__init__()
        self.held: list[Frame] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, LLMFullResponseEndFrame) and direction is FrameDirection.DOWNSTREAM:
            self.held.append(frame)
            return
        await self.push_frame(frame, direction)

    def release(self) -> None:
        """Let the held end frames go on (the audio before them has been played)."""
        held, self.held = self.held, []
        for frame in held:
            self.create_task(self.push_frame(frame))


class SeesInterruptions(FrameProcessor):
    """Where the output transport is: counts the interruptions that passed the service."""

    def __init__(self) -> None:
        super().__init__()
        self.interruptions = 0

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, InterruptionFrame) and direction is FrameDirection.DOWNSTREAM:
            self.interruptions += 1
        await self.push_frame(frame, direction)


class OutputOnly:
    """A transport stand-in for `build_pipeline`: a pass-through input, and ``output``."""

    def __init__(self, output: FrameProcessor) -> None:
        self._input = _PassThrough()
        self._output = output

    def input(self) -> FrameProcessor:
        return self._input

    def output(self) -> FrameProcessor:
        return self._output


class _PassThrough(FrameProcessor):
    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        await self.push_frame(frame, direction)
