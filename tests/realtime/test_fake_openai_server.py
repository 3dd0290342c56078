"""The fake OpenAI Realtime server drives the real Pipecat service, offline.

A real pipeline (user aggregator, ``OpenAIRealtimeLLMService``, assistant aggregator) talks to
`FakeRealtimeServer` over a real websocket: the fake calls a function and hears the result, and
a barge-in (server VAD's ``speech_started``) during a slow handler makes Pipecat cancel it and
answer the API's call with ``CANCELLED``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
from pipecat.frames.frames import EndFrame, LLMRunFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.services.llm_service import FunctionCallParams
from pipecat.services.openai.realtime import events
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
from pipecat.workers.runner import WorkerRunner

from pipecat_actions.testing.fake_openai_realtime import Event, FakeRealtimeServer
from tests._waiting import HANG_GUARD_SECS, guarded

BOOK = FunctionSchema(
    name="book",
    description="Book a table.",
    properties={"party": {"type": "integer"}},
    required=["party"],
)


@asynccontextmanager
async def running_pipeline(
    server: FakeRealtimeServer,
    handler: Callable[[FunctionCallParams], Awaitable[None]],
    **options: Any,
) -> AsyncIterator[OpenAIRealtimeLLMService]:
    """Run the real pipeline against ``server`` until the first (empty) response is asked for."""
    llm = OpenAIRealtimeLLMService(api_key="x", base_url=server.url)
    llm.register_function("book", handler, **options)
    pair = LLMContextAggregatorPair(LLMContext(tools=ToolsSchema(standard_tools=[BOOK])))
    worker = PipelineWorker(
        Pipeline([pair.user(), llm, pair.assistant()]),
        enable_rtvi=False,
        cancel_on_idle_timeout=False,
        idle_timeout_secs=None,
    )
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    running = asyncio.ensure_future(runner.run())
    try:
        await worker.queue_frame(LLMRunFrame())
        await server.wait_for(_type("response.create"), HANG_GUARD_SECS)
        yield llm
        await worker.queue_frame(EndFrame())
        await guarded(asyncio.shield(running), what="the pipeline to end")
    finally:
        if not running.done():
            await worker.cancel(reason="the test failed")
            await running


def _assert_pipecat_parses_all_sent(server: FakeRealtimeServer) -> None:
    """Every event the fake sent validates as Pipecat's model of it (else its loop would end)."""
    for event in server.sent:
        parsed = events.parse_server_event(json.dumps(event))  # type: ignore[no-untyped-call]
        assert parsed is not None, event


def _type(type_: str) -> Callable[[Event], bool]:
    return lambda event: event.get("type") == type_


def _output_for(call_id: str) -> Callable[[Event], bool]:
    def matches(event: Event) -> bool:
        item: dict[str, Any] = event.get("item", {})
        return item.get("type") == "function_call_output" and item.get("call_id") == call_id

    return matches


async def test_a_function_call_reaches_the_handler_and_its_result_reaches_the_api() -> None:
    heard: list[dict[str, Any]] = []

    async def book(params: FunctionCallParams) -> None:
        heard.append(dict(params.arguments))
        await params.result_callback({"ok": True})

    async with FakeRealtimeServer() as server, running_pipeline(server, book):
        call_id = await server.call("book", {"party": 2})
        output = await server.wait_for(_output_for(call_id), HANG_GUARD_SECS)
        # With the result delivered, the service asks the model to go on.
        after = server.received.index(output) + 1
        await server.wait_for(_type("response.create"), HANG_GUARD_SECS, since=after)

    assert heard == [{"party": 2}]
    assert [json.loads(text) for text in server.function_outputs(call_id)] == [{"ok": True}]
    assert server.connections == 1
    assert server.paths[0].startswith("/?model=")
    _assert_pipecat_parses_all_sent(server)


async def test_a_barge_in_during_a_slow_handler_cancels_it_and_answers_the_call_cancelled() -> None:
    started, cancelled = asyncio.Event(), asyncio.Event()

    async def book(params: FunctionCallParams) -> None:
        started.set()
        try:
            await asyncio.Event().wait()  # slow: only the cancellation ends it
        except asyncio.CancelledError:
            cancelled.set()
            raise

    async with (
        FakeRealtimeServer() as server,
        running_pipeline(server, book, cancel_on_interruption=True),
    ):
        call_id = await server.call("book", {"party": 4})
        await guarded(started.wait(), what="the handler to start")
        await server.speech_started()
        await server.wait_for(_output_for(call_id), HANG_GUARD_SECS)
        await guarded(cancelled.wait(), what="the handler to be cancelled")

    assert server.function_outputs(call_id) == ["CANCELLED"]
    _assert_pipecat_parses_all_sent(server)
