"""The offline demo with a DBOS worker on PostgreSQL: the restaurant story across processes.

    make demo DURABLE=1             # or: .venv/bin/python -m bots.durable_demo

The same restaurant as ``make demo`` (`bots.restaurant_service`, a real HTTP service on
127.0.0.1, started and stopped by the demo), the same scripted model, fake voice and real
Pipecat aggregators, but the booking and the refund run durably (``execution: durable``,
`configs/restaurant_durable.yaml`): the bot is only a DBOS client, and a
``pipecat-actions worker --dbos`` process runs them. PostgreSQL is the machine's, named by
``PIPECAT_ACTIONS_PG_ADMIN_URL`` (default ``postgresql://postgres@127.0.0.1:5432/postgres``):
the demo makes a database of its own there, with the ledger's and DBOS's tables, and drops it
at the end. No keys, no network beyond 127.0.0.1. The story:

1. Alice books a table for nine. The bot hands the booking to the worker in one transaction
   and she hears that it started; the worker books it at the restaurant and the bot tells her
   in the call.
2. She asks for her deposit back: the refund waits for a manager's approval while the
   conversation goes on; the manager approves, the worker refunds, and she is told.
3. Bob books a table for eight; the restaurant is slow, and his call (the bot's process) ends
   right after the hand-off. The worker finishes the booking with nobody listening; when Bob
   calls back, the new conversation is told once.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from loguru import logger

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
if __name__ == "__main__":
    logger.remove()  # before Pipecat is imported: its banner is no line of this demo's

from bots.demo import DATE, Story  # noqa: E402
from bots.restaurant_api import RESTAURANT, RestaurantAPI, build_actions  # noqa: E402
from bots.restaurant_service.process import RestaurantProcess  # noqa: E402
from pipecat_actions import ActionRuntime, AllowAll, SessionState, attach, tools_schema  # noqa: E402
from pipecat_actions.approvals import Approver  # noqa: E402
from pipecat_actions.ledger import Operation, OperationFilter  # noqa: E402
from pipecat_actions.operator import OperatorApp  # noqa: E402
from pipecat_actions.policy import PolicySet, load_policy  # noqa: E402

POLICY = ROOT / "configs" / "restaurant_durable.yaml"
PG_ADMIN_URL = os.environ.get(
    "PIPECAT_ACTIONS_PG_ADMIN_URL", "postgresql://postgres@127.0.0.1:5432/postgres"
)
RESTAURANT_URL_ENV = "PA_DEMO_RESTAURANT_URL"
"""Where the worker process finds the restaurant (its `app` reads it)."""
HANG_GUARD_SECS = 60.0
"""How long the demo waits for a step of the story before it says it is stuck."""


def _progress(text: str) -> None:
    print(f"... {text}", file=sys.stderr, flush=True)


def app() -> OperatorApp:
    """The worker's application: the restaurant's actions, bound to the demo's restaurant."""
    api = RestaurantAPI(os.environ[RESTAURANT_URL_ENV])
    return OperatorApp(policy=load_policy(POLICY), actions=build_actions(api))


# --- PostgreSQL: a database of the demo's own -------------------------------------------------


async def _reachable(admin_url: str) -> str | None:
    """None if PostgreSQL answers at ``admin_url``; else why not, in a few words."""
    import asyncpg

    try:
        conn = await asyncio.wait_for(asyncpg.connect(admin_url), timeout=10)
    except (OSError, TimeoutError, asyncpg.PostgresError) as exc:
        return f"{type(exc).__name__}: {exc}".strip().splitlines()[0]
    await conn.close()
    return None


@asynccontextmanager
async def _database(admin_url: str) -> AsyncIterator[str]:
    """A new database with the ledger's and DBOS's tables; dropped when the block ends."""
    from pipecat_actions.durable import install_dbos_schema
    from pipecat_actions.scenarios.durable import database_of_its_own

    async with database_of_its_own(admin_url, prefix="pa_demo") as url:
        from pipecat_actions.ledger import SqlLedger

        ledger = await SqlLedger.create(url)
        await ledger.close()
        await install_dbos_schema(url)
        yield url


# --- the worker: another process, as on another host ------------------------------------------


class Worker:
    """A ``pipecat-actions worker --dbos`` process; each line it prints goes into the story."""

    def __init__(self, url: str, restaurant_url: str, story: Story) -> None:
        env = dict(os.environ, PYTHONPATH=str(ROOT), **{RESTAURANT_URL_ENV: restaurant_url})
        self.process = subprocess.Popen(
            [sys.executable, "-m", "pipecat_actions.cli", "worker", "--dbos", "--app",
             "bots.durable_demo:app", "--ledger", url, "--executor-id", "demo-worker-1",
             "--polling-secs", "0.1"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        self.lines: list[str] = []
        self.ready = threading.Event()
        self._story = story
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for raw in self.process.stdout:
            line = raw.rstrip()
            self.lines.append(line)
            if "runs durable operations" in line:
                self.ready.set()
            elif line.startswith("op_"):
                op_id, _, rest = line.partition(" ")
                self._story.line(f"worker {op_id[-8:]} {rest}")

    async def started(self) -> None:
        give_up = time.monotonic() + HANG_GUARD_SECS
        while not self.ready.is_set():
            if self.process.poll() is not None or time.monotonic() > give_up:
                raise RuntimeError("the worker did not start:\n" + "\n".join(self.lines[-20:]))
            await asyncio.sleep(0.05)

    def stop(self) -> int:
        """SIGTERM, as a supervisor stops it; its exit code."""
        if self.process.poll() is None:
            self.process.terminate()
        try:
            code = self.process.wait(timeout=HANG_GUARD_SECS)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        self._reader.join(timeout=5)
        return code


# --- the bot: a DBOS client ---------------------------------------------------------------------


@asynccontextmanager
async def bot_runtime(
    url: str, policy: PolicySet, restaurant_url: str, owner: str
) -> AsyncIterator[ActionRuntime]:
    """A bot process's runtime: its durable tools handed to the worker, never run here."""
    from pipecat_actions.durable import DurableLedger

    ledger = await DurableLedger.open(url, policy)
    api = RestaurantAPI(restaurant_url)
    try:
        runtime = await ActionRuntime.create(
            policy,
            authorizer=AllowAll(),  # demo only: a real deployment checks the principal's rights
            actions=build_actions(api),
            ledger=ledger,
            owner=owner,
        )
        try:
            yield runtime
        finally:
            await runtime.close()
    finally:
        await api.aclose()
        await ledger.close()


async def _until(what: str, ready: Callable[[], Any]) -> Any:
    """Wait for ``ready()`` to give something (a hang guard, not a budget)."""
    give_up = time.monotonic() + HANG_GUARD_SECS
    while True:
        found = await ready()
        if found:
            return found
        if time.monotonic() > give_up:
            raise RuntimeError(f"the story is stuck waiting for {what}")
        await asyncio.sleep(0.1)


async def _told(runtime: ActionRuntime, session: SessionState, tool: str) -> Operation | None:
    ops = await runtime.ledger.list(OperationFilter(session_id=session.session_id, tool=tool))
    return next((op for op in ops if op.delivered_at is not None), None)


def _book(time_of_day: str, party_size: int, guest: str) -> dict[str, Any]:
    return {
        "restaurant_id": RESTAURANT,
        "date": DATE,
        "time": time_of_day,
        "party_size": party_size,
        "guest_name": guest,
        "phone": "+44 20 7946 0000",
    }


async def _conversation(
    runtime: ActionRuntime,
    session: SessionState,
    script: list[Any],
    steps: list[Any],
    story: Story,
) -> Any:
    """One call on a real Pipecat pipeline, its lines printed as they happen."""
    from pipecat.processors.aggregators.llm_context import LLMContext

    # The call's own transcript (what it heard is numbered from its start), on the story's
    # clock.
    call = Story(story.out)
    call.started = story.started

    from pipecat_actions.adapters import ActionResultGate, ActionTurnTracker
    from pipecat_actions.testing import FakeTransport, FakeTTS, ScriptedLLM, run_conversation

    llm = ScriptedLLM(script, fallback="Okay.")
    attach(runtime, llm, session)
    context = LLMContext(
        messages=[{"role": "system", "content": "You take restaurant bookings."}],
        tools=tools_schema(runtime),
    )
    transport = FakeTransport()
    began = time.time()
    following = asyncio.ensure_future(call.follow(runtime, session, transport))
    try:
        result = await run_conversation(
            steps,
            llm=llm,
            tts=FakeTTS(secs_per_char=0.03),
            transport=transport,
            context=context,
            after_user_aggregator=[ActionTurnTracker(session)],
            before_assistant_aggregator=[ActionResultGate(runtime, session)],
            observers=[call.observer()],
            timeout_secs=120.0,
        )
    finally:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)
    await call.catch_up(runtime, session)
    for index, heard in enumerate(result.heard):
        call.line(
            f"bot    {heard.text}{' [interrupted]' if heard.interrupted else ''}",
            began + heard.started_at_secs,
            key=f"bot:{index}",
        )
    return result


async def alice(url: str, policy: PolicySet, restaurant: RestaurantProcess, story: Story) -> None:
    """Part 1: the booking told in the call, the refund approved by a manager meanwhile."""
    from pipecat_actions.testing import Call, Say, ToolCalls, UserSays, WaitUntilIdle

    await restaurant.admin.set_latency("book", 4.0)  # it commits after "started" was heard
    script = [
        ToolCalls(
            [("book_table", _book("21:00", 2, "Alice"))],
            say="Sure, I have started the booking; I will tell you when the restaurant confirms.",
        ),
        Say("Your table for two at nine tonight is booked."),
        ToolCalls(
            [
                (
                    "refund_deposit",
                    {
                        "booking_id": "bk_0001",
                        "amount": 2000,
                        "card": {"number": "4242424242424242", "expiry": "12/30"},
                    },
                )
            ],
            say="Of course.",
        ),
        Say("A manager needs to approve the refund; I will tell you as soon as I hear."),
        Say("Yes, there is a car park right next door."),
        Say("Good news: your refund of twenty euros has been approved and sent."),
    ]
    async with bot_runtime(url, policy, restaurant.url, "demo-bot-alice") as runtime:
        session = SessionState(session_id="call-alice", principal="alice", active_agent="host")

        async def booking_told() -> None:
            await _until("the booking to be told", lambda: _told(runtime, session, "book_table"))

        async def refund_told() -> None:
            await _until("the refund to be told", lambda: _told(runtime, session, "refund_deposit"))

        async def manager() -> None:
            # The manager answers a little after Alice's next question, to show the call going
            # on while the refund waits.
            while True:
                waiting = await runtime.pending_approvals()
                if waiting and session.user_turn >= 3 and not session.bot_speaking:
                    await asyncio.sleep(1.0)
                    op = waiting[0]
                    story.line(f"app    manager rosa approves {op.operation_id[-8:]}")
                    await runtime.approve(
                        op.operation_id,
                        approver=Approver("rosa", tenants={"default"}),
                        reason="deposit policy",
                        args_hash=op.args_hash,
                    )
                    return
                await asyncio.sleep(0.2)

        approving = asyncio.ensure_future(manager())
        try:
            await _conversation(
                runtime,
                session,
                script,
                [
                    UserSays("A table for two at nine tonight, please."),
                    Call(booking_told),
                    WaitUntilIdle(quiet_secs=0.8, timeout_secs=30.0),
                    UserSays("And please refund the deposit for that booking."),
                    WaitUntilIdle(quiet_secs=0.6, timeout_secs=30.0),
                    UserSays("Thanks. Is there parking nearby?"),
                    Call(refund_told),
                    WaitUntilIdle(quiet_secs=1.0, timeout_secs=30.0),
                ],
                story,
            )
        finally:
            approving.cancel()
            await asyncio.gather(approving, return_exceptions=True)


async def bob(url: str, policy: PolicySet, restaurant: RestaurantProcess, story: Story) -> str:
    """Part 2: Bob's call ends right after the hand-off; the next conversation is told once."""
    from pipecat_actions.testing import Call, Say, WaitUntilIdle

    await restaurant.admin.arm("book", "slow_before_commit", secs=3.0)
    session = SessionState(session_id="call-bob", principal="bob")
    async with bot_runtime(url, policy, restaurant.url, "demo-bot-bob-1") as runtime:
        session.settle_generation(0)  # bob's request was confirmed by a finished turn
        started = await runtime.propose("book_table", _book("20:00", 4, "Bob"), session, wait=False)
        op_id = str(started["operation_id"])
        story.line(f"app    bob's booking {op_id[-8:]}: {started['status']}; bob's call ends")
    # The bot's process is gone; the worker goes on with the booking.
    async with bot_runtime(url, policy, restaurant.url, "demo-bot-bob-2") as runtime:

        async def committed() -> Operation | None:
            op = await runtime.ledger.get(op_id)
            return op if op.committed_at is not None else None

        await _until("bob's booking to commit", committed)
        story.line("app    bob calls back: a new conversation of his session")
        session = SessionState(session_id="call-bob", principal="bob")

        async def told() -> None:
            await _until("bob to be told", lambda: _told(runtime, session, "book_table"))

        await _conversation(
            runtime,
            session,
            [Say("Welcome back, Bob: your table for four at eight tonight is booked.")],
            [Call(told), WaitUntilIdle(quiet_secs=1.0, timeout_secs=30.0)],
            story,
        )
    return op_id


# --- the report -----------------------------------------------------------------------------


async def report(url: str, restaurant: RestaurantProcess, out: Any = sys.stdout) -> dict[str, Any]:
    """The ledger, DBOS's workflows and the restaurant's own database, once it is over."""
    import asyncpg

    from pipecat_actions.ledger import SqlLedger

    async with await SqlLedger.create(url) as ledger:
        ops = sorted(await ledger.list(), key=lambda o: o.created_at)
        told = {
            op.operation_id: sum(
                1 for e in await ledger.events(op.operation_id) if "delivered" in e.detail_json
            )
            for op in ops
        }
    conn = await asyncpg.connect(url.replace("+asyncpg", ""))
    try:
        workflows = {
            r["workflow_uuid"]: r["status"]
            for r in await conn.fetch("SELECT workflow_uuid, status FROM dbos.workflow_status")
        }
    finally:
        await conn.close()
    print("\nLEDGER (each operation, and its DBOS workflow)", file=out)
    print(f"  {'operation':<10} {'tool':<16} {'status':<12} {'workflow':<10} told", file=out)
    for op in ops:
        workflow = workflows.get(f"pa-op:{op.operation_id}", "-")
        print(
            f"  {op.operation_id[-8:]:<10} {op.tool:<16} {op.status.value:<12} {workflow:<10} "
            f"{told[op.operation_id]}",
            file=out,
        )
    held = await restaurant.admin.bookings(restaurant_id=RESTAURANT, status="confirmed")
    effects = (await restaurant.admin.stats())["side_effects"]
    print("\nMETRICS", file=out)
    print(f"  bookings at the restaurant: {[(b['booking_id'], b['time']) for b in held]}", file=out)
    print(f"  provider side effects: {effects}", file=out)
    print(f"  DBOS workflows by status: {_count(workflows.values())}", file=out)
    return {
        "operations": [
            {
                "operation_id": op.operation_id,
                "tool": op.tool,
                "status": op.status.value,
                "workflow": workflows.get(f"pa-op:{op.operation_id}"),
                "told": told[op.operation_id],
                "lease_owner": op.lease_owner,
            }
            for op in ops
        ],
        "side_effects": effects,
    }


def _count(values: Any) -> str:
    counts: dict[str, int] = {}
    for value in values:
        counts[value] = counts.get(value, 0) + 1
    return json.dumps(counts, sort_keys=True)


async def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="pipecat_actions demo with a DBOS worker")
    parser.add_argument("--json", action="store_true", help="print the outcome as JSON too")
    args = parser.parse_args(argv)
    logger.remove()
    why = await _reachable(PG_ADMIN_URL)
    if why is not None:
        print(
            f"make demo DURABLE=1: PostgreSQL is not reachable at {PG_ADMIN_URL} ({why}); start "
            "it, or set PIPECAT_ACTIONS_PG_ADMIN_URL to a server where this role may create "
            "databases",
            file=sys.stderr,
        )
        return 2
    policy = load_policy(POLICY)
    workdir = Path(".pipecat_actions")
    workdir.mkdir(mode=0o700, exist_ok=True)
    restaurant_db = (workdir / f"durable-demo-restaurant-{uuid.uuid4().hex[:8]}.db").resolve()
    story = Story()
    try:
        async with _database(PG_ADMIN_URL) as url:
            _progress(f"policy {POLICY.relative_to(ROOT)}, a database of its own: {url}")
            with RestaurantProcess.start(restaurant_db) as restaurant:
                _progress(f"restaurant service on {restaurant.url}")
                worker = Worker(url, restaurant.url, story)
                try:
                    await worker.started()
                    _progress(
                        "a DBOS worker (pipecat-actions worker --dbos) runs the durable tools"
                    )
                    story.begin()
                    await alice(url, policy, restaurant, story)
                    await bob(url, policy, restaurant, story)
                finally:
                    code = worker.stop()
                print(f"\nWORKER (stopped with SIGTERM, exit {code})", file=sys.stdout)
                outcome = await report(url, restaurant)
            _progress("dropping the demo's database")
    finally:
        for leftover in workdir.glob(restaurant_db.name + "*"):
            leftover.unlink()
    if args.json:
        print(json.dumps(outcome))
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
