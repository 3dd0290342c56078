"""The fake Gemini Live server drives the real ``GeminiLiveLLMService``, offline.

A real Pipecat pipeline (user aggregator, the service, assistant aggregator) runs against
`FakeGeminiServer` over a local TLS websocket. What the tests show about the service (Pipecat
1.14, google-genai 2.34):

- It connects at pipeline setup with the init-time tools (none here), and connects again as the
  first context arrives, since the context brings tools: a context with tools makes two
  connections, the second declaring them.
- On a model that supports NON_BLOCKING tools (Gemini 2.x, 3.8+), a function registered with
  ``cancel_on_interruption=False`` is declared ``behavior: NON_BLOCKING``; its result is sent
  once, as a ``functionResponse`` with ``scheduling: WHEN_IDLE`` both as a field and inside
  ``response``, and ``will_continue: false``.
- It ignores ``toolCallCancellation``: the function runs on and its result is still sent.
- When the server drops the connection, it reconnects by itself: the SDK raises ``APIError`` for
  any close code, ``_handle_connection_error`` counts a failure (the third consecutive one is
  fatal) and ``_reconnect`` opens a new connection. Without a resumption handle it re-seeds the
  whole history as ``clientContent`` (on Gemini 2.5 with ``turnComplete``, forcing a reply);
  with one, it sends the handle in the setup and seeds nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
from pipecat.frames.frames import LLMRunFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.services.google.gemini_live.llm import GeminiLiveLLMService
from pipecat.services.llm_service import FunctionCallParams
from pipecat.workers.runner import WorkerRunner

from pipecat_actions.testing.fake_gemini_live import FakeGeminiServer, Message, field
from tests._waiting import HANG_GUARD_SECS, eventually, guarded

NATIVE_AUDIO_25 = "models/gemini-2.5-flash-native-audio-preview-09-2025"
"""A model the service treats as supporting NON_BLOCKING tools and scheduling hints."""

BOOK = FunctionSchema(
    name="book",
    description="Book a table.",
    properties={"when": {"type": "string"}},
    required=["when"],
)

Handler = Callable[[FunctionCallParams], Awaitable[None]]


async def book_ok(params: FunctionCallParams) -> None:
    """The ``book`` tool: succeeds at once."""
    await params.result_callback({"ok": True})


def service(fake: FakeGeminiServer, handler: Handler = book_ok) -> GeminiLiveLLMService:
    """The real service, pointed at the fake, with ``book`` as an async (non-cancelled) tool."""
    llm = GeminiLiveLLMService(
        api_key="fake-key",
        http_options=fake.http_options,
        settings=GeminiLiveLLMService.Settings(model=NATIVE_AUDIO_25),
    )
    llm.register_function("book", handler, cancel_on_interruption=False)
    return llm


@asynccontextmanager
async def running(llm: GeminiLiveLLMService) -> AsyncIterator[LLMContext]:
    """Run ``[user aggregator, llm, assistant aggregator]`` with an LLMRunFrame queued; yield
    the context. The pipeline is cancelled on the way out."""
    context = LLMContext(
        messages=[{"role": "user", "content": "Book a table for tonight."}],
        tools=ToolsSchema(standard_tools=[BOOK]),
    )
    pair = LLMContextAggregatorPair(context)
    worker = PipelineWorker(
        Pipeline([pair.user(), llm, pair.assistant()]),
        enable_rtvi=False,
        idle_timeout_secs=None,
        cancel_on_idle_timeout=False,
    )
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    run = asyncio.create_task(runner.run())
    await worker.queue_frame(LLMRunFrame())
    try:
        yield context
    finally:
        await worker.cancel(reason="test over")
        await asyncio.wait_for(run, HANG_GUARD_SECS)


def is_client_content(message: Message) -> bool:
    return field(message, "client_content") is not None


def is_tool_response(message: Message) -> bool:
    return field(message, "tool_response") is not None


def in_context(context: LLMContext, content: str) -> bool:
    """Whether a message with this ``content`` is in the context."""
    return any(isinstance(m, dict) and m.get("content") == content for m in context.get_messages())


async def seeded(fake: FakeGeminiServer) -> None:
    """Wait until the service has connected with its context and seeded the conversation."""
    await fake.wait_for(is_client_content, within=HANG_GUARD_SECS)
    await fake.wait_for_connections(2, within=HANG_GUARD_SECS)


async def test_a_tool_call_gets_its_result_as_a_non_blocking_when_idle_response() -> None:
    async with FakeGeminiServer() as fake, running(service(fake)) as context:
        await seeded(fake)

        assert fake.connections == 2  # at setup without tools, then with the context's tools
        assert fake.declared_functions(0) == []
        [declared] = fake.declared_functions()
        assert declared["name"] == "book"
        assert declared["behavior"] == "NON_BLOCKING"
        assert fake.client_texts() == ["Book a table for tonight."]
        assert all(p.endswith("GenerativeService.BidiGenerateContent") for p in fake.paths)

        call_id = await fake.call("book", {"when": "7pm"})
        await fake.wait_for(is_tool_response, within=HANG_GUARD_SECS)
        await fake.say("Booked for 7pm.")
        await eventually(
            lambda: in_context(context, "Booked for 7pm."),
            what="the model's reply in the context",
        )

        [response] = fake.tool_responses(call_id)  # one, even after the context moved on
        assert response["name"] == "book"
        assert response["response"] == {"ok": True, "scheduling": "WHEN_IDLE"}
        assert response["scheduling"] == "WHEN_IDLE"
        assert field(response, "will_continue") is False
        assert fake.tool_responses() == [response]


async def test_a_cancelled_tool_call_still_runs_and_sends_its_result() -> None:
    release = asyncio.Event()
    started = asyncio.Event()

    async def book_when_released(params: FunctionCallParams) -> None:
        started.set()
        await release.wait()
        await params.result_callback({"ok": True})

    async with FakeGeminiServer() as fake, running(service(fake, book_when_released)) as context:
        await seeded(fake)
        call_id = await fake.call("book", {"when": "7pm"})
        await guarded(started.wait(), what="the book function to start")

        await fake.cancel_calls(call_id)
        await fake.say("Anything else?")
        # The turn after the cancellation reached the context, so the service read the
        # cancellation first; it has no handler for it, and the function runs on.
        await eventually(
            lambda: in_context(context, "Anything else?"),
            what="the assistant turn sent after the cancellation",
        )
        release.set()
        await fake.wait_for(is_tool_response, within=HANG_GUARD_SECS)

        [response] = fake.tool_responses(call_id)
        assert response["response"] == {"ok": True, "scheduling": "WHEN_IDLE"}


async def test_a_dropped_connection_reconnects_and_re_seeds_the_history() -> None:
    async with FakeGeminiServer() as fake, running(service(fake)):
        await seeded(fake)
        await fake.call("book", {"when": "7pm"})
        await fake.wait_for(is_tool_response, within=HANG_GUARD_SECS)
        await fake.say("Booked for 7pm.")

        await fake.drop()
        # The service reconnects by itself (a failure; the third in a row would be fatal).
        await fake.wait_for_connections(3, within=HANG_GUARD_SECS)
        reseed = await fake.wait_for(is_client_content, within=HANG_GUARD_SECS, connection=3)

        assert field(reseed, "client_content") == {
            "turns": [
                {"parts": [{"text": "Book a table for tonight."}], "role": "user"},
                {
                    "parts": [{"text": '[Called function book with args {"when": "7pm"}]'}],
                    "role": "model",
                },
                {"parts": [{"text": '[Function book returned {"ok": true}]'}], "role": "user"},
                {"parts": [{"text": "Booked for 7pm."}], "role": "model"},
                {"parts": [{"text": " "}], "role": "user"},  # Gemini 2.5 wants a user turn last
            ],
            "turnComplete": True,  # on Gemini 2.5 a reconnect forces a reply
        }
        assert fake.declared_functions(2)[0]["behavior"] == "NON_BLOCKING"
        assert fake.setups[2]["sessionResumption"] == {}  # no handle was ever offered


async def test_a_reconnect_resumes_with_the_last_handle_and_seeds_nothing() -> None:
    async with FakeGeminiServer() as fake, running(service(fake)):
        await seeded(fake)
        await fake.resumption_update("handle-1")
        await fake.drop()  # the service reads the update before it meets the close
        await fake.wait_for_connections(3, within=HANG_GUARD_SECS)
        assert fake.setups[2]["sessionResumption"] == {"handle": "handle-1"}

        # The resumed session takes input at once: a tool call on it is answered, and nothing
        # was sent before that answer (a seed would have been sent first, at session ready).
        call_id = await fake.call("book", {"when": "8pm"})
        await fake.wait_for(is_tool_response, within=HANG_GUARD_SECS, connection=3)
        assert fake.received_from(3) == [
            {"tool_response": {"functionResponses": fake.tool_responses(call_id)}}
        ]
