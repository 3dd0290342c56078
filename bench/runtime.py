"""What the runtime adds to a tool call in a real Pipecat pipeline, bare handler side by side.

    .venv/bin/python bench/runtime.py [--calls N] [--rounds R] [--deadlines D]

One pipeline (user aggregator, ScriptedLLM, result tap, assistant aggregator) makes N tool
calls in a chain (each result triggers the next inference). The tool's handler returns at once,
either registered bare on the LLM or as an action through the runtime (a read tool and a
mutation tool). For each call it measures:

* proposal → effect start: from ``run_function_calls`` to the first line of the effect;
* effect end → result frame: from the effect's return to the result frame leaving the LLM.

It prints median and p99 of each, the added latency against the bare handler of the same
round, the ledger writes on a mutation's critical path (counted), the raw aiosqlite
insert+commit floor of the same run, and the watchdog's lateness with D pending deadlines.
Targets: a mutation adds at most 2 ledger writes, each at most 2x the floor; a read adds at most
0.3 ms p50; watchdog lateness p99 at most 5 ms with 1,000 pending deadlines. Figures, not
pass/fail: this machine is shared and noisy, so rounds are interleaved and the median round is
kept.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiosqlite
from loguru import logger
from pipecat.frames.frames import Frame, FunctionCallResultFrame, LLMRunFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.llm_service import FunctionCallParams
from pipecat.workers.runner import WorkerRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipecat_actions import attach
from pipecat_actions.actions import ActionContext, action
from pipecat_actions.admission.authorization import AllowAll
from pipecat_actions.clock import SystemClock
from pipecat_actions.execution.watchdog import Watchdog
from pipecat_actions.ledger import SqlLedger
from pipecat_actions.policy import load_policy_text
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.session import SessionState
from pipecat_actions.testing import Say, ScriptedLLM, ToolCalls

POLICY = """
version: 1
tools:
  lookup:
    kind: read
  book:
    kind: mutation
    on_duplicate: allow
"""


class Marks:
    """perf_counter marks per call: proposed, effect start, effect end, result frame."""

    def __init__(self) -> None:
        self.proposed: list[float] = []
        self.started: list[float] = []
        self.ended: list[float] = []
        self.result: list[float] = []

    def to_start_ms(self) -> list[float]:
        return [(s - p) * 1000 for p, s in zip(self.proposed, self.started, strict=False)]

    def to_result_ms(self) -> list[float]:
        return [(r - e) * 1000 for e, r in zip(self.ended, self.result, strict=False)]


class TimedLLM(ScriptedLLM):
    def __init__(self, marks: Marks, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.marks = marks

    async def run_function_calls(self, function_calls: Sequence[Any]) -> None:
        self.marks.proposed.append(time.perf_counter())
        await super().run_function_calls(function_calls)


class ResultTap(FrameProcessor):
    def __init__(self, marks: Marks, done: asyncio.Event, calls: int) -> None:
        super().__init__()
        self.marks, self.done, self.calls = marks, done, calls

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, FunctionCallResultFrame) and direction is FrameDirection.DOWNSTREAM:
            self.marks.result.append(time.perf_counter())
            if len(self.marks.result) >= self.calls:
                self.done.set()
        await self.push_frame(frame, direction)


async def run_chain(tool: str, calls: int, runtime: ActionRuntime | None, marks: Marks) -> None:
    script = [ToolCalls([(tool, {"n": i})]) for i in range(calls)] + [Say("done")]
    llm = TimedLLM(marks, script)
    session = SessionState(session_id=f"bench-{uuid.uuid4().hex[:6]}", principal="bench")
    if runtime is None:

        async def bare(params: FunctionCallParams) -> None:
            marks.started.append(time.perf_counter())
            marks.ended.append(time.perf_counter())
            await params.result_callback({"status": "ok"})

        llm.register_function(tool, bare)
    else:
        attach(runtime, llm, session)
    context = LLMContext(messages=[{"role": "user", "content": "go"}])
    pair = LLMContextAggregatorPair(context)
    done = asyncio.Event()
    pipeline = Pipeline([pair.user(), llm, ResultTap(marks, done, calls), pair.assistant()])
    await run_until(pipeline, done)


async def run_until(pipeline: Pipeline, done: asyncio.Event, timeout: float = 300) -> None:
    """Run ``pipeline``, make its LLM run once it started, and cancel it once ``done`` is set."""
    worker = PipelineWorker(pipeline, cancel_on_idle_timeout=False, enable_rtvi=False)
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    started = asyncio.Event()

    @worker.event_handler("on_pipeline_started")
    async def _started(worker: Any, frame: Any) -> None:
        started.set()

    async def drive() -> None:
        await started.wait()
        await worker.queue_frame(LLMRunFrame())
        await asyncio.wait_for(done.wait(), timeout=timeout)
        await worker.cancel()

    await asyncio.gather(runner.run(), drive())


def _stats(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


async def raw_floor(path: Path, n: int = 300) -> float:
    db = await aiosqlite.connect(path, isolation_level=None)
    try:
        await db.execute("PRAGMA journal_mode=WAL")
        await db.execute("PRAGMA synchronous=FULL")
        await db.execute("CREATE TABLE t (id TEXT PRIMARY KEY, body TEXT)")
        times = []
        for _ in range(n):
            t = time.perf_counter()
            await db.execute("BEGIN")
            await db.execute("INSERT INTO t VALUES (?, ?)", (uuid.uuid4().hex, "x" * 400))
            await db.commit()
            times.append(time.perf_counter() - t)
        return statistics.median(times) * 1000
    finally:
        await db.close()


class CountingLedger:
    """Counts ledger writes made while a mutation is on its critical path."""

    WRITES = ("admit", "transition", "annotate", "record_refusal", "record_completed")

    def __init__(self, ledger: SqlLedger) -> None:
        self.counts: dict[str, int] = dict.fromkeys(self.WRITES, 0)
        self.durations_ms: dict[str, list[float]] = {name: [] for name in self.WRITES}
        for name in self.WRITES:
            original = getattr(ledger, name)

            async def counted(
                *args: Any, _original: Any = original, _name: str = name, **kwargs: Any
            ) -> Any:
                self.counts[_name] += 1
                started = time.perf_counter()
                try:
                    return await _original(*args, **kwargs)
                finally:
                    self.durations_ms[_name].append((time.perf_counter() - started) * 1000)

            setattr(ledger, name, counted)


async def watchdog_lateness(pending: int) -> tuple[float, float]:
    fired = asyncio.Event()
    count = 0

    async def on_expiry(_: str) -> None:
        nonlocal count
        count += 1
        if count == pending:
            fired.set()

    watchdog = Watchdog(SystemClock(), on_expiry)
    watchdog.start()
    now = time.time()
    for i in range(pending):
        watchdog.arm(f"op{i}", now + 0.2 + (i % 500) * 0.002)
    await asyncio.wait_for(fired.wait(), timeout=30)
    await watchdog.stop()
    return _stats([s * 1000 for s in watchdog.lateness_secs])


async def main(args: argparse.Namespace) -> None:
    logger.remove()
    rows: dict[str, list[tuple[float, float, float, float]]] = {}
    writes: dict[str, int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        floor = await raw_floor(Path(tmp, "raw.db"))
        ledger = await SqlLedger.create(f"sqlite:///{Path(tmp, 'ledger.db')}")
        counter = CountingLedger(ledger)

        @action(name="lookup")
        async def lookup(ctx: ActionContext, n: int) -> dict[str, Any]:
            marks.started.append(time.perf_counter())
            marks.ended.append(time.perf_counter())
            return {"n": n}

        @action(name="book")
        async def book(ctx: ActionContext, n: int) -> dict[str, Any]:
            marks.started.append(time.perf_counter())
            marks.ended.append(time.perf_counter())
            return {"n": n}

        runtime = await ActionRuntime.create(
            load_policy_text(POLICY), authorizer=AllowAll(), actions=[lookup, book], ledger=ledger
        )
        for _ in range(args.rounds):
            for label, tool, rt in (
                ("bare handler (read)", "lookup", None),
                ("runtime read", "lookup", runtime),
                ("bare handler (mutation)", "book", None),
                ("runtime mutation", "book", runtime),
            ):
                marks = Marks()
                before = dict(counter.counts)
                await run_chain(tool, args.calls, rt, marks)
                if rt is not None and tool == "book":
                    writes[label] = sum(
                        counter.counts[k] - before[k] for k in ("admit", "transition")
                    )
                rows.setdefault(label, []).append(
                    (*_stats(marks.to_start_ms()), *_stats(marks.to_result_ms()))
                )
        await runtime.close()
        await ledger.close()
    lateness = await watchdog_lateness(args.deadlines)

    def median_round(label: str) -> tuple[float, float, float, float]:
        return sorted(rows[label], key=lambda r: r[0] + r[2])[len(rows[label]) // 2]

    print(f"calls per round: {args.calls}, rounds: {args.rounds}")
    print(f"{'':26}{'proposal->effect start':>26}{'effect end->result frame':>28}")
    print(f"{'':26}{'p50 ms':>13}{'p99 ms':>13}{'p50 ms':>14}{'p99 ms':>14}")
    for label in rows:
        a, b, c, d = median_round(label)
        print(f"{label:<26}{a:>13.3f}{b:>13.3f}{c:>14.3f}{d:>14.3f}")
    print()
    for kind, bare, ours in (
        ("read", "bare handler (read)", "runtime read"),
        ("mutation", "bare handler (mutation)", "runtime mutation"),
    ):
        b, o = median_round(bare), median_round(ours)
        print(
            f"{kind:<9} adds p50 {o[0] - b[0]:.3f} ms before the effect, {o[2] - b[2]:.3f} ms "
            f"after it ({o[0] + o[2] - b[0] - b[2]:.3f} ms in all; target read <= 0.3 ms)"
        )
    per_call = writes.get("runtime mutation", 0) / args.calls
    print(f"ledger writes on a mutation's critical path: {per_call:.2f} per call (target <= 2)")
    print(f"raw aiosqlite insert+commit floor this run: {floor:.3f} ms p50")
    for name in ("admit", "transition"):
        p50 = statistics.median(counter.durations_ms[name])
        print(f"  ledger {name:<10} p50 {p50:.3f} ms = {p50 / floor:.2f}x the floor (target <= 2x)")
    print(
        f"watchdog lateness with {args.deadlines} pending deadlines: p50 {lateness[0]:.3f} ms, "
        f"p99 {lateness[1]:.3f} ms (target p99 <= 5 ms)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--deadlines", type=int, default=1000)
    asyncio.run(main(parser.parse_args()))
