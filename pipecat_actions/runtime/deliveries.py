"""`Deliveries`: what the conversation owes the user, owned by the runtime. No frames here.

For each operation of a session the ledger holds what the conversation was told last
(``delivered_status``, ``delivered_at``, ``delivered_agent``) and whether that telling was
heard to the end (``acknowledged_at``). What is **owed** follows from it: an outcome whose
status differs from the one told, or one told and not heard. That survives a reconnect and a
restart: a new pipeline of the session is given what it is still owed.

`Deliveries` is the runtime's part; `SessionDelivery` is one pipeline's view of one session.
An adapter (the cascade `ActionResultGate`, a speech-to-speech adapter, a Flows adapter) opens
one with an `Outlet`, reports what happens in its pipeline (a call was closed before its
outcome, a result was told in place, the bot finished speaking, the user stopped), and is told
what to say through `Outlet.tell`: the service decides when (the delivery policy, idle
detection, calls proposed together told together), whether at all (already told? suppressed?
visible to the active agent?) and with which words. The adapter decides only how a `Told`
reaches the model: a developer message before the assistant aggregator, an item sent to a
realtime provider, a Flows function result.
"""

from __future__ import annotations

__all__ = [
    "PENDING_STATUSES",
    "Deliveries",
    "NextStep",
    "Outlet",
    "SessionDelivery",
    "Speaker",
    "Told",
    "compensation_told",
]

import asyncio
import json
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from loguru import logger

from pipecat_actions._recent import remember
from pipecat_actions.actions import Binding
from pipecat_actions.clock import Clock
from pipecat_actions.ledger import Ledger, Operation, OperationFilter
from pipecat_actions.ledger.records import First, may_be_owed
from pipecat_actions.observability.telemetry import Telemetry
from pipecat_actions.policy import DeliveryMode, ToolKind
from pipecat_actions.results import is_correction, reconcilable, render_operation
from pipecat_actions.runtime._joins import nap
from pipecat_actions.runtime._operations import RECENT_TOLD, Operations
from pipecat_actions.runtime.progress import Progress, ProgressReport
from pipecat_actions.runtime.supersession import Supersession
from pipecat_actions.session import SessionState
from pipecat_actions.status import (
    AWAITING_PERSON_STATUSES,
    IN_FLIGHT_STATUSES,
    TERMINAL_STATUSES,
    ActionStatus,
)

S = ActionStatus

_NEVER_OWED = frozenset({S.REQUESTED, S.AWAITING_CONFIRMATION})
"""Meaningless once the conversation that asked moved on (a confirmation is asked in it)."""
_TOLD_ON_RESUME = frozenset(
    {S.COMMITTED, S.FAILED_FINAL, S.COMPENSATED, S.CANCELLED, S.EXPIRED, S.REJECTED, S.UNKNOWN}
)
"""Reached while nobody listened: told as soon as a new pipeline of the session starts (an
UNKNOWN as "not yet known, being checked"; what reconciliation finds is told later)."""
WATCH_SECS = 2.0
"""How often an awaited operation this process does not run is re-read (another process, a
worker or an operator settles it; this process's listeners never hear of that). Where the
ledger gives notices (`Ledger.notices`), it is re-read when one comes, and this often anyway."""
_NOT_OUTCOMES = frozenset(IN_FLIGHT_STATUSES | AWAITING_PERSON_STATUSES)
"""Statuses that are no outcome: an operation seen in one is told when it leaves it."""
PENDING_STATUSES = frozenset(IN_FLIGHT_STATUSES | AWAITING_PERSON_STATUSES | {S.UNKNOWN})
"""Not finished: what a new agent is briefed on at a handoff, and told later when it finishes."""


def compensation_told(op: Operation) -> dict[str, Any]:
    """What the model is told about a compensation ``op`` of an operation of its session."""
    original = op.compensates
    ids = {"operation_id": original, "compensation_id": op.operation_id}
    if op.status is S.COMMITTED:
        return {
            "status": "compensated",
            **ids,
            "message": f"The earlier request {original} was undone; tell the user.",
            "result": op.result,
        }
    if op.status in TERMINAL_STATUSES:
        return {
            "status": "compensation_failed",
            **ids,
            "message": (
                f"Undoing the earlier request {original} did not work ({op.error}); it still "
                "stands. Tell the user."
            ),
        }
    if op.status is S.UNKNOWN or op.escalated_at is not None:
        # A compensation has no reconcile hook (nothing can look one up): an unknown outcome
        # is escalated at once, with its original, for a person to check.
        return {
            "status": "compensation_unknown",
            **ids,
            "message": (
                f"It is not yet known whether undoing the earlier request {original} worked, "
                "and the system cannot tell; a person will check it. Do not say it was undone."
            ),
        }
    return {
        "status": "compensation_unknown",
        **ids,
        "message": (
            f"Undoing the earlier request {original} is still in progress; it is not yet known "
            "whether it worked. Do not say it was undone."
        ),
    }


@dataclass(frozen=True)
class Told:
    """One thing the conversation is to be told now, as the delivery service decided it.

    Attributes:
        operation: The operation it is about (a compensation: the compensation's record).
        content: What the model is told, as data (for providers that take structured items).
        text: The same as one developer message.
        run_llm: Whether the model should answer now (False: into the context silently).
        interrupt: Cut the bot off first (the ``interrupt`` delivery mode while it speaks).
        superseded_by: The newer operation that replaced this one, if any.
        mode: The delivery mode it was decided under (a provider that schedules results
            itself, such as Gemini Live, is told it too).
        progress: A progress report of an operation still under way, not its outcome (an
            adapter must not answer the operation's call with it).
    """

    operation: Operation
    content: dict[str, Any]
    text: str
    run_llm: bool
    interrupt: bool = False
    superseded_by: str | None = None
    mode: DeliveryMode = DeliveryMode.WHEN_IDLE
    progress: bool = False


class Speaker(Protocol):
    """Puts what the delivery service decided into the conversation, and cuts the bot off."""

    async def tell(self, told: Told) -> None:
        """Put ``told`` into the conversation now."""

    async def interrupt(self) -> None:
        """Cut the bot off (it is speaking and an ``interrupt`` delivery is due)."""


class Outlet(Speaker, Protocol):
    """How a pipeline adapter lets the delivery service speak (see the module docstring)."""

    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        """Run ``coroutine`` as a task of the pipeline (cancelled when the pipeline ends)."""


NextStep = Callable[[Operation], Callable[[], Awaitable[None]] | None]
"""Given an outcome about to be told, what the conversation moves on to after it, if anything.

A Flows adapter answers with a node transition (`pipecat_actions.flows`): the telling then goes
into the context silently and the step, run after it, makes the bot speak (in the new node).
"""


@dataclass
class _Late:
    operation: Operation
    mode: DeliveryMode
    superseded_by: str | None


class Deliveries:
    """The runtime's delivery part: the durable records and the rules; see the module docstring.

    Args:
        ledger: Where deliveries and acknowledgements are recorded and owed outcomes read.
        bindings: The registered actions (their delivery policy and visibility).
        clock: The runtime's clock.
        telemetry: Delivery spans and counters.
        supersession: Which newer operation replaces an older one.
        operations: The registry whose outcomes sessions listen to.
        progress: The effects' progress reports, which sessions listen to as well.
    """

    def __init__(
        self,
        *,
        ledger: Ledger,
        bindings: Mapping[str, Binding],
        clock: Clock,
        telemetry: Telemetry,
        supersession: Supersession,
        operations: Operations,
        progress: Progress,
    ) -> None:
        self.ledger = ledger
        self.progress = progress
        self.bindings = bindings
        self.clock = clock
        self.telemetry = telemetry
        self.supersession = supersession
        self.operations = operations
        self._recorded: OrderedDict[str, ActionStatus] = OrderedDict()
        """The status this process last recorded as told, per operation (the most recent)."""

    def open(self, session: SessionState, outlet: Outlet) -> SessionDelivery:
        """Start delivering to one pipeline of ``session`` through ``outlet``."""
        return SessionDelivery(self, session, outlet)

    async def owed(self, session_id: str, *, before: float, mark: int) -> list[Operation]:
        """What the conversation of ``session_id`` is owed from before a pipeline started.

        ``before`` and ``mark`` bound it to operations from before the pipeline (its clock
        time and `Operations.call_mark`): the pipeline's own calls are told through their
        results. A compensation is told through the operation it reversed.
        """
        history = await self.ledger.list(OperationFilter(session_id=session_id))
        heard_compensations = {
            op.compensates
            for op in history
            if op.compensates is not None
            and op.delivered_status is op.status
            and op.acknowledged_at is not None
        }
        return [
            op
            for op in history
            if op.created_at <= before  # at the same instant: a manual clock, or a tie
            and not self.operations.noted_after(op.operation_id, mark)
            and op.compensates is None
            and may_be_owed(op)
            and _is_owed(op, compensation_heard=op.operation_id in heard_compensations)
        ]

    async def mark_delivered(self, op: Operation, *, session: SessionState, late: bool) -> None:
        """Record that ``op``, as it is, was told to ``session``'s conversation.

        Nothing is written if exactly this status was recorded as told already (told again,
        not heard the first time): its acknowledgement is still owed. This process remembers
        what it recorded (a burst of calls joined to one operation writes it once).
        """
        if op.delivered_status is op.status or self._recorded.get(op.operation_id) is op.status:
            return
        await self.ledger.annotate(
            op.operation_id,
            actor=_actor(session),
            detail={"delivered": op.status.value, "agent": session.active_agent, "late": late},
            changes={
                "delivered_at": self.clock.now(),
                "delivered_agent": session.active_agent,
                "delivered_status": op.status.value,
                "acknowledged_at": None,
            },
        )
        remember(self._recorded, op.operation_id, op.status, keep=RECENT_TOLD)

    async def mark_acknowledged(self, operation_ids: list[str], *, session: SessionState) -> None:
        """Record that what was told about ``operation_ids`` was heard to the end.

        The first hearing of the status told is the one that counts (``acknowledged_at``,
        from which `stats` measures commit to acknowledgement): a later one (a call that
        joined the operation and was told it again) is an audit event of its own and leaves
        the time as it was. Telling a new status makes its hearing owed again
        (`mark_delivered`).
        """
        for operation_id in operation_ids:
            try:
                await self.ledger.annotate(
                    operation_id,
                    actor=_actor(session),
                    detail={"acknowledged": True},
                    changes={"acknowledged_at": First(self.clock.now())},
                )
            except Exception as exc:  # a record of hearing must never break the conversation
                logger.bind(session_id=session.session_id, operation_id=operation_id).warning(
                    "acknowledgement of {} not recorded: {}", operation_id, exc
                )

    async def handoff(self, session: SessionState, agent: str) -> dict[str, Any] | None:
        """Make ``agent`` the active agent; return its brief on pending operations, if any.

        Operations belong to the session, not to the agent that started them. Each pending
        one is annotated, so that an operator can check no result was lost in the handoff.
        """
        session.active_agent = agent
        pending = await self.ledger.list(
            OperationFilter(session_id=session.session_id, status=sorted(PENDING_STATUSES))
        )
        if not pending:
            return None
        self.telemetry.handoff(agent, pending)
        for op in pending:
            await self.ledger.annotate(
                op.operation_id,
                actor=_actor(session),
                detail={"handoff_to": agent, "status": op.status.value},
            )
        brief = [
            {
                "operation_id": op.operation_id,
                "tool": op.tool,
                "status": op.status.value,
                "arguments": op.args,
            }
            for op in pending
        ]
        return {
            "role": "developer",
            "content": "You are now handling this conversation. Operations still pending for "
            f"the user: {json.dumps(brief)}. Their outcomes will be reported here; do not start "
            "them again.",
        }

    def mode_for(self, op: Operation, *, superseded: bool) -> DeliveryMode:
        """The delivery mode of a late outcome of ``op`` (its tool's policy)."""
        binding = self.bindings.get(op.tool)
        if binding is None:
            return DeliveryMode.WHEN_IDLE
        delivery = binding.policy.delivery
        return delivery.superseded if superseded else delivery.late

    def visible(self, op: Operation, agent: str | None) -> bool:
        """Whether ``agent`` may hear about ``op`` (its tool's ``visible_to``)."""
        binding = self.bindings.get(op.tool)
        allowed = binding.policy.visible_to if binding else ()
        return not allowed or agent in allowed

    def intermediate_mode(self, tool: str) -> DeliveryMode:
        """How progress of ``tool`` reaches the conversation (``delivery.intermediate``)."""
        binding = self.bindings.get(tool)
        return binding.policy.delivery.intermediate if binding else DeliveryMode.SILENT

    def intermediate_runs_llm(self, tool: str) -> bool:
        """Whether an intermediate result of ``tool`` should make the model answer."""
        mode = self.intermediate_mode(tool)
        return mode not in (DeliveryMode.SILENT, DeliveryMode.SUPPRESS)

    def is_read(self, tool: str) -> bool:
        """Whether ``tool`` is a registered read (its record is written after its answer)."""
        binding = self.bindings.get(tool)
        return binding is not None and binding.policy.kind is ToolKind.READ

    def reconcilable(self, tool: str) -> bool | None:
        """Whether a reconcile hook checks an UNKNOWN ``tool`` here (None: not registered)."""
        return reconcilable(self.bindings, tool)


def _is_owed(op: Operation, *, compensation_heard: bool) -> bool:
    if op.status in _NEVER_OWED:
        return False
    if op.status is S.REJECTED and op.delivered_status in (None, S.REJECTED):
        return False  # refused at the call, and told so there
    if op.status in (S.COMPENSATED, S.COMPENSATING) and compensation_heard:
        return False  # told through its compensation, and heard
    return op.delivered_status is not op.status or op.acknowledged_at is None


def _actor(session: SessionState) -> str:
    return f"gate:{session.session_id}"


@dataclass
class _SessionState:
    """What one pipeline's delivery keeps while it runs (the durable truth is in the ledger)."""

    awaited: set[str] = field(default_factory=set)
    """Operations whose outcome this conversation waits to be told."""
    groups: dict[str, str] = field(default_factory=dict)
    """Operation → the group of calls it was proposed with (told together)."""
    told: dict[str, ActionStatus] = field(default_factory=dict)
    retell: set[str] = field(default_factory=set)
    """Owed from before this pipeline: told here even if an earlier pipeline was told."""
    delivering: set[str] = field(default_factory=set)
    recheck: set[str] = field(default_factory=set)
    held: deque[_Late] = field(default_factory=deque)
    unacknowledged: list[str] = field(default_factory=list)
    interrupted: bool = False
    watched: set[str] = field(default_factory=set)
    """Awaited operations run elsewhere, re-read by a `SessionDelivery._watch` task."""
    progress_held: dict[str, ProgressReport] = field(default_factory=dict)
    """The latest progress report of each operation, waiting for nobody to speak."""


class SessionDelivery:
    """One pipeline's delivery for one session; adapters call it, it speaks through an `Outlet`.

    Built by `Deliveries.open`. It listens to the runtime's outcomes for the session until
    `close`. Every method an adapter calls from ``process_frame`` returns at once; ledger work
    runs in the outlet's tasks.
    """

    def __init__(self, service: Deliveries, session: SessionState, outlet: Outlet) -> None:
        self._service = service
        self.session = session
        self._outlet = outlet
        self._state = _SessionState()
        self._listening = False
        self._reads: set[asyncio.Task[Any]] = set()
        self._next: NextStep | None = None

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """The pipeline started: listen, and take over what the session is still owed.

        Speaking is this pipeline's state: a session whose last pipeline was cut off while
        someone spoke starts this one silent.
        """
        self.session.user_speaking = False
        self.session.bot_speaking = False
        self.listen()
        service = self._service
        self._reading(self._resume(before=service.clock.now(), mark=service.operations.call_mark))

    def reconcilable(self, tool: str) -> bool | None:
        """Whether a reconcile hook checks an UNKNOWN ``tool`` (`Deliveries.reconcilable`)."""
        return self._service.reconcilable(tool)

    def listen(self) -> None:
        """Hear the runtime's outcomes for the session (`start` does it too)."""
        if not self._listening:
            self._service.operations.listen(self.session.session_id, self.on_outcome)
            self._service.progress.listen(self.session.session_id, self.on_progress)
            self._listening = True

    def close(self) -> list[Any]:
        """Stop listening; what is still owed stays owed in the ledger.

        Returns:
            The tasks still reading the ledger for this pipeline (the look-up of what the
            session is owed, catch-ups, watchers): the adapter cancels them as its pipeline
            ends. They only read; what they would have told stays owed.
        """
        if self._listening:
            self._service.operations.unlisten(self.session.session_id, self.on_outcome)
            self._service.progress.unlisten(self.session.session_id, self.on_progress)
            self._listening = False
        reading, self._reads = [t for t in self._reads if not t.done()], set()
        return reading

    def _reading(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        """Spawn a task that only reads (see `close`)."""
        task = self._outlet.spawn(coroutine)
        if isinstance(task, asyncio.Task):
            self._reads.add(task)
            task.add_done_callback(self._reads.discard)

    def then(self, next_step: NextStep | None) -> None:
        """Ask ``next_step`` what follows each outcome this pipeline tells (see `NextStep`)."""
        self._next = next_step

    def next_step(self, op: Operation) -> Callable[[], Awaitable[None]] | None:
        """What follows telling ``op`` now (None: the telling itself makes the bot speak)."""
        if self._next is None:
            return None
        try:
            return self._next(op)
        except Exception as exc:  # what follows must never stop the telling
            logger.opt(exception=exc).warning(
                "{}: could not decide what follows {}: {}", self, op.operation_id, exc
            )
            return None

    # --- events from the adapter -----------------------------------------------------------

    def expect(self, operation_id: str, *, shown: str | None, group: str | None = None) -> None:
        """A call's result showed ``operation_id`` not finished (``shown``: its status then).

        Its outcome is told when it comes. If it came before the result reached the pipeline
        (the runtime's listeners fired first), it is told now.
        """
        self._await(operation_id, group)
        self._reading(self._catch_up(operation_id, shown))

    def told_in_place(self, operation_id: str, *, record: bool = True) -> None:
        """A call's result told ``operation_id``'s outcome: no later message for it.

        ``record``: record the delivery (a read's row is written after its answer: not yet).
        """
        self._forget(operation_id)
        if record:
            self._outlet.spawn(self._record_in_place(operation_id))

    async def current(self, operation_id: str) -> Operation | None:
        """``operation_id`` as the ledger holds it now; None if it cannot be read (logged)."""
        try:
            return await self._service.ledger.get(operation_id)
        except Exception as exc:
            logger.bind(session_id=self.session.session_id, operation_id=operation_id).warning(
                "{}: could not read {}: {}", self, operation_id, exc
            )
            return None

    async def told_now(self, op: Operation) -> None:
        """The adapter put ``op`` as it is into the conversation (a truthful close)."""
        self._state.interrupted = False
        await self._record(op, late=False)

    def await_outcome(self, operation_id: str, group: str | None = None) -> None:
        """Tell ``operation_id``'s outcome when it comes (its call was closed before it)."""
        self._await(operation_id, group)

    def bot_stopped(self) -> None:
        """The bot finished speaking: what it said since the last delivery was heard."""
        state = self._state
        if state.unacknowledged and not state.interrupted:
            done, state.unacknowledged = state.unacknowledged, []
            self._outlet.spawn(self._service.mark_acknowledged(done, session=self.session))
        state.interrupted = False
        self.release()

    def interrupted(self) -> None:
        """The bot was cut off: what it was saying was not heard to the end."""
        self._state.interrupted = True

    def release(self) -> None:
        """Tell what waits for the user and the bot to be quiet, if they are."""
        state = self._state
        if self.session.user_speaking or self.session.bot_speaking:
            return
        held_progress, state.progress_held = list(state.progress_held.values()), {}
        for report in held_progress:
            self._outlet.spawn(self._tell_progress(report, DeliveryMode.WHEN_IDLE))
        if not state.held:
            return
        ready = [late for late in state.held if self._visible(late.operation)]
        for late in ready:
            state.held.remove(late)
            self._outlet.spawn(self._push(late))

    async def handoff(self, agent: str) -> dict[str, Any] | None:
        """``agent`` takes over: return its brief (or None); results it may hear are released."""
        brief = await self._service.handoff(self.session, agent)
        self.release()
        return brief

    # --- outcomes --------------------------------------------------------------------------

    def on_outcome(self, op: Operation) -> None:
        """An operation of the session got an outcome (a runtime listener; never awaits).

        Also called with what a re-read found (a catch-up, a watcher): a status that is no
        outcome (it runs, or waits for a person) is not told; its outcome is, when it comes.
        """
        if op.status in _NOT_OUTCOMES:
            return
        state = self._state
        # The operation stays awaited until it is told (see _push), so that siblings told
        # meanwhile know it is still to come. An UNKNOWN told stays awaited: what
        # reconciliation finds is told too.
        if op.compensates is not None and op.operation_id not in state.told:
            # The application reversed an operation of this session: the conversation still
            # says it happened. Told like a late outcome (the model may have offered to undo).
            state.awaited.add(op.operation_id)
        if is_correction(op):
            # It was told it did not happen, and the system of record now says it did: the
            # conversation is owed the correction, whichever call or pipeline told it first.
            state.awaited.add(op.operation_id)
        if op.operation_id not in state.awaited:
            return
        if (
            op.status not in TERMINAL_STATUSES
            and op.operation_id not in state.watched
            and self._service.operations.get(op.operation_id) is None
        ):
            # Handed to a person (escalated): nothing here looks at it again, but a person or
            # another process may settle it; it is re-read until this conversation is told.
            state.watched.add(op.operation_id)
            self._reading(self._watch(op.operation_id))
        if self._service.operations.is_answering(self.session.session_id, op.operation_id):
            return  # a call waiting for it (confirm_action, a join) tells it in place, once
        answered = self._service.operations.answered(op.operation_id, self.session.session_id)
        retold = op.operation_id in state.retell
        if answered is not None and answered.status is op.status and not retold:
            # A call's result holds this very outcome and is on its way to the gate, which
            # records it in place: a catch-up or a watcher that read it meanwhile is too late.
            # (A new pipeline retells what an old one may not have heard: `retell`.)
            return
        if op.operation_id in state.delivering:
            state.recheck.add(op.operation_id)  # look again once the delivery under way ends
            return
        if state.told.get(op.operation_id) is op.status:
            return
        state.delivering.add(op.operation_id)
        self._outlet.spawn(self._deliver(op))

    def on_progress(self, report: ProgressReport) -> None:
        """An operation of the session reported progress (a runtime listener; never awaits).

        Told per its tool's ``delivery.intermediate``: ``suppress`` not at all (the audit
        trail has it), ``silent`` into the conversation without making the bot speak,
        ``when_idle`` once nobody speaks (only the latest report of an operation waits),
        ``in_place`` and ``interrupt`` now (``interrupt`` cuts the bot off). Never to an agent
        that may not hear the tool, and never once the outcome is known.
        """
        op = report.operation
        mode = self._service.intermediate_mode(op.tool)
        if mode is DeliveryMode.SUPPRESS or not self._visible(op):
            return
        busy = self.session.user_speaking or self.session.bot_speaking
        if mode is DeliveryMode.WHEN_IDLE and busy:
            self._state.progress_held[op.operation_id] = report
            return
        self._outlet.spawn(self._tell_progress(report, mode))

    async def _tell_progress(self, report: ProgressReport, mode: DeliveryMode) -> None:
        op = report.operation
        if self._service.progress.has_outcome(op.operation_id):
            return  # the outcome is known: it is what the conversation hears, not this
        content: dict[str, Any] = {
            "status": "in_progress",
            "operation_id": op.operation_id,
            "tool": op.tool,
            "progress": report.message,
        }
        if report.details:
            content["details"] = dict(report.details)
        text = (
            f"Progress of the {op.tool} request still under way (not its outcome; do not say "
            f"it is done): {json.dumps(content)}"
        )
        told = Told(
            operation=op,
            content=content,
            text=text,
            run_llm=mode is not DeliveryMode.SILENT,
            interrupt=mode is DeliveryMode.INTERRUPT and self.session.bot_speaking,
            mode=mode,
            progress=True,
        )
        try:
            if told.interrupt:
                await self._outlet.interrupt()
            await self._outlet.tell(told)
        except Exception as exc:  # progress is news of a moment: dropped, never owed
            logger.bind(session_id=self.session.session_id, operation_id=op.operation_id).warning(
                "{}: progress of {} not told: {}", self, op.operation_id, exc
            )

    def _await(self, operation_id: str, group: str | None) -> None:
        state = self._state
        untracked = self._service.operations.get(operation_id) is None
        if untracked and operation_id not in state.awaited | state.watched:
            # Run elsewhere: this process's listeners will not hear its outcome.
            state.watched.add(operation_id)
            self._reading(self._watch(operation_id))
        state.awaited.add(operation_id)
        if group is not None:
            state.groups[operation_id] = group

    async def _watch(self, operation_id: str) -> None:
        """Re-read an awaited operation run elsewhere until this conversation was told it."""
        state, service = self._state, self._service
        seen: ActionStatus | None = None
        try:
            async with service.ledger.notices(operation_id) as changed:
                # Woken by the ledger's notice where it gives them (re-read at once once
                # listening: a change since the caller's read is not missed), else polled.
                pause = 0.0 if changed is not None else WATCH_SECS
                while operation_id in state.awaited:
                    await nap(service.clock, pause, changed)
                    pause = WATCH_SECS
                    if service.operations.get(operation_id) is not None:
                        return  # this process runs it now (recovered here): its listener tells
                    try:
                        current = await service.ledger.get(operation_id)
                    except Exception as exc:  # tried again at the next turn
                        logger.debug("{}: could not re-read {}: {}", self, operation_id, exc)
                        continue
                    if current.status is not seen:
                        seen = current.status
                        self.on_outcome(current)
        finally:
            state.watched.discard(operation_id)

    def _forget(self, operation_id: str) -> None:
        state = self._state
        state.retell.discard(operation_id)
        state.awaited.discard(operation_id)
        state.delivering.discard(operation_id)
        state.groups.pop(operation_id, None)

    def _siblings_pending(self, operation_id: str) -> bool:
        """True if calls proposed together with this one still wait for their outcome."""
        groups = self._state.groups
        group = groups.get(operation_id)
        return group is not None and any(
            groups.get(other) == group for other in self._state.awaited if other != operation_id
        )

    def _visible(self, op: Operation) -> bool:
        return self._service.visible(op, self.session.active_agent)

    async def _resume(self, *, before: float, mark: int) -> None:
        try:
            owed = await self._service.owed(self.session.session_id, before=before, mark=mark)
        except Exception as exc:  # a ledger hiccup must not break the conversation
            logger.warning("{}: could not look up owed operations: {}", self, exc)
            return
        for op in owed:
            self._await(op.operation_id, None)
            self._state.retell.add(op.operation_id)
        for op in owed:
            if op.status in _TOLD_ON_RESUME or op.escalated_at is not None:
                self.on_outcome(op)

    async def _catch_up(self, operation_id: str, shown: str | None) -> None:
        try:
            current = await self._service.ledger.get(operation_id)
        except Exception as exc:  # the listener still covers later outcomes
            logger.warning("{}: could not re-read {}: {}", self, operation_id, exc)
            return
        if current.status.value.lower() != shown:
            self.on_outcome(current)

    async def _deliver(self, op: Operation) -> None:
        state = self._state
        try:
            await self._deliver_once(op)
        except Exception as exc:  # the outcome stays owed in the ledger for the next pipeline
            logger.warning("{}: could not tell {}: {}", self, op.operation_id, exc)
        finally:
            state.delivering.discard(op.operation_id)
            if op.operation_id in state.recheck:
                state.recheck.discard(op.operation_id)
                if op.operation_id in state.awaited:
                    state.delivering.add(op.operation_id)
                    self._outlet.spawn(self._deliver(op))

    async def _deliver_once(self, op: Operation) -> None:
        state, service = self._state, self._service
        current = await service.ledger.get(op.operation_id)
        told = state.told.get(current.operation_id)
        told_elsewhere = (
            current.delivered_status is current.status and current.operation_id not in state.retell
        )
        if told is current.status or (told is None and told_elsewhere):
            if current.status in TERMINAL_STATUSES:
                self._forget(current.operation_id)
            return
        superseded_by = await service.supersession.superseded_by(current)
        mode = service.mode_for(current, superseded=superseded_by is not None)
        late = _Late(current, mode, superseded_by)
        if not self._visible(current):
            state.held.append(late)  # until an agent who may hear it is active
            return
        if late.mode is DeliveryMode.SUPPRESS:
            self._forget(current.operation_id)
            service.telemetry.suppressed(current)
            await service.ledger.annotate(
                current.operation_id,
                actor=_actor(self.session),
                detail={"delivery": "suppressed"},
            )
            return
        busy = self.session.user_speaking or self.session.bot_speaking
        if late.mode is DeliveryMode.WHEN_IDLE and busy:
            state.held.append(late)
            return
        await self._push(late)

    async def _push(self, late: _Late) -> None:
        state, op = self._state, late.operation
        if op.operation_id not in state.awaited:
            return  # told meanwhile, in place
        # Read before deciding (the decision below takes no turn of the loop): both directions
        # of supersession, a later request replacing this one or an earlier one standing.
        among = (
            {}
            if op.compensates is not None
            else await self._service.supersession.told(
                op, superseded_by=late.superseded_by, known=True
            )
        )
        if op.operation_id not in state.awaited:
            return  # told meanwhile, in place
        operations, session_id = self._service.operations, self.session.session_id
        answered = operations.answered(op.operation_id, session_id)
        retold = op.operation_id in state.retell
        if operations.is_answering(session_id, op.operation_id) or (
            answered is not None and answered.status is op.status and not retold
        ):
            # A call of this conversation answers with this outcome, or was answered with it
            # (a repeat that joined the operation as it finished): the gate records it in
            # place when that answer passes.
            return
        if op.compensates is not None:
            content = compensation_told(op)
            text = f"Undoing an earlier request: {json.dumps(content)}"
        else:
            content = render_operation(op, reconcilable=self._service.reconcilable(op.tool))
            content.update(among)
            text = f"Outcome of an earlier {op.tool} request: {json.dumps(content)}"
        # Calls proposed together are told together: every outcome but the last goes into the
        # context silently, and the last one makes the bot speak about all of them.
        # What follows (a Flows transition) makes the bot speak instead, after the telling.
        step = self.next_step(op) if late.mode is not DeliveryMode.SILENT else None
        run_llm = (
            late.mode is not DeliveryMode.SILENT
            and step is None
            and not self._siblings_pending(op.operation_id)
        )
        self._forget(op.operation_id)
        state.told[op.operation_id] = op.status
        if op.status not in TERMINAL_STATUSES:
            state.awaited.add(op.operation_id)  # UNKNOWN now; its settling comes later
        told = Told(
            operation=op,
            content=content,
            text=text,
            run_llm=run_llm,
            interrupt=late.mode is DeliveryMode.INTERRUPT and self.session.bot_speaking,
            superseded_by=late.superseded_by,
            mode=late.mode,
        )
        with self._service.telemetry.delivery(
            op, self.session, late=True, superseded_by=late.superseded_by
        ):
            if told.interrupt:
                await self._outlet.interrupt()
            await self._outlet.tell(told)
            state.interrupted = False
            await self._record(op, late=True)
        if step is not None:
            try:
                await step()
            except Exception as exc:  # told and recorded: a failed step loses no outcome
                logger.opt(exception=exc).warning(
                    "{}: what follows {} failed: {}", self, op.operation_id, exc
                )

    async def _record_in_place(self, operation_id: str) -> None:
        service = self._service
        try:
            # What the call was answered with, as the runtime rendered it: no read back, and
            # the record says what was told even if the operation moved on meanwhile (then
            # the newer status stays owed). Read only if the runtime no longer keeps it.
            op = service.operations.answered(
                operation_id, self.session.session_id
            ) or await service.ledger.get(operation_id)
            with service.telemetry.delivery(op, self.session, late=False):
                self._state.interrupted = False
                await self._record(op, late=False)
        except Exception as exc:  # a record of delivery must never break the conversation
            logger.bind(session_id=self.session.session_id, operation_id=operation_id).warning(
                "{}: delivery of {} not recorded: {}", self, operation_id, exc
            )

    async def _record(self, op: Operation, *, late: bool) -> None:
        state = self._state
        # Owed an acknowledgement from now on, before the write: the bot may finish saying a
        # short outcome while the delivery is still being recorded.
        if op.operation_id not in state.unacknowledged:
            state.unacknowledged.append(op.operation_id)
        await self._service.mark_delivered(op, session=self.session, late=late)

    def __repr__(self) -> str:
        return f"SessionDelivery({self.session.session_id})"
