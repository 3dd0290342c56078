"""The offline demo: a restaurant booking conversation that shows what pipecat_actions is for.

    make demo                       # or: .venv/bin/python -m bots.demo
    POLICY=configs/restaurant_verbal_refunds.yaml make demo

No keys, no network beyond 127.0.0.1: a scripted model (`ScriptedLLM`), a fake voice
(`FakeTTS`) played in real time by an offline transport, the real Pipecat aggregators, the
runtime, the tracker and the gate, the SQLite ledger under ``.pipecat_actions/``, and the
restaurant: a real HTTP service (`bots.restaurant_service`) in a process of its own, with its
own SQLite database, started on 127.0.0.1 (a free port) by the demo and always stopped by it.
The actions reach it through `bots.restaurant_api`, the adapter a team writes for its own
provider. The story:

1. Alice books a table for nine; the booking is slow. She barges in: "make it half past nine".
   The half-past-nine booking is queued behind the first (one booking at a time per caller):
   it waits, and she is told the nine o'clock one is still going through.
2. The nine o'clock booking commits late. The gate tells the model the truth (booked, not
   cancelled); the model books half past nine and the application cancels the nine o'clock
   one as a compensation: exactly one booking is left.
3. She asks for her deposit back: the refund waits for a manager's approval (or for her spoken
   yes, with the verbal-refunds policy) while the conversation goes on, then runs and she is
   told.
4. A second bot process books a table; the restaurant commits it and holds the answer, and the
   bot process is killed (SIGKILL) while the restaurant keeps running. A fresh runtime recovers
   the operation, asks the restaurant about its idempotency key, and reports it committed.

It prints a timestamped transcript (user, bot, tool events) as the story happens, line by line,
then the crash, the ledger, and metrics, and ends
with the operator's commands that read this demo's ledger, ``.pipecat_actions/demo.db`` (the
command line's default is ``.pipecat_actions/ledger.db``, which the demo leaves alone).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from loguru import logger

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bots.restaurant_api import RESTAURANT, RestaurantAPI, build_actions  # noqa: E402
from bots.restaurant_service.process import RestaurantProcess  # noqa: E402
from pipecat_actions import ActionRuntime, AllowAll, SessionState, attach, tools_schema  # noqa: E402
from pipecat_actions.approvals import Approver  # noqa: E402
from pipecat_actions.ledger import Operation, OperationFilter  # noqa: E402
from pipecat_actions.policy import ConfirmationMode, load_policy  # noqa: E402
from pipecat_actions.status import ActionStatus  # noqa: E402

S = ActionStatus
DATE = "2030-05-01"
DEFAULT_POLICY = ROOT / "configs" / "restaurant.yaml"


def _progress(text: str) -> None:
    print(f"... {text}", file=sys.stderr, flush=True)


# --- the scripted model --------------------------------------------------------------------


def _last_tool_result(messages: list[Any], key: str) -> dict[str, Any]:
    for message in reversed(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if not isinstance(content, str) or key not in content:
            continue
        found = re.search(r"\{.*\}", content)
        if found:
            try:
                data = json.loads(found.group(0))
            except ValueError:
                continue
            if key in json.dumps(data):
                return dict(data)
    return {}


def _booking_at(messages: list[Any], time_of_day: str) -> str | None:
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            pattern = r'"booking_id": "(bk_\d+)", "date": "[^"]+", "time": "([^"]+)"'
            for match in re.finditer(pattern, content.replace('\\"', '"')):
                if match.group(2) == time_of_day:
                    return match.group(1)
    return None


def script(refund_mode: ConfirmationMode) -> list[Any]:
    """The model's side of the story; steps that need ids read them from the context."""
    from pipecat_actions.testing import Say, ToolCalls

    def book(time_of_day: str) -> dict[str, Any]:
        return {
            "restaurant_id": RESTAURANT,
            "date": DATE,
            "time": time_of_day,
            "party_size": 2,
            "guest_name": "Alice",
            "phone": "+44 20 7946 0000",
        }

    def refund(messages: list[Any]) -> Any:
        booking_id = _booking_at(messages, "21:00") or "bk_0001"
        return ToolCalls(
            [
                (
                    "refund_deposit",
                    {
                        "booking_id": booking_id,
                        "amount": 2000,
                        "card": {"number": "4242424242424242", "expiry": "12/30"},
                    },
                )
            ],
            say="Of course.",
        )

    def confirm_refund(messages: list[Any]) -> Any:
        pending = _last_tool_result(messages, "confirmation_token")
        return ToolCalls(
            [
                (
                    "confirm_action",
                    {
                        "operation_id": pending.get("operation_id", ""),
                        "confirmation_token": pending.get("confirmation_token", ""),
                    },
                )
            ]
        )

    steps: list[Any] = [
        ToolCalls([("book_table", book("21:00"))], say="Sure, a table for two at nine tonight."),
        ToolCalls([("book_table", book("21:30"))]),
        Say("Your nine o'clock booking is still going through; I will change it when it is done."),
        ToolCalls(
            [("book_table", book("21:30"))],
            say="Your table at nine is booked. Moving it to half past nine now.",
        ),
        Say("Done: a table for two at half past nine. I am cancelling the nine o'clock one."),
        # The compensation's outcome is told when it comes, and the model answers it.
        Say("The nine o'clock booking is cancelled, free of charge."),
        refund,
    ]
    if refund_mode is ConfirmationMode.VERBAL:
        steps += [
            Say("Shall I refund the twenty euro deposit to your card?"),
            confirm_refund,
            # confirm_action answers that the refund started; its outcome is told after.
            Say("I have started the refund."),
            Say("Your refund of twenty euros has been sent."),
            Say("Yes, there is a car park right next door."),
        ]
    else:
        steps += [
            Say("A manager needs to approve the refund; I will tell you as soon as I hear."),
            Say("Yes, there is a car park right next door."),
            Say("Good news: your refund of twenty euros has been approved and sent."),
        ]
    return steps


# --- the story, printed as it happens --------------------------------------------------------


_WRITING = threading.Lock()
"""Held while a `Story` writes a line: one for every story, as they may share an output."""


class Story:
    """Prints each line of the transcript when it happens, flushed: ``make demo`` is never silent.

    The user's lines come from the pipeline (an observer of the transcriptions the transport
    sends), the bot's when the user has heard them (the fake transport's record of played
    audio), the tool events from the ledger's audit trail, the application's from itself.
    Each is printed once, with the seconds since the call started. Lines come from more than
    one thread (the durable demo's worker output is read in a thread of its own) and from more
    than one story on the same output (a call's own): each is written whole, as one write
    under one lock, so two lines never run into each other.
    """

    def __init__(self, out: Any = sys.stdout) -> None:
        self.out = out
        self.started = time.time()
        self._printed: set[str] = set()

    def begin(self) -> None:
        self.started = time.time()
        self._print("TRANSCRIPT (seconds since the call started, printed as it happens)")

    def line(self, text: str, at: float | None = None, *, key: str | None = None) -> None:
        key = key or text
        when = (at if at is not None else time.time()) - self.started
        with _WRITING:
            if key in self._printed:
                return
            self._printed.add(key)
            self._write(f"  {when:6.2f}  {text}")

    def _print(self, text: str) -> None:
        with _WRITING:
            self._write(text)

    def _write(self, text: str) -> None:
        # One write of the line and its end (print() makes two, which another thread's line
        # can come between).
        self.out.write(text + "\n")
        self.out.flush()

    def observer(self) -> Any:
        """A Pipecat observer that tells each user transcription once, when it is pushed."""
        from pipecat.frames.frames import TranscriptionFrame
        from pipecat.observers.base_observer import BaseObserver, FramePushed

        story = self

        class _Transcriptions(BaseObserver):
            async def on_push_frame(self, data: FramePushed) -> None:
                frame = data.frame
                if isinstance(frame, TranscriptionFrame):
                    story.line(f"user   {frame.text}", key=f"user:{frame.id}")

        return _Transcriptions()

    async def follow(self, runtime: ActionRuntime, session: SessionState, transport: Any) -> None:
        """Print what the user heard and each tool event, until cancelled."""
        heard = 0
        while True:
            await self.catch_up(runtime, session)
            played = transport.heard
            # The last utterance may still be playing (or be cut): told once the bot stops.
            settled = len(played) if not session.bot_speaking else len(played) - 1
            for index in range(heard, settled):
                utterance = played[index]
                cut = " [interrupted]" if utterance.interrupted else ""
                self.line(f"bot    {utterance.text}{cut}", key=f"bot:{index}")
            heard = max(heard, settled)
            await asyncio.sleep(0.1)

    async def catch_up(self, runtime: ActionRuntime, session: SessionState) -> None:
        """Print the tool events of ``session``'s operations not printed yet."""
        ops = await runtime.ledger.list(OperationFilter(session_id=session.session_id))
        for op in sorted(ops, key=lambda o: o.created_at):
            for event in await runtime.ledger.events(op.operation_id):
                what = _event_text(event)
                if what is not None:
                    text = f"tool   {op.tool:<16} {op.operation_id[-8:]} {what}"
                    self.line(text, event.at, key=f"{op.operation_id}:{event.at}:{what}")


def _event_text(event: Any) -> str | None:
    if event.kind.value in ("created", "transition"):
        return f"{event.from_status} -> {event.to_status}"
    if "delivered" in (event.detail_json or ""):
        return "delivered to the conversation"
    return None


# --- the application around the conversation ------------------------------------------------


class Director:
    """What the application does meanwhile: the move and the manager's approval."""

    def __init__(self, runtime: ActionRuntime, session: SessionState, story: Story) -> None:
        self.runtime, self.session, self.story = runtime, session, story
        self.events: list[tuple[float, str]] = []
        self.compensation: Operation | None = None
        self.tasks: list[asyncio.Task[Any]] = []

    def note(self, text: str) -> None:
        self.events.append((time.time(), text))
        self.story.line(f"app    {text}")

    def on_outcome(self, op: Operation) -> None:
        if op.tool == "book_table" and op.status is S.COMMITTED and op.args["time"] != "21:00":
            self.tasks.append(asyncio.ensure_future(self.move_done(op)))

    async def move_done(self, new_booking: Operation) -> None:
        earlier = [
            o
            for o in await self.runtime.ledger.list(
                OperationFilter(
                    session_id=self.session.session_id, tool="book_table", status=[S.COMMITTED]
                )
            )
            if o.operation_id != new_booking.operation_id
        ]
        for old in earlier:
            self.note(f"application: compensating {old.operation_id} (moved to 21:30)")
            self.compensation = await self.runtime.compensate(
                old.operation_id, actor="app:move", reason="the guest moved it to 21:30"
            )

    async def manager(self) -> None:
        """Approve the refund like `pipecat-actions approvals approve` would, after a pause."""
        while True:
            waiting = await self.runtime.pending_approvals()
            # The manager answers a little after Alice's next question, to show the bot
            # talking on while the refund waits.
            if waiting and self.session.user_turn >= 4 and not self.session.bot_speaking:
                await asyncio.sleep(1.0)
                op = waiting[0]
                self.note(f"manager rosa approves {op.operation_id} (args {op.args_hash[:12]})")
                await self.runtime.approve(
                    op.operation_id,
                    approver=Approver("rosa", tenants={"default"}),
                    reason="deposit policy",
                    args_hash=op.args_hash,
                )
                return
            await asyncio.sleep(0.2)


async def converse(
    ledger_url: str, policy_path: Path, restaurant: RestaurantProcess, story: Story
) -> dict[str, Any]:
    from pipecat.processors.aggregators.llm_context import LLMContext

    from pipecat_actions.adapters import ActionResultGate, ActionTurnTracker
    from pipecat_actions.testing import (
        BargeIn,
        FakeTransport,
        FakeTTS,
        ScriptedLLM,
        UserSays,
        WaitUntilIdle,
        run_conversation,
    )

    policy = load_policy(policy_path)
    refund_mode = policy["refund_deposit"].confirmation.mode
    await restaurant.admin.set_latency("book", 0.3)
    await restaurant.admin.arm("book", "slow_before_commit", secs=2.5)  # the first booking
    api = RestaurantAPI(restaurant.url)
    runtime = await ActionRuntime.create(
        policy,
        authorizer=AllowAll(),  # demo only: a real deployment checks the principal's rights
        actions=build_actions(api),
        ledger_url=ledger_url,
    )
    session = SessionState(session_id="call-alice", principal="alice", active_agent="host")
    director = Director(runtime, session, story)
    runtime.listen(session.session_id, director.on_outcome)
    llm = ScriptedLLM(script(refund_mode))
    attach(runtime, llm, session)
    context = LLMContext(
        messages=[{"role": "system", "content": "You take restaurant bookings."}],
        tools=tools_schema(runtime),
    )
    steps: list[Any] = [
        UserSays("A table for two at nine tonight, please."),
        BargeIn("Actually, make it half past nine.", after_secs=1.6),
        WaitUntilIdle(quiet_secs=1.0, timeout_secs=30.0),
        UserSays("And please refund the deposit for the nine o'clock booking."),
        WaitUntilIdle(quiet_secs=0.6, timeout_secs=20.0),
    ]
    if refund_mode is ConfirmationMode.VERBAL:
        steps += [UserSays("Yes, please."), WaitUntilIdle(quiet_secs=0.6, timeout_secs=20.0)]
    else:
        director.tasks.append(asyncio.ensure_future(director.manager()))
    steps += [
        UserSays("Thanks. Is there parking nearby?"),
        WaitUntilIdle(quiet_secs=2.0, timeout_secs=30.0),
    ]
    transport = FakeTransport()
    story.begin()
    started = story.started
    following = asyncio.ensure_future(story.follow(runtime, session, transport))
    try:
        result = await run_conversation(
            steps,
            llm=llm,
            tts=FakeTTS(secs_per_char=0.03),
            transport=transport,
            context=context,
            after_user_aggregator=[ActionTurnTracker(session)],
            before_assistant_aggregator=[ActionResultGate(runtime, session)],
            observers=[story.observer()],
            timeout_secs=120.0,
        )
        await asyncio.gather(*director.tasks, return_exceptions=True)
        await runtime.flush()
    finally:
        following.cancel()
        await asyncio.gather(following, return_exceptions=True)
    # What was printed as it happened is complete: the last events, and all that was heard.
    await story.catch_up(runtime, session)
    for index, heard in enumerate(result.heard):
        cut = " [interrupted]" if heard.interrupted else ""
        story.line(f"bot    {heard.text}{cut}", started + heard.started_at_secs, key=f"bot:{index}")
    ops = await runtime.ledger.list()
    trails = {op.operation_id: await runtime.ledger.events(op.operation_id) for op in ops}
    await runtime.close()
    await api.aclose()
    # What the restaurant's own database holds once the call is over.
    held = {
        "bookings": await restaurant.admin.bookings(restaurant_id=RESTAURANT, status="confirmed"),
        "side_effects": (await restaurant.admin.stats())["side_effects"],
    }
    return {
        "started": started,
        "result": result,
        "director": director,
        "restaurant": held,
        "ops": ops,
        "trails": trails,
    }


# --- the crash ------------------------------------------------------------------------------


async def crash_child(ledger_url: str, restaurant_url: str, policy_path: Path) -> None:
    runtime = await ActionRuntime.create(
        load_policy(policy_path),
        authorizer=AllowAll(),
        actions=build_actions(RestaurantAPI(restaurant_url)),
        ledger_url=ledger_url,
        lease_secs=1.0,
        owner="demo-child",
    )
    session = SessionState(session_id="call-bob", principal="bob")
    session.settle_generation(0)  # bob's request was confirmed by a finished turn
    print("ready", flush=True)
    await runtime.propose(
        "book_table",
        {
            "restaurant_id": RESTAURANT,
            "date": DATE,
            "time": "20:00",
            "party_size": 4,
            "guest_name": "Bob",
        },
        session,
    )


async def crash_and_recover(
    ledger_url: str, policy_path: Path, restaurant: RestaurantProcess
) -> dict[str, Any]:
    # The restaurant commits Bob's booking and holds its answer: the bot dies waiting for it.
    await restaurant.admin.arm("book", "slow_after_commit", secs=60.0)
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "bots.demo",
            "--crash-child",
            ledger_url,
            restaurant.url,
            str(policy_path.resolve()),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    try:
        assert child.stdout is not None
        child.stdout.readline()
        deadline = time.time() + 20
        while time.time() < deadline and not await restaurant.admin.bookings(guest_name="Bob"):
            await asyncio.sleep(0.05)
        killed_at = time.time()
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait()
    bot_pid = child.pid
    await asyncio.sleep(1.2)  # the dead owner's lease (1 s) runs out
    api = RestaurantAPI(restaurant.url)
    runtime = await ActionRuntime.create(
        load_policy(policy_path),
        authorizer=AllowAll(),
        actions=build_actions(api),
        ledger_url=ledger_url,
        owner="demo-restart",
    )
    recovered = [op for op in await runtime.ledger.list(OperationFilter(session_id="call-bob"))]
    final = [await runtime.wait(op.operation_id) for op in recovered]
    trails = {op.operation_id: await runtime.ledger.events(op.operation_id) for op in final}
    await runtime.close()
    await api.aclose()
    return {
        "killed_at": killed_at,
        "ops": final,
        "trails": trails,
        "bot_pid": bot_pid,
        "restaurant_pid": restaurant.process.pid,
        "bob": await restaurant.admin.bookings(guest_name="Bob"),
        # What the restaurant's own database holds at the end of the demo, Bob's booking too.
        "restaurant": {
            "bookings": await restaurant.admin.bookings(
                restaurant_id=RESTAURANT, status="confirmed"
            ),
            "side_effects": (await restaurant.admin.stats())["side_effects"],
        },
    }


# --- the report -----------------------------------------------------------------------------


def _short(value: Any, width: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def report(conversation: dict[str, Any], crash: dict[str, Any], out: Any = sys.stdout) -> None:
    """What follows the transcript (printed as it happened): the crash, the ledger, metrics."""
    result = conversation["result"]
    print("\nCRASH AND RECOVERY", file=out)
    print(
        f"  SIGKILL to the bot process (pid {crash['bot_pid']}); the restaurant service "
        f"(pid {crash['restaurant_pid']}) kept running",
        file=out,
    )
    killed = crash["killed_at"]
    for op_id, trail in crash["trails"].items():
        for event in trail:
            print(
                f"  {event.at - killed:+6.2f}s  {op_id[-8:]} {event.kind.value:<13} "
                f"{event.from_status} -> {event.to_status}  by {event.actor}",
                file=out,
            )
    held = [(b["booking_id"], b["time"], b["status"]) for b in crash["bob"]]
    print(f"  the restaurant's own database, for Bob: {held}", file=out)
    ops: Sequence[Operation] = [*conversation["ops"], *crash["ops"]]
    print("\nLEDGER", file=out)
    print(f"  {'operation':<10} {'tool':<24} {'status':<12} {'arguments':<38} result", file=out)
    for op in ops:
        args = {k: v for k, v in op.args.items() if k in ("time", "booking_id", "amount")}
        print(
            f"  {op.operation_id[-8:]:<10} {op.tool:<24} {op.status.value:<12} "
            f"{_short(args, 38):<38} {_short(op.result or op.error or '', 40)}",
            file=out,
        )
    held = crash["restaurant"]  # the end of both parts, as the ledger table above is
    by_status: dict[str, int] = {}
    for op in ops:
        by_status[op.status.value] = by_status.get(op.status.value, 0) + 1
    committed = [o for o in ops if o.committed_at and o.kind == "mutation"]
    print("\nMETRICS", file=out)
    print(f"  operations by status: {json.dumps(by_status, sort_keys=True)}", file=out)
    print(
        "  bookings left at the restaurant: "
        f"{[(b['booking_id'], b['time']) for b in held['bookings']]}",
        file=out,
    )
    print(f"  provider side effects: {held['side_effects']}", file=out)
    if committed:
        spans = sorted((o.committed_at or 0) - o.created_at for o in committed)
        print(
            f"  admission to commit: median {spans[len(spans) // 2]:.2f} s, "
            f"max {spans[-1]:.2f} s over {len(spans)} mutations",
            file=out,
        )
    delivered = [o for o in ops if o.delivered_at]
    print(
        f"  delivered to the conversation: {len(delivered)}; acknowledged: "
        f"{sum(1 for o in ops if o.acknowledged_at)}",
        file=out,
    )
    raw_cancelled = sum(1 for m in result.context_messages if m.get("content") == "CANCELLED")
    print(f"  Pipecat 'CANCELLED' tool results left in the context: {raw_cancelled}", file=out)


def _cli() -> str:
    """How to run ``pipecat-actions`` from here: its name if it is on PATH, else its path."""
    beside = Path(sys.executable).with_name("pipecat-actions")
    if not beside.exists() or shutil.which("pipecat-actions") == str(beside):
        return "pipecat-actions"
    return shlex.quote(str(beside))


def operator_commands(ledger_url: str, ops: Sequence[Operation], out: Any = sys.stdout) -> None:
    """Print the commands that read this demo's ledger, ready to paste."""
    ledger = shlex.quote(ledger_url)
    cli = _cli()
    refund = next((o for o in ops if o.tool == "refund_deposit"), None)
    print(f"\nREAD THIS DEMO'S LEDGER ({ledger_url})", file=out)
    print(f"  {cli} ledger list --ledger {ledger}", file=out)
    if refund is not None:
        print(f"  {cli} ledger show {refund.operation_id} --ledger {ledger}", file=out)
    print(f"  {cli} approvals list --ledger {ledger}", file=out)
    print(f"  {cli} stats --ledger {ledger}", file=out)
    print("  the approvals console in a browser (add an operator once, then serve it):", file=out)
    print(
        f"  {cli} users add rosa --role manager --tenant default --users .pipecat_actions/users",
        file=out,
    )
    print(f"  {cli} console --ledger {ledger} --users .pipecat_actions/users", file=out)


async def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="pipecat_actions offline demo")
    parser.add_argument("--crash-child", nargs=3, metavar=("LEDGER", "RESTAURANT_URL", "POLICY"))
    parser.add_argument("--json", action="store_true", help="print the outcome as JSON too")
    args = parser.parse_args(argv)
    logger.remove()
    if args.crash_child:
        await crash_child(args.crash_child[0], args.crash_child[1], Path(args.crash_child[2]))
        return 0
    policy_path = Path(os.environ.get("POLICY") or DEFAULT_POLICY)
    workdir = Path(".pipecat_actions")
    workdir.mkdir(mode=0o700, exist_ok=True)  # private, as the ledger makes its own directory
    database = (workdir / "demo.db").resolve()
    restaurant_db = (workdir / "demo-restaurant.db").resolve()
    for stale in [*workdir.glob("demo.db*"), *workdir.glob("demo-restaurant.db*")]:
        stale.unlink()
    ledger_url = f"sqlite:///{database}"
    _progress(f"policy {policy_path}, ledger {database}")
    # Stopped when the block ends, on an error or Ctrl-C too; and with this process if it dies.
    with RestaurantProcess.start(restaurant_db) as restaurant:
        _progress(f"restaurant service on {restaurant.url}, its database {restaurant_db}")
        _progress("running the conversation (about 20 seconds of real time)")
        conversation = await converse(ledger_url, policy_path, restaurant, Story())
        _progress("killing the bot process with a booking in flight, then restarting")
        crash = await crash_and_recover(ledger_url, policy_path, restaurant)
    report(conversation, crash)
    operator_commands(ledger_url, [*conversation["ops"], *crash["ops"]])
    if args.json:
        print(
            json.dumps(
                {
                    "ledger": ledger_url,
                    "operations": [
                        {
                            "operation_id": o.operation_id,
                            "tool": o.tool,
                            "status": o.status.value,
                            "args": o.args,
                            "compensates": o.compensates,
                        }
                        for o in [*conversation["ops"], *crash["ops"]]
                    ],
                }
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
