"""Memory stays flat: nothing about a finished operation stays in the runtime (issue 12, B10).

Before, every operation's `Tracked` record stayed in the registry for the life of the process
(30,697 after 100 sessions for 60 s); per-principal and per-session counters and the watchdog's
heap kept an entry per principal, per session and per operation. `bench/memory.py` shows the
RSS over 100,000 operations; this test pins the mechanism with a few thousand.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

from pipecat_actions.actions import ActionContext, action
from pipecat_actions.clock import ManualClock
from pipecat_actions.execution.tracked import Tracked
from pipecat_actions.session import SessionState
from tests.runtime._execution_support import running

POLICY = """
    version: 1
    tools:
      book_table:
        kind: mutation
        deadline_secs: 600
        limits: {per_principal: 2}
"""
CALLS = 1_500


@action(name="book_table", description="Book a table.")
async def book_table(ctx: ActionContext, slot: int) -> dict[str, Any]:
    """Book a table at once."""
    return {"booking_id": f"bk_{slot}"}


async def test_nothing_of_a_finished_operation_stays_in_memory(
    ledger_url: str, clock: ManualClock
) -> None:
    async with running(POLICY, [book_table], ledger_url=ledger_url, clock=clock) as runtime:
        gate = asyncio.Semaphore(25)

        async def conversation(n: int) -> None:
            async with gate:
                session = SessionState(session_id=f"call-{n}", principal=f"user-{n}")
                heard: list[Any] = []
                runtime.listen(session.session_id, heard.append)
                told = await runtime.propose(
                    "book_table", {"slot": n}, session, tool_call_id=f"call_{n}"
                )
                runtime.unlisten(session.session_id, heard.append)
                assert told["status"] == "committed"

        await asyncio.gather(*(conversation(n) for n in range(CALLS)))
        await runtime.flush()

        assert len(runtime._operations) == 0
        gc.collect()
        assert [o for o in gc.get_objects() if isinstance(o, Tracked)] == []
        assert runtime._operations._listeners == {}
        assert dict(runtime.limiter._tools["book_table"].per_principal) == {}
        assert runtime.watchdog.pending == 0
        # Disarmed deadlines leave the heap lazily, and it is rebuilt before they pile up.
        assert len(runtime.watchdog._heap) <= 1_025
