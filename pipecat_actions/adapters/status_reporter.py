"""`ActionStatusReporter`: RTVI clients hear the real status of the runtime's operations.

Pipecat's ``RTVIObserver`` reports every function call to RTVI clients, and turns every
``FunctionCallCancelFrame`` into ``llm-function-call-stopped {cancelled: true}`` whatever the
runtime does next: after a barge-in or Pipecat's ``timeout_secs`` only the *wait* ended, and the
booking goes on. For the tools the runtime owns, `rtvi_observer_params` turns those reports off
(``RTVIFunctionCallReportLevel.DISABLED``), and the reporter tells the client instead, in an RTVI
server message (an ``RTVIServerMessageFrame``, which the client receives as ``server-message``)::

    {"type": "action-status", "event": "wait_interrupted", "operation_id": "op_...",
     "tool": "book_table", "tool_call_id": "call_1", "status": "running",
     "message": "book_table is in progress; the outcome will follow."}

``status`` is what the ledger says at that moment, lower case, with the ``message`` the model
is told (`pipecat_actions.results.render_operation`). ``event`` says why the message was sent:

* ``proposed``: the model called the tool; ``status`` is ``requested`` and there is no
  ``operation_id`` yet (admission decides);
* ``wait_interrupted`` / ``wait_timed_out``: Pipecat stopped waiting for the call (a barge-in,
  or its ``timeout_secs``); ``status`` is the operation's real one (``running``, ``committed``,
  ...), ``cancelled`` only when it was cancelled. Before admission ended it is ``requested``:
  whether the call goes ahead is not known yet, and an outcome follows if it does;
* ``changed``: the operation's status changed, whether the call's own result told it
  (``committed``, ``failed_final``, ``awaiting_approval``, ``rejected``, ...) or it came later,
  after the wait ended (``committed`` after ``unknown``, ``failed_final`` at a deadline,
  ``committed`` or ``rejected`` after an approval, ``compensated``; a compensation's own
  operation carries ``compensates``, the operation it reverses);
* ``answered``: a call about an operation another call made (the model's ``cancel_<tool>``,
  ``confirm_action``) got its answer: ``tool`` and ``tool_call_id`` are that call's,
  ``status`` and ``message`` its answer, ``operation_id`` the operation it is about. The
  operation's own statuses stay under the operation's own call (the one that proposed it),
  whatever a cancel or a confirmation answered.

A message never carries arguments or result values, and its ``message`` is cut to
`MAX_MESSAGE_CHARS`, so a provider's huge error text cannot blow it up. An operation's messages
never go back in time: a record older (``event_seq``) than the one last told is dropped, and
so is one that tells the same status again (a wait that ended is always told). Calls of tools
the runtime does not own are left to Pipecat's own reports.

Place it right after the LLM service (the pipeline template does): it sees the service's
downstream function-call frames before the output transport holds them behind audio and
before the `ActionResultGate` replaces a cancel. It reads the ledger only in tasks; every frame
passes on at once, unchanged.
"""

from __future__ import annotations

__all__ = ["ACTION_STATUS", "MAX_MESSAGE_CHARS", "ActionStatusReporter", "rtvi_observer_params"]

import asyncio
import copy
from collections import OrderedDict, deque
from collections.abc import Coroutine, Mapping
from typing import TYPE_CHECKING, Any

from loguru import logger
from pipecat.frames.frames import (
    CancelFrame,
    EndFrame,
    Frame,
    FunctionCallCancelFrame,
    FunctionCallInProgressFrame,
    FunctionCallResultFrame,
    StartFrame,
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.processors.frameworks.rtvi.frames import RTVIServerMessageFrame
from pipecat.processors.frameworks.rtvi.observer import (
    RTVIFunctionCallReportLevel,
    RTVIObserverParams,
)

from pipecat_actions._recent import remember
from pipecat_actions.ledger import Operation
from pipecat_actions.policy import ToolKind
from pipecat_actions.policy.fields import cancel_tool_name
from pipecat_actions.results import ToolResult
from pipecat_actions.runtime.calls import CONFIRM_TOOL
from pipecat_actions.session import SessionState

if TYPE_CHECKING:
    from pipecat_actions.runtime import ActionRuntime

ACTION_STATUS = "action-status"
"""The ``type`` of every server message the reporter sends."""

MAX_MESSAGE_CHARS = 500
"""The longest ``message`` a client is sent; longer text is cut and ends with an ellipsis."""

_MAX_NAME_CHARS = 128
"""The longest tool name, tool call id or status a client is sent."""

_REMEMBERED = 1_000
"""How many calls and operations one reporter keeps track of (the oldest are forgotten)."""

_CALL_FRAMES = (FunctionCallInProgressFrame, FunctionCallCancelFrame, FunctionCallResultFrame)
_WAIT_ENDED = frozenset({"wait_interrupted", "wait_timed_out"})


def rtvi_observer_params(
    runtime: ActionRuntime, params: RTVIObserverParams | None = None
) -> RTVIObserverParams:
    """Return RTVI observer parameters that leave the runtime's tools to `ActionStatusReporter`.

    Pipecat's function-call reports are turned off (``DISABLED``) for every tool registered on
    ``runtime``, every tool its policy names (registered later by ``instrument`` or
    `pipecat_actions.adapters.flows.FlowActions`, node by node) and ``confirm_action``; every
    other tool keeps the level ``params`` gives it. Pass the result to
    ``PipelineWorker(..., rtvi_observer_params=...)``.

    Args:
        runtime: The runtime whose tools are reported by the `ActionStatusReporter`.
        params: The parameters to start from (default: Pipecat's); they are not changed.
    """
    made = copy.copy(params) if params is not None else RTVIObserverParams()
    levels = dict(made.function_call_report_level)
    calls = runtime.calls
    cancels = [cancel_tool_name(name) for name in calls.bindings]
    for name in [*calls.bindings, *calls.policy.names(), CONFIRM_TOOL]:
        levels[name] = RTVIFunctionCallReportLevel.DISABLED
    for name in cancels:
        if calls.cancel_target(name) is not None:  # the runtime's cancel_<tool>
            levels[name] = RTVIFunctionCallReportLevel.DISABLED
    made.function_call_report_level = levels
    return made


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


class ActionStatusReporter(FrameProcessor):
    """Tells RTVI clients each runtime-owned call's real status (see the module docstring).

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
        self._told: OrderedDict[str, tuple[int, str]] = OrderedDict()
        self._call_of: OrderedDict[str, str] = OrderedDict()
        self._closed: OrderedDict[str, None] = OrderedDict()
        self._confirming: OrderedDict[str, str] = OrderedDict()
        self._outbox: deque[dict[str, Any]] = deque()
        self._pump: asyncio.Task[None] | None = None
        self._in_frame = False
        """`process_frame` is noting a call's frame: what it sends is pushed there, after it."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._listening = False

    # --- frames ----------------------------------------------------------------------------

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        """Note the function-call frames of the runtime's tools; push every frame on."""
        await super().process_frame(frame, direction)
        if isinstance(frame, StartFrame):
            self._listen()
        elif isinstance(frame, (EndFrame, CancelFrame)):
            self._stop_listening()
        elif (
            direction is FrameDirection.DOWNSTREAM
            and isinstance(frame, _CALL_FRAMES)
            and self._owns(frame.function_name)
        ):
            self._in_frame = True
            try:
                self._on_call(frame)
            finally:
                self._in_frame = False
        await self.push_frame(frame, direction)
        if self._outbox and (self._pump is None or self._pump.done()):
            # What the frame's call made it send, right after the frame; no task per message.
            await self._drain()

    def _owns(self, tool: str) -> bool:
        return self.calls.owns(tool)

    def _on_call(
        self, frame: FunctionCallInProgressFrame | FunctionCallCancelFrame | FunctionCallResultFrame
    ) -> None:
        call = frame.tool_call_id
        if isinstance(frame, FunctionCallInProgressFrame):
            if self.calls.cancel_target(frame.function_name) is not None:
                return  # about an operation that exists already: told when the cancel answers
            if frame.function_name == CONFIRM_TOOL:
                # About an operation that exists already: told when the confirmation answers.
                confirmed = (frame.arguments or {}).get("operation_id")
                if isinstance(confirmed, str) and len(confirmed) <= _MAX_NAME_CHARS:
                    remember(self._confirming, call, confirmed, keep=_REMEMBERED)
            elif call not in self._closed:  # a cancel (a system frame) may have overtaken it
                self._send(
                    self._message(
                        "proposed",
                        tool=frame.function_name,
                        tool_call_id=call,
                        status="requested",
                        message=f"{frame.function_name} was requested; it is being checked.",
                    )
                )
            return
        remember(self._closed, call, None, keep=_REMEMBERED)
        if isinstance(frame, FunctionCallCancelFrame):
            # Pipecat asks for inference on a cancel only when the call ran past its timeout.
            event = "wait_timed_out" if frame.run_llm else "wait_interrupted"
            confirmed = self._confirming.get(call)
            operation_id = self.calls.operation_for(call) or confirmed
            if operation_id is None:
                self._send(self._not_admitted(event, frame.function_name, call))
                return
            # Looked up by the provider's call id (not unique across sessions) or named by the
            # model (confirm_action): told only if it is this session's.
            self._spawn(
                self._read(operation_id, event, call, ours_only=True, about=confirmed is not None)
            )
            return
        if frame.properties is not None and not frame.properties.is_final:
            return
        result = ToolResult.of(frame.result)
        operation_id = result.operation_id
        if self._is_about_another_call(frame.function_name):
            self._on_answer_about(frame.function_name, call, result, operation_id)
            return
        # The operation the runtime answered with is what this session's model was told (a
        # duplicate may join another session's); any other is told only if it is this one's.
        ours_only = False
        if operation_id is None:
            operation_id = self.calls.operation_for(call)
            ours_only = True
        if operation_id is not None and not self._is_read(frame.function_name):
            told = self._told.get(operation_id)
            if told is not None and told[1] == result.said:
                return  # the client has this status already (the runtime's word came first)
            fallback = (frame.function_name, result)
            self._spawn(
                self._read(operation_id, "changed", call, ours_only=ours_only, fallback=fallback)
            )
        elif "status" in result:
            # A refusal before any operation was recorded, or a read (its record is written
            # after its answer, in a batch): told as the model got it.
            self._send(self._answer(frame.function_name, call, result, operation_id))

    def _is_about_another_call(self, tool: str) -> bool:
        """Whether ``tool``'s calls are about an operation another call made.

        The model's ``cancel_<tool>`` and ``confirm_action`` name an operation that exists
        already; their answers are theirs, and the operation's statuses stay under its own call.
        """
        return self.calls.about_another_call(tool)

    def _on_answer_about(
        self, tool: str, call: str, result: Mapping[str, Any], operation_id: Any
    ) -> None:
        """A call about another call's operation was answered (see `_is_about_another_call`).

        It gets its own message, under its own id, with its own answer; the operation's
        status, if that is news, is told under the operation's own call.
        """
        named = operation_id if isinstance(operation_id, str) else None
        if "status" in result:
            self._send(self._answer(tool, call, result, named, event="answered"))
        if named is not None:
            # Named by the model: told only if it is this session's.
            self._spawn(self._read(named, "changed", None, ours_only=True))

    def _is_read(self, tool: str) -> bool:
        policy = self.calls.policy_of(tool)
        return policy is not None and policy.kind is ToolKind.READ

    # --- operations ------------------------------------------------------------------------

    def _on_outcome(self, op: Operation) -> None:
        # Called inside the runtime when an outcome is written: never raise, never wait.
        try:
            self._tell(op, "changed", authoritative=True)
            if op.compensates is not None:
                # The operation it reverses moved too (COMPENSATED, or back to COMMITTED).
                self._spawn(self._read(op.compensates, "changed", None, ours_only=True))
        except Exception as exc:
            logger.warning("{}: outcome of {} not reported: {}", self, op.operation_id, exc)

    async def _read(
        self,
        operation_id: str,
        event: str,
        tool_call_id: str | None,
        *,
        ours_only: bool = False,
        fallback: tuple[str, Mapping[str, Any]] | None = None,
        about: bool = False,
    ) -> None:
        """Tell ``operation_id`` as the ledger has it; unread, the call's result (``fallback``).

        ``about``: ``tool_call_id`` is a call about the operation (``confirm_action``), not its
        own: the message goes under that call, which the operation's later statuses do not.
        """
        try:
            op = await self.calls.read(operation_id)
        except Exception as exc:  # a ledger hiccup must not break the conversation
            logger.warning("{}: could not read {}: {}", self, operation_id, exc)
            if fallback is not None and "status" in fallback[1] and operation_id not in self._told:
                tool, result = fallback
                self._send(self._answer(tool, tool_call_id, result, operation_id))
            return
        if ours_only and op.session_id != self.session.session_id:
            return
        if about and tool_call_id is not None:
            self._tell_about(op, event, tool_call_id)
            return
        self._tell(op, event, tool_call_id=tool_call_id)

    def _tell(
        self,
        op: Operation,
        event: str,
        *,
        tool_call_id: str | None = None,
        authoritative: bool = False,
    ) -> None:
        """Send ``op``'s status, unless the client was told as much or more already."""
        told = self.calls.told(op)
        status = str(told.said)
        if not self._is_news(op, status, event, authoritative=authoritative):
            return
        remember(self._told, op.operation_id, (op.event_seq, status), keep=_REMEMBERED)
        if tool_call_id is not None:
            remember(self._call_of, op.operation_id, tool_call_id, keep=_REMEMBERED)
        data = self._message(
            event,
            tool=op.tool,
            tool_call_id=self._call_of.get(op.operation_id, op.provider_call_id),
            status=status,
            message=told.message,
            operation_id=op.operation_id,
        )
        if op.compensates is not None:
            data["compensates"] = op.compensates
        self._send(data)

    def _tell_about(self, op: Operation, event: str, tool_call_id: str) -> None:
        """Send ``op``'s status under a call about it (its own call's record is left alone)."""
        told = self.calls.told(op)
        self._send(
            self._message(
                event,
                tool=op.tool,
                tool_call_id=tool_call_id,
                status=str(told.said),
                message=told.message,
                operation_id=op.operation_id,
            )
        )

    def _is_news(self, op: Operation, status: str, event: str, *, authoritative: bool) -> bool:
        last = self._told.get(op.operation_id)
        if last is None:
            return True
        seq, last_status = last
        if op.event_seq < seq:
            return False  # read before the record last told was written
        if status == last_status:
            return event in _WAIT_ENDED  # the client learns the wait ended, the action goes on
        # Same record, another status: only the runtime's own word (an outcome it knows before
        # the ledger holds it) beats what was told; a read of that record is older news.
        return op.event_seq > seq or authoritative

    # --- messages --------------------------------------------------------------------------

    def _message(
        self,
        event: str,
        *,
        tool: str,
        tool_call_id: str | None,
        status: str,
        message: str,
        operation_id: str | None = None,
    ) -> dict[str, Any]:
        return {
            "type": ACTION_STATUS,
            "event": event,
            "operation_id": operation_id,
            "tool": _cut(tool, _MAX_NAME_CHARS),
            "tool_call_id": None if tool_call_id is None else _cut(tool_call_id, _MAX_NAME_CHARS),
            "status": _cut(status, _MAX_NAME_CHARS),
            "message": _cut(message, MAX_MESSAGE_CHARS),
        }

    def _not_admitted(self, event: str, tool: str, tool_call_id: str) -> dict[str, Any]:
        """The message of a wait that ended with no operation known for the call."""
        if self._is_read(tool):
            # A read runs in the handler's task: the cancel stopped it, and it changed nothing.
            status, message = "cancelled", f"{tool} was stopped with the wait; it changed nothing."
        else:
            # Admission goes on (the runtime shields it): an outcome follows if it runs.
            status = "requested"
            message = (
                f"The wait for {tool} ended before it was admitted; whether it goes ahead is "
                "not known yet."
            )
        return self._message(
            event, tool=tool, tool_call_id=tool_call_id, status=status, message=message
        )

    def _answer(
        self,
        tool: str,
        tool_call_id: str | None,
        result: Mapping[str, Any],
        operation_id: str | None = None,
        *,
        event: str = "changed",
    ) -> dict[str, Any]:
        """The message of a call's result as the model got it (no record of it to read)."""
        return self._message(
            event,
            tool=tool,
            tool_call_id=tool_call_id,
            status=str(result.get("status")),
            message=str(result.get("message", "")),
            operation_id=operation_id,
        )

    def _send(self, data: dict[str, Any]) -> None:
        # One pusher at a time, so the client gets the messages in the order decided: the
        # frame's own `process_frame` (see there), else one task, which takes what is queued
        # meanwhile too.
        self._outbox.append(data)
        if not self._in_frame and (self._pump is None or self._pump.done()):
            self._pump = self._spawn(self._drain())

    async def _drain(self) -> None:
        while self._outbox:
            await self.push_frame(RTVIServerMessageFrame(data=self._outbox.popleft()))

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = self.create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # --- lifecycle -------------------------------------------------------------------------

    def _listen(self) -> None:
        if not self._listening:
            self.calls.listen(self.session.session_id, self._on_outcome)
            self._listening = True

    def _stop_listening(self) -> None:
        if self._listening:
            self.calls.unlisten(self.session.session_id, self._on_outcome)
            self._listening = False

    async def cleanup(self) -> None:
        """Stop listening to the runtime and cancel the reads and sends still under way."""
        self._stop_listening()
        for task in list(self._tasks):
            await self.cancel_task(task)
        await super().cleanup()  # type: ignore[no-untyped-call]
