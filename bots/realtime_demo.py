"""The offline demo in realtime form: the restaurant story on a real speech-to-speech service.

    make demo REALTIME=openai      # or: .venv/bin/python -m bots.realtime_demo openai
    make demo REALTIME=gemini

No keys, no network: the real ``OpenAIRealtimeLLMService`` or ``GeminiLiveLLMService`` runs in
the pipeline `build_pipeline` lays out for a speech-to-speech service (with its realtime
adapter), against a fake provider on 127.0.0.1 (`pipecat_actions.testing.fake_openai_realtime`,
`pipecat_actions.testing.fake_gemini_live`) that plays the model's part of the story; the
runtime, the SQLite ledger under ``.pipecat_actions/`` and the fake restaurant are the real
ones of the cascade demo. The story:

1. The model books a table for nine; the restaurant is slow. Alice talks over it ("make it
   half past nine"): the booking goes on (``on_interruption: continue``); on Gemini the
   provider cancels its call, and the runtime still tells it the truth.
2. The model asks for half past nine while nine o'clock runs: it waits its turn (one booking
   at a time per guest).
3. Nine o'clock commits: the provider hears it booked (on OpenAI, also that the user changed it
   since: a later user turn; Gemini Live gives no user turns without local VAD). The
   application cancels nine o'clock as a compensation (the provider hears that too), and half
   past nine commits.
4. The model repeats the half-past-nine booking (duplicate calls happen): joined, not run.
5. The deposit refund waits for a manager, who approves it: the provider hears the outcome.

It prints what the provider heard (every function answer and message), the ledger and the
bookings left. The check at the end: no ``CANCELLED`` reached the provider, one booking is left.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from loguru import logger

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bots.demo import operator_commands  # noqa: E402
from bots.restaurant import RESTAURANT, build_actions, new_system_of_record  # noqa: E402
from pipecat_actions import ActionRuntime, AllowAll, SessionState, tools_schema  # noqa: E402
from pipecat_actions.approvals import Approver  # noqa: E402
from pipecat_actions.ledger import Operation, OperationFilter, SqlLedger  # noqa: E402
from pipecat_actions.policy import load_policy  # noqa: E402
from pipecat_actions.status import ActionStatus  # noqa: E402

S = ActionStatus
DATE = "2030-05-01"
POLICY = ROOT / "configs" / "restaurant.yaml"
GEMINI_MODEL = "models/gemini-2.5-flash-native-audio-preview-09-2025"
HANG_SECS = 60.0
OPENING = "A table for two at nine tonight, please."


def _progress(text: str) -> None:
    print(f"... {text}", file=sys.stderr, flush=True)


def _book(time_of_day: str) -> dict[str, Any]:
    return {
        "restaurant_id": RESTAURANT,
        "date": DATE,
        "time": time_of_day,
        "party_size": 2,
        "guest_name": "Alice",
        "phone": "+44 20 7946 0000",
    }


# --- the fake provider's side, the same story for both services ----------------------------


class Provider:
    """The model's side of the story on one fake provider; subclasses speak its protocol."""

    name = ""

    def service(self) -> Any:
        """The real Pipecat service, pointed at the fake."""
        raise NotImplementedError

    async def ready(self) -> None:
        """Wait until the service's session is set up with the tools."""

    async def call(self, tool: str, args: dict[str, Any]) -> str:
        """The model calls ``tool``; return the call id."""
        raise NotImplementedError

    async def user_talks_over(self, call_id: str) -> None:
        """The user speaks while ``call_id`` runs."""

    async def user_done(self) -> None:
        """The user stopped speaking."""

    def heard(self) -> list[str]:
        """What the provider received that tells an outcome, in order, as text."""
        raise NotImplementedError

    async def until_heard(self, *words: str) -> str:
        """Wait until the provider heard something with all of ``words``; return it."""
        deadline = time.monotonic() + HANG_SECS
        while time.monotonic() < deadline:
            for text in self.heard():
                if all(word in text for word in words):
                    return text
            await asyncio.sleep(0.05)
        raise TimeoutError(f"the provider never heard {words}; it heard {self.heard()}")


class OpenAIProvider(Provider):
    """The story on `FakeRealtimeServer`: server VAD's speech events, function calls."""

    name = "OpenAI Realtime"

    def __init__(self, server: Any) -> None:
        self.server = server

    def service(self) -> Any:
        from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService

        return OpenAIRealtimeLLMService(api_key="offline", base_url=self.server.url)

    async def ready(self) -> None:
        await self.server.wait_for(lambda e: e.get("type") == "response.create", HANG_SECS)

    async def call(self, tool: str, args: dict[str, Any]) -> str:
        return str(await self.server.call(tool, args))

    async def user_talks_over(self, call_id: str) -> None:
        await self.server.speech_started()

    async def user_done(self) -> None:
        await self.server.speech_stopped()

    def heard(self) -> list[str]:
        told = []
        for event in self.server.received:
            item = event.get("item") or {}
            if item.get("type") == "function_call_output":
                told.append(f"answer to {item.get('call_id')}: {item.get('output')}")
            elif item.get("type") == "message" and item.get("role") != "user":
                text = " ".join(part.get("text", "") for part in item.get("content") or [])
                told.append(f"message: {text}")
        return told


class GeminiProvider(Provider):
    """The story on `FakeGeminiServer`: tool calls, an interruption that cancels a call."""

    name = "Gemini Live"

    def __init__(self, server: Any) -> None:
        self.server = server

    def service(self) -> Any:
        from pipecat.services.google.gemini_live.llm import GeminiLiveLLMService

        return GeminiLiveLLMService(
            api_key="offline",
            http_options=self.server.http_options,
            settings=GeminiLiveLLMService.Settings(model=GEMINI_MODEL),
        )

    async def ready(self) -> None:
        # It connects at setup, and again once the context brings the tools.
        await self.server.wait_for_connections(2, HANG_SECS)

    async def call(self, tool: str, args: dict[str, Any]) -> str:
        return str(await self.server.call(tool, args))

    async def user_talks_over(self, call_id: str) -> None:
        # Gemini's server VAD: the model is cut off, and it cancels the call it had made.
        await self.server.interrupted()
        await self.server.cancel_calls(call_id)

    def heard(self) -> list[str]:
        from pipecat_actions.testing.fake_gemini_live import field

        told = []
        for message in self.server.received:
            response = field(message, "tool_response")
            for answer in field(response or {}, "function_responses") or []:
                how = answer.get("scheduling", "no scheduling")
                if answer.get("will_continue", answer.get("willContinue")):
                    how += ", the call stays open"
                told.append(
                    f"answer to {answer.get('id')} ({how}): {json.dumps(answer['response'])}"
                )
            content = field(message, "client_content")
            for turn in (content or {}).get("turns") or []:
                text = " ".join(part.get("text", "") for part in turn.get("parts") or [])
                if text.strip() and text != OPENING:
                    told.append(f"text: {text}")
        return told


# --- the application around the conversation ------------------------------------------------


async def _until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    deadline = time.monotonic() + HANG_SECS
    while time.monotonic() < deadline:
        if await check():
            return
        await asyncio.sleep(0.05)
    raise TimeoutError(f"still waiting for {what}")


async def story(provider: Provider, runtime: ActionRuntime, session: SessionState) -> list[str]:
    """Play the model's part; return the lines of the transcript (what happened, in order)."""
    lines: list[str] = []
    ledger = runtime.ledger

    def note(text: str) -> None:
        lines.append(text)
        _progress(text)

    async def booking_at(time_of_day: str, *statuses: S) -> Operation:
        found: list[Operation] = []

        async def check() -> bool:
            found[:] = [
                op
                for op in await ledger.list(OperationFilter(tool="book_table"))
                if op.args["time"] == time_of_day and op.status in statuses
            ]
            return bool(found)

        await _until(check, f"the {time_of_day} booking to be {statuses}")
        return found[0]

    await provider.ready()
    first = await provider.call("book_table", _book("21:00"))
    note(f"model: book_table 21:00 ({first}); the restaurant is slow")
    await booking_at("21:00", S.RUNNING)
    await provider.user_talks_over(first)
    note("user talks over it: 'actually, make it half past nine'")
    await provider.user_done()
    moved = await provider.call("book_table", _book("21:30"))
    note(f"model: book_table 21:30 ({moved}) while 21:00 still runs: it waits its turn")
    await provider.until_heard("committed", '"time": "21:00"')
    note("restaurant: 21:00 committed; the provider heard it booked")
    old = await booking_at("21:00", S.COMMITTED)
    note(f"application: compensating {old.operation_id[-8:]} (moved to 21:30)")
    await runtime.compensate(old.operation_id, actor="app:move", reason="moved to 21:30")
    await provider.until_heard("compensated")
    note("the provider heard that 21:00 was cancelled")
    new = await booking_at("21:30", S.COMMITTED)
    await provider.until_heard(moved, "committed")
    note("restaurant: 21:30 committed; the provider heard it")
    repeat = await provider.call("book_table", _book("21:30"))
    note(f"model repeats book_table 21:30 ({repeat}): joined, not run again")
    await provider.until_heard(repeat, "committed")
    refund = await provider.call(
        "refund_deposit",
        {
            "booking_id": str((old.result or {}).get("booking_id", "bk_0001")),
            "amount": 2000,
            "card": {"number": "4242424242424242", "expiry": "12/30"},
        },
    )
    note(f"model: refund_deposit ({refund}); it waits for a manager")

    async def waiting() -> bool:
        return bool(await runtime.pending_approvals())

    await _until(waiting, "the refund to wait for approval")
    (pending,) = await runtime.pending_approvals()
    await runtime.approve(
        pending.operation_id,
        approver=Approver("rosa", tenants={"default"}),
        reason="deposit policy",
        args_hash=pending.args_hash,
    )
    note(f"manager rosa approves {pending.operation_id[-8:]}")
    await provider.until_heard("refund_deposit", "committed")
    note("the provider heard the refund went through")
    assert new.status is S.COMMITTED
    return lines


async def run(kind: str, ledger_url: str) -> int:
    from pipecat.frames.frames import EndFrame, LLMRunFrame
    from pipecat.pipeline.worker import PipelineWorker
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.workers.runner import WorkerRunner

    from pipecat_actions.adapters.pipeline import build_pipeline
    from pipecat_actions.testing.fake_gemini_live import FakeGeminiServer
    from pipecat_actions.testing.fake_openai_realtime import FakeRealtimeServer

    sor = new_system_of_record()
    sor.faults.set_latency(1.5, kind="book")
    runtime = await ActionRuntime.create(
        load_policy(POLICY),
        authorizer=AllowAll(),  # demo only: a real deployment checks the principal's rights
        actions=build_actions(sor),
        ledger_url=ledger_url,
    )
    session = SessionState(session_id="call-alice-realtime", principal="alice", active_agent="host")
    server: Any = FakeRealtimeServer() if kind == "openai" else FakeGeminiServer()
    async with server:
        provider = OpenAIProvider(server) if kind == "openai" else GeminiProvider(server)
        _progress(f"{provider.name} (the real Pipecat service) against a fake on 127.0.0.1")
        context = LLMContext(
            messages=[{"role": "user", "content": OPENING}],
            tools=tools_schema(runtime),
        )
        pipeline, _ = build_pipeline(
            runtime=runtime, session=session, llm=provider.service(), context=context
        )
        worker = PipelineWorker(
            pipeline, enable_rtvi=False, cancel_on_idle_timeout=False, idle_timeout_secs=None
        )
        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(worker)
        running = asyncio.ensure_future(runner.run())
        try:
            await worker.queue_frame(LLMRunFrame())
            lines = await story(provider, runtime, session)
            await worker.queue_frame(EndFrame())
            await asyncio.wait_for(asyncio.shield(running), HANG_SECS)
        finally:
            if not running.done():
                await worker.cancel(reason="the demo is over")
                await running
        heard = provider.heard()
    ops = await runtime.ledger.list()
    await runtime.close()
    return report(provider.name, lines, heard, ops, sor)


def report(
    name: str, lines: list[str], heard: list[str], ops: Sequence[Operation], sor: Any
) -> int:
    print(f"REALTIME DEMO on {name}")
    print("\nSTORY")
    for line in lines:
        print(f"  {line}")
    print("\nWHAT THE PROVIDER HEARD (function answers and messages, in order)")
    for text in heard:
        print(f"  {text if len(text) <= 160 else text[:159] + '…'}")
    print("\nLEDGER")
    for op in ops:
        args = {k: v for k, v in op.args.items() if k in ("time", "booking_id", "amount")}
        told = op.delivered_status.value if op.delivered_status else "-"
        print(
            f"  {op.operation_id[-8:]:<10} {op.tool:<22} {op.status.value:<12} "
            f"{json.dumps(args):<34} told: {told}"
        )
    confirmed = [(b.booking_id, b.time) for b in sor.bookings(RESTAURANT, status="confirmed")]
    # Nothing in the story is cancelled or left undone: any such answer would be false. (The
    # compensation's own result says the 21:00 *booking* is cancelled, which is true: only
    # what an answer or message claims at its top level counts.)
    false_claims = sum(
        text.count(claim)
        for text in heard
        for claim in ("CANCELLED", '{"status": "cancelled"', '{"status": "not_started"')
    )
    print("\nCHECKS")
    print(f"  bookings left at the restaurant: {confirmed}")
    print(f"  provider side effects: {dict(sor.side_effects)}")
    print(f"  'CANCELLED' told to the provider: {sum('CANCELLED' in text for text in heard)}")
    print(f"  calls told cancelled or not started though they went on: {false_claims}")
    ok = false_claims == 0 and len(confirmed) == 1 and confirmed[0][1] == "21:30"
    print(f"  {'OK' if ok else 'FAILED'}")
    return 0 if ok else 1


async def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="pipecat_actions realtime demo (offline)")
    parser.add_argument("service", choices=["openai", "gemini"])
    args = parser.parse_args(argv)
    logger.remove()
    workdir = Path(".pipecat_actions")
    workdir.mkdir(mode=0o700, exist_ok=True)
    database = (workdir / f"demo-{args.service}.db").resolve()
    for stale in workdir.glob(f"demo-{args.service}.db*"):
        stale.unlink()
    _progress(f"policy {POLICY}, ledger {database}")
    ledger_url = f"sqlite:///{database}"
    code = await run(args.service, ledger_url)
    async with await SqlLedger.create(ledger_url, read_only=True) as ledger:
        operator_commands(ledger_url, await ledger.list())
    return code


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
