"""``pipecat-actions worker``: an owner for the operations of bot processes that are gone.

Where bot processes come and go (one per call, as on Pipecat Cloud), nothing is left running to
finish what a dead call started: its booking may be RUNNING with a lost answer, approved but not
sent, or waiting for a person past its window. The worker is an `ActionRuntime` with no pipeline
on the shared ledger: every lease heartbeat it claims the operations whose owner's lease ran out
and finishes them as any runtime's recovery does (reconciliation of what may have been sent,
deadlines, approval expiry, approved work run once); its own operations keep a lease while it
lives, so a second worker or a bot takes them over if it dies.

It says what it does. For each operation it claims, one line once it is finished: its id, its
tool, the status it was claimed in and how it ended (``claimed op_… book_table in RUNNING:
COMMITTED``); one taken while it waits for a person says so when it is claimed, and again when
the person (or its deadline) ends it. ``--once`` ends after one pass with a summary; ``--json``
prints the same as JSON lines (``started``, ``operation``, ``summary``). The exit status of a
pass: 0 when every operation it claimed is finished or waits for a person, `LEFT_UNFINISHED`
(3) when it left some that need someone (UNKNOWN after reconciliation, a tool this
application does not run, a ledger failure), 1 when it could not run at all (one line on
stderr).

What it finishes is left *untold*: the next pipeline of the same session tells it (the result
gate takes over a session's untold operations when it starts), and ``pipecat-actions
undelivered`` lists what no conversation has heard.

The worker needs the application's code (its effects and ``reconcile`` hooks, bound to the real
system of record): ``--app MODULE:ATTR`` names an `OperatorApp`, as for ``reconcile``. Without an
authorizer in it, operations that were admitted but never sent are failed rather than sent
(``recover_unsent: fail``): sending them needs the application's say. It opens an existing
ledger only, as every command but ``db upgrade`` does.
"""

from __future__ import annotations

__all__ = ["LEFT_UNFINISHED", "run_worker"]

import asyncio
import builtins
import json
import os
import socket
import sys
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Any, Literal, TextIO

from pipecat_actions._operator_text import ledger_line, shown_url, when
from pipecat_actions._printable import printable
from pipecat_actions.admission.authorization import AllowAll
from pipecat_actions.clock import Clock, SystemClock
from pipecat_actions.errors import LedgerError
from pipecat_actions.ledger import ForwardingLedger, Ledger, LedgerSettings, Operation, SqlLedger
from pipecat_actions.operator import OperatorApp
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.status import AWAITING_PERSON_STATUSES, TERMINAL_STATUSES, ActionStatus

LEFT_UNFINISHED = 3
"""The exit status of a pass that left claimed operations needing someone."""

Outcome = Literal["finished", "waiting", "left", "running"]
"""How a claimed operation stands: finished (a final status), waiting for a person, left
unfinished (it needs someone), or still running when the worker stopped."""


class _ClaimWatch(ForwardingLedger):
    """The ledger as the worker's runtime sees it, reporting each operation it claims.

    The runtime's recovery claims stale operations a batch at a time and starts each one (it
    tracks it, so `ActionRuntime.wait` waits for its end) before it claims the next batch, in
    the same task. So a batch is handed to ``on_claimed`` when the task that claimed it claims
    again (the pass ends with a claim that finds nothing), or when `release` says so.
    """

    def __init__(self, inner: Ledger, on_claimed: Callable[[list[Operation]], None]) -> None:
        super().__init__(inner)
        self._on_claimed = on_claimed
        self._held: dict[asyncio.Task[Any] | None, list[Operation]] = {}

    async def claim_stale(
        self,
        owner: str,
        *,
        lease_secs: float,
        limit: int,
        except_ids: Collection[str] = (),
        gone: Collection[str] = (),
    ) -> builtins.list[Operation]:
        """See `Ledger.claim_stale`."""
        task = asyncio.current_task()
        self.release(task)
        claimed = await super().claim_stale(
            owner, lease_secs=lease_secs, limit=limit, except_ids=except_ids, gone=gone
        )
        if claimed:
            self._held[task] = claimed
        return claimed

    def release(self, task: asyncio.Task[Any] | None) -> None:
        """Hand over what ``task`` claimed last: its recovery has started each of them."""
        held = self._held.pop(task, None)
        if held:
            self._on_claimed(held)


@dataclass
class _Report:
    """What the worker prints, as text or JSON lines, and the tally of its claims."""

    out: TextIO
    as_json: bool
    app: OperatorApp
    outcomes: dict[str, Outcome] = field(default_factory=dict)
    finished: Counter[str] = field(default_factory=Counter)

    def started(self, *, owner: str, url: str, lease_secs: float, once: bool) -> None:
        """Say which ledger the worker owns work of, under which name, and how it claims."""
        unsent = "run" if self.app.authorizer is not None else "fail"
        if self.as_json:
            self._json(
                event="started",
                worker=owner,
                ledger=shown_url(url),
                lease_secs=lease_secs,
                claims_every_secs=lease_secs / 3,
                once=once,
                recover_unsent=unsent,
            )
            return
        how = "once, then exits" if once else f"every {lease_secs / 3:g} s"
        self._say(ledger_line(url))
        self._say(
            f"worker {printable(owner)} claims stale operations {how} (lease {lease_secs:g} s)"
            + ("; recover_unsent: fail, no authorizer" if unsent == "fail" else "")
        )

    def claimed(self, op: Operation) -> None:
        """Count ``op`` as claimed; say so now if it waits for a person."""
        if op.status not in AWAITING_PERSON_STATUSES:
            self.outcomes[op.operation_id] = "running"
            return
        self.outcomes[op.operation_id] = "waiting"
        until = f" until {when(op.deadline_at)}" if op.deadline_at is not None else ""
        self._operation(op, op, "waiting", f"waiting for a person{until}")

    def unread(self, claimed: Operation, exc: Exception) -> None:
        """Say that how ``claimed`` ended could not be read (the ledger failed)."""
        self.outcomes[claimed.operation_id] = "left"
        self._operation(claimed, claimed, "left", f"its end could not be read: {exc}")

    def ended(self, claimed: Operation, final: Operation) -> None:
        """Say how ``claimed`` stands now that the worker's recovery of it returned."""
        status = final.status
        if status in TERMINAL_STATUSES:
            outcome: Outcome = "finished"
            said = status.value + (f" ({final.error})" if final.error else "")
            self.finished[status.value] += 1
        elif status in AWAITING_PERSON_STATUSES:
            outcome = "waiting"
            said = f"{status.value}, waiting for a person"
        elif status is ActionStatus.UNKNOWN:
            outcome = "left"
            said = (
                "still UNKNOWN: its reconcile hook did not settle it"
                + (" (escalated)" if final.escalated_at is not None else "")
                + f"; ask again with `pipecat-actions reconcile {final.operation_id}`"
            )
        else:
            outcome = "left"
            said = f"left {status.value}: {self._why_left(final)}"
        self.outcomes[claimed.operation_id] = outcome
        self._operation(claimed, final, outcome, said)

    def _why_left(self, op: Operation) -> str:
        if op.compensates is None and op.tool not in {a.name for a in self.app.actions}:
            return (
                "its tool is not among the application's actions (--app): left for a "
                "process that has it"
            )
        return (
            "not finished here (the warning on stderr says why); it is claimed again once "
            "its lease runs out"
        )

    def _operation(self, claimed: Operation, now: Operation, outcome: Outcome, said: str) -> None:
        if self.as_json:
            self._json(
                event="operation",
                operation_id=claimed.operation_id,
                tool=claimed.tool,
                claimed_in=claimed.status.value,
                status=now.status.value,
                outcome=outcome,
                error=now.error,
                escalated=now.escalated_at is not None,
            )
            return
        self._say(
            f"claimed {printable(claimed.operation_id)} {printable(claimed.tool)} in "
            f"{claimed.status.value}: {printable(said)}"
        )

    def summary(self, *, once: bool) -> int:
        """Print the tally; return the exit status it makes."""
        tally = Counter(self.outcomes.values())
        running = tally["running"]
        status = LEFT_UNFINISHED if tally["left"] else 0
        if self.as_json:
            self._json(
                event="summary",
                claimed=len(self.outcomes),
                finished=dict(sorted(self.finished.items())),
                waiting=tally["waiting"],
                left=tally["left"],
                running=running,
                exit_status=status,
            )
            return status
        head = "one pass" if once else "stopped"
        if not self.outcomes:
            self._say(f"{head}: nothing was stale")
            return status
        finished = ", ".join(f"{n} {s}" for s, n in sorted(self.finished.items()))
        parts = [f"{tally['finished']} finished" + (f" ({finished})" if finished else "")]
        parts.append(f"{tally['waiting']} waiting for a person")
        parts.append(f"{tally['left']} left unfinished")
        if running:
            parts.append(f"{running} still running, left to the next owner")
        self._say(f"{head}: {len(self.outcomes)} claimed: " + ", ".join(parts))
        return status

    def _say(self, line: str) -> None:
        print(line, file=self.out, flush=True)

    def _json(self, **data: Any) -> None:
        print(json.dumps(data), file=self.out, flush=True)


async def run_worker(
    app: OperatorApp,
    *,
    ledger_url: str | None,
    stop: asyncio.Event,
    out: TextIO,
    owner: str | None = None,
    lease_secs: float = 30.0,
    once: bool = False,
    as_json: bool = False,
    err: TextIO | None = None,
    clock: Clock | None = None,
    pool_size: int | None = None,
) -> int:
    """Own the stale operations of the ledger at ``ledger_url`` until ``stop`` is set.

    Args:
        app: The application's policy, actions and authorizer.
        ledger_url: The shared ledger; it must exist (`SqlLedger.create` ``must_exist``).
        stop: Set to stop (SIGTERM, SIGINT); what is still running is left to recovery.
        out: Where the worker says what it claimed and how each one ended.
        owner: Its name in leases (default ``worker:<host>:<pid>``).
        lease_secs: Its lease; it claims at every third of it.
        once: Claim what is stale now, wait for what it claimed to finish (not for people),
            print a summary and stop: for a scheduled job instead of a service.
        as_json: Print JSON lines instead of text (the ``ledger:`` line goes to ``err``).
        err: Where the ``ledger:`` line goes with ``as_json`` (default stderr).
        clock: The time source (tests).
        pool_size: Its ledger's connection budget (`LedgerSettings.pool_size`; default 5):
            on PostgreSQL the worker then holds at most ``pool_size + 2`` connections.

    Returns:
        The exit status: 0, or `LEFT_UNFINISHED` when a claimed operation was left needing
        someone.

    Raises:
        LedgerError: The ledger cannot be opened (there is none, it is not one, it cannot be
            reached).
    """
    clock = clock or SystemClock()
    report = _Report(out=out, as_json=as_json, app=app)
    runtime: ActionRuntime | None = None
    early: list[Operation] = []
    following: set[asyncio.Task[None]] = set()

    async def follow(claimed: Operation) -> None:
        assert runtime is not None
        try:
            final = await runtime.wait(claimed.operation_id)
        except LedgerError as exc:
            report.unread(claimed, exc)
        else:
            report.ended(claimed, final)

    def on_claimed(batch: list[Operation]) -> None:
        if runtime is None:  # claimed while the runtime starts: said once it has started
            early.extend(batch)
            return
        for op in batch:
            report.claimed(op)
            if once and op.status in AWAITING_PERSON_STATUSES:
                continue  # a pass does not wait for people
            task = asyncio.get_running_loop().create_task(follow(op))
            following.add(task)
            task.add_done_callback(following.discard)

    settings = None if pool_size is None else LedgerSettings(pool_size=pool_size)
    opened = await SqlLedger.create(ledger_url, clock=clock, must_exist=True, settings=settings)
    watch = _ClaimWatch(opened, on_claimed)
    name = owner or f"worker:{socket.gethostname()}:{os.getpid()}"
    try:
        runtime = await ActionRuntime.create(
            app.policy,
            authorizer=app.authorizer or AllowAll(),
            actions=app.actions,
            routed=app.routed,
            ledger=watch,
            clock=clock,
            owner=name,
            lease_secs=lease_secs,
            recover=True,  # claims once now, then at every heartbeat
            recover_unsent="run" if app.authorizer is not None else "fail",
            # It finishes what bots left; a durable operation is DBOS's (its lease never ends).
            admits_calls=False,
        )
        try:
            if as_json:
                print(ledger_line(opened.url), file=err or sys.stderr, flush=True)
            report.started(owner=name, url=opened.url, lease_secs=lease_secs, once=once)
            on_claimed(early)
            if once:
                await runtime.recover()  # anything stale since the first claim
                watch.release(asyncio.current_task())
                await _until_followed(following, stop)
            else:
                await stop.wait()
            for task in list(following):
                task.cancel()
            await asyncio.gather(*following, return_exceptions=True)
            return report.summary(once=once)
        finally:
            await runtime.close()
    finally:
        await opened.close()


async def _until_followed(following: set[asyncio.Task[None]], stop: asyncio.Event) -> None:
    """Wait until every operation followed has ended (more may be claimed meanwhile), or stop."""
    stopping = asyncio.ensure_future(stop.wait())
    try:
        while not stop.is_set():
            pending = [task for task in following if not task.done()]
            if not pending:
                return
            await asyncio.wait([*pending, stopping], return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopping.cancel()
