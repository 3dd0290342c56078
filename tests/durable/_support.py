"""Databases, bots and DBOS workers of the durable-execution tests (real PostgreSQL).

Each test gets a database of its own with the ledger's schema, DBOS's tables and the fake
provider's table. Workers are real ``pipecat-actions worker --dbos`` processes, so that one can
be killed with SIGKILL mid-step and started again under its executor id, as a supervisor would.
Nothing here waits on real time as the test's logic: a wait is for a condition, under the
hang guard of `tests._waiting`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg

from pipecat_actions.admission.authorization import AllowAll
from pipecat_actions.durable import DurableLedger, install_dbos_schema
from pipecat_actions.ledger import SqlLedger
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.session import SessionState
from tests._waiting import eventually
from tests.durable import _app

ROOT = Path(__file__).resolve().parents[2]
POOL_SIZE = 4
"""Each test worker's pools (ledger, DBOS): the shared server's 100 connections go round."""


async def prepare_database(url: str) -> None:
    """Give an empty database the ledger's schema, DBOS's tables and the provider's table."""
    ledger = await SqlLedger.create(url)
    await ledger.close()
    await install_dbos_schema(url)
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(_app.PROVIDER_TABLE)
        await conn.execute(_app.GATES_TABLE)
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def bot(
    url: str, *, durable: type[DurableLedger] = DurableLedger, **create: Any
) -> AsyncIterator[ActionRuntime]:
    """A bot process's runtime: a DBOS client that hands the durable tools to workers.

    ``durable``: the kind of durable ledger (a test's subclass); a ``clock`` given for the
    runtime is its ledger's too.
    """
    clock = create.get("clock")
    ledger = await durable.open(
        url,
        _app.POLICY,
        ledger=None if clock is None else await SqlLedger.create(url, clock=clock),
    )
    try:
        runtime = await ActionRuntime.create(
            _app.POLICY,
            authorizer=AllowAll(),
            actions=_app.ACTIONS,
            ledger=ledger,
            **create,
        )
        try:
            yield runtime
        finally:
            await runtime.close()
    finally:
        await ledger.close()


def session(session_id: str = "call-1") -> SessionState:
    return SessionState(session_id=session_id, principal="alice")


async def rows(url: str, query: str, *args: Any) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(url)
    try:
        return list(await conn.fetch(query, *args))
    finally:
        await conn.close()


class Workers:
    """``pipecat-actions worker --dbos`` processes on one database, by executor id."""

    def __init__(
        self, url: str, logs: Path, *, answer_delay: float = 0.0, gates: bool = False
    ) -> None:
        self.url = url
        self.logs = logs
        self.answer_delay = answer_delay
        self.gates = gates
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.starts: dict[str, int] = {}

    def _log(self, executor_id: str) -> Path:
        return self.logs / f"{executor_id}.{self.starts[executor_id]}.log"

    async def start(self, executor_id: str) -> None:
        """Start a worker under ``executor_id``; return once it runs durable operations."""
        self.starts[executor_id] = self.starts.get(executor_id, 0) + 1
        env = dict(
            os.environ,
            PYTHONPATH=str(ROOT),
            PA_TEST_PROVIDER_URL=self.url,
            PA_TEST_ANSWER_DELAY=str(self.answer_delay),
            PA_TEST_GATES="1" if self.gates else "0",
        )
        log = self._log(executor_id).open("wb")
        self.procs[executor_id] = subprocess.Popen(
            [sys.executable, "-m", "pipecat_actions.cli", "worker", "--dbos", "--app",
             "tests.durable._app:app", "--ledger", self.url, "--executor-id", executor_id,
             "--pool-size", str(POOL_SIZE)],
            env=env, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
        )  # fmt: skip
        log.close()
        proc = self.procs[executor_id]

        def ready() -> bool:
            if proc.poll() is not None:
                raise AssertionError(
                    f"worker {executor_id} exited {proc.returncode}: "
                    + self._log(executor_id).read_text()[-3000:]
                )
            return "runs durable operations" in self._log(executor_id).read_text()

        await eventually(ready, what=f"worker {executor_id} to start")

    def kill(self, executor_id: str) -> None:
        """SIGKILL the worker: no clean-up of any kind."""
        proc = self.procs[executor_id]
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def output(self, executor_id: str) -> str:
        return "".join(
            (self.logs / f"{executor_id}.{n}.log").read_text()
            for n in range(1, self.starts[executor_id] + 1)
        )

    async def stop(self) -> None:
        """SIGTERM every live worker and wait for each to exit."""
        for proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for executor_id, proc in self.procs.items():
            try:
                await eventually(
                    lambda proc=proc: proc.poll() is not None,
                    what=f"worker {executor_id} to stop on SIGTERM",
                )
            except AssertionError:
                proc.kill()
                raise
