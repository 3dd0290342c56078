"""Child process of the cross-process dedup test: 250 concurrent calls of one intent.

Usage: python _dedup_child.py LEDGER_URL EFFECTS_FILE CALLS
Prints "ready", waits for a line on stdin, makes the calls at once, prints one JSON list of
(operation_id, status, result) and exits.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import sys
from pathlib import Path
from typing import Any

from loguru import logger

from pipecat_actions import ActionContext, ActionRuntime, AllowAll, SessionState, action
from pipecat_actions.policy import load_policy_text

POLICY = """
version: 1
tools:
  book_table:
    kind: mutation
    on_duplicate: join
    idempotency: {scope: tenant}
    deadline_secs: 60
"""


async def main(url: str, effects: Path, calls: int) -> None:
    logger.remove()

    @action
    async def book_table(ctx: ActionContext, time: str) -> dict[str, Any]:
        """Book a table; every real booking is one line in the shared effects file."""
        await asyncio.sleep(0.5)  # long enough for every other caller to arrive meanwhile
        with effects.open("a") as f:
            fcntl.flock(f, fcntl.LOCK_EX)
            f.write(ctx.idempotency_key + "\n")
        return {"booking_id": "bk_1", "time": time}

    runtime = await ActionRuntime.create(
        load_policy_text(POLICY), authorizer=AllowAll(), actions=[book_table], ledger_url=url
    )
    print("ready", flush=True)
    sys.stdin.readline()
    sessions = [SessionState(session_id=f"s{i}", principal=f"p{i}") for i in range(calls)]
    results = await asyncio.gather(
        *(runtime.propose("book_table", {"time": "21:00"}, s) for s in sessions),
        return_exceptions=True,
    )
    await runtime.close()
    print(
        json.dumps(
            [
                [r.get("operation_id"), r.get("status"), r.get("result")]
                if isinstance(r, dict)
                else ["error", type(r).__name__, str(r)]
                for r in results
            ]
        ),
        flush=True,
    )


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])))
