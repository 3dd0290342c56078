"""The pharmacy agent in your own Pipecat pipeline, driven offline: no keys, no network.

    python examples/your_own_agent/main.py

The pipeline is the one you deploy; only the services differ. Offline, the test kit's
`ScriptedLLM` plays the model (it answers through Pipecat's real tool-call path), `FakeTTS`
speaks silent audio and `FakeTransport` plays it to nobody and records what the caller heard.
In production: your LLM service (OpenAI, Gemini, ...), your STT and TTS, your transport
(Daily, WebRTC, ...), and the caller's speech instead of `user_says`.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from pipecat.frames.frames import EndFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineParams, PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.workers.runner import WorkerRunner

from pipecat_actions import (
    ActionResultGate,
    ActionRuntime,
    ActionTurnTracker,
    SessionState,
    attach,
    check_placement,
    tools_schema,
)
from pipecat_actions.testing import (
    FakeTransport,
    FakeTTS,
    Say,
    ScriptedLLM,
    ToolCalls,
    offline_user_params,
    user_says,
)

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))  # agent.py beside this file, wherever it is run from

from agent import Patients, Pharmacy, build_actions  # noqa: E402


async def until_heard(heard: Sequence[str], words: str) -> None:
    """Wait until the caller heard ``words`` (``heard`` is the transport's live view)."""
    async with asyncio.timeout(30):  # a hang guard, not a measure: it never fires in a run
        while not any(words in text for text in heard):
            await asyncio.sleep(0.05)


async def main(ledger_url: str | None = None) -> list[str]:
    """Run one call: the caller asks for a refill twice; one refill is ordered."""
    pharmacy = Pharmacy()
    runtime = await ActionRuntime.create(
        HERE / "policy.yaml",
        authorizer=Patients(),
        actions=build_actions(pharmacy),
        ledger_url=ledger_url,  # None: $PIPECAT_ACTIONS_LEDGER_URL, else .pipecat_actions/
    )
    session = SessionState(session_id="call-1", principal="patient-7")

    llm = ScriptedLLM(  # yours: OpenAILLMService(...) and the model decides
        [
            ToolCalls([("refill_prescription", {"prescription_id": "rx-100"})]),
            Say("Your refill is ordered; it is ready tomorrow."),
            ToolCalls([("refill_prescription", {"prescription_id": "rx-100"})]),
            Say("That refill was already ordered; it is ready tomorrow."),
        ]
    )
    attach(runtime, llm, session)  # one Pipecat handler per action
    context = LLMContext(
        [{"role": "system", "content": "You are the pharmacy's assistant."}],
        tools=tools_schema(runtime),
    )
    pair = LLMContextAggregatorPair(context, user_params=offline_user_params())
    transport = FakeTransport()  # yours: DailyTransport(...), and an STT after its input
    processors = [
        transport.input(),
        pair.user(),
        ActionTurnTracker(session),  # right after the user aggregator
        llm,
        FakeTTS(),  # yours: a TTS service
        transport.output(),
        ActionResultGate(runtime, session),  # right before the assistant aggregator
        pair.assistant(),
    ]
    check_placement(processors)  # refuses a processor in the wrong place, saying why
    worker = PipelineWorker(
        Pipeline(processors),
        params=PipelineParams(audio_in_sample_rate=16000, audio_out_sample_rate=16000),
        idle_timeout_secs=None,
    )
    heard = transport.heard_texts  # a live view: it fills as the caller hears the bot

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    running = asyncio.create_task(runner.run())
    try:
        await worker.queue_frames(user_says("Can you refill my prescription rx-100?"))
        await until_heard(heard, "ready tomorrow")
        await worker.queue_frames(user_says("Please refill rx-100 again, to be sure."))
        await until_heard(heard, "already ordered")
        await worker.queue_frame(EndFrame())
        await running
    finally:
        if not running.done():
            await worker.cancel()
            await running
        await runtime.close()

    for text in heard:
        print("caller heard:", text)
    print("refills ordered:", len(pharmacy.refills))
    return list(heard)


if __name__ == "__main__":
    from loguru import logger

    logger.remove()  # Pipecat logs every frame at DEBUG: keep warnings and errors only
    logger.add(sys.stderr, level="WARNING")
    asyncio.run(main())
