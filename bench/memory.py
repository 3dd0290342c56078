"""Memory of a long-running runtime: RSS over 100,000 operations (issue 12, B10).

    .venv/bin/python bench/memory.py [--ops N] [--concurrency C] [--per-session K]

Runs ``--ops`` bookings through one real `ActionRuntime` on a SQLite ledger file, ``--per-session``
per conversation (each conversation listens for outcomes and stops listening at its end, as the
result gate does), ``--concurrency`` at a time. At checkpoints it prints the process's resident
memory, the operations the runtime still holds in memory, and the `Tracked` records alive, then
the ratios that show whether memory is flat:

* RSS at the end / RSS at the first checkpoint (flat: close to 1.0);
* RSS growth per 10,000 operations in the second half / in the first half.

Before this change, finished operations were never removed: 30,697 `Tracked` objects were alive
after 100 sessions for 60 s, and RSS grew from 74 to 213 MB. Figures, not pass/fail.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loguru import logger

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipecat_actions.actions import ActionContext, action
from pipecat_actions.admission.authorization import AllowAll
from pipecat_actions.execution.tracked import Tracked
from pipecat_actions.ledger import Operation
from pipecat_actions.policy import load_policy_text
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.session import SessionState

POLICY = """
version: 1
tools:
  book_table:
    kind: mutation
    idempotency: {window_secs: 60}
"""


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def tracked_alive() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, Tracked))


@action(name="book_table", description="Book a table.")
async def book_table(ctx: ActionContext, restaurant_id: str, slot: int) -> dict[str, Any]:
    """Book a table (instantly: only the runtime's own memory is measured)."""
    return {"booking_id": f"bk_{ctx.operation_id[-8:]}"}


async def conversation(runtime: ActionRuntime, index: int, per_session: int) -> None:
    session = SessionState(session_id=f"call-{index}", principal=f"user-{index % 500}")
    heard: list[Operation] = []
    runtime.listen(session.session_id, heard.append)
    try:
        for n in range(per_session):
            await runtime.propose(
                "book_table",
                {"restaurant_id": "r1", "slot": index * per_session + n},
                session,
                tool_call_id=f"call_{index}_{n}",
            )
    finally:
        runtime.unlisten(session.session_id, heard.append)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--per-session", type=int, default=20)
    args = parser.parse_args()
    logger.remove()  # a line per call to stderr would measure the terminal, not the runtime

    folder = Path(tempfile.mkdtemp(prefix="pa-bench-memory-"))
    runtime = await ActionRuntime.create(
        load_policy_text(POLICY),
        authorizer=AllowAll(),
        actions=[book_table],
        ledger_url=f"sqlite:///{folder / 'ledger.db'}",
    )
    sessions = args.ops // args.per_session
    checkpoints = sorted({sessions * k // 20 for k in (2, 5, 10, 15, 20)})
    rows: list[tuple[int, float, int, int]] = []
    started = time.perf_counter()
    try:
        queue: asyncio.Queue[int] = asyncio.Queue()
        done = 0

        async def worker() -> None:
            nonlocal done
            while True:
                index = await queue.get()
                await conversation(runtime, index, args.per_session)
                done += 1
                queue.task_done()

        workers = [asyncio.create_task(worker()) for _ in range(args.concurrency)]
        previous = 0
        for checkpoint in checkpoints:
            for index in range(previous, checkpoint):
                queue.put_nowait(index)
            await queue.join()
            previous = checkpoint
            await runtime.flush()
            ops = checkpoint * args.per_session
            rows.append((ops, rss_mb(), len(runtime._operations), tracked_alive()))
            print(
                f"{ops:>8} operations  RSS {rows[-1][1]:7.1f} MB  "
                f"held in memory {rows[-1][2]:>5}  Tracked alive {rows[-1][3]:>5}  "
                f"({time.perf_counter() - started:.0f} s)",
                flush=True,
            )
        for task in workers:
            task.cancel()
    finally:
        await runtime.close()
    first, last = rows[0], rows[-1]
    middle = min(rows, key=lambda r: abs(r[0] - last[0] / 2))
    per_10k_first = (middle[1] - first[1]) / max(1, (middle[0] - first[0])) * 10_000
    per_10k_second = (last[1] - middle[1]) / max(1, (last[0] - middle[0])) * 10_000
    print()
    print(f"RSS end / RSS at {first[0]} operations: {last[1] / first[1]:.3f}")
    print(
        f"RSS growth per 10,000 operations: first half {per_10k_first:+.2f} MB, "
        f"second half {per_10k_second:+.2f} MB"
    )
    print(f"operations held in memory at the end: {last[2]}; Tracked alive: {last[3]}")


if __name__ == "__main__":
    asyncio.run(main())
