"""Durable execution on DBOS: the cost of the hand-off, and what more workers add.

    .venv/bin/python bench/durable.py [--ops N] [--queued Q] [--effect-secs S]

On a PostgreSQL database created for the run (ledger, DBOS's tables) and dropped after it:

* **hand-off**: a bot's ``propose`` of a durable tool (the ledger row and the workflow enqueue
  in one transaction, then the answer "started") against ``propose(wait=False)`` of the same
  tool run in the call (the row written RUNNING, the effect started in the process), N calls
  each, interleaved; median and p99 latency, and their ratio;
* **workers**: Q durable operations queued first, then drained by 1 worker and by 4
  (``pipecat-actions worker --dbos`` processes, ``worker_concurrency: 8`` each, the effect a
  provider latency of S seconds): operations per second from the first start to the last
  outcome, and the ratio 4 : 1 (the issue's goal is >= 3x).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path

import asyncpg

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from _durable_app import ACTIONS, POLICY  # noqa: E402

from pipecat_actions.admission.authorization import AllowAll  # noqa: E402
from pipecat_actions.durable import DurableLedger, install_dbos_schema  # noqa: E402
from pipecat_actions.ledger import SqlLedger  # noqa: E402
from pipecat_actions.runtime import ActionRuntime  # noqa: E402
from pipecat_actions.session import SessionState  # noqa: E402

POLLING_SECS = 0.1
"""How often each worker polls the queue."""

PG_ADMIN_URL = os.environ.get(
    "PIPECAT_ACTIONS_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)


def _ms(values: list[float]) -> str:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"median {statistics.median(ordered) * 1000:7.2f} ms  p99 {p99 * 1000:7.2f} ms"


async def _hand_off(url: str, ops: int) -> None:
    ledger = await DurableLedger.open(url, POLICY)
    runtime = await ActionRuntime.create(
        POLICY, authorizer=AllowAll(), actions=ACTIONS, ledger=ledger, recover=False
    )
    durable: list[float] = []
    in_call: list[float] = []
    try:
        for i in range(ops):
            for tool, times in (("pay_durably", durable), ("pay_in_call", in_call)):  # new keys
                session = SessionState(session_id=f"s-{tool}-{i}", principal="bench")
                start = time.perf_counter()
                await runtime.propose(tool, {"n": i}, session, wait=False)
                times.append(time.perf_counter() - start)
        await runtime.flush()
    finally:
        await runtime.close()
        await ledger.close()
    print(f"hand-off  durable  {_ms(durable)}")
    print(f"hand-off  in call  {_ms(in_call)}")
    ratio = statistics.median(durable) / statistics.median(in_call)
    print(f"hand-off  durable : in call (median) = {ratio:.2f}x")


async def _queue(url: str, count: int, tag: int) -> list[str]:
    ledger = await DurableLedger.open(url, POLICY)
    runtime = await ActionRuntime.create(
        POLICY, authorizer=AllowAll(), actions=ACTIONS, ledger=ledger, recover=False
    )
    try:
        return [
            (
                await runtime.propose(
                    "pay_durably",
                    {"n": tag * 1_000_000 + i},  # a new intent each: no call joins another
                    SessionState(session_id=f"q-{tag}-{i}", principal="bench"),
                    wait=False,
                )
            )["operation_id"]
            for i in range(count)
        ]
    finally:
        await runtime.close()
        await ledger.close()


async def _drain(url: str, ids: list[str], workers: int, effect_secs: float) -> float:
    env = dict(
        os.environ,
        PYTHONPATH=f"{ROOT}:{ROOT / 'bench'}",
        BENCH_EFFECT_SECS=str(effect_secs),
    )
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "pipecat_actions.cli",
                "worker",
                "--dbos",
                "--app",
                "_durable_app:app",
                "--ledger",
                url,
                "--executor-id",
                f"bench-{workers}-{n}",
                "--polling-secs",
                str(POLLING_SECS),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for n in range(workers)
    ]
    conn = await asyncpg.connect(url)
    try:
        while True:  # the first start to the last outcome, read from the ledger's own times
            row = await conn.fetchrow(
                "SELECT count(*) FILTER (WHERE finished_at IS NOT NULL) AS done, "
                "min(started_at) AS first, max(finished_at) AS last "
                "FROM pa_operations WHERE operation_id = ANY($1::text[])",
                ids,
            )
            if row["done"] == len(ids):
                break
            await asyncio.sleep(0.2)
    finally:
        await conn.close()
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            proc.wait()
    return len(ids) / (row["last"] - row["first"])


async def _workers(url: str, queued: int, effect_secs: float) -> None:
    rates = {}
    for workers in (1, 4):
        ids = await _queue(url, queued, workers)
        rates[workers] = await _drain(url, ids, workers, effect_secs)
        print(f"workers   {workers}: {rates[workers]:8.1f} operations/s ({queued} queued)")
    print(f"workers   4 : 1 = {rates[4] / rates[1]:.2f}x (goal >= 3x)")


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=200)
    parser.add_argument("--queued", type=int, default=1000)
    parser.add_argument("--effect-secs", type=float, default=0.02)
    args = parser.parse_args()
    name = f"pa_bench_durable_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(PG_ADMIN_URL)
    await admin.execute(f'CREATE DATABASE "{name}"')
    url = PG_ADMIN_URL.rpartition("/")[0] + "/" + name
    try:
        ledger = await SqlLedger.create(url)
        await ledger.close()
        await install_dbos_schema(url)
        await _hand_off(url, args.ops)
        await _workers(url, args.queued, args.effect_secs)
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


if __name__ == "__main__":
    os.environ.setdefault("LOGURU_LEVEL", "WARNING")
    asyncio.run(main())
