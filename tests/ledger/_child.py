"""A child process for the multi-process ledger tests. Speaks JSON lines on stdout.

Usage::

    _child.py admit-same-key URL KEY TASKS    ready, wait for "go", TASKS concurrent admits
    _child.py claim URL OWNER LIMIT           ready, wait for "go", claim_stale until none left
    _child.py write-forever URL WORKERS       admit and transition in a loop until killed

Every child opens the ledger first and prints ``{"event": "ready"}``; the barrier children then
block on a line on stdin, so the parent can release them all at the same moment. A line is only
printed after the ledger call it reports has returned. A child exits by itself when its stdin
closes (its parent is gone or let go of it), before "go" or, for ``write-forever``, at any time,
so an orphan never lingers; nothing in a child depends on how long anything takes.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import uuid
from typing import Any

from loguru import logger

from pipecat_actions.ledger import LedgerSettings, NewOperation, SqlLedger
from pipecat_actions.status import ActionStatus

# Four processes share one PostgreSQL server (max_connections 100) with other test runs: a
# small pool keeps them under it; the tests are about correctness, not throughput.
_SETTINGS = LedgerSettings(pool_size=4, max_overflow=4)
ARGS = {"restaurant": "Chez Test", "time": "21:00", "party": 2}


def say(**message: Any) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def wait_for_go() -> bool:
    return sys.stdin.readline().strip() == "go"


def new_op(key: str, **overrides: Any) -> NewOperation:
    fields: dict[str, Any] = {
        "tool": "book_table",
        "kind": "mutation",
        "args": ARGS,
        "idempotency_key": key,
        "session_id": f"session-{os.getpid()}",
        "principal": "user:alice",
    }
    fields.update(overrides)
    return NewOperation(**fields)


async def admit_same_key(url: str, key: str, tasks: int) -> None:
    async with await SqlLedger.create(url, settings=_SETTINGS) as ledger:
        say(event="ready", pid=os.getpid())
        if not wait_for_go():
            return
        results = await asyncio.gather(
            *(ledger.admit(new_op(key)) for _ in range(tasks)), return_exceptions=True
        )
        ids = [r.operation.operation_id for r in results if not isinstance(r, BaseException)]
        created = sum(1 for r in results if not isinstance(r, BaseException) and r.created)
        errors = [f"{type(r).__name__}: {r}" for r in results if isinstance(r, BaseException)]
        say(event="done", ids=ids, created=created, errors=errors)


async def claim(url: str, owner: str, limit: int) -> None:
    async with await SqlLedger.create(url, settings=_SETTINGS) as ledger:
        say(event="ready", pid=os.getpid())
        if not wait_for_go():
            return
        claimed: list[tuple[str, int]] = []
        rounds = 0
        while True:
            batch = await ledger.claim_stale(owner, lease_secs=600, limit=limit)
            if not batch:
                break
            rounds += 1
            claimed.extend((op.operation_id, op.fence) for op in batch)
        say(event="done", claimed=claimed, rounds=rounds)


def exit_when_stdin_closes() -> None:
    """Exit at once when stdin reaches its end: the parent is gone (or let go of this child)."""

    def watch() -> None:
        sys.stdin.read()
        os._exit(0)

    threading.Thread(target=watch, name="stdin-watch", daemon=True).start()


async def write_forever(url: str, workers: int) -> None:
    exit_when_stdin_closes()
    async with await SqlLedger.create(url, settings=_SETTINGS) as ledger:
        say(event="ready", pid=os.getpid())

        async def worker(number: int) -> None:
            while True:
                key = f"crash-{os.getpid()}-{number}-{uuid.uuid4().hex}"
                op = (await ledger.admit(new_op(key))).operation
                say(event="wrote", op=op.operation_id, seq=op.event_seq, status=op.status)
                op = await ledger.transition(
                    op.operation_id,
                    expected=ActionStatus.ADMITTED,
                    to=ActionStatus.RUNNING,
                    fence=op.fence,
                    actor="child",
                )
                say(event="wrote", op=op.operation_id, seq=op.event_seq, status=op.status)
                op = await ledger.annotate(
                    op.operation_id, actor="child", detail={"note": "sent"}, changes={}
                )
                say(event="wrote", op=op.operation_id, seq=op.event_seq, status=op.status)
                op = await ledger.transition(
                    op.operation_id,
                    expected=ActionStatus.RUNNING,
                    to=ActionStatus.COMMITTED,
                    fence=op.fence,
                    actor="child",
                    changes={"result": {"confirmation": op.operation_id}},
                )
                say(event="wrote", op=op.operation_id, seq=op.event_seq, status=op.status)

        await asyncio.gather(*(worker(n) for n in range(workers)))


def main(argv: list[str]) -> None:
    logger.remove()
    mode, url, *rest = argv
    if mode == "admit-same-key":
        asyncio.run(admit_same_key(url, rest[0], int(rest[1])))
    elif mode == "claim":
        asyncio.run(claim(url, rest[0], int(rest[1])))
    elif mode == "write-forever":
        asyncio.run(write_forever(url, int(rest[0])))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
