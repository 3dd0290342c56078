"""What metrics and tracing cost per tool call: tracing off (the default) against on.

    .venv/bin/python bench/observability.py [--calls N] [--rounds R]

One runtime on a SQLite ledger makes N calls of a read whose effect returns at once (the
path where overhead shows most: no write before the effect). Printed side by side, from one
run, rounds interleaved and the median round kept (the machine is shared):

* ``off``: ``runtime.propose`` with tracing off, as every runtime starts; metrics are
  always on. Also whether ``opentelemetry`` got imported (it must not be).
* ``on``: the same runtime with `enable_tracing` on an SDK provider exporting to memory.
* ``tracing off alone``: what the tracing points of a read cost while tracing is off (the
  admission scope's check and the attempt's shared no-op span), alone in a loop, and its
  share of the ``off`` call: the price of having tracing available.
* ``metrics alone``: the always-on metrics a read call records (admission latency and
  decision, the recorded read's counts), alone in a loop, and its share of the call.

Figures, not pass/fail.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loguru import logger

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipecat_actions import ActionRuntime, AllowAll, SessionState, action
from pipecat_actions.admission.decisions import ReadAdmission
from pipecat_actions.ledger import NewOperation
from pipecat_actions.policy import load_policy_text

POLICY = "version: 1\ntools:\n  find_tables:\n    kind: read\n"


@action
async def find_tables(ctx: Any, restaurant_id: str) -> dict[str, Any]:
    """Find free tables."""
    return {"free": 3}


async def _calls(runtime: ActionRuntime, session: SessionState, n: int) -> float:
    """Median seconds per ``propose`` over ``n`` calls."""
    times = []
    for i in range(n):
        started = time.perf_counter()
        await runtime.propose("find_tables", {"restaurant_id": f"r{i % 7}"}, session)
        times.append(time.perf_counter() - started)
    await runtime.flush()
    return statistics.median(times)


def _points(runtime: ActionRuntime, session: SessionState, n: int) -> tuple[float, float]:
    """Seconds per call of a read's tracing points (off) and of its metrics, each alone."""
    telemetry = runtime.telemetry
    assert telemetry.tracer is None
    decision = ReadAdmission(
        runtime.bindings["find_tables"], {"restaurant_id": "r1"}, None, "k", None, "0"
    )  # type: ignore[arg-type]
    new = NewOperation(
        tool="find_tables", kind="read", args={}, idempotency_key="k", session_id="s",
        principal="p", detail={"attempts": 1, "timed_out": False},
    )  # fmt: skip

    class _Op:  # the two fields `completed` reads
        tool = "find_tables"
        status = new.status

    op: Any = _Op()
    started = time.perf_counter()
    for _ in range(n):
        _ids = None if telemetry.tracer is None else object()  # as `_read` does
        with telemetry.read_attempt(_ids, 1):  # type: ignore[arg-type]
            pass
    tracing = (time.perf_counter() - started) / n
    started = time.perf_counter()
    for _ in range(n):
        with telemetry.admission("find_tables", session, "call-1") as scope:
            scope.decided(decision)
        telemetry.completed(new, op)
    return tracing, (time.perf_counter() - started) / n


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    logger.remove()

    with tempfile.TemporaryDirectory() as where:
        policy = load_policy_text(POLICY)
        off = await ActionRuntime.create(
            policy, authorizer=AllowAll(), actions=[find_tables],
            ledger_url=f"sqlite:///{where}/off.db",
        )  # fmt: skip
        on = await ActionRuntime.create(
            policy, authorizer=AllowAll(), actions=[find_tables],
            ledger_url=f"sqlite:///{where}/on.db",
        )  # fmt: skip
        session = SessionState(session_id="bench", principal="alice")
        await _calls(off, session, 50)  # warm-up, before anything imports opentelemetry
        imported = any(m.split(".")[0] == "opentelemetry" for m in sys.modules)

        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import (
            InMemorySpanExporter,
        )

        from pipecat_actions.observability import enable_tracing

        exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        enable_tracing(on, provider)
        await _calls(on, session, 50)

        rounds: list[tuple[float, float, tuple[float, float]]] = []
        for _ in range(args.rounds):
            exporter.clear()
            rounds.append(
                (
                    await _calls(off, session, args.calls),
                    await _calls(on, session, args.calls),
                    _points(off, session, args.calls * 10),
                )
            )
        spans = len(exporter.get_finished_spans())
        await off.close()
        await on.close()

    rounds.sort(key=lambda r: r[0])
    t_off, t_on, (t_tracing, t_metrics) = rounds[len(rounds) // 2]
    print(f"read calls per round: {args.calls}, rounds: {args.rounds} (median round shown)")
    print(f"opentelemetry imported with tracing off: {imported}")
    print(f"propose, tracing off      : {t_off * 1e6:8.1f} us per call")
    print(
        f"propose, tracing on       : {t_on * 1e6:8.1f} us per call   "
        f"({t_on / t_off:.2f}x off; {spans // args.calls} spans per call)"
    )
    print(
        f"tracing off alone         : {t_tracing * 1e6:8.2f} us per call   "
        f"({t_tracing / t_off:.1%} of a call with tracing off)"
    )
    print(
        f"metrics alone (always on) : {t_metrics * 1e6:8.2f} us per call   "
        f"({t_metrics / t_off:.1%} of a call with tracing off)"
    )


if __name__ == "__main__":
    asyncio.run(main())
