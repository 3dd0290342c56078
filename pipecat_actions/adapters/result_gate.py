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
* **Closes before the end.** An ``EndFrame`` (or ``StopFrame``) that follows a cancel waits
  until the cancelled call's truthful result has been pushed, so the context never ends with
  Pipecat's ``IN_PROGRESS``.
* **Late results.** What the conversation still owes the user (an outcome that came after its
  call was closed, a compensation, what a cut-off pipeline of the session never got to say) is
  decided by the runtime's delivery service (`pipecat_actions.runtime.deliveries`); the gate
  is its cascade outlet: it reports the pipeline's events (calls closed, results told in place,
  who speaks, interruptions) and pushes each `Told` as a developer message.

For calls of tools the runtime does not own, the gate changes nothing at all: their
in-progress frames, cancels and results (intermediate or final, with their ``run_llm``) pass
unchanged, in the order they come; Pipecat's own behaviour for them is kept, #5779 included.

The gate does no ledger I/O in ``process_frame``: reads and records run in tasks. Every frame it
does not act on is pushed on at once.
"""

from __future__ import annotations

__all__ = ["ActionResultGate"]

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from loguru import logger
from pipecat.frames.frames import (
    BotStartedSpeakingFrame,
    BotStoppedSpeakingFrame,
    EndFrame,
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
    StopFrame,
    UserStartedSpeakingFrame,
    UserStoppedSpeakingFrame,
)
from pipecat.processors.frame_processor import (
    FrameDirection,
    FrameProcessor,
    FrameProcessorSetup,
)

from pipecat_actions.adapters._closing import closing_frame
from pipecat_actions.results import ToolResult
from pipecat_actions.runtime.calls import (
    CONFIRM_TOOL,
    PENDING_STATUSES,
    SessionDelivery,
    Speaker,
    Told,
)
from pipecat_actions.session import SessionState, warn_if_untracked
from pipecat_actions.status import TERMINAL_STATUSES

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from pipecat_actions.runtime import ActionRuntime

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
    EndFrame,
    StopFrame,
)


class RealtimeSpeaker(Speaker, Protocol):
    """What the gate speaks through for a speech-to-speech service (its realtime adapter)."""

    def played(self, frame: Frame) -> None:
        """A response's end frame passed the gate: the user heard that response to its end."""

    async def append(self, message: dict[str, Any], *, run_llm: bool) -> None:
        """Put ``message`` into the provider's conversation through the service."""


@dataclass
class _Call:
    """What the gate keeps about one Pipecat function call of its pipeline."""

    progressed: bool = False
    early_cancel: FunctionCallCancelFrame | None = None
    """A cancel that overtook the in-progress frame (pipecat #5779), passed on after it."""
    group: str | None = None
    """The group of calls it was proposed with (told together)."""
    confirms: str | None = None
    """The operation a ``confirm_action`` call is about."""
    closed_by_gate: bool = False
    finished: bool = False
    """Its final result passed (or the gate closed it): a second final result is dropped."""


class ActionResultGate(FrameProcessor):
    """Keeps the context truthful about the runtime's operations (see the module docstring).

    Args:
        runtime: The runtime whose operations the calls are.
        session: The session this pipeline serves.
        **kwargs: Passed to `FrameProcessor`. ``enable_direct_mode`` is on unless given: it
            only keeps state and pushes frames on, never waiting, so each frame goes through
            in the task that pushed it, without the input and process queues and the two
            tasks a queued processor keeps (and switches through for every frame).
    """

    def __init__(self, runtime: ActionRuntime, session: SessionState, **kwargs: Any) -> None:
        kwargs.setdefault("enable_direct_mode", True)
        super().__init__(**kwargs)
        self.runtime = runtime
        self.calls = runtime.calls
        self.session = session
        self.delivery: SessionDelivery = self.calls.open_delivery(session, self)
        self._calls: dict[str, _Call] = {}
        self._closing = 0
        self._ends: list[Frame] = []
        self._speaker: RealtimeSpeaker | None = None

    def speak_through(self, speaker: RealtimeSpeaker) -> None:
        """Tell late outcomes through ``speaker`` instead of into the local context.

        A speech-to-speech service keeps its own conversation at the provider, so what is
        owed must reach the provider through the service; the realtime adapters
        (`pipecat_actions.adapters.realtime`) call this. The service then also counts the
        generations (its response start and end), so the gate stops counting them.
        """
        self._speaker = speaker

    @property
    def speaker(self) -> RealtimeSpeaker | None:
        """What late outcomes are told through instead of the gate itself, if anything."""
        return self._speaker

    async def setup(self, setup: FrameProcessorSetup) -> None:  # type: ignore[override]
        """Set up; with Pipecat's tracing on, parent the runtime's spans to its turn spans."""
        await super().setup(setup)
        if setup.enable_tracing and setup.tracing_context is not None:
            self.calls.follow_turns(self.session.session_id, setup.tracing_context)

    # --- the outlet the delivery service speaks through ------------------------------------

    async def tell(self, told: Told) -> None:
        """Push what the delivery service decided to tell, as a developer message."""
        if self._speaker is not None:
            await self._speaker.tell(told)
            return
        message: Any = {"role": "developer", "content": told.text}
        await self.push_frame(LLMMessagesAppendFrame(messages=[message], run_llm=told.run_llm))

    async def interrupt(self) -> None:
        """Cut the bot off for an ``interrupt`` delivery."""
        if self._speaker is not None:
            await self._speaker.interrupt()
            return
        await self.broadcast_interruption()  # type: ignore[no-untyped-call]

    def spawn(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        """Run a task of the delivery service as this processor's task."""
        return self.create_task(coroutine)

    # --- frames ----------------------------------------------------------------------------

    def _call(self, tool_call_id: str) -> _Call:
        call = self._calls.get(tool_call_id)
        if call is None:
            call = self._calls[tool_call_id] = _Call()
        return call

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        """Act on function-call, speaking and interruption frames; push every frame on."""
        await super().process_frame(frame, direction)
        if isinstance(frame, StartFrame):
            self.delivery.start()
            # The tracker upstream has seen this StartFrame already, if there is one.
            warn_if_untracked(self.session, "the ActionResultGate started")
        else:
            self.delivery.listen()  # a pipeline test may start without a StartFrame
        if direction is FrameDirection.UPSTREAM:
            if isinstance(frame, LLMContextFrame) and self._speaker is None:
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
        if isinstance(frame, (EndFrame, StopFrame)) and (self._closing or self._ends):
            self._ends.append(frame)  # after the truthful closes under way (see _close)
            return
        await self.push_frame(frame, direction)
        if isinstance(frame, FunctionCallInProgressFrame) and self._owns(frame.function_name):
            call = self._call(frame.tool_call_id)
            call.progressed = True
            confirmed = (frame.arguments or {}).get("operation_id")
            if frame.function_name == CONFIRM_TOOL and isinstance(confirmed, str):
                # A confirmation is about an operation too: if it is cancelled, the model is
                # told that operation's real state, never a bare CANCELLED.
                call.confirms = confirmed
            call.group = frame.group_id
            early, call.early_cancel = call.early_cancel, None
            if early is not None:
                await self._on_cancel(early)
        elif isinstance(frame, UserStartedSpeakingFrame):
            self.session.user_speaking = True
        elif isinstance(frame, UserStoppedSpeakingFrame):
            self.session.user_speaking = False
            self.delivery.release()
        elif isinstance(frame, BotStartedSpeakingFrame):
            self.session.bot_speaking = True
        elif isinstance(frame, BotStoppedSpeakingFrame):
            self.session.bot_speaking = False
            self.delivery.bot_stopped()
        elif isinstance(frame, InterruptionFrame):
            self.delivery.interrupted()
        elif isinstance(frame, LLMFullResponseEndFrame):
            if self._speaker is None:
                self.session.settle_generation()
            else:
                self._speaker.played(frame)  # the provider's response was heard to its end

    def _owns(self, function_name: str) -> bool:
        return self.calls.owns(function_name)

    async def _on_cancel(self, frame: FunctionCallCancelFrame) -> None:
        if not self._owns(frame.function_name):
            await self.push_frame(frame)  # not the runtime's call: Pipecat's own, unchanged
            return
        call = self._call(frame.tool_call_id)
        if not call.progressed:
            # Overtook its in-progress frame: acted on only after that frame (see above).
            call.early_cancel = frame
            return
        call.closed_by_gate = call.finished = True
        now = self.calls.close_now(frame.function_name, frame.tool_call_id, about=call.confirms)
        if now is not None:
            # No operation behind it: a read (it runs in the handler's task, stopped with it),
            # or a call stopped before it was admitted. Closed with a result, which keeps its
            # place behind the in-progress frame: a re-pushed cancel, a system frame, would
            # overtake that frame again in the aggregator's queue.
            await self.push_frame(closing_frame(frame, now))
            return
        self._closing += 1
        self.create_task(self._close(frame, call.confirms, call.group))

    async def _close(
        self, cancel: FunctionCallCancelFrame, about: str | None, group: str | None
    ) -> None:
        """Close a cancelled call with its operation's real state; then release held ends."""
        try:
            await self._close_truthfully(cancel, about, group)
        finally:
            self._closing -= 1
            if not self._closing:
                ends, self._ends = self._ends, []
                for end in ends:
                    await self.push_frame(end)

    async def _close_truthfully(
        self, cancel: FunctionCallCancelFrame, about: str | None, group: str | None
    ) -> None:
        closed = await self.calls.close_cancelled(
            self.delivery,
            cancel.function_name,
            cancel.tool_call_id,
            timed_out=bool(cancel.run_llm),  # Pipecat sets run_llm only after its timeout
            about=about,
        )
        result, operation_id, op = closed.result, closed.operation_id, closed.operation
        if operation_id is None:
            await self.push_frame(closing_frame(cancel, result))
            return
        if op is None or op.status not in TERMINAL_STATUSES:
            self.delivery.await_outcome(operation_id, group)
        # What the truth leads to (a Flows transition) follows once it is in the context.
        frame = closing_frame(cancel, result, then=self.delivery.next_step(op) if op else None)
        if op is None:
            await self.push_frame(frame)
            return
        with self.calls.telling(op, self.session):
            await self.push_frame(frame)
            if op.status in TERMINAL_STATUSES:
                await self.delivery.told_now(op)

    async def _on_result(self, frame: FunctionCallResultFrame) -> None:
        if not self._owns(frame.function_name):
            # Not the runtime's call: its results (intermediate ones with their run_llm, a
            # reused tool_call_id) are the application's business, passed on as they are.
            await self.push_frame(frame)
            return
        call = self._call(frame.tool_call_id)
        if call.closed_by_gate:
            self._log(frame.tool_call_id).debug(
                "{}: dropping a result for a call it already closed", self
            )
            return
        final = frame.properties is None or frame.properties.is_final
        if final and call.finished:
            self._log(frame.tool_call_id).debug(
                "{}: dropping a duplicate final result of {}", self, frame.tool_call_id
            )
            return
        if not final:
            # Intermediate results go into the context silently unless the policy says else.
            frame.properties = FunctionCallResultProperties(
                run_llm=self.calls.intermediate_runs_llm(frame.function_name),
                is_final=False,
                on_context_updated=frame.properties.on_context_updated
                if frame.properties
                else None,
            )
        else:
            call.finished = True
        await self.push_frame(frame)
        result = ToolResult.of(frame.result)
        operation_id = result.operation_id
        if operation_id is None or not final:
            return
        if result.status in PENDING_STATUSES:
            # Not the outcome: the outcome is told later.
            self.delivery.expect(operation_id, shown=result.said, group=call.group)
        else:
            # Told in place (e.g. by confirm_action): no late message for it any more. A
            # read's row is written after its answer, in a batch; its refusal at once.
            record = not self.calls.is_read(frame.function_name) or result.refused
            self.delivery.told_in_place(operation_id, record=record)

    # --- handoffs --------------------------------------------------------------------------

    async def handoff(self, agent: str) -> None:
        """Make ``agent`` the active agent; brief it on pending operations; release results.

        Operations belong to the session, not to the agent that started them: results held
        because the previous agent could not see them are delivered if this one may.
        """
        brief: Any = await self.delivery.handoff(agent)
        if brief is None:
            return
        if self._speaker is not None:
            await self._speaker.append(brief, run_llm=False)  # the provider's conversation
        else:
            await self.push_frame(LLMMessagesAppendFrame(messages=[brief], run_llm=False))

    # --- logging and cleanup ---------------------------------------------------------------

    def _log(self, tool_call_id: str) -> Any:
        """The logger bound to this session and a call's ids."""
        return logger.bind(
            session_id=self.session.session_id,
            tool_call_id=tool_call_id,
            operation_id=self.calls.operation_for(tool_call_id),
        )

    async def cleanup(self) -> None:
        """Stop listening to the runtime; stop this pipeline's ledger reads."""
        for reading in self.delivery.close():
            await self.cancel_task(reading)
        self.calls.forget_session(self.session.session_id)
        await super().cleanup()  # type: ignore[no-untyped-call]
