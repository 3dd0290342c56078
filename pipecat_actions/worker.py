"""``pipecat-actions worker``: an owner for the operations of bot processes that are gone.

Where bot processes come and go (one per call, as on Pipecat Cloud), nothing is left running to
finish what a dead call started: its booking may be RUNNING with a lost answer, approved but not
sent, or waiting for a person past its window. The worker is an `ActionRuntime` with no pipeline
on the shared ledger: every lease heartbeat it claims the operations whose owner's lease ran out
and finishes them as any runtime's recovery does (reconciliation of what may have been sent,
deadlines, approval expiry, approved work run once); its own operations keep a lease while it
lives, so a second worker or a bot takes them over if it dies.

What it finishes is left *untold*: the next pipeline of the same session tells it (the result
gate takes over a session's untold operations when it starts), and ``pipecat-actions
undelivered`` lists what no conversation has heard.

The worker needs the application's code (its effects and ``reconcile`` hooks, bound to the real
system of record): ``--app MODULE:ATTR`` names an `OperatorApp`, as for ``reconcile``. Without an
authorizer in it, operations that were admitted but never sent are failed rather than sent
(``recover_unsent: fail``): sending them needs the application's say.
"""

from __future__ import annotations

__all__ = ["run_worker"]

import asyncio
import os
import socket
from typing import TextIO

from loguru import logger

from pipecat_actions.admission.authorization import AllowAll
from pipecat_actions.clock import Clock
from pipecat_actions.ledger import OperationFilter
from pipecat_actions.operator import OperatorApp
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.status import AWAITING_PERSON_STATUSES


async def run_worker(
    app: OperatorApp,
    *,
    ledger_url: str | None,
    stop: asyncio.Event,
    out: TextIO,
    owner: str | None = None,
    lease_secs: float = 30.0,
    once: bool = False,
    clock: Clock | None = None,
) -> int:
    """Own the stale operations of the ledger at ``ledger_url`` until ``stop`` is set.

    Args:
        app: The application's policy, actions and authorizer.
        ledger_url: The shared ledger.
        stop: Set to stop (SIGTERM, SIGINT); what is still running is left to recovery.
        out: Where the worker says what it claimed.
        owner: Its name in leases (default ``worker:<host>:<pid>``).
        lease_secs: Its lease; it claims at every third of it.
        once: Claim what is stale now, wait for what it claimed to finish (not for people),
            then stop: for a scheduled job instead of a service.
        clock: The time source (tests).

    Returns:
        The exit status (0).
    """
    runtime = await ActionRuntime.create(
        app.policy,
        authorizer=app.authorizer or AllowAll(),
        actions=app.actions,
        routed=app.routed,
        ledger_url=ledger_url,
        clock=clock,
        owner=owner or f"worker:{socket.gethostname()}:{os.getpid()}",
        lease_secs=lease_secs,
        recover=True,
        recover_unsent="run" if app.authorizer is not None else "fail",
    )
    try:
        claimed = await runtime.recover()  # already done once by create; anything left since
        where = getattr(runtime.ledger, "url", ledger_url)
        print(
            f"worker {runtime.owner} on {where}: claims stale operations every "
            f"{lease_secs / 3:g} s"
            + (" (recover_unsent: fail, no authorizer)" if app.authorizer is None else ""),
            file=out,
            flush=True,
        )
        if once:
            await _finish(runtime, [op.operation_id for op in claimed])
            return 0
        await stop.wait()
        return 0
    finally:
        await runtime.close()


async def _finish(runtime: ActionRuntime, claimed_now: list[str]) -> None:
    """Wait for every operation this worker owns to leave its hands (people aside)."""
    mine = [
        op
        for op in await runtime.ledger.list(OperationFilter(lease_owner=runtime.owner))
        if op.status not in AWAITING_PERSON_STATUSES
    ]
    ids = {op.operation_id for op in mine} | set(claimed_now)
    for operation_id in sorted(ids):
        final = await runtime.wait(operation_id)
        logger.bind(operation_id=operation_id).info(
            "worker: {} {} is {}", final.tool, operation_id, final.status.value
        )
