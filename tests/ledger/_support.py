"""Helpers shared by the ledger tests: operation factories and child processes on a barrier."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import sqlite3
import sys
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import event

from pipecat_actions.clock import ManualClock
from pipecat_actions.ledger import NewOperation, SqlLedger, migrate
from pipecat_actions.ledger.records import Operation, OperationEvent
from pipecat_actions.status import ActionStatus

CHILD_SCRIPT = Path(__file__).with_name("_child.py")
CHILD_TIMEOUT_SECS = 60.0
"""Upper bound on any wait for a child's output; a healthy child answers within seconds."""

S = ActionStatus
T0 = ManualClock().now()  # where the `clock` fixture starts


def new_op(key: str = "key-1", **overrides: Any) -> NewOperation:
    """Return a `NewOperation` for a booking tool, with ``overrides`` applied."""
    fields: dict[str, Any] = {
        "tool": "book_table",
        "kind": "mutation",
        "args": {"restaurant": "Chez Test", "time": "21:00", "party": 2},
        "idempotency_key": key,
        "session_id": "session-1",
        "principal": "user:alice",
    }
    fields.update(overrides)
    return NewOperation(**fields)


def event_rows(trail: Sequence[OperationEvent]) -> list[tuple[Any, ...]]:
    """Project audit events onto what a test compares: (seq, kind, from, to, actor, detail)."""
    return [(e.seq, e.kind, e.from_status, e.to_status, e.actor, e.detail) for e in trail]


async def snapshot(ledger: SqlLedger, operation_id: str) -> tuple[Operation, list[OperationEvent]]:
    """Return the stored row and the audit trail of an operation, to compare before and after."""
    return await ledger.get(operation_id), await ledger.events(operation_id)


def assert_trail_is_contiguous(op: Operation, trail: Sequence[OperationEvent]) -> None:
    """Assert the events are numbered 1..event_seq without gaps and chain status to status."""
    assert [e.seq for e in trail] == list(range(1, op.event_seq + 1)), (op, trail)
    assert trail[0].from_status is ActionStatus.REQUESTED
    for before, after in itertools.pairwise(trail):
        assert after.from_status == before.to_status, (before, after)
    assert trail[-1].to_status == op.status


@dataclass
class Child:
    """A child process running `_child.py`, talking JSON lines on stdout."""

    process: asyncio.subprocess.Process
    stderr_path: Path

    def stderr(self) -> str:
        """Return what the child wrote on stderr so far (for failure messages)."""
        try:
            return self.stderr_path.read_text(errors="replace")[-4000:]
        except OSError:
            return "<no stderr>"

    async def read_line(self, timeout: float = CHILD_TIMEOUT_SECS) -> dict[str, Any] | None:
        """Return the next JSON line of the child, or None at end of output."""
        assert self.process.stdout is not None
        try:
            line = await asyncio.wait_for(self.process.stdout.readline(), timeout)
        except TimeoutError:
            raise AssertionError(
                f"child {self.process.pid} said nothing for {timeout} s; stderr:\n{self.stderr()}"
            ) from None
        if not line:
            return None
        decoded: dict[str, Any] = json.loads(line)
        return decoded

    async def expect(self, event: str) -> dict[str, Any]:
        """Read the next line and check that it is ``event``."""
        message = await self.read_line()
        assert message is not None and message.get("event") == event, (
            f"child {self.process.pid} sent {message!r} instead of {event!r}; "
            f"stderr:\n{self.stderr()}"
        )
        return message

    async def go(self) -> None:
        """Release the child from its barrier."""
        assert self.process.stdin is not None
        self.process.stdin.write(b"go\n")
        await self.process.stdin.drain()


@contextlib.asynccontextmanager
async def spawn_children(
    runs: Sequence[Sequence[str]], workdir: Path
) -> AsyncIterator[list[Child]]:
    """Start one `_child.py` per argument list; every child is killed and reaped on exit."""
    children: list[Child] = []
    try:
        for index, args in enumerate(runs):
            stderr_path = workdir / f"child-{index}.stderr"
            with stderr_path.open("wb") as stderr:
                process = await asyncio.create_subprocess_exec(
                    sys.executable,
                    str(CHILD_SCRIPT),
                    *args,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=stderr,
                )
            children.append(Child(process, stderr_path))
        yield children
    finally:
        for child in children:
            if child.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    child.process.kill()
        for child in children:
            await child.process.wait()


async def start_together(children: Sequence[Child]) -> None:
    """Wait until every child has opened its ledger, then release them all at once."""
    for child in children:
        await child.expect("ready")
    await asyncio.gather(*(child.go() for child in children))


def record_selects(
    ledger: SqlLedger, wanted: Callable[[str], bool] | None = None
) -> list[tuple[str, Any]]:
    """From now on, the SELECTs on operations ``ledger`` issues (or those ``wanted`` keeps)."""
    issued: list[tuple[str, Any]] = []

    def keep(statement: str) -> bool:
        if wanted is not None:
            return wanted(statement)
        return statement.lstrip().upper().startswith("SELECT") and "pa_operations" in statement

    def record(conn: Any, cursor: Any, statement: str, parameters: Any, *_: Any) -> None:
        if keep(statement):
            issued.append((statement, parameters))

    event.listen(ledger._engine.sync_engine, "before_cursor_execute", record)
    return issued


def sqlite_plans(path: Path | str, issued: Sequence[tuple[str, Any]]) -> list[str]:
    """SQLite's query plan of each statement, its steps joined by " | "."""
    with sqlite3.connect(path) as raw:
        return [
            " | ".join(step[3] for step in raw.execute(f"EXPLAIN QUERY PLAN {sql}", params))
            for sql, params in issued
        ]


async def alembic(url: str, verb: str, revision: str) -> None:
    """Run alembic's ``verb`` (``upgrade``, ``downgrade``) to ``revision`` on ``url``'s ledger."""
    await migrate.to_revision(url, revision, down=verb == "downgrade")
