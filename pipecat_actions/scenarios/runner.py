"""Running a scenario: a real Pipecat pipeline, the runtime, the processors and a fake provider.

Each scenario gets its own ledger (a SQLite file in a temporary directory unless a URL is
given), its own `FakeSystemOfRecord` and a `ManualClock` shared by the runtime and the
provider. A scenario whose policy has ``execution: durable`` tools runs on PostgreSQL only,
its bot a DBOS client and a DBOS worker in the same process
(`pipecat_actions.scenarios.durable`). The conversation is played by `run_conversation` with
`ScriptedLLM`, `FakeTTS` and the offline transport; ``crash`` and ``reconnect`` steps end one
pipeline and start the next on the same session. What happened is gathered into a `Run` for
the expectations (`pipecat_actions.scenarios.checks`).
"""

from __future__ import annotations

__all__ = [
    "Run",
    "ScenarioApp",
    "ScenarioWorld",
    "StepFailed",
    "TimelineEntry",
    "check_app",
    "run_loaded",
]

import asyncio
import contextlib
import difflib
import io
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipecat.processors.aggregators.llm_context import LLMContext

from pipecat_actions.actions import ActionDefinition
from pipecat_actions.adapters import ActionResultGate, ActionTurnTracker
from pipecat_actions.adapters.handlers import attach
from pipecat_actions.adapters.tools import tools_schema
from pipecat_actions.admission.authorization import AllowAll, Authorizer
from pipecat_actions.approvals import Approver
from pipecat_actions.clock import ManualClock
from pipecat_actions.durable import DURABLE_OWNER, DurableLedger, workflow_id_for
from pipecat_actions.errors import OperationNotFound, PolicyProblem
from pipecat_actions.ledger import Ledger, Operation, OperationEvent, OperationFilter, SqlLedger
from pipecat_actions.ledger.keys import LedgerKeys
from pipecat_actions.operator import OperatorApp
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.scenarios.durable import (
    database_of_its_own,
    prepare_database,
    refuse_on_sqlite,
)
from pipecat_actions.scenarios.faults import FaultLayer
from pipecat_actions.scenarios.loader import LoadedScenario, ScenarioError, flat_steps
from pipecat_actions.scenarios.model import (
    STEP_KINDS,
    AdvanceStep,
    ApproveStep,
    BargeInStep,
    CallerStep,
    CompensateStep,
    CrashStep,
    FaultStep,
    HandoffStep,
    HangUpStep,
    IdleStep,
    LlmStep,
    ReconnectStep,
    RejectStep,
    ReleaseHungStep,
    Step,
    TogetherStep,
    UntilStep,
    UserStep,
    WaitStep,
)
from pipecat_actions.scenarios.script import model_script
from pipecat_actions.scenarios.timeline import (
    DeliveryWatch,
    TimelineEntry,
    TimelineLedger,
    told_outcomes,
)
from pipecat_actions.session import SessionState
from pipecat_actions.status import TERMINAL_STATUSES, ActionStatus
from pipecat_actions.testing import (
    BargeIn,
    Call,
    FakeSystemOfRecord,
    FakeTransport,
    FakeTTS,
    HeardUtterance,
    ScriptedLLM,
    UserSays,
    Wait,
    WaitUntilIdle,
    run_conversation,
)
from pipecat_actions.testing import Step as ConversationStep
from pipecat_actions.testing.restaurant import build_actions

S = ActionStatus
_ADVANCE_SLICE_SECS = 0.25
"""`advance` moves the clock in slices this long, letting work settle between them."""
_SETTLE_TURNS = 20
"""Event-loop turns without a ledger call or a new clock sleeper that make the runtime's work
settled: between two ledger calls (the runtime's only real I/O here) its work takes a few
turns of plain asyncio hops, however long a turn takes on a busy machine."""
_SETTLE_HANG_SECS = 60.0
"""Bound on one settle: work that never stops calling the ledger is a hang, not load."""
_HANG_GUARD_SECS = 60.0
"""How long a wait of the story's order (`_Scene.calls_made`) lasts before it is called stuck:
a hang guard, never a budget a healthy story has to meet."""
_WORKER_POLLING_SECS = 0.1
"""How often the in-process DBOS worker polls its queues (real seconds)."""
_WORKER_DRAIN_SECS = 10
"""How long, at the end, the in-process worker waits for its workflows to end, so that none
of their threads runs a step on the next scenario's worker (a hang guard: the run's open
workflows are cancelled first, and a cancelled one ends at its next look, within seconds)."""


@dataclass
class Run:
    """What a scenario run produced, for the expectations and the report.

    Attributes:
        operations: The session's operations at the end (and their compensations).
        events: Each operation's audit trail.
        labels: Call label -> operation id (for labelled calls that reached the runtime).
        heard: What the user heard, over every pipeline, in order.
        context: The LLM context messages at the end.
        side_effects: Committed provider mutations by kind.
        effects_by_key: Committed provider mutations by idempotency key.
        script_left: llm steps no inference used.
        unresolved: ``from_context`` / ``from_call`` arguments that found no value.
        timeline: Steps, ledger writes and utterances in the order they happened.
        error: Why the run stopped early, if it did.
    """

    operations: list[Operation] = field(default_factory=list)
    events: dict[str, list[OperationEvent]] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    heard: list[HeardUtterance] = field(default_factory=list)
    context: list[Any] = field(default_factory=list)
    side_effects: dict[str, int] = field(default_factory=dict)
    effects_by_key: dict[str, int] = field(default_factory=dict)
    script_left: int = 0
    unresolved: list[str] = field(default_factory=list)
    timeline: list[TimelineEntry] = field(default_factory=list)
    error: str | None = None
    requests: dict[str, int] = field(default_factory=dict)
    """Requests that reached each effect or hook (``tool`` or ``tool.hook``)."""


@dataclass(frozen=True)
class ScenarioWorld:
    """What a version-2 app factory is given to build the scenario's world.

    Attributes:
        clock: The scenario's manual clock: the runtime's, and the one a fake system of
            record should wait on, so ``advance`` moves both.
        seed: The file's ``seed`` mapping: records the system of record holds at the start.
        restaurant: The built-in fake restaurant, set up from the file's ``provider``; an app
            with its own system of record ignores it.
    """

    clock: ManualClock
    seed: Mapping[str, Any]
    restaurant: FakeSystemOfRecord


@dataclass(frozen=True)
class ScenarioApp:
    """A version-2 app: its actions and, optionally, what its system of record committed.

    Attributes:
        actions: The actions (the scenario's policy picks which exist in the story).
        effects: Committed side effects by kind, for ``expect.side_effects``.
        effects_for_key: Committed side effects under one idempotency key, for
            ``expect.max_effects_per_key``.
        authorizer: What each caller may do (``caller`` steps); None allows everything.
    """

    actions: Sequence[ActionDefinition]
    effects: Callable[[], Mapping[str, int]] | None = None
    effects_for_key: Callable[[str], int] | None = None
    authorizer: Authorizer | None = None


class _Crash(Exception):
    """Raised by a crash step to cut the pipeline."""


class _Reconnect(Exception):
    """Raised by a reconnect step to cut the pipeline."""


class _HangUp(Exception):
    """Raised by a hang-up step to end the pipeline (the runtime goes on)."""


def _build_app(loaded: LoadedScenario, sor: FakeSystemOfRecord, clock: ManualClock) -> ScenarioApp:
    """The scenario's app: the restaurant on ``sor``, or the file's factory's.

    Raises:
        ScenarioError: The factory raised, returned something that is not actions, or has
            no action for a tool the scenario's policy names (one line, nothing run).
    """
    if loaded.factory is None:
        return _covering(loaded, ScenarioApp(build_actions(sor)))
    try:
        if loaded.spec.version == 1:
            built: Any = loaded.factory(sor)
        else:
            built = loaded.factory(ScenarioWorld(clock, dict(loaded.spec.seed), sor))
    except Exception as exc:  # whatever the team's factory raised: the app cannot be built
        raise _app_problem(loaded, f"cannot be built: {type(exc).__name__}: {exc}") from None
    if isinstance(built, ScenarioApp):
        return _covering(loaded, built)
    if isinstance(built, Sequence) and all(isinstance(a, ActionDefinition) for a in built):
        return _covering(loaded, ScenarioApp(built))
    raise _app_problem(
        loaded,
        f"returned {type(built).__name__}: return a list of actions (@action) or a ScenarioApp",
    )


def _covering(loaded: LoadedScenario, app: ScenarioApp) -> ScenarioApp:
    """``app``, when it has an action for every tool of the scenario's policy."""
    names = [a.name for a in app.actions]
    missing = [name for name in loaded.policy if name not in names]
    if not missing:
        return app
    named = []
    for name in missing:
        close = difflib.get_close_matches(name, names, n=1)
        named.append(f"{name} (did you mean {close[0]}?)" if close else name)
    raise ScenarioError(
        [
            PolicyProblem(
                loaded.source,
                "policy",
                f"names tools the app {loaded.spec.app!r} has no action for: "
                f"{', '.join(named)} (its actions: {', '.join(sorted(names)) or 'none'})",
            )
        ]
    )


def _app_problem(loaded: LoadedScenario, why: str) -> ScenarioError:
    return ScenarioError([PolicyProblem(loaded.source, "app", f"{loaded.spec.app!r} {why}")])


def check_app(loaded: LoadedScenario) -> None:
    """Build the scenario's app once on a world of its own, as a run would, and discard it.

    Lets a command or a test runner refuse a scenario whose app cannot be built before
    anything runs (the factory is called again, on a fresh world, for the run itself).

    Raises:
        ScenarioError: The factory raised or returned something that is not actions, or the
            policy names a tool the app has no action for; one line, naming the file.
    """
    clock = ManualClock(time.time())
    _build_app(loaded, _new_provider(loaded, clock), clock)


def _new_provider(loaded: LoadedScenario, clock: ManualClock) -> FakeSystemOfRecord:
    setup = loaded.spec.provider
    sor = FakeSystemOfRecord(clock=clock, honours_idempotency_keys=setup.honours_idempotency_keys)
    for restaurant, tables in setup.restaurants.items():
        sor.add_restaurant(restaurant, tables=tables)
    for payment in setup.payments:
        sor.add_payment(payment.payment_id, payment.amount_cents, payment.principal)
    for kind, secs in setup.latency.items():
        sor.faults.set_latency(secs, kind=kind)
    return sor


class StepFailed(Exception):
    """A scenario step did not do what it says (an approval refused, ...): ``file:line: why``."""


class _Scene:
    """The world of one scenario run: clock, provider, ledger, runtime, session, pipeline."""

    def __init__(
        self, loaded: LoadedScenario, ledger_url: str, run: Run, *, durable: bool = False
    ) -> None:
        self.loaded = loaded
        self.spec = loaded.spec
        self.ledger_url = ledger_url
        self.run = run
        self.durable = durable
        """The policy has durable tools: the bot is a DBOS client, a worker runs them."""
        # A scenario's ledger is its own, thrown away after it: a policy that marks values
        # sensitive seals them with the environment's keys, or with keys made for this run.
        configured = LedgerKeys.from_environment()
        self.ledger_keys = (
            configured
            if configured.can_encrypt and configured.hash_key is not None
            else LedgerKeys.fresh()
        )
        self.clock = ManualClock(time.time())
        self.sor = _new_provider(loaded, self.clock)
        self.app = _build_app(loaded, self.sor, self.clock)
        self.faults = FaultLayer(self.clock)
        # The scenario's policy picks which of the app's tools exist in this story.
        self.actions = self.faults.wrap([a for a in self.app.actions if a.name in loaded.policy])
        self.script = model_script(loaded, self.run.unresolved)
        self.script_steps = len(self.script)
        self.calls_before = _calls_before(loaded.steps)
        """Per step: how many of the model's steps come first, up to its last one with calls."""
        self.llm: ScriptedLLM | None = None
        self.emitted: list[str] = []
        """Every call the models of this story made, pipeline after pipeline."""
        self.answered: set[str] = set()
        self.runtime: ActionRuntime | None = None
        self.ledger: TimelineLedger | None = None
        self.run_id = uuid.uuid4().hex[:8]
        setup = self.spec.session
        self.callers: dict[str, tuple[SessionState, LLMContext]] = {}
        self.session, self.context = self._caller(setup.principal, setup.session_id, setup.agent)
        self.gate: ActionResultGate | None = None
        self.generation = 0
        self.background: list[asyncio.Future[None]] = []
        self.step_keys = {id(step): key for key, step in flat_steps(loaded.steps)}
        """Each step's key path (``steps[3]``), for `StepFailed` to name its line."""

    def failed(self, step: Step, what: str) -> StepFailed:
        """The step at its file and line did not do what it says: the run stops there."""
        key = self.step_keys.get(id(step), "")
        return StepFailed(f"{self.loaded.where(key)}: {_describe(step)}: {what}")

    def _caller(
        self, principal: str, session_id: str | None, agent: str | None
    ) -> tuple[SessionState, LLMContext]:
        """The session and context of ``principal``, the same each time they are asked for."""
        if principal not in self.callers:
            # Suffixed per run, so runs sharing a database neither see nor join each other's
            # work.
            session = SessionState(
                session_id=f"{session_id or 'call-' + principal}-{self.run_id}",
                principal=principal,
                tenant=f"{self.spec.session.tenant}-{self.run_id}",
                active_agent=agent,
            )
            self.callers[principal] = (session, self._new_context())
        return self.callers[principal]

    def _restarted(self) -> None:
        """After a crash: every caller's session anew (same ids), their contexts empty."""
        current = self.session.principal
        old = dict(self.callers)
        self.callers.clear()
        for principal, (session, _) in old.items():
            self.callers[principal] = (
                SessionState(
                    session_id=session.session_id,
                    principal=principal,
                    tenant=session.tenant,
                    active_agent=self.spec.session.agent
                    if principal == self.spec.session.principal
                    else session.active_agent,
                ),
                self._new_context(),
            )
        self.session, self.context = self.callers[current]

    @property
    def session_ids(self) -> list[str]:
        """Every caller's session."""
        return [session.session_id for session, _ in self.callers.values()]

    def _new_context(self) -> LLMContext:
        return LLMContext(messages=[{"role": "system", "content": self.spec.system_prompt}])

    async def open_runtime(self, *, recover: bool) -> None:
        self.generation += 1
        stored: Ledger = await SqlLedger.create(self.ledger_url, clock=self.clock)
        if self.durable:
            assert isinstance(stored, SqlLedger)
            stored = await DurableLedger.open(self.ledger_url, self.loaded.policy, ledger=stored)
        self.ledger = TimelineLedger(stored, self.run.timeline)
        self.runtime = await ActionRuntime.create(
            self.loaded.policy,
            authorizer=self.app.authorizer or AllowAll(),
            actions=self.actions,
            ledger=self.ledger,
            clock=self.clock,
            owner=f"scenario-process-{self.generation}",
            lease_secs=self.spec.lease_secs,
            recover=recover,
            ledger_keys=self.ledger_keys,
        )

    async def close_runtime(self, *, grace_secs: float) -> None:
        if self.runtime is not None:
            await self.runtime.close(grace_secs=grace_secs)
        if self.ledger is not None:
            await self.ledger.close()
        self.runtime = self.ledger = None

    @contextlib.asynccontextmanager
    async def worker(self) -> AsyncIterator[None]:
        """A DBOS worker in this process for the story's durable tools, as a host would run.

        It runs the scenario's own actions (the fault layer and the fake system of record
        included) on the scenario's manual clock, so ``fault``, ``advance`` and the counts of
        effects hold for durable tools as for in-call ones. What it finishes is noted on the
        timeline (``worker: op_… tool: STATUS``).
        """
        from pipecat_actions.dbos_worker import dbos_worker

        app = OperatorApp(
            policy=self.loaded.policy,
            actions=self.actions,
            authorizer=self.app.authorizer or AllowAll(),
        )
        async with dbos_worker(
            app,
            ledger_url=self.ledger_url,
            out=_TimelineLines(self),
            executor_id=f"scenario-{self.run_id}",
            polling_secs=_WORKER_POLLING_SECS,
            clock=self.clock,
            drain_secs=_WORKER_DRAIN_SECS,
            ledger_keys=self.ledger_keys,
            seen_through=lambda stored: TimelineLedger(stored, self.run.timeline),
        ):
            self.note("a DBOS worker runs the durable tools in this process")
            yield

    async def cancel_open_workflows(self) -> None:
        """Cancel the workflows of the run's operations that are still open (ledger untouched).

        The story is over: a workflow left waiting for a decision or queued must not be run
        by a later worker on the same database, nor keep a thread of this one.
        """
        ledger = self.ledger
        found = ledger.inner if ledger is not None else None
        if not isinstance(found, DurableLedger):
            return
        client = found.client
        for op in self.run.operations:
            if op.lease_owner == DURABLE_OWNER and op.status not in TERMINAL_STATUSES:
                await asyncio.to_thread(client.cancel_workflow, workflow_id_for(op.operation_id))

    # --- steps -----------------------------------------------------------------------------

    def note(self, what: str) -> None:
        self.run.timeline.append(TimelineEntry(time.monotonic(), what))

    async def op_id(self, label: str, timeout_secs: float = 60.0) -> str:
        """The operation of a labelled call, waiting for the call to reach the runtime."""
        call_id = f"call_{label}"
        deadline = time.monotonic() + timeout_secs
        while True:
            found = self.run.labels.get(label)
            if found is None and self.runtime is not None:
                # A read is known to the runtime's calls only once answered; its effect sooner.
                found = self.runtime.operation_for_call(call_id) or self.faults.started.get(call_id)
                for session_id in self.session_ids if found is None else []:
                    ops = await self.runtime.ledger.list(OperationFilter(session_id=session_id))
                    found = next(
                        (o.operation_id for o in ops if o.provider_call_id == call_id), None
                    )
                    if found is not None:
                        break
            if found is not None:
                self.run.labels[label] = found
                return found
            if time.monotonic() > deadline:
                raise TimeoutError(f"the call labelled {label!r} never reached the runtime")
            await asyncio.sleep(0.02)

    def translate(self, index: int, step: Step) -> list[ConversationStep]:
        """The conversation steps that play one scenario step (see `_PLAYED`, `_WORLD`)."""
        played = _PLAYED.get(type(step))
        if played is not None:
            return played(self, index, step)
        world = _WORLD.get(type(step))
        if world is None:
            return []  # llm steps are the model's script
        return self.noted(index, step, lambda: world(self, index, step))

    def noted(
        self, index: int, step: Step, fn: Callable[[], Awaitable[None]]
    ) -> list[ConversationStep]:
        """``fn`` as a conversation step that first notes the story's step in the timeline."""

        async def noted() -> None:
            self.note(f"step {index + 1}: {_describe(step)}")
            await fn()

        return [Call(noted)]

    def user(self, index: int, step: UserStep) -> list[ConversationStep]:
        return [
            *self.noted(index, step, _nothing),
            UserSays(step.text, speech_secs=step.speech_secs),
        ]

    def barge_in(self, index: int, step: BargeInStep) -> list[ConversationStep]:
        if step.op is not None:
            assert step.text is not None  # the model refuses a timed barge-in without words
            return [
                *self.noted(index, step, lambda: self.reached(step)),
                Wait(step.after_secs),
                UserSays(step.text, speech_secs=step.speech_secs),
            ]
        return [
            *self.noted(index, step, _nothing),
            BargeIn(
                step.text,
                after_secs=step.after_secs,
                speech_secs=step.speech_secs,
                timeout_secs=step.timeout_secs,
            ),
        ]

    def idle(self, index: int, step: IdleStep) -> list[ConversationStep]:
        # Quiet means the ledger too: an outcome written just now is about to be told.
        idle = WaitUntilIdle(
            quiet_secs=step.quiet_secs, timeout_secs=step.timeout_secs, function_calls=step.calls
        )
        return [idle, Call(lambda: self.ledger_quiet(step)), idle]

    def together(self, index: int, step: TogetherStep) -> list[ConversationStep]:
        """The world's steps start at once in the background; the user's runs meanwhile."""
        started: list[asyncio.Future[None]] = []
        world: list[Callable[[], Awaitable[None]]] = []
        user: list[ConversationStep] = []
        for member in step.steps:
            translated = self.translate(index, member)
            if isinstance(member, UserStep | BargeInStep):
                user.extend(translated)
                continue
            world.extend(_as_calls(translated))

        async def start() -> None:
            self.note(f"step {index + 1}: together")
            started.extend(asyncio.ensure_future(fn()) for fn in world)

        async def join() -> None:
            await asyncio.gather(*started)

        return [Call(start), *user, Call(join)]

    async def reached(self, step: BargeInStep) -> None:
        """Wait until the labelled call's operation was admitted (or ran) as ``step.at`` says."""
        assert step.op is not None
        wanted = S.RUNNING if step.at == "running" else S.ADMITTED
        op_id = await self.op_id(step.op, step.timeout_secs)
        deadline = time.monotonic() + step.timeout_secs
        while True:
            assert self.runtime is not None
            events = await self.runtime.ledger.events(op_id)
            if any(e.to_status is wanted for e in events) or self._read_running(op_id, events):
                return
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{step.op} ({op_id}) was never {wanted.value} in {step.timeout_secs}s"
                )
            await asyncio.sleep(0.01)

    def _read_running(self, op_id: str, events: Sequence[OperationEvent]) -> bool:
        """Whether ``op_id`` is a read whose effect was called and whose row is not written."""
        return not events and op_id in self.faults.started.values()

    async def ledger_quiet(self, step: IdleStep) -> None:
        await self.settle()
        deadline = time.monotonic() + step.timeout_secs
        while True:
            last = max((e.at for e in self.run.timeline if e.operation_id), default=0.0)
            quiet_for = time.monotonic() - last
            if quiet_for >= step.quiet_secs:
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"the ledger was not quiet for {step.quiet_secs}s")
            await asyncio.sleep(step.quiet_secs - quiet_for)

    async def settle(self) -> None:
        """Return once the runtime's work waits on the clock, on a person or on nothing.

        That is: no ledger call in flight, and for `_SETTLE_TURNS` turns of the event loop
        neither a new ledger call nor a change in the clock's sleepers. Work in progress (a
        compensation just started, a deadline that just fired) thus reaches its next clock
        wait before the clock moves on, however slow the machine: what happens at which
        clock time never depends on how fast the real I/O was.
        """
        ledger = self.ledger
        if ledger is None:
            return
        seen: tuple[int, int] | None = None
        quiet = 0
        async with asyncio.timeout(_SETTLE_HANG_SECS):
            while quiet < _SETTLE_TURNS:
                if ledger.in_flight:
                    await ledger.wait_idle()
                    seen, quiet = None, 0
                    continue
                await asyncio.sleep(0)
                now = (ledger.calls, self.clock.sleepers)
                seen, quiet = now, (quiet + 1 if now == seen else 0)

    async def calls_made(self, made: int) -> None:
        """Wait until the model used its first ``made`` steps and each call reached the runtime.

        In story order (see `AdvanceStep`): a call the file writes before an ``advance`` is in
        the runtime before the clock moves, however slow the model's turn or the pipeline.
        Only while a conversation runs (nobody makes calls while the user is away).
        """
        if self.llm is None:
            return
        give_up = time.monotonic() + _HANG_GUARD_SECS
        while True:
            used = self.script_steps - len(self.script)
            waiting = [c for c in self.emitted if not self._arrived(c)]
            if used >= made and not waiting:
                return
            if time.monotonic() > give_up:
                what = (
                    f"the model's call(s) {', '.join(waiting)} to reach the runtime"
                    if used >= made
                    else f"the model to use its step {made} (it used {used})"
                )
                raise TimeoutError(f"advance: still waiting for {what} (a stuck story)")
            await asyncio.sleep(0.01)

    def _arrived(self, tool_call_id: str) -> bool:
        """Whether a call of the model is admitted, refused or running as a read."""
        runtime = self.runtime
        return (
            tool_call_id in self.answered
            or tool_call_id in self.faults.started
            or (runtime is not None and runtime.operation_for_call(tool_call_id) is not None)
        )

    async def advance(self, secs: float, *, made: int = 0) -> None:
        # Small slices let chained timers (a deadline, then a probe) fire in turn; a long
        # advance takes at most about 40 of them. Before each, the work that is running
        # settles: it reaches its next clock wait, so the slice that is due wakes it.
        slice_secs = max(_ADVANCE_SLICE_SECS, secs / 40)
        left = secs
        await self.calls_made(made)
        await self.settle()
        while left > 1e-9:
            stride = min(slice_secs, left)
            self.clock.advance(stride)
            left -= stride
            await self.settle()

    async def until(self, step: UntilStep) -> None:
        deadline = time.monotonic() + step.timeout_secs
        op_id = await self.op_id(step.op, step.timeout_secs)
        assert self.runtime is not None
        while True:
            try:
                op = await self.runtime.ledger.get(op_id)
            except OperationNotFound:
                if not self._read_running(op_id, []):
                    raise
                # A read still running: no row until its answer is recorded.
                if S.RUNNING in step.status and not step.delivered:
                    return
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"{step.op} ({op_id}) did not reach {' or '.join(step.status)} in "
                        f"{step.timeout_secs}s: the read is still running"
                    ) from None
                await asyncio.sleep(0.02)
                continue
            told_it = op.delivered_at is not None or (
                op.kind == "read" and told_outcomes(self.run.timeline, op_id) > 0
            )
            told = told_it or not step.delivered
            if op.status in step.status and told:
                return
            if time.monotonic() > deadline:
                wanted = " or ".join(s.value for s in step.status)
                raise TimeoutError(
                    f"{step.op} ({op_id}) did not reach {wanted}"
                    f"{', told,' if step.delivered else ''} in {step.timeout_secs}s: "
                    f"it is {op.status.value}{'' if told else ', not told'}"
                )
            await asyncio.sleep(0.02)

    async def fault(self, step: FaultStep) -> None:
        if step.target is not None:
            self.faults.arm(step.target, step.fault, times=step.times, secs=step.secs)
            return
        faults = self.sor.faults
        if step.fault == "latency":
            assert step.secs is not None
            faults.set_latency(step.secs, kind=step.kind)
        elif step.fault == "slow_cancel":
            assert step.secs is not None
            self.sor.slow_cancel_secs = step.secs
        elif step.fault == "hang":
            faults.hang(step.kind, step.times, ignore_cancellation=step.ignore_cancellation)
        else:
            getattr(faults, step.fault)(step.kind, step.times)

    async def release_hung(self) -> None:
        self.sor.release_hung()
        self.faults.release_hung()

    async def approve(self, step: ApproveStep) -> None:
        assert self.runtime is not None
        op = await self.runtime.ledger.get(await self.op_id(step.op))
        seen = op.args_hash
        if step.seen_args is not None:
            # Normalised as the runtime normalises a call's arguments (defaults filled in).
            model = self.runtime.bindings[op.tool].action.args_model
            seen = self.runtime.ledger.args_hash(
                op.tool, model.model_validate(step.seen_args).model_dump(mode="json")
            )
        try:
            await self.runtime.approve(
                op.operation_id,
                # A scenario's approver works for the scenario's own tenant.
                approver=Approver(step.approver, frozenset(step.roles), frozenset({op.tenant})),
                reason=step.reason,
                args_hash=seen,
            )
        except Exception as exc:
            self.note(f"approval of {op.operation_id} refused: {exc}")
            if not step.refused:
                raise self.failed(
                    step,
                    f"the approval was refused: {exc} (approver {step.approver!r} with roles "
                    f"{step.roles}; `refused: true` says a refusal is meant)",
                ) from None
            return
        if step.refused:
            raise self.failed(step, "the approval was accepted, and the step says refused: true")

    async def reject(self, step: RejectStep) -> None:
        assert self.runtime is not None
        op = await self.runtime.ledger.get(await self.op_id(step.op))
        op_id = op.operation_id
        who = Approver(step.approver, frozenset(step.roles), frozenset({op.tenant}))
        try:
            await self.runtime.reject(op_id, approver=who, reason=step.reason)
        except Exception as exc:
            self.note(f"rejection of {op_id} refused: {exc}")
            if not step.refused:
                raise self.failed(
                    step,
                    f"the rejection was refused: {exc} (approver {step.approver!r} with roles "
                    f"{step.roles}; `refused: true` says a refusal is meant)",
                ) from None
            return
        if step.refused:
            raise self.failed(step, "the rejection was accepted, and the step says refused: true")

    async def handoff(self, agent: str) -> None:
        assert self.gate is not None
        await self.gate.handoff(agent)

    async def compensate(self, step: CompensateStep) -> None:
        # Started, not awaited: the compensation runs on the manual clock, which later steps
        # move (an `until` waits for its outcome).
        assert self.runtime is not None
        runtime, op_id = self.runtime, await self.op_id(step.op)

        async def undo() -> None:
            try:
                await runtime.compensate(op_id, actor="app:scenario", reason=step.reason)
            except Exception as exc:
                self.note(f"compensation of {op_id} refused: {exc}")

        self.background.append(asyncio.ensure_future(undo()))

    async def crash(self) -> None:
        # Nothing more is written: the runtime stops at once, leaving statuses as they are.
        await self.close_runtime(grace_secs=0)
        raise _Crash

    async def reconnect(self) -> None:
        raise _Reconnect

    async def hang_up(self) -> None:
        raise _HangUp

    # --- the run ---------------------------------------------------------------------------

    def segments(self) -> list[tuple[list[ConversationStep], Step | None, bool]]:
        """The steps of each pipeline, the step that ends it, and whether the user is away.

        Between a hang-up and the reconnect the steps run with no pipeline (``away``).
        """
        segments: list[tuple[list[ConversationStep], Step | None, bool]] = []
        current: list[ConversationStep] = []
        away = False
        for index, step in enumerate(self.loaded.steps):
            if away and isinstance(step, ReconnectStep | CallerStep):
                segments.append((current, step, True))
                current, away = [], False
                continue
            current.extend(self.translate(index, step))
            if isinstance(step, CrashStep | ReconnectStep | HangUpStep | CallerStep):
                segments.append((current, step, away))
                current = []
                away = away or isinstance(step, HangUpStep)
        segments.append((current, None, away))
        return segments

    async def offline(self, steps: list[ConversationStep]) -> None:
        """Play steps with no conversation: the world's steps, the clock, a crash."""
        for fn in _as_calls(steps):
            try:
                await fn()
            except _Crash:
                return  # the steps after it restart the process (see play)

    async def play(self) -> None:
        await self.seed()
        await self.open_runtime(recover=True)
        for steps, ender, away in self.segments():
            if away:
                await self.offline(steps)
                if isinstance(ender, ReconnectStep):
                    self.note("the user calls back")
            else:
                await self.converse(steps, settle=ender is None)
            if isinstance(ender, HangUpStep):
                self.note("the user hangs up")
            if isinstance(ender, CallerStep):
                self.session, self.context = self._caller(
                    ender.principal, ender.session_id, ender.agent
                )
                self.note(f"{ender.principal} calls ({self.session.session_id})")
            if isinstance(ender, CrashStep):
                self.clock.advance(self.spec.lease_secs + 1)  # the dead owner's leases lapse
                self.note("the bot process restarts")
                self._restarted()
                await self.open_runtime(recover=ender.recover)
            elif isinstance(ender, ReconnectStep) and not away:
                self.note("the user reconnects")

    async def converse(self, steps: list[ConversationStep], *, settle: bool) -> None:
        assert self.runtime is not None
        llm = ScriptedLLM(self.script, fallback="Okay.")
        llm.emitted = self.emitted  # one list for the story, whichever pipeline makes a call
        self.llm = llm
        attach(self.runtime, llm, self.session)
        self.context.set_tools(tools_schema(self.runtime))
        self.gate = ActionResultGate(self.runtime, self.session)
        transport = FakeTransport()
        try:
            await run_conversation(
                steps,
                llm=llm,
                tts=FakeTTS(secs_per_char=0.01),
                transport=transport,
                context=self.context,
                after_user_aggregator=[ActionTurnTracker(self.session)],
                before_assistant_aggregator=[self.gate],
                observers=[DeliveryWatch(self.run.timeline, self.answered)],
                settle=WaitUntilIdle(quiet_secs=0.5, timeout_secs=20, function_calls=False)
                if settle
                else None,
                timeout_secs=self.spec.timeout_secs,
            )
        except (_Crash, _Reconnect, _HangUp):
            pass
        finally:
            self.llm = None
            self.run.heard.extend(transport.heard)

    async def seed(self) -> None:
        """Bookings the restaurant holds before the story starts (not the story's effects)."""
        for booking in self.spec.provider.bookings:
            await self.sor.book(
                booking.restaurant_id,
                booking.date,
                booking.time,
                booking.party_size,
                booking.guest,
            )
        self.sor.side_effects.clear()

    async def gather(self) -> None:
        """Read the end state: the session's operations, their trails, the provider."""
        if self.runtime is None:
            await self.open_runtime(recover=False)
        assert self.runtime is not None
        for task in self.background:
            task.cancel()  # a compensation still waiting has its state in the ledger
        await asyncio.gather(*self.background, return_exceptions=True)
        await self.runtime.flush()
        ledger = self.runtime.ledger
        ops = [
            op
            for session_id in self.session_ids
            for op in await ledger.list(OperationFilter(session_id=session_id))
        ]
        ids = {op.operation_id for op in ops}
        linked = [op for op in await ledger.list() if op.compensates in ids]
        self.run.operations = [*ops, *(op for op in linked if op.operation_id not in ids)]
        for op in self.run.operations:
            self.run.events[op.operation_id] = await ledger.events(op.operation_id)
            if op.provider_call_id and op.provider_call_id.startswith("call_"):
                label = op.provider_call_id.removeprefix("call_")
                if label in self.loaded.labels:
                    self.run.labels.setdefault(label, op.operation_id)
        for label in self.loaded.labels:  # joined duplicates have no row of their own
            found = self.runtime.operation_for_call(f"call_{label}")
            if label not in self.run.labels and found is not None:
                self.run.labels[label] = found
        self.run.context = [dict(m) for m in self.context.get_messages()]  # type: ignore[arg-type]
        # An app without counts of its own is counted by the restaurant it was handed.
        effects = self.app.effects or (lambda: self.sor.side_effects)
        for_key = self.app.effects_for_key or self.sor.effects_for_key
        self.run.side_effects = dict(effects())
        self.run.effects_by_key = {
            op.idempotency_key: for_key(op.idempotency_key) for op in self.run.operations
        }
        self.run.requests = dict(self.faults.requests)
        self.run.script_left = len(self.script)
        for utterance in self.run.heard:
            self.run.timeline.append(
                TimelineEntry(
                    utterance.started_monotonic,
                    "heard: " + utterance.text + (" [cut]" if utterance.interrupted else ""),
                )
            )
        self.run.timeline.sort(key=lambda entry: entry.at)


async def _nothing() -> None:
    return None


_Played = Callable[["_Scene", int, Any], list[ConversationStep]]
_PLAYED: dict[type[Step], _Played] = {
    UserStep: lambda scene, index, step: scene.user(index, step),
    BargeInStep: lambda scene, index, step: scene.barge_in(index, step),
    WaitStep: lambda scene, index, step: [Wait(step.secs)],
    IdleStep: lambda scene, index, step: scene.idle(index, step),
    TogetherStep: lambda scene, index, step: scene.together(index, step),
}
"""The steps that are the conversation's own: what the user says and does, and the waits."""

_World = Callable[["_Scene", int, Any], Awaitable[None]]
_WORLD: dict[type[Step], _World] = {
    AdvanceStep: lambda scene, index, step: scene.advance(
        step.secs, made=scene.calls_before[index]
    ),
    UntilStep: lambda scene, index, step: scene.until(step),
    FaultStep: lambda scene, index, step: scene.fault(step),
    ReleaseHungStep: lambda scene, index, step: scene.release_hung(),
    ApproveStep: lambda scene, index, step: scene.approve(step),
    RejectStep: lambda scene, index, step: scene.reject(step),
    HandoffStep: lambda scene, index, step: scene.handoff(step.agent),
    CompensateStep: lambda scene, index, step: scene.compensate(step),
    CrashStep: lambda scene, index, step: scene.crash(),
    ReconnectStep: lambda scene, index, step: scene.reconnect(),
    HangUpStep: lambda scene, index, step: scene.hang_up(),
    CallerStep: lambda scene, index, step: scene.reconnect(),
}
"""The world's steps: each one coroutine of the scene, noted in the timeline as it starts."""


def _calls_before(steps: Sequence[Step]) -> list[int]:
    """For each step, how many llm steps come before it up to the last one that makes calls."""
    counts: list[int] = []
    seen = needed = 0
    for step in steps:
        counts.append(needed)
        if isinstance(step, LlmStep):
            seen += 1
            if step.calls:
                needed = seen
    return counts


def _as_calls(steps: list[ConversationStep]) -> list[Callable[[], Awaitable[None]]]:
    """The world's translated steps as plain coroutine functions (a wait sleeps)."""
    calls: list[Callable[[], Awaitable[None]]] = []
    for step in steps:
        if isinstance(step, Call):
            calls.append(step.fn)
        elif isinstance(step, Wait):
            secs = step.secs
            calls.append(lambda secs=secs: asyncio.sleep(secs))  # type: ignore[misc]
    return calls


def _describe(step: Step) -> str:
    kind = next(k for k, (model, _) in STEP_KINDS.items() if type(step) is model)
    fields = step.model_dump(mode="json", exclude_defaults=True, by_alias=True)
    return f"{kind} {fields}" if fields else kind


class _TimelineLines(io.StringIO):
    """The in-process worker's output, each line noted on the scenario's timeline."""

    def __init__(self, scene: _Scene) -> None:
        super().__init__()
        self._scene = scene

    def write(self, text: str) -> int:
        """Note each line (the worker's DBOS threads write here too: a list append)."""
        for line in text.splitlines():
            if line.strip():
                self._scene.note(f"worker: {line}")
        return len(text)


async def run_loaded(
    loaded: LoadedScenario, *, ledger_url: str | None = None, fresh_database: bool = False
) -> Run:
    """Play a loaded scenario and return what happened (expectations are not checked here).

    Args:
        loaded: The scenario.
        ledger_url: Where the ledger lives; a fresh SQLite file if omitted. A shared database
            must be empty of this scenario's session (use a new database or schema per run).
            A scenario whose policy has ``execution: durable`` tools needs PostgreSQL: its
            bot is a DBOS client and a DBOS worker runs in this process.
        fresh_database: ``ledger_url`` names a PostgreSQL server (and a database to connect
            to): the scenario runs on a database of its own made there, dropped after it.

    Raises:
        ScenarioError: The app cannot be built (see `check_app`), or the scenario has durable
            tools and no PostgreSQL URL; nothing ran.
    """
    refuse_on_sqlite(loaded, ledger_url, fresh_database=fresh_database)
    if fresh_database:
        assert ledger_url is not None  # refuse_on_sqlite
        async with database_of_its_own(ledger_url) as url:
            return await _run_loaded(loaded, url)
    return await _run_loaded(loaded, ledger_url)


async def _run_loaded(loaded: LoadedScenario, ledger_url: str | None) -> Run:
    run = Run()
    with tempfile.TemporaryDirectory(prefix="pipecat-actions-scenario-") as workdir:
        url = ledger_url or f"sqlite:///{Path(workdir) / 'ledger.db'}"
        durable = bool(loaded.policy.durable_names())
        try:
            scene = _Scene(loaded, url, run, durable=durable)
        except ScenarioError:
            raise  # the app cannot be built: a problem of the file, nothing ran
        except Exception as exc:
            run.error = f"the scenario cannot start: {type(exc).__name__}: {exc}"
            return run
        try:
            async with contextlib.AsyncExitStack() as stack:
                if durable:
                    try:
                        await prepare_database(url)
                        await stack.enter_async_context(scene.worker())
                    except Exception as exc:
                        run.error = (
                            f"the scenario's DBOS worker cannot start: {type(exc).__name__}: {exc}"
                        )
                        return run
                await _play(scene, loaded, run)
        finally:
            await scene.close_runtime(grace_secs=0)
    return run


async def _play(scene: _Scene, loaded: LoadedScenario, run: Run) -> None:
    """Play the story, note why it stopped early if it did, and gather the end state."""
    try:
        await scene.play()
    except StepFailed as exc:
        run.error = str(exc)  # file:line: the step, and why it failed
    except TimeoutError as exc:
        run.error = (
            f"TimeoutError: {exc}"
            if str(exc)
            else (
                f"TimeoutError: the scenario did not end within its timeout_secs "
                f"({loaded.spec.timeout_secs:g} s)"
            )
        )
    except Exception as exc:
        run.error = f"{type(exc).__name__}: {exc}"
    await scene.gather()
    if scene.durable:
        await scene.cancel_open_workflows()
