"""Calls that join an operation already admitted: their audit notes, and their wait for it.

A burst of duplicate calls (the model repeating itself, several processes serving one intent)
must cost the ledger a few calls, not one or more per duplicate:

* `JoinNotes` records the joins in batches, a note per operation per batch, after the calls
  are answered. A note is best effort: one that cannot be written is logged; it never fails
  the call it describes, which has already joined.
* `SharedWaits` lets every call of this process that waits for an operation another process
  runs share one waiter, woken by the ledger's notice when the operation settles
  (`Ledger.notices`: PostgreSQL ``LISTEN/NOTIFY``), and re-reading on a slow pause in case a
  notice is lost; a ledger that cannot notify is polled on a growing pause.
"""

from __future__ import annotations

__all__ = ["JOINS_PER_NOTE", "NOTICED_PAUSE_SECS", "JoinNotes", "SharedWaits", "nap"]

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from loguru import logger

from pipecat_actions.clock import Clock, sleep_from_now
from pipecat_actions.errors import LedgerError
from pipecat_actions.ledger import Ledger, Operation
from pipecat_actions.ledger.records import DUPLICATES_JOINED
from pipecat_actions.status import AWAITING_PERSON_STATUSES, IN_FLIGHT_STATUSES

JOINS_PER_NOTE = 100
"""The most joins one audit note lists (a bound on the size of one event's detail)."""
NOTICED_PAUSE_SECS = 1.0
"""How often a waiter that gets the ledger's notices re-reads anyway (a notice may be lost)."""


async def nap(clock: Clock, secs: float, changed: asyncio.Event | None) -> None:
    """Wait ``secs`` of ``clock``, or until ``changed`` is set; clear ``changed`` after."""
    if changed is None:
        await clock.sleep(secs)
        return
    if not changed.is_set():
        sleeper = asyncio.ensure_future(sleep_from_now(clock, secs))
        noticed = asyncio.ensure_future(changed.wait())
        try:
            await asyncio.wait({sleeper, noticed}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            sleeper.cancel()
            noticed.cancel()
    changed.clear()


Spawn = Callable[[Coroutine[Any, Any, Any]], "asyncio.Task[Any]"]


class JoinNotes:
    """The audit notes of calls that joined an operation, written in batches.

    Args:
        ledger: Where the notes go.
        actor: Who writes them (the runtime).
        spawn: Starts the runtime's background tasks (so that closing waits for them).
    """

    def __init__(self, ledger: Ledger, *, actor: str, spawn: Spawn) -> None:
        self._ledger = ledger
        self._actor = actor
        self._spawn = spawn
        self._pending: dict[str, list[dict[str, Any]]] = {}
        self._writer: asyncio.Task[Any] | None = None

    def note(
        self, operation_id: str, *, tool_call_id: str | None, turn_id: str, session_id: str
    ) -> None:
        """Record that a call joined ``operation_id``; written soon, with the others."""
        self._pending.setdefault(operation_id, []).append(
            {"tool_call_id": tool_call_id, "turn_id": turn_id, "session_id": session_id}
        )
        if self._writer is None or self._writer.done():
            self._writer = self._spawn(self._write_all())

    async def flush(self) -> None:
        """Write every note recorded so far, and return once they are written (or logged)."""
        if self._writer is not None:
            await asyncio.wait({self._writer})  # waits without cancelling it
        await self._write_all()  # whatever was recorded meanwhile

    async def _write_all(self) -> None:
        # Joins recorded while a batch is being written go into the next batch.
        while self._pending:
            batch, self._pending = self._pending, {}
            notes = [
                (operation_id, joins[start : start + JOINS_PER_NOTE])
                for operation_id, joins in batch.items()
                for start in range(0, len(joins), JOINS_PER_NOTE)
            ]
            written = await asyncio.gather(
                *(
                    self._ledger.annotate(
                        op_id, actor=self._actor, detail={DUPLICATES_JOINED: joins}
                    )
                    for op_id, joins in notes
                ),
                return_exceptions=True,
            )
            for (op_id, joins), result in zip(notes, written, strict=True):
                if isinstance(result, BaseException):
                    logger.bind(operation_id=op_id).warning(
                        "{} joined call(s) of operation {} not audited: {}",
                        len(joins),
                        op_id,
                        result,
                    )


class SharedWaits:
    """Waits for operations that another process runs, one waiter per operation.

    Each waiter re-reads the operation until it leaves the in-flight statuses or its deadline
    has passed by a second; the ledger is the only place two processes share. It re-reads when
    the ledger notices the operation settled (and every `NOTICED_PAUSE_SECS` in case a notice
    is lost), or, on a ledger that cannot notify, on a growing pause (50 ms to 1 s of the
    clock). A read that fails is retried at the next pause, so a struggling ledger makes the
    waiters wait longer, never fail; past the deadline they get the operation as last read (an
    in-flight status, told as "the outcome will follow").

    Args:
        ledger: Where the operations are read.
        clock: The runtime's clock.
        spawn: Starts the runtime's background tasks.
    """

    def __init__(self, ledger: Ledger, clock: Clock, *, spawn: Spawn) -> None:
        self._ledger = ledger
        self._clock = clock
        self._spawn = spawn
        self._polls: dict[str, asyncio.Task[Operation]] = {}
        self._waiting = 0

    @property
    def pollers(self) -> int:
        """How many operations are being polled now."""
        return len(self._polls)

    @property
    def waiting(self) -> int:
        """How many callers are waiting now, over every poller."""
        return self._waiting

    async def wait(
        self,
        op: Operation,
        *,
        until_settled: bool = False,
        follow: Callable[[Operation], Awaitable[None]] | None = None,
    ) -> Operation:
        """Return ``op`` once it has an outcome (or its deadline is over); see the class.

        With ``until_settled``, the deadline is not waited out here: a durable operation's
        worker settles it (its deadline too), and its outcome is what is waited for, through
        a wait for a person's decision too. ``follow`` is awaited with the operation after
        each read that finds it still waiting (its progress, `Progress.follower`); given by
        the first waiter of an operation only.
        """
        poll = self._polls.get(op.operation_id)
        if poll is None:
            poll = self._spawn(self._poll(op, until_settled=until_settled, follow=follow))
            self._polls[op.operation_id] = poll
            poll.add_done_callback(lambda _: self._polls.pop(op.operation_id, None))
        self._waiting += 1
        try:
            return await asyncio.shield(poll)
        finally:
            self._waiting -= 1

    async def _poll(
        self,
        op: Operation,
        *,
        until_settled: bool = False,
        follow: Callable[[Operation], Awaitable[None]] | None = None,
    ) -> Operation:
        failures = 0
        async with self._ledger.notices(op.operation_id) as changed:
            # Listening from here on: a first re-read at once sees an outcome that came before.
            pause = 0.0 if changed is not None else 0.05
            while op.status in IN_FLIGHT_STATUSES or (
                until_settled and op.status in AWAITING_PERSON_STATUSES
            ):
                if (
                    not until_settled
                    and op.deadline_at is not None
                    and self._clock.now() > op.deadline_at + 1.0
                ):
                    break
                await nap(self._clock, pause, changed)
                pause = NOTICED_PAUSE_SECS if changed is not None else min(pause * 2, 1.0)
                try:
                    op = await self._ledger.get(op.operation_id)
                except LedgerError as exc:
                    failures += 1
                    if failures == 1:
                        logger.bind(operation_id=op.operation_id).warning(
                            "waiting for operation {}: the ledger failed ({}); still waiting",
                            op.operation_id,
                            exc,
                        )
                    continue
                if follow is not None and op.status in IN_FLIGHT_STATUSES:
                    await follow(op)
        return op
