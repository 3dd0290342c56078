"""The template's cost at scale: many sessions, each its own pipeline, against bare handlers.

    .venv/bin/python bench/template.py [--sessions S] [--calls K] [--rounds R] [--postgres]

S sessions run at once, each in its own Pipecat pipeline driven by a `ScriptedLLM` that makes
K tool calls in a chain (each result makes the next inference), then says "done". Side by
side in interleaved rounds (the median round is kept):

* **bare**: ``[user aggregator, LLM, assistant aggregator]`` with the tool registered bare on
  the LLM (a handler that answers at once);
* **template**: `build_pipeline`'s stages (turn tracker, LLM, status reporter, result gate,
  both aggregators) with the same tool as a non-idempotent mutation through the runtime, on a
  SQLite ledger (``--postgres``: on a fresh PostgreSQL database).

It prints calls per second over all sessions, the p50 and p99 of one call (proposal to its
result frame) and the ledger calls per tool call (counted), then the throughput ratio.
Target: the template at >= 0.6x the bare throughput, with no ledger read or write per result
beyond the call's own (admit, RUNNING, COMMITTED).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from loguru import logger
from pipecat.pipeline.pipeline import Pipeline
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.services.llm_service import FunctionCallParams

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _measure import drop_pg, fresh_pg
from runtime import Marks, ResultTap, TimedLLM, run_until

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
from pipecat_actions.ledger import ForwardingLedger, SqlLedger
from pipecat_actions.policy import load_policy_text
from pipecat_actions.testing import Say, ToolCalls

POLICY = """
version: 1
tools:
  book:
    kind: mutation
    on_duplicate: allow
"""


class Counted(ForwardingLedger):
    """Counts the ledger calls, by method."""

    def __init__(self, inner: SqlLedger) -> None:
        super().__init__(inner)
        self.calls: Counter[str] = Counter()

    def __getattribute__(self, name: str) -> Any:
        found = super().__getattribute__(name)
        if name in _COUNTED:

            async def counted(*args: Any, **kwargs: Any) -> Any:
                self.calls[name] += 1
                return await found(*args, **kwargs)

            return counted
        return found


_COUNTED = {"admit", "transition", "annotate", "get", "find_by_key", "list", "record_completed"}


async def _session(n: int, calls: int, runtime: ActionRuntime | None) -> list[float]:
    marks = Marks()
    done = asyncio.Event()
    script = [ToolCalls([("book", {"n": i})]) for i in range(calls)] + [Say("done")]
    llm = TimedLLM(marks, script)
    context = LLMContext(messages=[{"role": "user", "content": "go"}])
    tap = ResultTap(marks, done, calls)
    if runtime is None:

        async def bare(params: FunctionCallParams) -> None:
            await params.result_callback({"status": "ok"})

        llm.register_function("book", bare)
        pair = LLMContextAggregatorPair(context)
        pipeline = Pipeline([pair.user(), llm, tap, pair.assistant()])
    else:
        # `build_pipeline`'s stages, with the tap right after the LLM (where the bare one is).
        context.set_tools(tools_schema(runtime))
        session = SessionState(session_id=f"s{n}-{uuid.uuid4().hex[:6]}", principal=f"p{n}")
        pair = LLMContextAggregatorPair(context)
        attach(runtime, llm, session)
        stages = [
            pair.user(),
            ActionTurnTracker(session),
            llm,
            ActionStatusReporter(runtime, session),
            tap,
            ActionResultGate(runtime, session),
            pair.assistant(),
        ]
        check_placement(stages)
        pipeline = Pipeline(stages)
    await run_until(pipeline, done)
    return [(r - p) * 1000 for p, r in zip(marks.proposed, marks.result, strict=False)]


async def _round(
    sessions: int, calls: int, runtime: ActionRuntime | None
) -> tuple[float, list[float]]:
    start = time.perf_counter()
    per_session = await asyncio.gather(*(_session(n, calls, runtime) for n in range(sessions)))
    seconds = time.perf_counter() - start
    return sessions * calls / seconds, [ms for one in per_session for ms in one]


async def _runtime(url: str) -> tuple[ActionRuntime, Counted]:
    @action
    async def book(ctx: ActionContext, n: int) -> dict[str, Any]:
        """Book."""
        return {"booking_id": f"bk_{n}"}

    ledger = Counted(await SqlLedger.create(url))
    runtime = await ActionRuntime.create(
        load_policy_text(POLICY), authorizer=AllowAll(), actions=[book], ledger=ledger
    )
    return runtime, ledger


def _p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


async def measure(args: argparse.Namespace) -> None:
    rounds: dict[str, list[tuple[float, list[float]]]] = {"bare": [], "template": []}
    ledger_calls: Counter[str] = Counter()
    pg_name = None
    with tempfile.TemporaryDirectory() as tmp:
        url = f"sqlite:///{Path(tmp, 'ledger.db')}"
        if args.postgres:
            pg_name, url = await fresh_pg()
        try:
            for _ in range(args.rounds):
                rounds["bare"].append(await _round(args.sessions, args.calls, None))
                runtime, ledger = await _runtime(url)
                try:
                    rounds["template"].append(await _round(args.sessions, args.calls, runtime))
                    await runtime.flush()
                finally:
                    await runtime.close()
                    await ledger.inner.close()
                ledger_calls = ledger.calls
        finally:
            if pg_name is not None:
                await drop_pg(pg_name)

    backend = "PostgreSQL" if args.postgres else "SQLite"
    print(
        f"{args.sessions} sessions x {args.calls} chained calls, {args.rounds} rounds "
        f"(median round), ledger: {backend}"
    )
    print(f"{'pipelines':<10}{'calls/s':>10}{'p50 ms':>10}{'p99 ms':>10}")
    chosen = {}
    for name, samples in rounds.items():
        throughput, latencies = sorted(samples, key=lambda s: s[0])[len(samples) // 2]
        chosen[name] = throughput
        print(
            f"{name:<10}{throughput:>10.0f}{statistics.median(latencies):>10.2f}"
            f"{_p(latencies, 0.99):>10.2f}"
        )
    total = args.sessions * args.calls
    per_call = {k: round(v / total, 2) for k, v in sorted(ledger_calls.items())}
    print(f"ledger calls per tool call (last round): {per_call}")
    print()
    ratio = chosen["template"] / chosen["bare"]
    print(f"template throughput {ratio:.2f}x the bare pipelines (target >= 0.6x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--postgres", action="store_true")
    args = parser.parse_args()
    logger.remove()
    asyncio.run(measure(args))


if __name__ == "__main__":
    main()
