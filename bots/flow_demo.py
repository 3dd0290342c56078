"""The offline flow demo: a restaurant reservation as a Pipecat Flows conversation.

    make demo FLOW=1                # or: .venv/bin/python -m bots.flow_demo

No keys, no network: a real `FlowManager` runs ``configs/flows/restaurant.yaml`` (greet →
collect → book → confirm, with ``checking`` and ``try_again``) in a real Pipecat pipeline
(the real aggregators, `ActionTurnTracker` after the user aggregator and `ActionResultGate`
before the assistant aggregator, as `pipecat_actions.adapters.pipeline.build_pipeline` places
them), a scripted model (`ScriptedLLM`) plays the model's part, a fake voice (`FakeTTS`) is
played in real time by an offline transport, the flow's functions go through `FlowActions` under
``configs/restaurant_flow_policy.yaml``, the ledger is SQLite under ``.pipecat_actions/``, and
the restaurant is the fake system of record. The story:

1. The bot greets Alice; she wants a table; the flow collects her details (``collect_details``,
   a read, writes them into the flow's state) and moves to the book node.
2. The bot books (``book_table``, ``mode: blocking``). The restaurant is slow: the request
   sits there, on the restaurant's own clock, until the demo lets it answer.
3. In the silence Alice asks "are you still there?": her turn interrupts the booking's call.
   Pipecat stops waiting, and the model is told the booking is still running (not
   "CANCELLED"); the flow stays in the book node. The model repeats the booking call (a
   duplicate): it is joined to the booking under way, not sent again.
4. The restaurant commits. The flow reaches ``confirm`` on that truth, and the bot reads the
   reference back. Exactly one booking exists.

It prints a timestamped transcript (user, bot, nodes, tool events), the nodes visited, the
ledger rows with their audit trail, and a final check line; it exits 0 only if the checks hold
(one booking, the flow reached ``confirm``, no ``CANCELLED`` in the model's context).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from loguru import logger

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bots.demo import operator_commands  # noqa: E402
from bots.restaurant import RESTAURANT, new_system_of_record  # noqa: E402
from bots.restaurant_flow import FLOW_POLICY, flow_state, flow_tools, restaurant_flow  # noqa: E402
from pipecat_actions import ActionRuntime, AllowAll, SessionState, attach  # noqa: E402
from pipecat_actions.clock import ManualClock  # noqa: E402
from pipecat_actions.ledger import Operation, OperationEvent  # noqa: E402
from pipecat_actions.status import ActionStatus  # noqa: E402

S = ActionStatus
DATE = "2030-05-01"
DETAILS = {"date": DATE, "time": "21:00", "party_size": 2, "guest_name": "Alice"}
BOOKING = {"restaurant_id": RESTAURANT, **DETAILS}
RESTAURANT_SECS = 8.0
"""How long the restaurant takes to answer a booking, on its own (manual) clock."""


def _progress(text: str) -> None:
    print(f"... {text}", file=sys.stderr, flush=True)


# --- the scripted model --------------------------------------------------------------------


def _reference(messages: list[Any]) -> str:
    """The booking reference in the last tool result or outcome that has one."""
    for message in reversed(messages):
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            found = re.search(r'"booking_id": "(bk_\d+)"', content.replace('\\"', '"'))
            if found:
                return found.group(1)
    return "(no reference)"


def script() -> list[Any]:
    """The model's side of the story, one step per inference (see the module docstring)."""
    from pipecat_actions.testing import Say, ToolCalls

    def confirm(messages: list[Any]) -> Any:
        return Say(
            f"You're all set: a table for two tonight at nine, reference {_reference(messages)}. "
            "Goodbye!"
        )

    return [
        # greet
        Say("Good evening, Trattoria. How can I help?"),
        ToolCalls([("wants_table", {})]),
        # collect
        Say("Gladly. For how many, at what time, and under which name?"),
        ToolCalls([("collect_details", DETAILS)]),
        # book: the booking starts once this reply has been spoken (admit_when: turn_confirmed)
        ToolCalls([("book_table", BOOKING)], say="Lovely, I'm booking that now."),
        # Alice's "are you still there?": the result says running; the model repeats the call
        ToolCalls(
            [("book_table", BOOKING)],
            say="Yes, I'm here. The restaurant is still confirming your table.",
        ),
        # confirm, once the restaurant has answered
        confirm,
    ]


# --- watching the flow ---------------------------------------------------------------------


@dataclass
class Nodes:
    """The nodes the flow entered, in order, with the time each was first seen."""

    manager: Any = None
    visited: list[tuple[float, str]] = field(default_factory=list)

    def look(self) -> None:
        node = self.manager.current_node if self.manager is not None else None
        if node is not None and (not self.visited or self.visited[-1][1] != node):
            self.visited.append((time.time(), node))

    @property
    def names(self) -> list[str]:
        return [name for _, name in self.visited]


def _node_observer(nodes: Nodes) -> Any:
    """An observer that notes the flow's node on every frame (a node change pushes frames)."""
    from pipecat.observers.base_observer import BaseObserver, FramePushed

    class NodeObserver(BaseObserver):
        async def on_push_frame(self, data: FramePushed) -> None:
            nodes.look()

    return NodeObserver()


# --- the conversation ----------------------------------------------------------------------


async def _until(check: Any, what: str, timeout_secs: float = 20.0) -> None:
    """Poll ``check`` until it is true (a cause, not a duration: the bound only stops a hang)."""
    async with asyncio.timeout(timeout_secs):
        while not check():
            await asyncio.sleep(0.02)
    del what


async def converse(ledger_url: str, policy_path: Path = FLOW_POLICY) -> dict[str, Any]:
    """Run the story; return what was heard, the context, the nodes, the ledger and the checks."""
    from pipecat.flows import FlowManager
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair

    from pipecat_actions.adapters import ActionResultGate, ActionTurnTracker
    from pipecat_actions.adapters.pipeline import check_placement
    from pipecat_actions.testing import (
        Call,
        FakeTransport,
        FakeTTS,
        ScriptedLLM,
        Step,
        UserSays,
        Wait,
        WaitUntilIdle,
        offline_user_params,
        run_conversation,
    )

    restaurant_clock = ManualClock()  # the restaurant answers when the story lets it
    sor = new_system_of_record(clock=restaurant_clock)
    sor.faults.set_latency(RESTAURANT_SECS, kind="book")
    runtime = await ActionRuntime.create(
        policy_path,
        authorizer=AllowAll(),  # demo only: a real deployment checks the principal's rights
        actions=[],  # the flow's functions are registered by FlowActions, node by node
        routed=flow_tools(),
        ledger_url=ledger_url,
    )
    events: list[tuple[float, str]] = []
    try:
        session = SessionState(session_id="flow-alice", principal="alice")
        actions, flow = restaurant_flow(runtime, session, sor)
        llm = ScriptedLLM(script())
        context = LLMContext()
        pair = LLMContextAggregatorPair(context, user_params=offline_user_params())
        # What build_pipeline does for the tracker and the gate, in the layout run_conversation
        # builds (transport.input → user_agg → tracker → llm → tts → transport.output → gate
        # → assistant_agg); the RTVI status reporter is left out (there is no client).
        attach(runtime, llm, session)
        tracker, gate = ActionTurnTracker(session), ActionResultGate(runtime, session)
        transport = FakeTransport()
        tts = FakeTTS(secs_per_char=0.02)
        check_placement(
            [
                transport.input(),
                pair.user(),
                tracker,
                llm,
                tts,
                transport.output(),
                gate,
                pair.assistant(),
            ]
        )
        nodes = Nodes()

        async def started(worker: Any) -> None:
            manager = FlowManager(
                worker=worker,
                llm=llm,
                context_aggregator=pair,
                global_functions=flow.global_functions,
            )
            nodes.manager = manager
            actions.attach(manager, gate)
            manager.state.update(flow_state(DATE))
            await manager.initialize(flow.initial_node)
            nodes.look()

        async def at_the_restaurant() -> None:
            await _until(lambda: sor.calls["book"] >= 1, "the booking at the restaurant")
            events.append((time.time(), "restaurant: the booking request arrived; no answer yet"))

        async def restaurant_answers() -> None:
            events.append(
                (time.time(), f"restaurant: answers, {RESTAURANT_SECS:.0f} s later on its clock")
            )
            restaurant_clock.advance(RESTAURANT_SECS)

        steps: list[Step] = [
            WaitUntilIdle(quiet_secs=0.3),
            UserSays("Hi, I'd like to book a table for tonight."),
            WaitUntilIdle(quiet_secs=0.3),
            UserSays("Two of us at nine, under Alice."),
            Call(at_the_restaurant),
            Wait(0.8),  # silence on the line while the restaurant thinks
            UserSays("Hello? Are you still there?"),
            WaitUntilIdle(quiet_secs=0.5, function_calls=False),
            Call(restaurant_answers),
            WaitUntilIdle(quiet_secs=1.0, timeout_secs=20.0),
        ]
        began = time.time()
        result = await run_conversation(
            steps,
            llm=llm,
            tts=tts,
            transport=transport,
            context_aggregator=pair,
            after_user_aggregator=[tracker],
            before_assistant_aggregator=[gate],
            observers=[_node_observer(nodes)],
            on_started=started,
            timeout_secs=60.0,
        )
        nodes.look()
        await runtime.flush()
        ops = await runtime.ledger.list()
        trails = {op.operation_id: await runtime.ledger.events(op.operation_id) for op in ops}
    finally:
        await runtime.close()
    outcome = {
        "began": began,
        "result": result,
        "nodes": nodes,
        "events": events,
        "sor": sor,
        "ops": ops,
        "trails": trails,
    }
    outcome["checks"] = checks(outcome)
    return outcome


# --- the checks and the report -------------------------------------------------------------


def _book_calls(messages: list[Any]) -> list[str]:
    """The ids of the book_table calls the model made, in order."""
    return [
        call["id"]
        for message in messages
        for call in (message.get("tool_calls") or [] if isinstance(message, dict) else [])
        if call.get("function", {}).get("name") == "book_table"
    ]


def _first_book_result(messages: list[Any]) -> dict[str, Any]:
    calls = _book_calls(messages)
    for message in messages:
        if message.get("role") == "tool" and calls and message.get("tool_call_id") == calls[0]:
            try:
                return dict(json.loads(message["content"]))
            except (TypeError, ValueError):
                return {}
    return {}


def checks(outcome: dict[str, Any]) -> dict[str, bool]:
    """What must hold for the story to be told truthfully."""
    messages = outcome["result"].context_messages
    sor = outcome["sor"]
    bookings = [op for op in outcome["ops"] if op.tool == "book_table"]
    names = outcome["nodes"].names
    return {
        "one booking at the restaurant": (
            sor.side_effects.get("book", 0) == 1
            and len(sor.bookings(RESTAURANT, status="confirmed")) == 1
        ),
        "one booking operation, committed": [op.status for op in bookings] == [S.COMMITTED],
        "the duplicate call was joined": len(_book_calls(messages)) == 2
        and sum(_joined(outcome["trails"].get(op.operation_id, [])) for op in bookings) >= 1,
        "the barge-in was told running": _first_book_result(messages).get("status") == "running",
        "reached confirm": bool(names) and names[-1] == "confirm",
        "no CANCELLED in the context": "CANCELLED" not in json.dumps(messages, default=str),
        "the commit told once": _times_told_committed(messages, bookings) == 1,
    }


def _times_told_committed(messages: Sequence[Any], bookings: Sequence[Operation]) -> int:
    """How many messages told the model the booking committed (a call's result or a late one)."""
    ids = {op.operation_id for op in bookings}
    told = 0
    for message in messages:
        content = message.get("content") if isinstance(message, dict) else None
        if message.get("role") not in ("tool", "developer") or not isinstance(content, str):
            continue
        start = content.find("{")
        try:
            said = json.loads(content[start:]) if start >= 0 else None
        except ValueError:
            continue
        if isinstance(said, dict) and said.get("status") == "committed":
            told += said.get("operation_id") in ids
    return told


def _joined(trail: Sequence[OperationEvent]) -> int:
    from pipecat_actions.ledger.records import joined_calls

    total = 0
    for event in trail:
        try:
            detail = json.loads(event.detail_json or "{}")
        except ValueError:
            continue
        total += joined_calls(detail) if isinstance(detail, dict) else 0
    return total


def _short(value: Any, width: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= width else text[: width - 1] + "…"


def report(outcome: dict[str, Any], out: Any = sys.stdout) -> None:
    """Print the transcript, the nodes, the ledger and the checks."""
    from pipecat.frames.frames import TranscriptionFrame

    began, result = outcome["began"], outcome["result"]
    lines: list[tuple[float, str]] = []
    for observed in result.frames:
        if isinstance(observed.frame, TranscriptionFrame):
            lines.append((began + observed.at_secs, f"user   {observed.frame.text}"))
    for heard in result.heard:
        cut = " [interrupted]" if heard.interrupted else ""
        lines.append((began + heard.started_at_secs, f"bot    {heard.text}{cut}"))
    for at, node in outcome["nodes"].visited:
        lines.append((at, f"node   -> {node}"))
    lines += [(at, f"app    {text}") for at, text in outcome["events"]]
    ops: list[Operation] = outcome["ops"]
    for op in ops:
        for event in outcome["trails"][op.operation_id]:
            if event.kind.value in ("created", "transition"):
                what = f"{event.from_status} -> {event.to_status}"
            elif _joined([event]):
                what = "a duplicate call joined it"
            elif "delivered" in (event.detail_json or ""):
                what = "delivered to the conversation"
            else:
                continue
            lines.append((event.at, f"tool   {op.tool:<16} {op.operation_id[-8:]} {what}"))
    print("TRANSCRIPT (seconds since the call started)", file=out)
    seen: set[tuple[float, str]] = set()
    for at, text in sorted(lines, key=lambda line: round(line[0], 2)):
        if (at, text) not in seen:
            seen.add((at, text))
            print(f"  {at - began:6.2f}  {text}", file=out)

    print("\nNODES VISITED", file=out)
    print(f"  {' -> '.join(outcome['nodes'].names)}", file=out)

    print("\nLEDGER", file=out)
    print(f"  {'operation':<10} {'tool':<16} {'status':<10} {'arguments':<40} result", file=out)
    for op in ops:
        args = {k: v for k, v in op.args.items() if k in ("date", "time", "party_size")}
        print(
            f"  {op.operation_id[-8:]:<10} {op.tool:<16} {op.status.value:<10} "
            f"{_short(args, 40):<40} {_short(op.result or op.error or '', 40)}",
            file=out,
        )
        for event in outcome["trails"][op.operation_id]:
            print(
                f"  {'':<10}   {event.at - began:+6.2f}s {event.kind.value:<11} "
                f"{event.from_status} -> {event.to_status} by {event.actor}",
                file=out,
            )
    sor = outcome["sor"]
    confirmed = sor.bookings(RESTAURANT, status="confirmed")
    print("\nRESTAURANT", file=out)
    print(f"  bookings: {[(b.booking_id, b.time, b.guest) for b in confirmed]}", file=out)
    print(f"  provider side effects: {dict(sor.side_effects)}", file=out)

    results = outcome["checks"]
    verdict = "OK" if all(results.values()) else "FAILED"
    detail = "; ".join(f"{name}: {'yes' if ok else 'NO'}" for name, ok in results.items())
    print(f"\nCHECK {verdict}: {detail}", file=out)


async def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="pipecat_actions offline flow demo")
    parser.add_argument("--json", action="store_true", help="print the outcome as JSON too")
    args = parser.parse_args(argv)
    logger.remove()
    workdir = Path(".pipecat_actions")
    workdir.mkdir(mode=0o700, exist_ok=True)
    database = (workdir / "flow_demo.db").resolve()
    for stale in workdir.glob("flow_demo.db*"):
        stale.unlink()
    ledger_url = f"sqlite:///{database}"
    _progress(f"flow configs/flows/restaurant.yaml, policy {FLOW_POLICY.name}, ledger {database}")
    _progress("running the conversation (about 15 seconds of real time)")
    outcome = await converse(ledger_url)
    report(outcome)
    operator_commands(ledger_url, outcome["ops"])
    if args.json:
        print(
            json.dumps(
                {
                    "ledger": ledger_url,
                    "nodes": outcome["nodes"].names,
                    "checks": outcome["checks"],
                    "bookings": outcome["sor"].side_effects.get("book", 0),
                    "operations": [
                        {
                            "operation_id": o.operation_id,
                            "tool": o.tool,
                            "status": o.status.value,
                            "args": o.args,
                        }
                        for o in outcome["ops"]
                    ],
                }
            )
        )
    return 0 if all(outcome["checks"].values()) else 1


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main()))
