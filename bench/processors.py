"""Per-frame cost of the tracker and the gate on frames they do not act on, against a bare one.

    .venv/bin/python bench/processors.py [--frames N] [--rounds R]

Each configuration is a pipeline ``[source, processor, sink]``; N audio frames then N text
frames are pushed through it. For each it prints the CPU time per frame (``process_time`` over
the whole run, divided by frames) and the latency per frame (push at the source to arrival at
the sink, median and p99), side by side with a bare pass-through `FrameProcessor` measured in
the same round. Rounds are interleaved and the median round kept (the machine is shared).
Target: at most 1.1x the bare processor. Figures, not pass/fail.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from loguru import logger
from pipecat.frames.frames import EndFrame, Frame, OutputAudioRawFrame, TextFrame
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.workers.runner import WorkerRunner

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipecat_actions import ActionContext, ActionRuntime, AllowAll, SessionState, action
from pipecat_actions.adapters import ActionResultGate, ActionTurnTracker
from pipecat_actions.ledger import SqlLedger
from pipecat_actions.policy import load_policy_text


class Bare(FrameProcessor):
    """The reference: a processor that pushes every frame on."""

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        await self.push_frame(frame, direction)


class Sink(FrameProcessor):
    def __init__(self) -> None:
        super().__init__()
        self.latencies: list[float] = []
        self.arrived = asyncio.Event()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        sent = getattr(frame, "bench_sent", None)
        if sent is not None:
            self.latencies.append(time.perf_counter() - sent)
            self.arrived.set()
        await self.push_frame(frame, direction)


def _frame(i: int, frames: int) -> Frame:
    if i < frames:
        return OutputAudioRawFrame(audio=b"\x00" * 640, sample_rate=16000, num_channels=1)
    return TextFrame(text="hello there")


async def measure(processor: FrameProcessor | None, frames: int) -> tuple[float, float, float]:
    """Return (CPU us per frame, latency p50 us, latency p99 us) of ``[processor, sink]``.

    Frames are sent one at a time, each after the previous one arrived, so the latency is the
    pipeline's own and not a queue's; CPU is process time over the whole run.
    """
    sink = Sink()
    stages = [sink] if processor is None else [processor, sink]
    worker = PipelineWorker(Pipeline(stages), cancel_on_idle_timeout=False, enable_rtvi=False)
    started = asyncio.Event()

    @worker.event_handler("on_pipeline_started")
    async def _started(worker: Any, frame: Any) -> None:
        started.set()

    async def drive() -> tuple[float, float, float]:
        await started.wait()
        cpu = time.process_time()
        for i in range(2 * frames):
            frame = _frame(i, frames)
            sink.arrived.clear()
            frame.bench_sent = time.perf_counter()  # type: ignore[attr-defined]
            await worker.queue_frame(frame)
            await asyncio.wait_for(sink.arrived.wait(), timeout=10)
        cpu = time.process_time() - cpu
        await worker.queue_frame(EndFrame())
        ordered = sorted(sink.latencies)
        return (
            cpu / (2 * frames) * 1e6,
            statistics.median(ordered) * 1e6,
            ordered[int(len(ordered) * 0.99)] * 1e6,
        )

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    _, figures = await asyncio.gather(runner.run(), drive())
    return figures


@action
async def noop(ctx: ActionContext) -> dict[str, Any]:
    """Do nothing (the policy's one tool; never called here)."""
    return {}


async def main(args: argparse.Namespace) -> None:
    logger.remove()
    ledger = await SqlLedger.create(f"sqlite:///{Path('.pipecat_actions', 'bench.db').resolve()}")
    runtime = await ActionRuntime.create(
        load_policy_text("version: 1\ntools:\n  noop:\n    kind: read\n"),
        authorizer=AllowAll(),
        actions=[noop],
        ledger=ledger,
    )
    session = SessionState(session_id="bench", principal="bench")
    rows: dict[str, list[tuple[float, float, float]]] = {}
    for _ in range(args.rounds):
        for label, make in (
            ("(no processor)", lambda: None),
            ("bare FrameProcessor", Bare),
            ("ActionTurnTracker", lambda: ActionTurnTracker(session)),
            ("ActionResultGate", lambda: ActionResultGate(runtime, session)),
        ):
            rows.setdefault(label, []).append(await measure(make(), args.frames))
    await runtime.close()
    await ledger.close()

    def median_round(label: str) -> tuple[float, float, float]:
        return sorted(rows[label], key=lambda r: r[0])[len(rows[label]) // 2]

    empty = median_round("(no processor)")
    bare = median_round("bare FrameProcessor")
    print(f"frames per round: {2 * args.frames} (audio and text), rounds: {args.rounds}")
    print("whole pipeline (worker, sink and the processor), per frame:")
    print(f"{'processor':<22}{'CPU us':>9}{'p50 us':>9}{'p99 us':>9}{'CPU x bare':>12}")
    for label in rows:
        cpu, p50, p99 = median_round(label)
        print(f"{label:<22}{cpu:>9.1f}{p50:>9.1f}{p99:>9.1f}{cpu / bare[0]:>12.2f}")
    print("each processor's own share (the pipeline without a processor subtracted):")
    bare_cpu, bare_p50 = bare[0] - empty[0], bare[1] - empty[1]
    print(f"  bare FrameProcessor    CPU {bare_cpu:5.1f} us, latency {bare_p50:5.1f} us")
    for label in ("ActionTurnTracker", "ActionResultGate"):
        cpu, p50, _ = median_round(label)
        own_cpu, own_p50 = cpu - empty[0], p50 - empty[1]
        print(
            f"  {label:<22} CPU {own_cpu:5.1f} us = {own_cpu / bare_cpu:4.2f}x bare, "
            f"latency {own_p50:5.1f} us = {own_p50 / bare_p50:4.2f}x bare"
        )
    print("target: <= 1.10x the bare processor on frames the processors do not act on")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    asyncio.run(main(parser.parse_args()))
