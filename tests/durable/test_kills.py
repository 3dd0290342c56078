"""Workers killed with SIGKILL mid-step, at points of the step chosen at random (seeded).

Three ``pipecat-actions worker --dbos`` processes run operations that a bot hands off in
batches. For each batch one operation is chosen at random, and one point of its step: the test
stops that operation there, sees it there (the ledger's row, DBOS's ``workflow_status`` and
``operation_outputs``, the fake provider's table, the lock its worker waits on in
``pg_locks``), and kills the worker that runs it, whatever else that worker is doing. The
worker is started again under its executor id, as a supervisor would, and DBOS recovers its
workflows. The points (`POINTS`):

* ``step begun``: the workflow dequeued and its step begun, nothing written (ledger ADMITTED);
* ``request unsent``: the write-ahead record written (RUNNING), the request not sent;
* ``request in flight``: the request sent, the provider holding it (it applies it after the
  worker died, as a real provider would);
* ``effect done``: the effect done at the provider, its answer not back;
* ``settled, DBOS unaware``: the outcome written to the ledger, the step's output not yet
  recorded by DBOS (the worker waits for DBOS's row lock of the workflow, which the test
  holds);
* ``awaiting approval``: the workflow waiting between its steps for a person's decision, which
  comes before or after the worker is back (chosen at random).

The scale is ``PIPECAT_ACTIONS_DURABLE_KILLS`` (``OPERATIONS:KILLS``, default 60:6, every
point once); ``make test-durable-kills`` runs the issue's 200:20. The seed is fresh each run
unless ``PIPECAT_ACTIONS_DURABLE_KILL_SEED`` gives it; a failure says it.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from pipecat_actions.approvals import Approver
from pipecat_actions.durable.handoff import workflow_state
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.status import TERMINAL_STATUSES, ActionStatus
from tests._waiting import eventually
from tests.durable import _app
from tests.durable._support import Workers, bot, rows, session

pytestmark = pytest.mark.postgres
S = ActionStatus
WORKERS = ("w1", "w2", "w3")
MARIA = Approver("maria", tenants={"default"})


@dataclass(frozen=True)
class Point:
    """Where in its step an operation's worker is killed, and what is seen there."""

    name: str
    gate: int | None
    """The gate of `tests.durable._app` the operation is held at (None: no gate)."""
    ledger: str
    """The ledger's status of the operation there."""
    effect: bool
    """Whether the provider has its effect there."""


POINTS = (
    Point("step begun", _app.GATE_STEP_BEGUN, "ADMITTED", effect=False),
    Point("request unsent", _app.GATE_REQUEST_UNSENT, "RUNNING", effect=False),
    Point("request in flight", _app.GATE_IN_FLIGHT, "RUNNING", effect=False),
    Point("effect done", _app.GATE_EFFECT_DONE, "RUNNING", effect=True),
    Point("settled, DBOS unaware", _app.GATE_EFFECT_DONE, "RUNNING", effect=True),
    Point("awaiting approval", None, "AWAITING_APPROVAL", effect=False),
)


def _scale() -> tuple[int, int]:
    operations, _, kills = os.environ.get("PIPECAT_ACTIONS_DURABLE_KILLS", "60:6").partition(":")
    return int(operations), int(kills)


def _plan(rng: random.Random, kills: int) -> list[Point]:
    """``kills`` points: each as often as the others (the remainder drawn), in random order."""
    points = list(POINTS) * (kills // len(POINTS)) + rng.sample(POINTS, kills % len(POINTS))
    rng.shuffle(points)
    return points


@dataclass
class Kill:
    point: Point
    operation_id: str
    executor_id: str
    approved_before_restart: bool | None = None


_STATE = """
SELECT w.executor_id, w.status AS workflow, o.status AS ledger, o.error,
       EXISTS (SELECT 1 FROM provider_effects p WHERE p.operation_id = o.operation_id) AS effect,
       EXISTS (SELECT 1 FROM dbos.operation_outputs s WHERE s.workflow_uuid = w.workflow_uuid
               AND s.function_name = 'pipecat_actions.settle') AS step_recorded
FROM pa_operations o JOIN dbos.workflow_status w ON w.workflow_uuid = 'pa-op:' || o.operation_id
WHERE o.operation_id = $1
"""
"""One operation as the ledger, DBOS and the provider see it."""

_AT_GATE = """
SELECT pid FROM pg_locks
WHERE locktype = 'advisory' AND NOT granted AND classid = $1 AND objid = $2 AND objsubid = 2
"""
"""The database sessions waiting at a gate for one operation (its worker's)."""

_BLOCKED_BY = "SELECT pid FROM pg_stat_activity WHERE $1 = ANY(pg_blocking_pids(pid))"


async def _seen(
    db: asyncpg.Connection,
    operation_id: str,
    waiters: str | None = None,
    *args: object,
    until: Callable[[asyncpg.Record], bool] = lambda state: True,
    workflow: str = "PENDING",
) -> dict[str, Any]:
    """Wait until ``operation_id`` is where ``until`` says, its workflow as ``workflow`` says.

    ``waiters`` finds the database sessions the worker waits in there (the lock it waits
    for); then at least one must be found. Returns the state seen, with those sessions' pids.
    """
    state: list[asyncpg.Record] = []
    waiting: list[int] = []

    async def there() -> bool:
        waiting[:] = [r["pid"] for r in await db.fetch(waiters, *args)] if waiters else []
        state[:] = await db.fetch(_STATE, operation_id)
        return (
            (waiters is None or bool(waiting))
            and bool(state)
            and state[0]["workflow"] == workflow
            and until(state[0])
        )

    await eventually(there, what=lambda: f"{operation_id} at its point: {state} {waiting}")
    return {**dict(state[0]), "pids": list(waiting)}


async def _gone(db: asyncpg.Connection, pids: list[int]) -> None:
    """Wait until the killed worker's database sessions held at the point have ended."""

    async def ended() -> bool:
        return not await db.fetch("SELECT 1 FROM pg_stat_activity WHERE pid = ANY($1)", pids)

    await eventually(ended, what=f"the dead worker's sessions {pids} to end")


async def _kill_at(
    point: Point,
    operation_id: str,
    key: int,
    *,
    db: asyncpg.Connection,
    holder: asyncpg.Connection,
    workers: Workers,
    runtime: ActionRuntime,
    rng: random.Random,
) -> Kill:
    """Kill the worker of ``operation_id`` (held at ``point``'s gate, if any) and restart it."""
    if point.name == "awaiting approval":
        # Between its steps: the first one recorded its answer, a person has not decided.
        state = await _seen(
            db,
            operation_id,
            until=lambda s: s["ledger"] == "AWAITING_APPROVAL" and s["step_recorded"],
        )
        kill = Kill(point, operation_id, state["executor_id"], rng.random() < 0.5)
        workers.kill(kill.executor_id)
        waiting = await runtime.ledger.get(operation_id)

        async def approve() -> None:
            await runtime.approve(
                operation_id, approver=MARIA, reason="ok", args_hash=waiting.args_hash
            )

        if kill.approved_before_restart:
            await approve()
        await workers.start(kill.executor_id)
        if not kill.approved_before_restart:
            await approve()
        return kill
    assert point.gate is not None
    state = await _seen(db, operation_id, _AT_GATE, point.gate, key)
    assert (state["ledger"], state["effect"], state["step_recorded"]) == (
        point.ledger, point.effect, False
    ), (point.name, state)  # fmt: skip
    pids = state["pids"]
    release = None
    if point.name == "settled, DBOS unaware":
        # DBOS records a step's output under a row lock of its workflow: held here, the
        # worker writes the outcome to the ledger and then waits to record it.
        release = holder.transaction()
        await release.start()
        await holder.execute(
            "SELECT 1 FROM dbos.workflow_status WHERE workflow_uuid = $1 FOR UPDATE",
            f"pa-op:{operation_id}",
        )
        await holder.execute("SELECT pg_advisory_unlock($1, $2)", point.gate, key)
        holder_pid = await holder.fetchval("SELECT pg_backend_pid()")
        state = await _seen(db, operation_id, _BLOCKED_BY, holder_pid)
        assert (state["ledger"], state["step_recorded"]) == ("COMMITTED", False), state
        pids = state["pids"]
    kill = Kill(point, operation_id, state["executor_id"])
    workers.kill(kill.executor_id)
    if release is not None:
        await release.rollback()
    else:
        await holder.execute("SELECT pg_advisory_unlock($1, $2)", point.gate, key)
    # What the dead worker's sessions were doing ends before it is back (a request in flight
    # reaches the provider now, or never): the provider's commit horizon is 0.
    await _gone(db, pids)
    await workers.start(kill.executor_id)
    return kill


async def test_workers_killed_at_random_points_of_a_step_never_double_an_effect_and_all_agree(
    durable_url: str, tmp_path: Path
) -> None:
    operations, kills = _scale()
    seed = int(os.environ.get("PIPECAT_ACTIONS_DURABLE_KILL_SEED") or random.randrange(2**32))
    print(f"PIPECAT_ACTIONS_DURABLE_KILL_SEED={seed} ({operations} operations, {kills} kills)")
    try:
        await _run(durable_url, tmp_path, operations, kills, seed)
    except BaseException as exc:
        exc.add_note(f"PIPECAT_ACTIONS_DURABLE_KILL_SEED={seed} runs this again")
        raise


async def _run(url: str, tmp_path: Path, operations: int, kills: int, seed: int) -> None:
    rng = random.Random(seed)
    per_batch = operations // kills
    workers = Workers(url, tmp_path, gates=True)
    for executor_id in WORKERS:
        await workers.start(executor_id)
    ids: list[str] = []
    done: list[Kill] = []
    holder = await asyncpg.connect(url)  # holds the gates and locks
    db = await asyncpg.connect(url)  # looks
    try:
        async with bot(url) as runtime:
            for k, point in enumerate(_plan(rng, kills)):
                batch = range(k * per_batch, operations if k == kills - 1 else (k + 1) * per_batch)
                victim = rng.choice(batch)
                key = 100 + victim  # its amount_cents: its gates' key
                if point.gate is not None:
                    await holder.execute("SELECT pg_advisory_lock($1, $2)", point.gate, key)
                victim_id = ""
                for n in batch:
                    tool = "refund" if n == victim and point.gate is None else "transfer"
                    args = (
                        {"order": f"ord-{n}", "amount_cents": 100 + n}
                        if tool == "refund"
                        else {"account": f"acc-{n}", "amount_cents": 100 + n}
                    )
                    started = await runtime.propose(tool, args, session(f"call-{n}"), wait=False)
                    ids.append(started["operation_id"])
                    if n == victim:
                        victim_id = started["operation_id"]
                done.append(
                    await _kill_at(
                        point, victim_id, key,
                        db=db, holder=holder, workers=workers, runtime=runtime, rng=rng,
                    )
                )  # fmt: skip
                # Recovered before the next kill, which could otherwise hit it again.
                await _seen(db, victim_id, workflow="SUCCESS")
            assert len(ids) == operations
            ledger = runtime.ledger
            last: list[object] = []

            async def finished() -> bool:
                last[:] = await db.fetch(
                    "SELECT w.workflow_uuid, w.status, w.executor_id, o.status AS op "
                    "FROM dbos.workflow_status w "
                    "JOIN pa_operations o ON w.workflow_uuid = 'pa-op:' || o.operation_id "
                    "WHERE w.status <> 'SUCCESS'",
                )
                return not last

            await eventually(finished, what=lambda: f"every workflow to finish: {last}")
            ops = {op_id: await ledger.get(op_id) for op_id in ids}
            states = {op_id: await workflow_state(ledger.client, op_id) for op_id in ids}
            events = {kill.operation_id: await ledger.events(kill.operation_id) for kill in done}
    finally:
        await holder.close()
        await db.close()
        await workers.stop()
    found = await rows(
        url, "SELECT idem_key, count(*) AS n FROM provider_effects GROUP BY idem_key"
    )
    effects = {r["idem_key"]: r["n"] for r in found}
    # Every operation settled; exactly one effect per committed key and none for the others;
    # the ledger, DBOS's workflow and the provider agree on every operation.
    assert all(op.status in TERMINAL_STATUSES for op in ops.values())
    assert all(n == 1 for n in effects.values()), effects
    assert {o.idempotency_key for o in ops.values() if o.status is S.COMMITTED} == set(effects)
    for op in ops.values():
        if op.status is not S.COMMITTED:
            assert op.status is S.FAILED_FINAL and "did not happen" in (op.error or ""), op
    assert {i: s for i, s in states.items() if s != ("SUCCESS", ops[i].status.value)} == {}
    # Each killed operation was settled as its point says.
    for kill in done:
        op = ops[kill.operation_id]
        trail = [e.to_status for e in events[kill.operation_id]]
        why = (kill, op.status, op.error, [(e.to_status, e.actor) for e in events[op.operation_id]])
        name = kill.point.name
        if name in ("step begun", "settled, DBOS unaware"):
            assert op.status is S.COMMITTED and S.UNKNOWN not in trail, why
        elif name == "request unsent":
            assert op.status is S.FAILED_FINAL and S.UNKNOWN in trail, why
        elif name in ("request in flight", "effect done"):
            assert op.status is S.COMMITTED and S.UNKNOWN in trail, why
        else:
            assert op.status is S.COMMITTED and trail.count(S.ADMITTED) == 1, why
    assert len({kill.operation_id for kill in done}) == kills
