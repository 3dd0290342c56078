"""`SessionDelivery`: one pipeline's delivery for one session, and what it keeps meanwhile.

An adapter (the cascade `ActionResultGate`, a speech-to-speech adapter, a Flows adapter) opens
one with an `Outlet` (`Deliveries.open`), reports what happens in its pipeline (a call was
closed before its outcome, a result was told in place, the bot finished speaking, the user
stopped), and is told what to say through `Outlet.tell`: the pipeline's delivery decides when
(the delivery policy, idle detection, calls proposed together told together), whether at all
(already told? suppressed? visible to the active agent?) and with which words. The adapter
decides only how a `Told` reaches the model: a developer message before the assistant
aggregator, an item sent to a realtime provider, a Flows function result.

What one pipeline keeps while it runs is its `PipelineState`; the durable truth (what was
told, what was heard, what is owed) is the ledger's, written and read through the delivery
service (`DeliveryService`, the runtime's `Deliveries`). No frames here.
"""

from __future__ import annotations

__all__ = [
    "PENDING_STATUSES",
    "WATCH_SECS",
    "DeliveryService",
    "NextStep",
    "Outlet",
    "PipelineState",
    "SessionDelivery",
    "Speaker",
    "Told",
    "actor_of",
    "compensation_told",
]

import asyncio
import json
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from typing import Any, Protocol

from loguru import logger

from pipecat_actions.clock import Clock
from pipecat_actions.ledger import Ledger, Operation
from pipecat_actions.observability.telemetry import Telemetry
from pipecat_actions.policy import DeliveryMode
from pipecat_actions.results import is_correction, render_operation
from pipecat_actions.runtime._joins import nap
from pipecat_actions.runtime._operations import Operations
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

    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> asyncio.Future[Any]:
        """Run ``coroutine`` as a task of the pipeline (cancelled when the pipeline ends)."""


NextStep = Callable[[Operation], Callable[[], Awaitable[None]] | None]
"""Given an outcome about to be told, what the conversation moves on to after it, if anything.

A Flows adapter answers with a node transition (`pipecat_actions.adapters.flows`): the telling
then goes into the context silently and the step, run after it, makes the bot speak (in the
new node).
"""


@dataclass
class _Late:
    """An outcome to tell late (not in its call's result), as its policy says."""

    operation: Operation
    mode: DeliveryMode
    superseded_by: str | None


class DeliveryService(Protocol):
    """What a pipeline's delivery asks of the runtime's delivery service (`Deliveries`)."""

    @property
    def ledger(self) -> Ledger:
        """Where operations are read again (and a suppressed delivery annotated)."""

    @property
    def clock(self) -> Clock:
        """The runtime's clock."""

    @property
    def telemetry(self) -> Telemetry:
        """Delivery spans and counters."""

    @property
    def supersession(self) -> Supersession:
        """Which newer operation replaces an older one."""

    @property
    def operations(self) -> Operations:
        """The registry whose outcomes a pipeline listens to."""

    @property
    def progress(self) -> Progress:
        """The effects' progress reports, which a pipeline listens to as well."""

    async def owed(self, session_id: str, *, before: float, mark: int) -> list[Operation]:
        """What the conversation of ``session_id`` is owed from before a pipeline started."""

    async def mark_delivered(self, op: Operation, *, session: SessionState, late: bool) -> None:
        """Record that ``op``, as it is, was told to ``session``'s conversation."""

    async def mark_acknowledged(self, operation_ids: list[str], *, session: SessionState) -> None:
        """Record that what was told about ``operation_ids`` was heard to the end."""

    async def handoff(self, session: SessionState, agent: str) -> dict[str, Any] | None:
        """Make ``agent`` the active agent; return its brief on pending operations, if any."""

    def mode_for(self, op: Operation, *, superseded: bool) -> DeliveryMode:
        """The delivery mode of a late outcome of ``op`` (its tool's policy)."""

    def visible(self, op: Operation, agent: str | None) -> bool:
        """Whether ``agent`` may hear about ``op`` (its tool's ``visible_to``)."""

    def intermediate_mode(self, tool: str) -> DeliveryMode:
        """How progress of ``tool`` reaches the conversation (``delivery.intermediate``)."""

    def reconcilable(self, tool: str) -> bool | None:
        """Whether a reconcile hook checks an UNKNOWN ``tool`` here (None: not registered)."""


def actor_of(session: SessionState) -> str:
    """The actor a delivery's ledger records name: the session's gate."""
    return f"gate:{session.session_id}"


@dataclass
class PipelineState:
    """What one pipeline's delivery keeps while it runs (the durable truth is in the ledger)."""

    to_tell: set[str] = field(default_factory=set)
    """Operations whose outcome this conversation waits to be told (an UNKNOWN told stays:
    what reconciliation finds is told too)."""
    group_of: dict[str, str] = field(default_factory=dict)
    """Operation → the group of calls it was proposed with (told together)."""
    told_status: dict[str, ActionStatus] = field(default_factory=dict)
    """Operation → the status this pipeline told it at, last."""
    owed_from_before: set[str] = field(default_factory=set)
    """Owed from before this pipeline: told here even if an earlier pipeline was told."""
    being_told: set[str] = field(default_factory=set)
    """Operations whose telling is under way (a task of `SessionDelivery._deliver`)."""
    changed_while_told: set[str] = field(default_factory=set)
    """Operations that got news while being told: looked at again once that telling ends."""
    held_outcomes: deque[_Late] = field(default_factory=deque)
    """Outcomes waiting for nobody to speak, or for an agent who may hear them."""
    told_not_heard: list[str] = field(default_factory=list)
    """Operations told since the bot last finished speaking: heard once it does, uncut."""
    cut_off: bool = False
    """The bot was cut off since the last telling: what it said was not heard to the end."""
    watched_elsewhere: set[str] = field(default_factory=set)
    """Awaited operations run elsewhere, re-read by a `SessionDelivery._watch` task."""
    held_progress: dict[str, ProgressReport] = field(default_factory=dict)
    """The latest progress report of each operation, waiting for nobody to speak."""


class SessionDelivery:
    """One pipeline's delivery for one session; adapters call it, it speaks through an `Outlet`.

    Built by `Deliveries.open`. It listens to the runtime's outcomes for the session until
    `close`. Every method an adapter calls from ``process_frame`` returns at once; ledger work
    runs in the outlet's tasks.
    """

    def __init__(self, service: DeliveryService, session: SessionState, outlet: Outlet) -> None:
        self._service = service
        self.session = session
        self._outlet = outlet
        self._state = PipelineState()
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
            # Not a method of self: the task outlives the pipeline until its write returns,
            # and must not keep the pipeline (self -> outlet -> processors) alive meanwhile.
            self._service.operations.keep_audit(
                self._outlet.spawn(
                    _record_in_place(
                        self._service, self.session, self._state, operation_id, repr(self)
                    )
                )
            )

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
        self._state.cut_off = False
        await self._record(op, late=False)

    def await_outcome(self, operation_id: str, group: str | None = None) -> None:
        """Tell ``operation_id``'s outcome when it comes (its call was closed before it)."""
        self._await(operation_id, group)

    def bot_stopped(self) -> None:
        """The bot finished speaking: what it said since the last delivery was heard."""
        state = self._state
        if state.told_not_heard and not state.cut_off:
            done, state.told_not_heard = state.told_not_heard, []
            self._service.operations.keep_audit(
                self._outlet.spawn(self._service.mark_acknowledged(done, session=self.session))
            )
        state.cut_off = False
        self.release()

    def interrupted(self) -> None:
        """The bot was cut off: what it was saying was not heard to the end."""
        self._state.cut_off = True

    def release(self) -> None:
        """Tell what waits for the user and the bot to be quiet, if they are."""
        state = self._state
        if self.session.user_speaking or self.session.bot_speaking:
            return
        held_progress, state.held_progress = list(state.held_progress.values()), {}
        for report in held_progress:
            self._outlet.spawn(self._tell_progress(report, DeliveryMode.WHEN_IDLE))
        if not state.held_outcomes:
            return
        ready = [late for late in state.held_outcomes if self._visible(late.operation)]
        for late in ready:
            state.held_outcomes.remove(late)
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
        if op.compensates is not None and op.operation_id not in state.told_status:
            # The application reversed an operation of this session: the conversation still
            # says it happened. Told like a late outcome (the model may have offered to undo).
            state.to_tell.add(op.operation_id)
        if is_correction(op):
            # It was told it did not happen, and the system of record now says it did: the
            # conversation is owed the correction, whichever call or pipeline told it first.
            state.to_tell.add(op.operation_id)
        if op.operation_id not in state.to_tell:
            return
        if (
            op.status not in TERMINAL_STATUSES
            and op.operation_id not in state.watched_elsewhere
            and self._service.operations.get(op.operation_id) is None
        ):
            # Handed to a person (escalated): nothing here looks at it again, but a person or
            # another process may settle it; it is re-read until this conversation is told.
            state.watched_elsewhere.add(op.operation_id)
            self._reading(self._watch(op.operation_id))
        if self._service.operations.is_answering(self.session.session_id, op.operation_id):
            return  # a call waiting for it (confirm_action, a join) tells it in place, once
        answered = self._service.operations.answered(op.operation_id, self.session.session_id)
        retold = op.operation_id in state.owed_from_before
        if answered is not None and answered.status is op.status and not retold:
            # A call's result holds this very outcome and is on its way to the gate, which
            # records it in place: a catch-up or a watcher that read it meanwhile is too late.
            # (A new pipeline retells what an old one may not have heard: `owed_from_before`.)
            return
        if op.operation_id in state.being_told:
            state.changed_while_told.add(
                op.operation_id
            )  # look again once the delivery under way ends
            return
        if state.told_status.get(op.operation_id) is op.status:
            return
        state.being_told.add(op.operation_id)
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
            self._state.held_progress[op.operation_id] = report
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
        if untracked and operation_id not in state.to_tell | state.watched_elsewhere:
            # Run elsewhere: this process's listeners will not hear its outcome.
            state.watched_elsewhere.add(operation_id)
            self._reading(self._watch(operation_id))
        state.to_tell.add(operation_id)
        if group is not None:
            state.group_of[operation_id] = group

    async def _watch(self, operation_id: str) -> None:
        """Re-read an awaited operation run elsewhere until this conversation was told it."""
        state, service = self._state, self._service
        seen: ActionStatus | None = None
        try:
            async with service.ledger.notices(operation_id) as changed:
                # Woken by the ledger's notice where it gives them (re-read at once once
                # listening: a change since the caller's read is not missed), else polled.
                pause = 0.0 if changed is not None else WATCH_SECS
                while operation_id in state.to_tell:
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
            state.watched_elsewhere.discard(operation_id)

    def _forget(self, operation_id: str) -> None:
        state = self._state
        state.owed_from_before.discard(operation_id)
        state.to_tell.discard(operation_id)
        state.being_told.discard(operation_id)
        state.group_of.pop(operation_id, None)

    def _siblings_pending(self, operation_id: str) -> bool:
        """True if calls proposed together with this one still wait for their outcome."""
        groups = self._state.group_of
        group = groups.get(operation_id)
        return group is not None and any(
            groups.get(other) == group for other in self._state.to_tell if other != operation_id
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
            self._state.owed_from_before.add(op.operation_id)
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
            state.being_told.discard(op.operation_id)
            if op.operation_id in state.changed_while_told:
                state.changed_while_told.discard(op.operation_id)
                if op.operation_id in state.to_tell:
                    state.being_told.add(op.operation_id)
                    self._outlet.spawn(self._deliver(op))

    async def _deliver_once(self, op: Operation) -> None:
        state, service = self._state, self._service
        current = await service.ledger.get(op.operation_id)
        told = state.told_status.get(current.operation_id)
        told_elsewhere = (
            current.delivered_status is current.status
            and current.operation_id not in state.owed_from_before
        )
        if told is current.status or (told is None and told_elsewhere):
            if current.status in TERMINAL_STATUSES:
                self._forget(current.operation_id)
            return
        superseded_by = await service.supersession.superseded_by(current)
        mode = service.mode_for(current, superseded=superseded_by is not None)
        late = _Late(current, mode, superseded_by)
        if not self._visible(current):
            state.held_outcomes.append(late)  # until an agent who may hear it is active
            return
        if late.mode is DeliveryMode.SUPPRESS:
            self._forget(current.operation_id)
            service.telemetry.suppressed(current)
            await service.ledger.annotate(
                current.operation_id,
                actor=actor_of(self.session),
                detail={"delivery": "suppressed"},
            )
            return
        busy = self.session.user_speaking or self.session.bot_speaking
        if late.mode is DeliveryMode.WHEN_IDLE and busy:
            state.held_outcomes.append(late)
            return
        await self._push(late)

    async def _push(self, late: _Late) -> None:
        state, op = self._state, late.operation
        if op.operation_id not in state.to_tell:
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
        if op.operation_id not in state.to_tell:
            return  # told meanwhile, in place
        operations, session_id = self._service.operations, self.session.session_id
        answered = operations.answered(op.operation_id, session_id)
        retold = op.operation_id in state.owed_from_before
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
        state.told_status[op.operation_id] = op.status
        if op.status not in TERMINAL_STATUSES:
            state.to_tell.add(op.operation_id)  # UNKNOWN now; its settling comes later
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
            state.cut_off = False
            await self._record(op, late=True)
        if step is not None:
            try:
                await step()
            except Exception as exc:  # told and recorded: a failed step loses no outcome
                logger.opt(exception=exc).warning(
                    "{}: what follows {} failed: {}", self, op.operation_id, exc
                )

    async def _record(self, op: Operation, *, late: bool) -> None:
        await _record(self._service, self.session, self._state, op, late=late)

    def __repr__(self) -> str:
        return f"SessionDelivery({self.session.session_id})"


async def _record(
    service: DeliveryService,
    session: SessionState,
    state: PipelineState,
    op: Operation,
    *,
    late: bool,
) -> None:
    """Record that ``op`` was told to ``session`` in this pipeline."""
    # Owed an acknowledgement from now on, before the write: the bot may finish saying a
    # short outcome while the delivery is still being recorded.
    if op.operation_id not in state.told_not_heard:
        state.told_not_heard.append(op.operation_id)
    await service.mark_delivered(op, session=session, late=late)


async def _record_in_place(
    service: DeliveryService,
    session: SessionState,
    state: PipelineState,
    operation_id: str,
    name: str,
) -> None:
    """Record the delivery of a call's own answer (`SessionDelivery.told_in_place`).

    It holds only what the write needs, not the pipeline's delivery: ``name`` is its name, for
    the log.
    """
    try:
        # What the call was answered with, as the runtime rendered it: no read back, and the
        # record says what was told even if the operation moved on meanwhile (then the newer
        # status stays owed). Read only if the runtime no longer keeps it.
        op = service.operations.answered(
            operation_id, session.session_id
        ) or await service.ledger.get(operation_id)
        with service.telemetry.delivery(op, session, late=False):
            state.cut_off = False
            await _record(service, session, state, op, late=False)
    except Exception as exc:  # a record of delivery must never break the conversation
        logger.bind(session_id=session.session_id, operation_id=operation_id).warning(
            "{}: delivery of {} not recorded: {}", name, operation_id, exc
        )
