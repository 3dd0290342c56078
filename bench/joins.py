"""Callers in several processes joined to one operation: how soon does the last one hear it?

    .venv/bin/python bench/joins.py [--processes P] [--callers C] [--effect-ms E] [--rounds R]
                                    [--no-postgres]

P processes, each with C concurrent callers of one intent (``on_duplicate: join``, tenant
scope), are started on one ledger and released at once. One caller's effect runs (E ms);
every other caller joins it: those of the same process wait on it in memory, those of the
other processes on the ledger. Per backend, side by side in interleaved rounds:

* **notices**: waiters are woken when the operation settles (`Ledger.notices`: PostgreSQL
  ``LISTEN/NOTIFY``; on SQLite, a datagram to each waiting process);
* **polling**: the same with notices turned off, as before (re-reads at 50, 100, 200 ms...).

Prints the time from release to the last caller's answer (median round), the effects that ran
(must be 1) and the ratio to the target: last caller within effect + 100 ms.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from _measure import drop_pg, fresh_pg  # noqa: E402 - after the path is set

POLICY = """
version: 1
tools:
  book_table:
    kind: mutation
    on_duplicate: join
    idempotency: {scope: tenant}
    deadline_secs: 30
"""

CHILD = r"""
import asyncio, contextlib, fcntl, json, sys, time
from pathlib import Path
from loguru import logger
from pipecat_actions import ActionContext, ActionRuntime, AllowAll, SessionState, action
from pipecat_actions.ledger import SqlLedger
from pipecat_actions.policy import load_policy_text

url, effects, callers, effect_secs, notices, policy, tag = sys.argv[1:8]
logger.remove()
if notices == "off":
    @contextlib.asynccontextmanager
    async def _none(self, operation_id):
        yield None
    SqlLedger.notices = _none

async def main():
    @action
    async def book_table(ctx: ActionContext, time: str) -> dict:
        "Book a table."
        await asyncio.sleep(float(effect_secs))
        with open(effects, "a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.write(ctx.idempotency_key + "\n")
        return {"booking_id": "bk_1"}

    runtime = await ActionRuntime.create(
        load_policy_text(policy), authorizer=AllowAll(), actions=[book_table], ledger_url=url
    )
    print("ready", flush=True)
    sys.stdin.readline()
    ends = []

    async def one(i):
        told = await runtime.propose(
            "book_table", {"time": tag}, SessionState(session_id=f"s{i}", principal=f"p{i}")
        )
        ends.append(time.time())
        return told["status"]

    statuses = await asyncio.gather(*(one(i) for i in range(int(callers))))
    await runtime.close()
    print(json.dumps({"last": max(ends), "statuses": sorted(set(statuses))}), flush=True)

asyncio.run(main())
"""


def _round(url: str, args: argparse.Namespace, notices: str, tag: str) -> tuple[float, int, list]:
    with tempfile.TemporaryDirectory() as tmp:
        effects = Path(tmp, "effects")
        effects.touch()
        children = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    CHILD,
                    url,
                    str(effects),
                    str(args.callers),
                    str(args.effect_ms / 1000),
                    notices,
                    POLICY,
                    tag,
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                cwd=ROOT,
                env={**os.environ, "PYTHONPATH": str(ROOT)},
            )
            for _ in range(args.processes)
        ]
        for child in children:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "ready"
        start = time.time()
        for child in children:
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        reports = [
            json.loads(child.communicate(timeout=120)[0].splitlines()[-1]) for child in children
        ]
        ran = len(effects.read_text().splitlines())
    last = max(r["last"] for r in reports) - start
    return last, ran, sorted({s for r in reports for s in r["statuses"]})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--callers", type=int, default=50)
    parser.add_argument("--effect-ms", type=float, default=50.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        backends = {"sqlite": f"sqlite:///{Path(tmp, 'ledger.db')}"}
        pg_name = None
        if not args.no_postgres:
            pg_name, backends["postgres"] = asyncio.run(fresh_pg())
        results: dict[tuple[str, str], list[float]] = {}
        ran: dict[tuple[str, str], set[int]] = {}
        statuses: dict[tuple[str, str], set[str]] = {}
        try:
            for r in range(args.rounds):
                for backend, url in backends.items():
                    for notices in ("on", "off"):
                        key = (backend, notices)
                        last, effects, told = _round(url, args, notices, f"{r}-{notices}")
                        results.setdefault(key, []).append(last)
                        ran.setdefault(key, set()).add(effects)
                        statuses.setdefault(key, set()).update(told)
        finally:
            if pg_name is not None:
                asyncio.run(drop_pg(pg_name))

    target = args.effect_ms + 100
    print(
        f"{args.processes} processes x {args.callers} callers, one intent, effect "
        f"{args.effect_ms:.0f} ms, {args.rounds} rounds (median round)"
    )
    print(f"{'backend':<10}{'waiters':<10}{'last caller ms':>16}{'effects':>9}  statuses")
    for (backend, notices), lasts in results.items():
        mode = "notices" if notices == "on" else "polling"
        print(
            f"{backend:<10}{mode:<10}{statistics.median(lasts) * 1000:>16.0f}"
            f"{','.join(map(str, sorted(ran[backend, notices]))):>9}  "
            f"{','.join(sorted(statuses[backend, notices]))}"
        )
    print()
    print(f"target: last caller within effect + 100 ms = {target:.0f} ms")
    for backend in backends:
        on = statistics.median(results[backend, "on"]) * 1000
        off = statistics.median(results[backend, "off"]) * 1000
        print(
            f"  {backend:<9} notices {on / target:4.2f}x the target; polling {off / target:4.2f}x "
            f"(notices {off / on:4.2f}x sooner; issue #14's agent-ledger: 720 ms)"
        )


if __name__ == "__main__":
    main()
