"""A PostgreSQL ledger opens no more connections than its budget, ``LedgerSettings.pool_size``.

Its hot path, SQLAlchemy's calls and the notices' batches share one set of connections: a
process holds at most ``pool_size`` of them for its calls, plus its runtime's life lock. Many
processes on one server (issue 34: 8 of them) used to hold 10 each, and the server refused
the rest. With a budget of one connection, concurrent calls wait their turn and all finish;
when the server refuses a connection, every call that needed one hears a clean refusal, none is
left waiting, and the next calls go through once the server takes connections again.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import asyncpg
import pytest

from pipecat_actions.actions import ActionContext, action
from pipecat_actions.admission.authorization import AllowAll
from pipecat_actions.clock import ManualClock
from pipecat_actions.ledger import SqlLedger
from pipecat_actions.ledger.engine import LedgerSettings
from pipecat_actions.ledger.records import Operation, OperationFilter
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.session import SessionState
from pipecat_actions.status import TERMINAL_STATUSES, ActionStatus
from tests._waiting import guarded
from tests.ledger._support import new_op
from tests.runtime._execution_support import policy

S = ActionStatus
pytestmark = pytest.mark.postgres

BOOKING = """
    version: 1
    tools:
      book_table:
        kind: mutation
        on_duplicate: allow
        deadline_secs: 60
"""

CALLS = 12


class Connections:
    """Every PostgreSQL connection opened in the test, the most open at once; a refusal switch."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.open: list[asyncpg.Connection] = []
        self.most = 0
        self.refuse = False
        self.refused = 0
        real = asyncpg.connect

        async def connect(*args: Any, **kwargs: Any) -> asyncpg.Connection:
            if self.refuse:
                self.refused += 1
                # What the server says when every connection slot is taken.
                raise asyncpg.TooManyConnectionsError("sorry, too many clients already")
            conn = await real(*args, **kwargs)
            self.open = [c for c in self.open if not c.is_closed()] + [conn]
            self.most = max(self.most, len(self.open))
            return conn

        # The ledger's hot path, SQLAlchemy's dialect, the notifier, the listener and the life
        # lock all open theirs through `asyncpg.connect`.
        monkeypatch.setattr(asyncpg, "connect", connect)

    def now(self) -> int:
        return sum(not c.is_closed() for c in self.open)


def booker() -> tuple[Any, Counter[str]]:
    ran: Counter[str] = Counter()

    @action
    async def book_table(ctx: ActionContext, n: int) -> dict[str, Any]:
        """Book a table."""
        ran[ctx.idempotency_key] += 1
        return {"booking_id": f"bk_{n}"}

    return book_table, ran


@pytest.mark.parametrize("pool_size", [1, 3])
async def test_a_ledger_opens_no_more_connections_than_its_pool_size_for_every_kind_of_call(
    pg_fresh_url: str, monkeypatch: pytest.MonkeyPatch, pool_size: int
) -> None:
    clock = ManualClock()
    settings = LedgerSettings(pool_size=pool_size)
    seen = Connections(monkeypatch)
    async with await SqlLedger.create(pg_fresh_url, clock=clock, settings=settings) as ledger:
        admitted = await asyncio.gather(*(ledger.admit(new_op(f"k{n}")) for n in range(20)))
        ops = [a.operation for a in admitted]

        async def settle(op: Operation) -> None:
            running = await ledger.transition(
                op.operation_id, expected=op.status, to=S.RUNNING, fence=op.fence, actor="rt"
            )
            await ledger.transition(
                op.operation_id, expected=S.RUNNING, to=S.COMMITTED, fence=op.fence, actor="rt"
            )
            assert running.attempt == 1

        # Hot-path writes (each settle queues a notice, sent in batches) beside SQLAlchemy's
        # reads, all at once.
        await asyncio.gather(
            *(settle(op) for op in ops),
            *(ledger.list(OperationFilter(limit=5)) for _ in range(10)),
            *(ledger.events(op.operation_id) for op in ops[:10]),
        )
        listed = await ledger.list(OperationFilter(limit=100))

    assert {op.status for op in listed} == {S.COMMITTED}
    assert len(listed) == 20
    assert 1 <= seen.most <= pool_size, seen.most


async def test_concurrent_calls_on_a_budget_of_one_connection_all_finish_and_a_refusal_is_clean(
    pg_fresh_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = ManualClock()
    seen = Connections(monkeypatch)
    ledger = await SqlLedger.create(pg_fresh_url, clock=clock, settings=LedgerSettings(pool_size=1))
    book_table, ran = booker()
    runtime = await ActionRuntime.create(
        policy(BOOKING), authorizer=AllowAll(), actions=[book_table], ledger=ledger, clock=clock
    )
    sessions = [SessionState(session_id=f"s{i}", principal=f"p{i}") for i in range(CALLS)]
    try:
        calls = [
            runtime.propose("book_table", {"n": i}, s, tool_call_id=f"c{i}")
            for i, s in enumerate(sessions)
        ]
        # The clock never moves: each call waits only for its turns on the one connection.
        answered = await guarded(asyncio.gather(*calls), what="every call on one connection")
        await runtime.flush()
        most_while_running = seen.most

        # The server takes no more connections, and the ledger's one connection is gone.
        seen.refuse = True
        for conn in seen.open:
            conn.terminate()
        ledger._fast._drop_idle()
        refused = await guarded(
            asyncio.gather(
                *(
                    runtime.propose("book_table", {"n": 100 + i}, s, tool_call_id=f"r{i}")
                    for i, s in enumerate(sessions[:4])
                )
            ),
            what="every call while the server refuses connections",
        )
        seen.refuse = False
        again = await guarded(
            runtime.propose("book_table", {"n": 200}, sessions[0], tool_call_id="again"),
            what="a call once the server takes connections again",
        )
        await runtime.flush()
        operations = await ledger.list(OperationFilter(limit=100))
    finally:
        await runtime.close()
        await ledger.close()

    assert [a["status"] for a in answered] == ["committed"] * CALLS
    # One connection for the calls, one for the runtime's life lock: nothing else.
    assert most_while_running <= 2, most_while_running
    assert [r["status"] for r in refused] == ["refused"] * 4
    assert {r["reason"] for r in refused} == {"ledger_unavailable"}
    assert seen.refused >= 4
    assert again["status"] == "committed"
    assert sum(ran.values()) == CALLS + 1  # nothing refused ran
    assert all(op.status in TERMINAL_STATUSES for op in operations)
    assert len(operations) == CALLS + 1
