"""A restaurant booking flow on a real `FlowManager`, in a real pipeline, with a scripted model.

`flow_agent` builds the runtime on a SQLite ledger, the booking function on a
`FakeSystemOfRecord` that waits its latency on a `ScriptClock` (a booking is at the provider
until the test advances the clock), and the pipeline (`build_pipeline` with its own
aggregator pair, which `FlowManager` needs). `FlowAgent.converse` runs a conversation script
with the flow initialized once the pipeline started, and records every node the flow entered.

The same story is told by a **configured** flow (`FlowConfig` YAML + Flows direct functions)
and by a flow **built in Python** (``NodeConfig`` dicts with `FlowsFunctionSchema` handlers
that return their next node), so each property is checked on both.
"""

from __future__ import annotations

import asyncio
import json
import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipecat.flows import TRANSITION_IN_YAML, FlowConfig, FlowManager, FlowsFunctionSchema
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair

from pipecat_actions import ActionRuntime, AllowAll, attach
from pipecat_actions.actions import ActionContext, Reconciliation, action_context
from pipecat_actions.adapters import ActionResultGate, ActionTurnTracker
from pipecat_actions.adapters.flows import FlowActions, FunctionHooks
from pipecat_actions.ledger import Operation
from pipecat_actions.session import SessionState
from pipecat_actions.testing import FakeSystemOfRecord
from pipecat_actions.testing.conversation import ConversationResult, Step, run_conversation
from pipecat_actions.testing.llm import ScriptedLLM, ScriptStep
from pipecat_actions.testing.transport import offline_user_params
from pipecat_actions.testing.tts import FakeTTS
from tests._waiting import HANG_GUARD_SECS
from tests.processors._clocked import ScriptClock, until
from tests.runtime._execution_support import new_session, policy

LATENCY = 0.7
"""How long the restaurant takes to commit a booking, on the script's clock (not one of the
runtime's pauses between reconcile checks, so the two are told apart)."""


DEADLINE = 30.0
"""The policy's ``deadline_secs``."""

DETAILS = {"date": "2030-05-01", "time": "21:00", "party_size": 2}

POLICY = """
    version: 1
    defaults:
      deadline_secs: 30
    tools:
      book_table:
        kind: mutation
        idempotency:
          key_fields: [date, time, party_size]
          provider_dedupes: true
        on_interruption: continue
      note_details:
        kind: read
"""


def booking_policy(*settings: str) -> str:
    """`POLICY` with more settings of book_table, one YAML line each (``"mode: blocking"``)."""
    extra = "".join(f"\n        {line}" for line in settings)
    return POLICY.replace("on_interruption: continue", "on_interruption: continue" + extra)


BRANCH = {"field": "status", "cases": {"committed": "confirm", "unknown": "checking"}}
"""The book function's transition in the configured flow: on the runtime's status."""

NODES = ("confirm", "checking", "wait", "try_again", "elsewhere")


def flow_yaml(transition_to: Any = BRANCH) -> str:
    """The configured flow: greet (with book_table) → confirm / checking / wait / try_again."""
    data = {
        "initial_node": "greet",
        "nodes": {
            "greet": {
                "role_message": "You take table bookings for a trattoria.",
                "task_messages": [{"role": "developer", "content": "Ask for the details."}],
                "functions": [
                    {"name": "book_table", "transition_to": transition_to},
                    {
                        "name": "ask_elsewhere",
                        "transition_only": True,
                        "description": "The caller asks about something else.",
                        "transition_to": "elsewhere",
                    },
                ],
            },
            **{
                name: {"task_messages": [{"role": "developer", "content": f"Node {name}."}]}
                for name in NODES
            },
        },
    }
    return json.dumps(data)


@dataclass
class FlowAgent:
    """One flow conversation's parts, and what happened in it."""

    runtime: ActionRuntime
    session: SessionState
    sor: FakeSystemOfRecord
    clock: ScriptClock
    actions: FlowActions
    llm: ScriptedLLM
    context: LLMContext
    pair: LLMContextAggregatorPair
    gate: ActionResultGate
    start: Callable[[FlowManager], Awaitable[None]]
    """Initializes the flow on its manager (the configured or the Python one)."""
    handled: list[str] = field(default_factory=list)
    """Which handler ran for each call, in order (a node's own handler names itself)."""
    manager: FlowManager | None = None
    still_checking: asyncio.Event = field(default_factory=asyncio.Event)
    """While set, the reconcile hook (``reconcile=True``) says "pending"."""
    nodes: list[str] = field(default_factory=list)
    """Every node the flow entered, in order."""
    global_functions: list[Any] = field(default_factory=list)
    """The manager's global functions (a configured flow's ``flow.global_functions``)."""

    async def converse(self, steps: Sequence[Step]) -> ConversationResult:
        """Run ``steps`` with the flow initialized once the pipeline started."""

        async def started(worker: Any) -> None:
            manager = FlowManager(
                worker=worker,
                llm=self.llm,
                context_aggregator=self.pair,
                global_functions=self.global_functions,
            )
            self.manager = manager
            set_node = manager._set_node

            async def entering(node_id: str, node_config: Any) -> None:
                await set_node(node_id, node_config)
                self.nodes.append(node_id)

            manager._set_node = entering  # type: ignore[method-assign]
            self.actions.attach(manager, self.gate)
            await self.start(manager)

        try:
            return await run_conversation(
                steps,
                llm=self.llm,
                tts=FakeTTS(),
                context_aggregator=self.pair,
                after_user_aggregator=[ActionTurnTracker(self.session)],
                before_assistant_aggregator=[self.gate],
                on_started=started,
                timeout_secs=4 * HANG_GUARD_SECS,  # a hang guard for the story, not a bound
            )
        except BaseException:
            # Shown by pytest with the failure: where the story stood.
            print("nodes entered:", self.nodes)
            for message in self.context.get_messages():
                print("context:", json.dumps(message, default=str)[:300])
            raise

    @property
    def node(self) -> str | None:
        """The node the flow is in."""
        return self.manager.current_node if self.manager is not None else None

    def entered(self, node: str) -> Callable[[], Awaitable[None]]:
        """A `Call` step: wait until the flow has entered ``node``."""

        async def wait() -> None:
            await until(lambda: node in self.nodes, what=f"the flow to enter {node}")

        return wait

    def told(self, status: Any, tool: str = "book_table") -> Callable[[], Awaitable[None]]:
        """A `Call` step: wait until ``tool``'s outcome ``status`` is recorded as told."""

        async def wait() -> None:
            op = await self.settled(status, tool=tool)

            async def check() -> bool:
                current = await self.runtime.ledger.get(op.operation_id)
                return current.delivered_status is status

            await until(check, what=f"{tool}'s {status} to be told")

        return wait

    def answers(self) -> Callable[[], Awaitable[None]]:
        """A `Call` step: once the restaurant holds the booking request, let it answer."""

        async def answer() -> None:
            await self.at_the_restaurant()
            self.commit()

        return answer

    async def at_the_restaurant(self, times: int = 1) -> None:
        """Wait until ``times`` booking requests are held by the restaurant (sent, unanswered)."""
        await self.clock.asked(LATENCY, times)

    def commit(self) -> None:
        """Let the restaurant answer the requests it holds."""
        self.clock.advance(LATENCY)

    async def operations(self, tool: str = "book_table") -> list[Operation]:
        """The operations of ``tool`` in the ledger."""
        return [op for op in await self.runtime.ledger.list() if op.tool == tool]

    async def settled(self, *statuses: Any, tool: str = "book_table") -> Operation:
        """Wait until the one operation of ``tool`` is in one of ``statuses``."""
        seen: list[Operation] = []

        async def check() -> bool:
            seen[:] = await self.operations(tool)
            return len(seen) == 1 and seen[0].status in statuses

        await until(check, what=f"{tool} to reach {statuses}")
        return seen[0]

    def bookings(self) -> int:
        """How many bookings the restaurant committed."""
        return int(self.sor.side_effects.get("book", 0))


def _book_with(
    sor: FakeSystemOfRecord, handled: list[str], label: str, own: dict[str, Any] | None = None
) -> Callable[..., Any]:
    """The booking handler; its result is the booking id and the fields of ``own``."""

    async def book(args: dict[str, Any]) -> dict[str, Any]:
        handled.append(label)
        booking = await sor.book(
            "r1",
            str(args["date"]),
            str(args["time"]),
            int(args["party_size"]),
            "Ada",
            idempotency_key=action_context().idempotency_key,  # the operation's own key
        )
        return {"booking_id": booking.booking_id, **(own or {})}

    return book


def configured_start(
    actions: FlowActions,
    sor: FakeSystemOfRecord,
    handled: list[str],
    transition_to: Any,
    own: dict[str, Any] | None = None,
) -> Callable[[FlowManager], Awaitable[None]]:
    """The configured flow: YAML joined to a Flows direct function that books."""
    book = _book_with(sor, handled, "configured", own)

    async def book_table(
        flow_manager: FlowManager, date: str, time: str, party_size: int
    ) -> tuple[dict[str, Any], Any]:
        """Book a table.

        Args:
            date: The day, YYYY-MM-DD.
            time: The time, HH:MM.
            party_size: How many guests.
        """
        result = await book({"date": date, "time": time, "party_size": party_size})
        flow_manager.state["booking"] = result
        return result, TRANSITION_IN_YAML

    flow = actions.flow(
        FlowConfig.from_yaml(flow_yaml(transition_to)), handlers=[{"book_table": book_table}]
    )

    async def start(manager: FlowManager) -> None:
        await manager.initialize(flow.initial_node)

    return start


def python_node(name: str, functions: Sequence[Any] = ()) -> dict[str, Any]:
    """A node built in Python."""
    return {
        "name": name,
        "task_messages": [{"role": "developer", "content": f"Node {name}."}],
        "functions": list(functions),
    }


def python_start(
    sor: FakeSystemOfRecord, handled: list[str]
) -> Callable[[FlowManager], Awaitable[None]]:
    """The flow built in Python: book_table's handler returns (result, the confirm node)."""
    book = _book_with(sor, handled, "python")

    async def book_table(args: dict[str, Any], flow_manager: FlowManager) -> tuple[Any, Any]:
        result = await book(args)
        return result, python_node("confirm")

    schema = FlowsFunctionSchema(
        name="book_table",
        description="Book a table.",
        properties={
            "date": {"type": "string"},
            "time": {"type": "string"},
            "party_size": {"type": "integer"},
        },
        required=["date", "time", "party_size"],
        handler=book_table,
    )

    async def elsewhere(args: dict[str, Any], flow_manager: FlowManager) -> tuple[Any, Any]:
        return None, python_node("elsewhere")

    ask = FlowsFunctionSchema(
        name="ask_elsewhere",
        description="The caller asks about something else.",
        properties={},
        required=[],
        handler=elsewhere,
    )

    async def start(manager: FlowManager) -> None:
        await manager.initialize(python_node("greet", [schema, ask]))

    return start


async def _reconcile(sor: FakeSystemOfRecord, ctx: ActionContext) -> Reconciliation:
    found = sor.find_by_idempotency_key(ctx.idempotency_key)
    if found is None:
        return Reconciliation.not_found()
    return Reconciliation.committed({"booking_id": getattr(found, "booking_id", None)})


@asynccontextmanager
async def flow_agent(
    tmp_path: Path,
    script: Sequence[ScriptStep],
    *,
    kind: str = "configured",
    policy_text: str = POLICY,
    transition_to: Any = BRANCH,
    authorizer: Any = None,
    reconcile: bool = False,
    own: dict[str, Any] | None = None,
) -> AsyncIterator[FlowAgent]:
    """A flow agent (``kind``: ``configured`` or ``python``) whose model follows ``script``.

    ``reconcile``: give book_table a reconcile hook that says "pending" while
    `FlowAgent.still_checking` is set, then what the restaurant holds. The pipeline is the
    cascade template's (tracker after the user aggregator, gate before the assistant
    aggregator; `run_conversation` lays it out), with ``runtime.attach``. ``own``: fields the
    configured flow's handler returns besides the booking id (its own ``status``, say).
    """
    clock = ScriptClock()
    sor = FakeSystemOfRecord(clock=clock)
    sor.add_restaurant("r1", tables=3)
    sor.faults.set_latency(LATENCY)
    loaded = policy(textwrap.dedent(policy_text))
    runtime = await ActionRuntime.create(
        loaded,
        authorizer=authorizer or AllowAll(),
        actions=[],
        routed=loaded.names(),  # every entry is a flow function (or an instrumented handler)
        ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
        clock=clock,
    )
    try:
        session = new_session()
        hooks = {}
        checking = asyncio.Event()
        checking.set()
        if reconcile:

            async def reconciled(ctx: ActionContext) -> Reconciliation:
                if checking.is_set():
                    return Reconciliation.pending()
                return await _reconcile(sor, ctx)

            hooks["book_table"] = FunctionHooks(reconcile=reconciled)
        unmanaged = ["ask_elsewhere"] if kind == "python" else []
        actions = FlowActions(runtime, session, unmanaged=unmanaged, hooks=hooks)
        handled: list[str] = []
        start = (
            configured_start(actions, sor, handled, transition_to, own)
            if kind == "configured"
            else python_start(sor, handled)
        )
        llm = ScriptedLLM(script)
        context = LLMContext()
        pair = LLMContextAggregatorPair(context, user_params=offline_user_params())
        gate = ActionResultGate(runtime, session)
        attach(runtime, llm, session)
        agent = FlowAgent(
            runtime, session, sor, clock, actions, llm, context, pair, gate, start, handled
        )
        agent.still_checking = checking
        yield agent
    finally:
        await runtime.close()


def tool_messages(result: ConversationResult) -> list[dict[str, Any]]:
    """The tool results in the final context, parsed."""
    return [
        json.loads(message["content"])
        for message in result.context_messages
        if message.get("role") == "tool"
    ]


def contents(result: ConversationResult) -> str:
    """The whole final context as text."""
    return json.dumps(result.context_messages, default=str)
