"""`ActionResultGate`: tool results reach the context only truthfully, and late ones still arrive.

Place it right before the assistant aggregator (after ``transport.output()``), where it sees
exactly the frames the aggregator sees, in the same order:

* **Truthful cancellation.** When Pipecat cancels a call the runtime owns (a barge-in on a
  blocking tool, Pipecat's ``timeout_secs``), the aggregator would write ``"CANCELLED"``. The
  gate withholds that cancel frame and closes the call with the operation's real state instead
  (still running, committed with its result, unknown and being checked, or really cancelled).
* **Ordering repair.** A cancel (a system frame) can overtake the in-progress frame (a control
  frame that waits behind audio), which would leave the tool message ``IN_PROGRESS`` forever
  (pipecat #5779). The gate keeps such a cancel until the in-progress frame has passed.
* **Late results.** An operation whose call was closed before it finished (interrupted, timed
  out, waiting for approval) is reported when it gets its outcome, as a developer message,
  after the relevance checks: already delivered? superseded by a newer operation on the same
  resource? visible to the active agent? Then the tool's delivery policy applies: ``in_place``
  and ``interrupt`` now, ``when_idle`` once neither the user nor the bot speaks, ``silent``
  without inference, ``suppress`` recorded only.
* **Delivery records.** ``delivered_at`` when a result enters the context, ``acknowledged_at``
  when the bot next finishes speaking without being interrupted.

Held frames and messages are kept in state and released from tasks, never by awaiting inside
``process_frame``. Every frame the gate does not act on is pushed on at once.
"""

from __future__ import annotations

__all__ = ["ActionResultGate"]

import json
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from loguru import logger
from pipecat.frames.frames import (
    BotStartedSpeakingFrame,
    BotStoppedSpeakingFrame,
    Frame,
    FunctionCallCancelFrame,
    FunctionCallInProgressFrame,
    FunctionCallResultFrame,
    FunctionCallResultProperties,
    InterruptionFrame,
    LLMContextFrame,
    LLMFullResponseEndFrame,
    LLMMessagesAppendFrame,
    StartFrame,
    UserStartedSpeakingFrame,
    UserStoppedSpeakingFrame,
)
from pipecat.processors.frame_processor import (
    FrameDirection,
    FrameProcessor,
    FrameProcessorSetup,
)

from pipecat_actions.binding import CONFIRM_TOOL
from pipecat_actions.ledger import Operation, OperationFilter
from pipecat_actions.policy import DeliveryMode, ToolKind
from pipecat_actions.results import render_operation
from pipecat_actions.runtime.supersession import SUPERSEDED_NOTE
from pipecat_actions.session import SessionState
from pipecat_actions.status import TERMINAL_STATUSES, ActionStatus

if TYPE_CHECKING:
    from pipecat_actions.runtime import ActionRuntime

S = ActionStatus
_WATCHED = (
    FunctionCallInProgressFrame,
    FunctionCallCancelFrame,
    FunctionCallResultFrame,
    UserStartedSpeakingFrame,
    UserStoppedSpeakingFrame,
    BotStartedSpeakingFrame,
    BotStoppedSpeakingFrame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
)
_STILL_OPEN = frozenset(
    {
        "running",
        "admitted",
        "failed_retryable",
        "unknown",
        "cancel_requested",
        "awaiting_approval",
        "awaiting_confirmation",
    }
)

_NEVER_RESUMED = frozenset({S.REQUESTED, S.REJECTED, S.AWAITING_CONFIRMATION})
"""Told at the moment of the call or meaningless later: not told again on a new pipeline."""
_RESUMED_AS_TOLD = frozenset({S.COMMITTED, S.FAILED_FINAL, S.COMPENSATED, S.CANCELLED, S.EXPIRED})
"""Finished while nobody listened: told as soon as a new pipeline of the session starts."""


def _compensation_told(op: Operation) -> dict[str, Any]:
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
    return {
        "status": "compensation_unknown",
        **ids,
        "message": (
            f"It is not yet known whether undoing the earlier request {original} worked; it "
            "is being checked. Do not say it was undone."
        ),
    }


@dataclass
class _Late:
    operation: Operation
    mode: DeliveryMode
    superseded_by: str | None


class ActionResultGate(FrameProcessor):
    """Keeps the context truthful about the runtime's operations (see the module docstring).

    Args:
        runtime: The runtime whose operations the calls are.
        session: The session this pipeline serves.
        **kwargs: Passed to `FrameProcessor`.
    """

    def __init__(self, runtime: ActionRuntime, session: SessionState, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.runtime = runtime
        self.session = session
        self._progressed: set[str] = set()
        self._early_cancels: dict[str, FunctionCallCancelFrame] = {}
        self._closed_by_gate: set[str] = set()
        self._awaiting_outcome: set[str] = set()
        self._held: deque[_Late] = deque()
        self._unacknowledged: list[str] = []
        self._interrupted_since_delivery = False
        self._listening = False
        self._group_of_call: dict[str, str] = {}
        self._delivering: set[str] = set()
        self._finished_calls: set[str] = set()
        self._told: dict[str, ActionStatus] = {}
        self._recheck: set[str] = set()
        self._group_of_operation: dict[str, str] = {}
        self._retell: set[str] = set()
        self._confirmations: dict[str, str] = {}

    async def setup(self, setup: FrameProcessorSetup) -> None:  # type: ignore[override]
        """Set up; with Pipecat's tracing on, parent the runtime's spans to its turn spans."""
        await super().setup(setup)
        if setup.enable_tracing and setup.tracing_context is not None:
            self.runtime.telemetry.follow_turns(self.session.session_id, setup.tracing_context)

    # --- frames ----------------------------------------------------------------------------

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        """Act on function-call, speaking and interruption frames; push every frame on."""
        await super().process_frame(frame, direction)
        if not self._listening:
            self.runtime.listen(self.session.session_id, self._on_outcome)
            self._listening = True
            if isinstance(frame, StartFrame):
                # Speaking is this pipeline's state: a session whose last pipeline was cut
                # off while someone spoke starts this one silent.
                self.session.user_speaking = False
                self.session.bot_speaking = False
                self.create_task(
                    self._resume(before=self.runtime.clock.now(), mark=self.runtime.call_mark)
                )
        if direction is FrameDirection.UPSTREAM:
            if isinstance(frame, LLMContextFrame):
                self.session.start_generation()  # the assistant aggregator asks for inference
            await self.push_frame(frame, direction)
            return
        if not isinstance(frame, _WATCHED):
            await self.push_frame(frame, direction)
            return
        if isinstance(frame, FunctionCallCancelFrame):
            await self._on_cancel(frame)
            return
        if isinstance(frame, FunctionCallResultFrame):
            await self._on_result(frame)
            return
        await self.push_frame(frame, direction)
        if isinstance(frame, FunctionCallInProgressFrame):
            self._progressed.add(frame.tool_call_id)
            confirmed = (frame.arguments or {}).get("operation_id")
            if frame.function_name == CONFIRM_TOOL and isinstance(confirmed, str):
                # A confirmation is about an operation too: if it is cancelled, the model is
                # told that operation's real state, never a bare CANCELLED.
                self._confirmations[frame.tool_call_id] = confirmed
            if frame.group_id is not None:
                self._group_of_call[frame.tool_call_id] = frame.group_id
            early = self._early_cancels.pop(frame.tool_call_id, None)
            if early is not None:
                await self._on_cancel(early)
        elif isinstance(frame, UserStartedSpeakingFrame):
            self.session.user_speaking = True
        elif isinstance(frame, UserStoppedSpeakingFrame):
            self.session.user_speaking = False
            self._release_when_idle()
        elif isinstance(frame, BotStartedSpeakingFrame):
            self.session.bot_speaking = True
        elif isinstance(frame, BotStoppedSpeakingFrame):
            self.session.bot_speaking = False
            self._acknowledge()
            self._release_when_idle()
        elif isinstance(frame, InterruptionFrame):
            self._interrupted_since_delivery = True
        elif isinstance(frame, LLMFullResponseEndFrame):
            self.session.settle_generation()

    async def _on_cancel(self, frame: FunctionCallCancelFrame) -> None:
        operation_id = self.runtime.operation_for_call(
            frame.tool_call_id
        ) or self._confirmations.get(frame.tool_call_id)
        if frame.tool_call_id not in self._progressed:
            # Overtook its in-progress frame: pass it on only after that frame (see above).
            self._early_cancels[frame.tool_call_id] = frame
            return
        if operation_id is None:
            await self.push_frame(frame)
            return
        self._closed_by_gate.add(frame.tool_call_id)
        self._finished_calls.add(frame.tool_call_id)
        self.create_task(self._close_truthfully(frame, operation_id))

    async def _close_truthfully(self, cancel: FunctionCallCancelFrame, operation_id: str) -> None:
        op = await self.runtime.ledger.get(operation_id)
        note = None
        if op.status not in TERMINAL_STATUSES:
            # Pipecat sets run_llm on a cancel only when the call ran past its own timeout.
            note = (
                "It is taking longer than the wait allows; the action was not stopped."
                if cancel.run_llm
                else "The user interrupted the wait; the action was not stopped."
            )
            self._await_outcome(operation_id, cancel.tool_call_id)
        result = render_operation(op, note=note)
        # After a barge-in, no inference (the user's turn drives the next one). After a
        # timeout, the aggregator's own rule decides: inference once every call proposed
        # together is done, never one per call of the group.
        run_llm = None if cancel.run_llm else False
        with self.runtime.telemetry.delivery(op, self.session, late=False):
            await self.push_frame(
                FunctionCallResultFrame(
                    function_name=cancel.function_name,
                    tool_call_id=cancel.tool_call_id,
                    arguments={},
                    result=result,
                    run_llm=run_llm,
                    properties=FunctionCallResultProperties(run_llm=run_llm),
                )
            )
            if op.status in TERMINAL_STATUSES:
                await self._mark_delivered(op)

    async def _on_result(self, frame: FunctionCallResultFrame) -> None:
        if frame.function_name not in self.runtime.bindings and frame.function_name != CONFIRM_TOOL:
            # Not the runtime's call: its results (intermediate ones with their run_llm, a
            # reused tool_call_id) are the application's business, passed on as they are.
            await self.push_frame(frame)
            return
        if frame.tool_call_id in self._closed_by_gate:
            self._log(frame.tool_call_id).debug(
                "{}: dropping a result for a call it already closed", self
            )
            return
        final = frame.properties is None or frame.properties.is_final
        if final and frame.tool_call_id in self._finished_calls:
            self._log(frame.tool_call_id).debug(
                "{}: dropping a duplicate final result of {}", self, frame.tool_call_id
            )
            return
        if not final:
            # Intermediate results go into the context silently unless the policy says else.
            frame.properties = FunctionCallResultProperties(
                run_llm=self._intermediate_runs_llm(frame.function_name),
                is_final=False,
                on_context_updated=frame.properties.on_context_updated
                if frame.properties
                else None,
            )
        else:
            self._finished_calls.add(frame.tool_call_id)
        await self.push_frame(frame)
        result = frame.result if isinstance(frame.result, dict) else {}
        operation_id = result.get("operation_id")
        if not isinstance(operation_id, str):
            return
        if result.get("status") in _STILL_OPEN:
            self._await_outcome(operation_id, frame.tool_call_id)
            self.create_task(self._catch_up(operation_id, result.get("status")))
        else:
            # Told in place (e.g. by confirm_action): no late message for it any more.
            self._forget(operation_id)
            # A read's row is written after its answer, in a batch; its refusal at once.
            if not self._is_read(frame.function_name) or result.get("status") == "refused":
                self.create_task(self._mark_delivered_id(operation_id))

    async def _catch_up(self, operation_id: str, told: object) -> None:
        """Tell an outcome that landed after the result was rendered but before it got here.

        The runtime's listeners fire when the outcome is written; if that was before this
        result reached the gate, the operation was not awaited yet and nobody would tell it.
        """
        try:
            current = await self.runtime.ledger.get(operation_id)
        except Exception as exc:  # the listener still covers later outcomes
            logger.warning("{}: could not re-read {}: {}", self, operation_id, exc)
            return
        if current.status.value.lower() != told:
            self._on_outcome(current)

    def _is_read(self, tool: str) -> bool:
        binding = self.runtime.bindings.get(tool)
        return binding is not None and binding.policy.kind is ToolKind.READ

    def _intermediate_runs_llm(self, tool: str) -> bool:
        binding = self.runtime.bindings.get(tool)
        mode = binding.policy.delivery.intermediate if binding else DeliveryMode.SILENT
        return mode not in (DeliveryMode.SILENT, DeliveryMode.SUPPRESS)

    # --- late outcomes ---------------------------------------------------------------------

    def _await_outcome(self, operation_id: str, tool_call_id: str) -> None:
        self._awaiting_outcome.add(operation_id)
        group = self._group_of_call.get(tool_call_id)
        if group is not None:
            self._group_of_operation[operation_id] = group

    def _forget(self, operation_id: str) -> None:
        self._retell.discard(operation_id)
        self._awaiting_outcome.discard(operation_id)
        self._delivering.discard(operation_id)
        self._group_of_operation.pop(operation_id, None)

    def _siblings_pending(self, operation_id: str) -> bool:
        """True if calls proposed together with this one still wait for their outcome."""
        group = self._group_of_operation.get(operation_id)
        return group is not None and any(
            self._group_of_operation.get(other) == group
            for other in self._awaiting_outcome
            if other != operation_id
        )

    async def _resume(self, *, before: float, mark: int) -> None:
        """Take over the session's operations that no conversation was told about yet.

        A pipeline that starts on a session with history (the user reconnected, or the bot
        process restarted) tells what finished while nobody was listening, and tells the rest
        when it finishes. Only operations from ``before`` this pipeline started: its own calls
        are told through their results. Compensations are the application's and are left to it.
        """
        try:
            history = await self.runtime.ledger.list(
                OperationFilter(session_id=self.session.session_id)
            )
        except Exception as exc:  # a ledger hiccup must not break the conversation
            logger.warning("{}: could not look up untold operations: {}", self, exc)
            return
        # Told but not heard to the end counts as untold: the process may have died while
        # the bot was saying it.
        untold = [
            op
            for op in history
            if op.created_at <= before  # at the same instant: a manual clock, or a tie
            and not self.runtime.noted_after(op.operation_id, mark)  # this pipeline's own
            and op.acknowledged_at is None
            and op.compensates is None
            and op.status not in _NEVER_RESUMED
            and op.kind != ToolKind.READ
        ]
        for op in untold:
            self._awaiting_outcome.add(op.operation_id)
            self._retell.add(op.operation_id)
        for op in untold:
            if op.status in _RESUMED_AS_TOLD or op.escalated_at is not None:
                self._on_outcome(op)

    def _on_outcome(self, op: Operation) -> None:
        # The operation stays in _awaiting_outcome until it is told (see _push_late), so that
        # siblings told meanwhile know it is still to come. An UNKNOWN told stays awaited:
        # what reconciliation finds is told too.
        if op.compensates is not None and op.operation_id not in self._told:
            # The application reversed an operation of this session: the conversation still
            # says it happened. Told like a late outcome (the model may have offered to undo).
            self._awaiting_outcome.add(op.operation_id)
        if op.operation_id not in self._awaiting_outcome:
            return
        if op.operation_id in self._delivering:
            self._recheck.add(op.operation_id)  # look again once the delivery under way ends
            return
        if self._told.get(op.operation_id) is op.status:
            return
        self._delivering.add(op.operation_id)
        self.create_task(self._deliver_late(op))

    async def _deliver_late(self, op: Operation) -> None:
        try:
            await self._deliver_late_once(op)
        finally:
            self._delivering.discard(op.operation_id)
            if op.operation_id in self._recheck:
                self._recheck.discard(op.operation_id)
                if op.operation_id in self._awaiting_outcome:
                    self._delivering.add(op.operation_id)
                    self.create_task(self._deliver_late(op))

    async def _deliver_late_once(self, op: Operation) -> None:
        current = await self.runtime.ledger.get(op.operation_id)
        told = self._told.get(current.operation_id)
        told_elsewhere = (
            current.delivered_at is not None and current.operation_id not in self._retell
        )
        if told is current.status or (told is None and told_elsewhere):
            self._delivering.discard(current.operation_id)
            if current.status in TERMINAL_STATUSES:
                self._forget(current.operation_id)
            return
        binding = self.runtime.bindings.get(current.tool)
        delivery = binding.policy.delivery if binding else None
        superseded_by = await self.runtime.superseded_by(current)
        if delivery is None:
            mode = DeliveryMode.WHEN_IDLE
        else:
            mode = delivery.superseded if superseded_by else delivery.late
        late = _Late(current, mode, superseded_by)
        if not self._visible(current):
            self._held.append(late)  # until an agent who may hear it is active
            return
        if mode is DeliveryMode.SUPPRESS:
            self._forget(current.operation_id)
            self.runtime.telemetry.suppressed(current)
            await self.runtime.ledger.annotate(
                current.operation_id, actor=self._actor, detail={"delivery": "suppressed"}
            )
            return
        busy = self.session.user_speaking or self.session.bot_speaking
        if mode is DeliveryMode.WHEN_IDLE and busy:
            self._held.append(late)
            return
        await self._push_late(late)

    async def _push_late(self, late: _Late) -> None:
        op = late.operation
        if op.operation_id not in self._awaiting_outcome:
            return  # told meanwhile, in place
        if op.compensates is not None:
            text = f"Undoing an earlier request: {json.dumps(_compensation_told(op))}"
        else:
            content = render_operation(op)
            if late.superseded_by is not None:
                content["superseded_by"] = late.superseded_by
                content["note"] = SUPERSEDED_NOTE
            text = f"Outcome of an earlier {op.tool} request: {json.dumps(content)}"
        message: Any = {"role": "developer", "content": text}
        if late.mode is DeliveryMode.INTERRUPT and self.session.bot_speaking:
            await self.broadcast_interruption()  # type: ignore[no-untyped-call]
        # Calls proposed together are told together: every outcome but the last goes into the
        # context silently, and the last one makes the bot speak about all of them.
        run_llm = late.mode is not DeliveryMode.SILENT and not self._siblings_pending(
            op.operation_id
        )
        self._forget(op.operation_id)
        self._told[op.operation_id] = op.status
        if op.status not in TERMINAL_STATUSES:
            self._awaiting_outcome.add(op.operation_id)  # UNKNOWN now; its settling comes later
        with self.runtime.telemetry.delivery(
            op, self.session, late=True, superseded_by=late.superseded_by
        ):
            await self.push_frame(LLMMessagesAppendFrame(messages=[message], run_llm=run_llm))
            await self._mark_delivered(op, late=True)

    def _release_when_idle(self) -> None:
        if self.session.user_speaking or self.session.bot_speaking or not self._held:
            return
        ready = [late for late in self._held if self._visible(late.operation)]
        for late in ready:
            self._held.remove(late)
            self.create_task(self._push_late(late))

    def _visible(self, op: Operation) -> bool:
        binding = self.runtime.bindings.get(op.tool)
        allowed = binding.policy.visible_to if binding else ()
        return not allowed or self.session.active_agent in allowed

    # --- handoffs --------------------------------------------------------------------------

    async def handoff(self, agent: str) -> None:
        """Make ``agent`` the active agent; brief it on pending operations; release results.

        Operations belong to the session, not to the agent that started them: results held
        because the previous agent could not see them are delivered if this one may.
        """
        self.session.active_agent = agent
        pending = await self.runtime.ledger.list(
            OperationFilter(
                session_id=self.session.session_id,
                status=[
                    S.RUNNING,
                    S.ADMITTED,
                    S.UNKNOWN,
                    S.AWAITING_APPROVAL,
                    S.AWAITING_CONFIRMATION,
                    S.FAILED_RETRYABLE,
                    S.CANCEL_REQUESTED,
                ],
            )
        )
        if pending:
            self.runtime.telemetry.handoff(agent, pending)
            for op in pending:
                # Recorded so that an operator can check no result was lost in the handoff.
                await self.runtime.ledger.annotate(
                    op.operation_id,
                    actor=self._actor,
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
            await self.push_frame(
                LLMMessagesAppendFrame(
                    messages=[
                        {
                            "role": "developer",
                            "content": "You are now handling this conversation. Operations still "
                            f"pending for the user: {json.dumps(brief)}. Their outcomes will be "
                            "reported here; do not start them again.",
                        }
                    ],
                    run_llm=False,
                )
            )
        self._release_when_idle()

    # --- delivery records ------------------------------------------------------------------

    def _log(self, tool_call_id: str | None = None, *, operation_id: str | None = None) -> Any:
        """The logger bound to this session and a call's (or an operation's) ids."""
        if operation_id is None and tool_call_id is not None:
            operation_id = self.runtime.operation_for_call(tool_call_id)
        return logger.bind(
            session_id=self.session.session_id,
            tool_call_id=tool_call_id,
            operation_id=operation_id,
        )

    @property
    def _actor(self) -> str:
        return f"gate:{self.session.session_id}"

    async def _mark_delivered_id(self, operation_id: str) -> None:
        try:
            op = await self.runtime.ledger.get(operation_id)
            with self.runtime.telemetry.delivery(op, self.session, late=False):
                await self._mark_delivered(op)
        except Exception as exc:  # a record of delivery must never break the conversation
            self._log(operation_id=operation_id).warning(
                "{}: delivery of {} not recorded: {}", self, operation_id, exc
            )

    async def _mark_delivered(self, op: Operation, *, late: bool = False) -> None:
        if op.delivered_at is not None:
            if op.acknowledged_at is None and op.operation_id not in self._unacknowledged:
                self._unacknowledged.append(op.operation_id)  # told again: hear it this time
            return
        # Owed an acknowledgement from now on, before the write: the bot may finish saying a
        # short outcome while the delivery is still being recorded.
        self._unacknowledged.append(op.operation_id)
        self._interrupted_since_delivery = False
        await self.runtime.ledger.annotate(
            op.operation_id,
            actor=self._actor,
            detail={
                "delivered": op.status.value,
                "agent": self.session.active_agent,
                "late": late,
            },
            changes={
                "delivered_at": self.runtime.clock.now(),
                "delivered_agent": self.session.active_agent,
            },
        )

    def _acknowledge(self) -> None:
        if not self._unacknowledged or self._interrupted_since_delivery:
            self._interrupted_since_delivery = False
            return
        done, self._unacknowledged = self._unacknowledged, []
        self.create_task(self._record_acknowledged(done))

    async def _record_acknowledged(self, operation_ids: list[str]) -> None:
        for operation_id in operation_ids:
            try:
                await self.runtime.ledger.annotate(
                    operation_id,
                    actor=self._actor,
                    detail={"acknowledged": True},
                    changes={"acknowledged_at": self.runtime.clock.now()},
                )
            except Exception as exc:
                self._log(operation_id=operation_id).warning(
                    "{}: acknowledgement of {} not recorded: {}", self, operation_id, exc
                )

    async def cleanup(self) -> None:
        """Stop listening to the runtime."""
        self.runtime.unlisten(self.session.session_id, self._on_outcome)
        self.runtime.telemetry.forget_session(self.session.session_id)
        await super().cleanup()  # type: ignore[no-untyped-call]
