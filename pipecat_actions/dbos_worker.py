"""``pipecat-actions worker --dbos``: a DBOS application that runs durable operations.

Each operation a bot admits with ``execution: durable`` is a DBOS workflow
(`WORKFLOW_NAME`, id `workflow_id_for` its operation) on its tool's queue. This process
registers that workflow and the queues of the policy, launches DBOS on the ledger's
PostgreSQL database (it creates DBOS's tables there the first time) and lets DBOS hand it
work: several workers on several hosts share the queues with no scheduler of ours, a queue's
``global_concurrency`` and ``rate_per_minute`` hold across all of them.

The workflow is one step, `ActionRuntime.run_handed`, run on this process's runtime (the
application's actions and ``reconcile`` hooks, no pipeline): the ledger decides what the step
does, so a step that DBOS runs again after a worker died never sends twice (what may have been
sent is reconciled with the system of record). A ledger that cannot be reached fails the step,
and DBOS tries it again with backoff. The workflow's result is the operation's final status.

Give each worker a stable executor id (``--executor-id`` or ``DBOS__VMID``): a worker started
again under the id of one that died recovers that one's workflows when it launches.
"""

from __future__ import annotations

__all__ = ["dbos_worker", "run_dbos_worker"]

import asyncio
import contextlib
import json
import os
import socket
import threading
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from pipecat_actions._operator_text import ledger_line
from pipecat_actions._printable import printable
from pipecat_actions.admission.authorization import AllowAll
from pipecat_actions.clock import Clock, SystemClock
from pipecat_actions.durable._names import DECISION_TOPIC, DEFAULT_QUEUE, WORKFLOW_NAME, queue_for
from pipecat_actions.durable.handoff import psycopg_url
from pipecat_actions.errors import ConfigurationError, LedgerError
from pipecat_actions.ledger import Ledger, Operation, SqlLedger
from pipecat_actions.ledger.engine import LedgerSettings, default_ledger_url
from pipecat_actions.ledger.keys import LedgerKeys
from pipecat_actions.operator import OperatorApp
from pipecat_actions.policy import PolicySet, load_policy
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.status import ActionStatus

APPROVAL_POLL_SECS = 2.0
"""How long a workflow waiting for a person's decision waits for its message before it reads
the ledger again (a decision recorded where no DBOS client sends one, e.g. the console)."""

_WAITS = frozenset({ActionStatus.AWAITING_APPROVAL.value, ActionStatus.AWAITING_CONFIRMATION.value})
_AGAIN = frozenset({ActionStatus.ADMITTED.value, ActionStatus.FAILED_RETRYABLE.value})
"""Statuses a step can leave when a decision raced its expiry: the step runs again."""

IDLE_QUEUE_POLL_SECS = 10.0
"""How often the shared queue is polled when no durable tool of the policy runs on it."""

APPLICATION_VERSION = "pipecat_actions.durable/1"
"""The DBOS application version of every worker: a worker of a newer build recovers the
workflows of an older one (the workflow is one step whose meaning the ledger carries)."""


@dataclass
class _Host:
    """The process's runtime and its event loop, where the workflow's step runs."""

    runtime: ActionRuntime
    loop: asyncio.AbstractEventLoop
    say: Callable[[Operation], None]


_host: _Host | None = None
_registered = threading.Lock()
_workflow: Callable[[str], str] | None = None


def _settle(operation_id: str) -> str:
    """The step: drive the operation to its end on the runtime's loop; its final status."""
    host = _host
    if host is None:  # pragma: no cover - DBOS runs workflows only after launch
        raise RuntimeError("no durable worker runtime in this process")
    final = asyncio.run_coroutine_threadsafe(
        host.runtime.run_handed(operation_id), host.loop
    ).result()
    host.say(final)
    return final.status.value


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, LedgerError) and exc.retryable


def _register() -> None:
    """Register the workflow and its step with DBOS, once per process."""
    global _workflow
    with _registered:
        if _workflow is not None:
            return
        from dbos import DBOS

        step = DBOS.step(
            name="pipecat_actions.settle",
            retries_allowed=True,
            should_retry=_retryable,
            interval_seconds=0.5,
            backoff_rate=2.0,
            max_attempts=12,
        )(_settle)

        def run_operation(operation_id: str) -> str:
            # Until it is settled: a decision a person has not made yet is waited for with
            # DBOS's durable recv (woken by the decider's message, else at the next look).
            while True:
                status = step(operation_id)
                if status in _WAITS:
                    DBOS.recv(DECISION_TOPIC, timeout_seconds=APPROVAL_POLL_SECS)
                elif status not in _AGAIN:
                    return status

        _workflow = DBOS.workflow(name=WORKFLOW_NAME)(run_operation)


def _launch(
    url: str, executor_id: str, policy: PolicySet, polling_secs: float, pool_size: int | None
) -> None:
    from dbos import DBOS, DBOSConfig

    config: DBOSConfig = {
        "name": "pipecat_actions",
        "system_database_url": psycopg_url(url),
        "executor_id": executor_id,
        "application_version": APPLICATION_VERSION,
        "log_level": os.environ.get("PIPECAT_ACTIONS_DBOS_LOG_LEVEL", "WARNING"),
    }
    if pool_size is not None:
        config["sys_db_pool_size"] = pool_size
    DBOS(config=config)
    DBOS.launch()
    tools = [(name, policy[name]) for name in policy.durable_names()]
    # The shared queue is polled as often as the tools' own queues only when a tool runs on
    # it; otherwise seldom, for what an earlier policy left there (each poll is a few
    # queries on every worker, whether or not there is work).
    shared = any(tool.durable is None for _, tool in tools)
    DBOS.register_queue(
        DEFAULT_QUEUE,
        polling_interval_sec=polling_secs if shared else max(polling_secs, IDLE_QUEUE_POLL_SECS),
        on_conflict="always_update",
    )
    for name, tool in tools:
        if tool.durable is None:
            continue
        limits = tool.durable
        DBOS.register_queue(
            queue_for(name, tool),
            global_concurrency=limits.global_concurrency,
            worker_concurrency=limits.worker_concurrency,
            limiter=(
                {"limit": limits.rate_per_minute, "period": 60.0}
                if limits.rate_per_minute is not None
                else None
            ),
            polling_interval_sec=polling_secs,
            on_conflict="always_update",
        )


def _destroy(drain_secs: int) -> None:
    from dbos import DBOS

    DBOS.destroy(workflow_completion_timeout_sec=drain_secs)


async def run_dbos_worker(
    app: OperatorApp,
    *,
    ledger_url: str | None,
    stop: asyncio.Event,
    out: TextIO,
    executor_id: str | None = None,
    polling_secs: float = 1.0,
    pool_size: int | None = None,
    as_json: bool = False,
    clock: Clock | None = None,
) -> int:
    """Run the durable operations of the ledger at ``ledger_url`` until ``stop`` is set.

    Args:
        app: The application's policy, actions (with ``reconcile`` hooks) and authorizer.
        ledger_url: The shared PostgreSQL ledger; it must exist.
        stop: Set to stop (SIGTERM, SIGINT); a step under way is left to DBOS's recovery.
        out: Where each finished operation is told (one line, or JSON lines).
        executor_id: Its DBOS executor id (default ``DBOS__VMID``, else host and pid).
        polling_secs: How often each queue is polled for work.
        pool_size: The most connections each of its pools opens: the ledger's (default 5)
            and DBOS's system database's (default DBOS's, 20).
        as_json: JSON lines instead of text.
        clock: The runtime's time source (tests).

    Returns:
        0 once stopped.

    Raises:
        LedgerConfigurationError: The ledger is not PostgreSQL.
        LedgerError: The ledger cannot be opened.
        ConfigurationError: A worker already runs in this process.
    """
    async with dbos_worker(
        app,
        ledger_url=ledger_url,
        out=out,
        executor_id=executor_id,
        polling_secs=polling_secs,
        pool_size=pool_size,
        as_json=as_json,
        clock=clock,
    ):
        await stop.wait()
    return 0


@contextlib.asynccontextmanager
async def dbos_worker(
    app: OperatorApp,
    *,
    ledger_url: str | None,
    out: TextIO,
    executor_id: str | None = None,
    polling_secs: float = 1.0,
    pool_size: int | None = None,
    as_json: bool = False,
    clock: Clock | None = None,
    drain_secs: int = 0,
    ledger_keys: LedgerKeys | None = None,
    seen_through: Callable[[Ledger], Ledger] | None = None,
) -> AsyncIterator[str]:
    """A DBOS worker running in this process while the block runs; it yields its executor id.

    DBOS is one instance per process: one worker at a time here (a second is refused), and
    once the block has ended another can be started in the same process (DBOS is destroyed
    and launched again; the workflow stays registered). `run_dbos_worker` is this block
    held open until it is told to stop; a scenario runs its story inside one.

    Args:
        app: The application's policy, actions (with ``reconcile`` hooks) and authorizer.
        ledger_url: The shared PostgreSQL ledger; it must exist.
        out: Where each finished operation is told (one line, or JSON lines).
        executor_id: Its DBOS executor id (default ``DBOS__VMID``, else host and pid).
        polling_secs: How often each queue is polled for work.
        pool_size: The most connections each of its pools opens: the ledger's (default 5)
            and DBOS's system database's (default DBOS's, 20).
        as_json: JSON lines instead of text.
        clock: The runtime's time source (a scenario's manual clock, tests).
        drain_secs: On leaving, how long DBOS waits for the workflows running in this
            process to end (0: none; a step under way is left to DBOS's recovery). A
            process that starts another worker afterwards drains, so that no thread of
            this one runs a step on the next one's runtime.
        ledger_keys: The keys that open the values the policy marks ``sensitive`` (default:
            the environment's, as the bots use).
        seen_through: Wraps the worker's ledger (a scenario notes its writes on its
            timeline); the worker closes what it returns.

    Raises:
        LedgerConfigurationError: The ledger is not PostgreSQL.
        LedgerError: The ledger cannot be opened.
        ConfigurationError: A worker already runs in this process.
    """
    global _host
    url = ledger_url or default_ledger_url()
    psycopg_url(url)  # PostgreSQL only: said before anything is opened
    if _host is not None:
        raise ConfigurationError("a durable worker already runs in this process")
    executor = (
        executor_id or os.environ.get("DBOS__VMID") or f"{socket.gethostname()}:{os.getpid()}"
    )
    policy = app.policy if isinstance(app.policy, PolicySet) else load_policy(Path(app.policy))
    clock = clock or SystemClock()
    settings = (
        LedgerSettings()
        if pool_size is None
        else LedgerSettings(pool_size=pool_size, max_overflow=0)
    )
    stored = await SqlLedger.create(url, clock=clock, must_exist=True, settings=settings)
    ledger = seen_through(stored) if seen_through is not None else stored
    try:
        runtime = await ActionRuntime.create(
            policy,
            authorizer=app.authorizer or AllowAll(),
            actions=app.actions,
            routed=app.routed,
            ledger=ledger,
            clock=clock,
            owner=f"dbos-worker:{executor}",
            recover=False,
            admits_calls=False,
            ledger_keys=ledger_keys,
        )
        try:
            loop = asyncio.get_running_loop()

            def say(op: Operation) -> None:
                if as_json:
                    line = json.dumps(
                        {
                            "event": "operation",
                            "operation_id": op.operation_id,
                            "tool": op.tool,
                            "status": op.status.value,
                            "error": op.error,
                        }
                    )
                else:
                    line = (
                        f"{printable(op.operation_id)} {printable(op.tool)}: {op.status.value}"
                        + (f" ({printable(op.error)})" if op.error else "")
                    )
                print(line, file=out, flush=True)

            _host = _Host(runtime, loop, say)
            _register()
            try:
                await asyncio.to_thread(_launch, url, executor, policy, polling_secs, pool_size)
                if as_json:
                    print(json.dumps({"event": "started", "executor_id": executor}), file=out)
                else:
                    print(ledger_line(stored.url), file=out)
                    print(f"dbos worker {printable(executor)} runs durable operations", file=out)
                out.flush()
                yield executor
            finally:
                await asyncio.to_thread(_destroy, drain_secs)
        finally:
            _host = None
            await runtime.close()
    finally:
        await ledger.close()
