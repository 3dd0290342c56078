"""Client CPU and memory of one process as it holds more sessions at once (issue 34, item 4).

    .venv/bin/python bench/sessions_per_process.py [--sessions 50,250] [--calls K] [--rounds R]
                                                   [--kinds bare,template] [--profile DIR]

One process, one runtime on a PostgreSQL database created for the run (dropped after it), and
the sessions of `bench/many_processes.py`'s worker (each its own Pipecat pipeline, a scripted
LLM making K chained calls), run S at once, bare and template alternating for R rounds (or one
kind alone with ``--kinds``). First it prints the RSS one Pipecat context aggregator pair adds
(both kinds have one per pipeline). Then, for each S and kind: the median round's client CPU
per call, the share of it spent in Python's garbage collector (timed by ``gc.callbacks``), the
most RSS seen during the rounds, the RSS once the pipelines ended and the allocator gave back
what is free (``malloc_trim``), the pipeline processors still alive once their last tasks
ended, and the entries of the runtime's per-session structures after the rounds (0 when
nothing is kept of an ended session). With ``--profile DIR`` each template round is profiled
(cProfile) into DIR, to compare the functions called per call at two session counts (the
profile's own cost inflates the CPU).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import ctypes
import gc
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _measure import drop_pg, fresh_pg
from loguru import logger
from many_processes import POLICY, _worker_round
from pipecat.processors.frame_processor import FrameProcessor

from pipecat_actions import ActionContext, ActionRuntime, AllowAll, action
from pipecat_actions.ledger import SqlLedger
from pipecat_actions.policy import load_policy_text

RSS_EVERY_SECS = 0.5
"""How often the RSS is read during a round (a file read: no measurable CPU)."""
SETTLE_SECS = 10.0
"""How long the ended pipelines' last tasks may take to finish before they are counted."""


class GcTime:
    """CPU time spent in the garbage collector, from ``gc.callbacks``."""

    def __init__(self) -> None:
        self.secs = 0.0
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.process_time()
        else:
            self.secs += time.process_time() - self._started


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def trimmed_rss_mb() -> float:
    """The RSS once the C allocator has given back its free memory (glibc only)."""
    gc.collect()
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return rss_mb()


async def ended_pipelines_alive() -> int:
    """Pipeline processors still alive once the last round's tasks have ended.

    A template pipeline's last delivery records are written by its processors' tasks, which
    end (and let the pipeline go) shortly after the round: waited for here, at most
    `SETTLE_SECS` (real time, a benchmark).
    """
    deadline = time.monotonic() + SETTLE_SECS
    while True:
        gc.collect()
        alive = sum(isinstance(o, FrameProcessor) for o in gc.get_objects())
        if alive == 0 or time.monotonic() > deadline:
            return alive
        await asyncio.sleep(0.1)


def aggregators_mb(count: int = 20) -> float:
    """RSS added by one Pipecat context aggregator pair (the first stage of every pipeline).

    Its user aggregator's default turn strategy loads Pipecat's Smart Turn ONNX model for
    each pair; built ``count`` times, then let go.
    """
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair

    before = rss_mb()
    pairs = [LLMContextAggregatorPair(LLMContext(messages=[])) for _ in range(count)]
    added = (rss_mb() - before) / len(pairs)
    del pairs
    gc.collect()
    return added


def per_session_state(runtime: ActionRuntime) -> int:
    """Entries of the runtime's per-session structures (outcome and progress listeners, calls
    being answered, operations tracked, tracing contexts)."""
    operations = runtime._operations
    return (
        len(operations._listeners)
        + len(runtime._progress._listeners)
        + len(operations._answering)
        + len(operations._tracked)
        + len(runtime.telemetry._turns)
    )


async def one_round(
    mode: str, round_no: int, sessions: int, args: argparse.Namespace, runtime: ActionRuntime
) -> dict[str, float]:
    peak = rss_mb()
    stop = asyncio.Event()

    async def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, rss_mb())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), RSS_EVERY_SECS)

    sampler = asyncio.create_task(sample())
    gc_time = GcTime()
    gc.callbacks.append(gc_time)
    profile = cProfile.Profile() if args.profile and mode == "template" else None
    if profile is not None:
        profile.enable()
    try:
        found = await _worker_round(mode, 0, round_no, sessions, args.calls, runtime)
    finally:
        if profile is not None:
            profile.disable()
        gc.callbacks.remove(gc_time)
        stop.set()
        await sampler
    if profile is not None:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
        profile.dump_stats(Path(args.profile) / f"template-{sessions}-{round_no}.prof")
    calls = sessions * args.calls
    return {
        "cpu_ms": found["cpu"] / calls * 1000,
        "gc_ms": gc_time.secs / calls * 1000,
        "errors": found["errors"],
        "peak_mb": max(peak, rss_mb()),
    }


async def measure(args: argparse.Namespace) -> None:
    @action
    async def book(ctx: ActionContext, n: int) -> dict[str, Any]:
        """Book."""
        return {"booking_id": f"bk_{n}"}

    name, url = await fresh_pg()
    try:
        await (await SqlLedger.create(url)).close()
        print(
            f"one process, {args.calls} chained calls per session, {args.rounds} rounds per kind "
            f"(median round); load average {os.getloadavg()[0]:.1f} at the start"
        )
        print(f"one Pipecat aggregator pair (first stage of both kinds): {aggregators_mb():.1f} MB")
        print(
            f"{'sessions':<9}{'pipelines':<10}{'CPU ms/call':>12}{'GC ms/call':>11}"
            f"{'errors':>7}{'peak RSS MB':>12}{'after MB':>9}{'processors':>11}{'kept':>5}"
        )
        for sessions in args.sessions:
            runtime = await ActionRuntime.create(
                load_policy_text(POLICY), authorizer=AllowAll(), actions=[book], ledger_url=url
            )
            try:
                rounds: dict[str, list[dict[str, float]]] = {kind: [] for kind in args.kinds}
                for round_no in range(args.rounds):
                    order = args.kinds if round_no % 2 == 0 else args.kinds[::-1]
                    for mode in order:
                        rounds[mode].append(
                            await one_round(mode, round_no, sessions, args, runtime)
                        )
                await runtime.flush()
                alive = await ended_pipelines_alive()
                after = trimmed_rss_mb()
                kept = per_session_state(runtime)
                for mode, samples in rounds.items():
                    cpu = statistics.median(s["cpu_ms"] for s in samples)
                    gc_ms = statistics.median(s["gc_ms"] for s in samples)
                    print(
                        f"{sessions:<9}{mode:<10}{cpu:>12.2f}{gc_ms:>11.2f}"
                        f"{sum(s['errors'] for s in samples):>7.0f}"
                        f"{max(s['peak_mb'] for s in samples):>12.0f}{after:>9.0f}"
                        f"{alive:>11}{kept:>5}"
                    )
            finally:
                await runtime.close()
        print(f"load average {os.getloadavg()[0]:.1f} at the end")
    finally:
        await drop_pg(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sessions", type=lambda s: [int(n) for n in s.split(",")], default=[50, 250]
    )
    parser.add_argument("--calls", type=int, default=5)
    parser.add_argument(
        "--kinds",
        type=lambda s: s.split(","),
        default=["bare", "template"],
        help="bare, template or both (one kind alone: its own memory, not the other's)",
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", help="profile each template round into this directory")
    args = parser.parse_args()
    logger.remove()
    asyncio.run(measure(args))


if __name__ == "__main__":
    main()
