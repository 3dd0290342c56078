"""The adapter for the Gemini Live API (``GeminiLiveLLMService``, and its Vertex subclass).

Needs Pipecat's ``google`` extra (``pip install 'pipecat-ai[google]==1.14.0'``, or this
package's ``gemini`` extra). What the 1.14 service does and what the adapter changes
(`pipecat/services/google/gemini_live/llm.py`):

* **behavior.** The service declares a tool ``NON_BLOCKING`` when its handler was registered
  with ``cancel_on_interruption=False``. The adapter declares each action of the runtime from
  its policy's ``mode`` (``background`` → NON_BLOCKING, ``blocking`` → BLOCKING where the model
  blocks by default only if asked), whatever the handler's barge-in setting.
* **scheduling.** The service sends WHEN_IDLE or SILENT only, from ``run_llm``. A background
  action's call stays open at the provider while it runs (Pipecat's async tools), and its
  answer comes after the conversation moved on, so the adapter schedules it from the tool's
  ``delivery.late``: ``silent`` → SILENT, ``when_idle`` → WHEN_IDLE, ``interrupt`` →
  INTERRUPT (SILENT while calls proposed with it still run). Intermediate results follow
  ``delivery.intermediate`` (SILENT by default). An answer that is no outcome yet (waiting for
  a person's approval, being checked) goes with ``will_continue`` and SILENT: the call stays
  open, and the outcome answers it when the delivery service tells it.
* **toolCallCancellation.** The service ignores it. The adapter treats it as a barge-in on
  those calls: a blocking call's wait is cancelled (the runtime's ``on_interruption`` decides
  about the action, and the truth is told), a background call's operation gets its
  ``on_interruption`` too. The provider no longer waits on those ids, so their truth is told
  as text.
* **Generations.** The service emits no turn frames; a generation runs from the model's first
  content (or tool call) to ``turn_complete``, and ends at a tool call too: a blocking call
  stops the model's turn until it is answered, so ``admit_when: turn_confirmed`` would wait
  forever for a ``turn_complete``. ``interrupted`` marks the generation under way interrupted;
  a call bundled with it is a stale proposal. What the model retracts after proposing, it
  cancels (``toolCallCancellation``). User turns (for verbal confirmations) need local VAD in
  the user aggregator, as Pipecat warns.
* **Reconnects.** The service drops a tool result sent while it reconnects (pipecat #5465) and
  forgets its call ids. The adapter holds such a result until the session is back and tells
  it as text; late outcomes wait for the session too.
* **The start-up session.** The service connects when the pipeline starts, and connects again
  when the pipeline's first context brings tools or instructions of its own (closing the
  first session a moment later), seeding the new one from the local context. So nothing is
  told before the service has had that first context (`RealtimeAdapter.ready`): an outcome
  goes once, into the session the conversation goes on in. A telling that asks for an
  answer before then asks for the context.

Which models take which settings (Pipecat 1.14's own gates, which the adapter follows):
NON_BLOCKING, ``scheduling`` and ``will_continue`` only where ``_supports_non_blocking_tools``
holds (Gemini 2.x, 3.8 and later, and model ids with no version); never on 3.0 to 3.7 nor on
Vertex AI, where a background action's call blocks like a blocking one (the adapter registers
it so: a barge-in ends the wait, the truth is told, the outcome follows as text; Pipecat would
otherwise write async-tool messages those models cannot take, and report an error). The 3.8
thinking models accept only NON_BLOCKING: a blocking action cannot make them wait (the model
may talk on; its outcome is still told truthfully), which is logged once.
"""

from __future__ import annotations

__all__ = ["GeminiLiveAdapter"]

import asyncio
import json
from typing import Any

from google.genai.types import FunctionResponse, FunctionResponseScheduling
from loguru import logger
from pipecat.adapters.llm.services.gemini_live_adapter import GeminiLiveLLMAdapter
from pipecat.frames.frames import (
    FunctionCallInProgressFrame,
    FunctionCallResultFrame,
    LLMMessagesAppendFrame,
)
from pipecat.processors.frame_processor import FrameDirection

from pipecat_actions.adapters._pipecat_private import gemini_live
from pipecat_actions.adapters.realtime._base import RealtimeAdapter
from pipecat_actions.policy import DeliveryMode, ExecutionMode
from pipecat_actions.results import ToolResult
from pipecat_actions.runtime.calls import PENDING_STATUSES, Told
from pipecat_actions.status import ActionStatus

_KEPT_OPEN = frozenset(
    status
    for status in PENDING_STATUSES
    if status not in (ActionStatus.AWAITING_CONFIRMATION, ActionStatus.REQUESTED)
)
"""An answer with one of these statuses is no outcome yet, and the outcome comes without the
user: the call stays open for it. (A confirmation is asked now and answered by
``confirm_action``: that answer closes the call.)"""
_OUTCOMES = frozenset(
    {
        ActionStatus.COMMITTED,
        ActionStatus.FAILED_FINAL,
        ActionStatus.CANCELLED,
        ActionStatus.EXPIRED,
        ActionStatus.COMPENSATED,
        ActionStatus.REJECTED,
    }
)
_SCHEDULING = {
    DeliveryMode.SILENT: "SILENT",
    DeliveryMode.INTERRUPT: "INTERRUPT",
    DeliveryMode.WHEN_IDLE: "WHEN_IDLE",
    DeliveryMode.IN_PLACE: "WHEN_IDLE",
    DeliveryMode.SUPPRESS: "SILENT",
}
"""Gemini's ``scheduling`` for each delivery mode (a call must still be answered: suppress is
SILENT)."""


def scheduling_for(told: Told) -> str:
    """The ``scheduling`` of the response that tells ``told`` (SILENT if nobody is to answer)."""
    if not told.run_llm:
        return "SILENT"
    return _SCHEDULING.get(told.mode, "WHEN_IDLE")


class GeminiLiveAdapter(RealtimeAdapter):
    """`RealtimeAdapter` for ``GeminiLiveLLMService``; see the module docstring."""

    service_name = "Gemini Live"

    def install(self) -> None:
        """Also take over results, declarations, server messages and the session's life."""
        llm: Any = gemini_live(self.llm)
        self._open: dict[str, list[tuple[str, str]]] = {}
        """Operation → the provider's calls of it still open (answered with its outcome)."""
        self._cancelled_by_server: set[str] = set()
        self._in_generation = False
        self._generation = self.session.generation
        self._warned_blocking = False
        result, tag = llm._handle_function_call_result, llm._tag_tool_behaviors
        message, ready, disconnect = (
            llm._handle_server_message,
            llm._handle_session_ready,
            llm._disconnect,
        )
        connection = llm._connection_task_handler
        handle_context = llm._handle_context
        self._has_context = llm._context is not None
        """Whether the service has had the pipeline's first context (see the docstring)."""
        self._groups: dict[str, str | None] = {}
        """Call id → the group it was proposed with, while its final answer is to come."""

        async def function_call_result(frame: FunctionCallResultFrame) -> None:
            if not self.calls.owns(frame.function_name):
                await result(frame)
                return
            await self._result(frame, result)

        def tag_tool_behaviors(tools: list[Any]) -> None:
            tag(tools)
            self._declare(tools)

        async def server_message(msg: Any) -> None:
            await self._server_message(msg, message)

        async def session_ready(session: Any) -> None:
            await ready(session)
            self._became_ready()

        async def context(context: Any, *args: Any, **kwargs: Any) -> None:
            # The first context may replace the start-up session (a reconnect) and seeds the
            # conversation: only from then on is the session the conversation's.
            await handle_context(context, *args, **kwargs)
            if not self._has_context:
                self._has_context = True
                self._conversation_set_up()

        async def disconnecting() -> None:
            self._went_away()
            self._open.clear()  # a new session knows none of the old call ids
            # Pipecat forgets which results it sent; its catch-up path would then send every
            # earlier tool result again, to ids the new session never issued.
            completed = set(llm._completed_tool_calls)
            await disconnect()
            llm._completed_tool_calls |= completed

        async def connected(config: Any) -> None:
            try:
                await connection(config)
            finally:
                # The session ended for good (too many failures), unless a reconnect has
                # started a connection of its own meanwhile.
                if llm._connection_task is asyncio.current_task():
                    self._went_away()

        llm._handle_function_call_result = function_call_result
        llm._tag_tool_behaviors = tag_tool_behaviors
        llm._handle_server_message = server_message
        llm._handle_session_ready = session_ready
        llm._disconnect = disconnecting
        llm._connection_task_handler = connected
        llm._handle_context = context
        if not llm._supports_non_blocking_tools:
            self._block_background_calls()
        super().install()

    def _block_background_calls(self) -> None:
        """On a model with no NON_BLOCKING calls, a background action's call blocks.

        Its wait is then cancelled by a barge-in like a blocking one (the truth is told, the
        outcome follows as text), and Pipecat writes no async-tool messages the model cannot
        take (it reports an error for them).
        """
        llm: Any = gemini_live(self.llm)
        for name, item in llm._functions.items():
            if name in self.calls.bindings and not item.cancel_on_interruption:
                item.cancel_on_interruption = True

    def _note_call(self, frame: FunctionCallInProgressFrame) -> None:
        super()._note_call(frame)
        if self.calls.owns(frame.function_name):
            self._groups[frame.tool_call_id] = frame.group_id

    def connected(self) -> bool:
        """Whether the service has a live session with the provider."""
        llm: Any = gemini_live(self.llm)
        return bool(llm._session is not None and not llm._disconnecting)

    def _set_up(self) -> bool:
        """Whether the service has had the pipeline's first context (its session is the one)."""
        return self._has_context

    async def _set_up_conversation(self, *, start: bool) -> None:
        if start:
            await self._ask_for_context()

    # --- declarations ----------------------------------------------------------------------

    def _background(self, tool: str) -> bool:
        binding = self.calls.bindings.get(tool)
        return binding is not None and binding.policy.mode is ExecutionMode.BACKGROUND

    def _non_blocking(self, tool: str) -> bool:
        """Whether ``tool``'s calls are NON_BLOCKING at the provider (model and policy)."""
        llm: Any = gemini_live(self.llm)
        if not llm._supports_non_blocking_tools:
            return False
        return self._background(tool) or not llm._supports_blocking_tools

    def _declare(self, tools: list[Any]) -> None:
        """Set ``behavior`` on the runtime's declarations from each action's ``mode``."""
        llm: Any = gemini_live(self.llm)
        for tool in tools:
            decls = tool.get("function_declarations") if isinstance(tool, dict) else None
            for decl in decls if isinstance(decls, list) else []:
                name = decl.get("name") if isinstance(decl, dict) else None
                if not isinstance(name, str) or name not in self.calls.bindings:
                    continue
                if self._background(name) or not llm._supports_blocking_tools:
                    decl["behavior"] = "NON_BLOCKING"
                    if not self._background(name) and not self._warned_blocking:
                        self._warned_blocking = True
                        logger.warning(
                            "{}: {} takes only NON_BLOCKING tools; the blocking action {} "
                            "cannot make it wait (its outcome is still told truthfully)",
                            self,
                            llm._settings.model,
                            name,
                        )
                elif llm._tools_default_to_non_blocking:
                    decl["behavior"] = "BLOCKING"
                else:
                    decl.pop("behavior", None)  # the model blocks unless told otherwise

    # --- results ---------------------------------------------------------------------------

    async def _result(self, frame: FunctionCallResultFrame, send: Any) -> None:
        """Send a result of the runtime's call to the provider, as its policy says."""
        llm: Any = gemini_live(self.llm)
        call_id = frame.tool_call_id
        final = frame.properties.is_final if frame.properties else True
        if final:
            llm._completed_tool_calls.add(call_id)  # never sent again from the context
        spoken = self._spoken(frame, final=final)
        if final:
            self._groups.pop(call_id, None)
        if call_id in self._cancelled_by_server or call_id not in llm._tool_call_id_to_name:
            # The provider does not wait on this id any more (it cancelled the call, or a
            # reconnect made it forget): the result is told as text.
            if final:
                await self._say(frame, answer=spoken)
            return
        name = llm._tool_call_id_to_name[call_id]
        if not self._non_blocking(frame.function_name):
            if not final:
                return  # a blocking call takes one answer (Pipecat drops these too)
            # A blocking call: one answer, no scheduling (whatever the handler's own flag).
            await self._respond(call_id, name, frame.result, scheduling=None, will_continue=False)
            return
        result = ToolResult.of(frame.result)
        operation_id = result.operation_id
        if final and operation_id is not None and result.status in _KEPT_OPEN:
            # Not finished (it waits for a person, or it is being checked): the call stays
            # open, and the outcome answers it when the delivery service tells it (_tell). The
            # user hears this answer (a manager must approve) unless calls proposed with it
            # still run.
            self._open.setdefault(operation_id, []).append((call_id, name))
            await self._respond(
                call_id,
                name,
                result,
                scheduling="WHEN_IDLE" if spoken else "SILENT",
                will_continue=True,
            )
            return
        await self._respond(
            call_id,
            name,
            frame.result,
            scheduling=self._scheduling(frame, final=final, spoken=spoken),
            will_continue=not final,
        )

    def _spoken(self, frame: FunctionCallResultFrame, *, final: bool) -> bool:
        """Whether the model should answer this result now.

        Not while calls proposed with it still wait for their answers (told together, as the
        cascade's aggregator does), nor when the result frame says not to.
        """
        run_llm = frame.properties.run_llm if frame.properties else None
        if run_llm is None:
            run_llm = frame.run_llm
        if run_llm is False:
            return False
        group = self._groups.get(frame.tool_call_id)
        siblings = [
            other
            for other, its in self._groups.items()
            if its is not None and its == group and other != frame.tool_call_id
        ]
        return not (final and siblings)

    def _scheduling(self, frame: FunctionCallResultFrame, *, final: bool, spoken: bool) -> str:
        """A background call's answer comes after the conversation moved on: ``delivery.late``.

        Intermediate results follow ``delivery.intermediate`` (SILENT by default); a refusal
        is said as soon as the model is idle (WHEN_IDLE), whatever ``late`` says; a result
        nobody is to answer now is SILENT.
        """
        binding = self.calls.bindings.get(frame.function_name)
        if binding is None:
            return "WHEN_IDLE" if spoken else "SILENT"
        delivery = binding.policy.delivery
        if not final:
            return _SCHEDULING.get(delivery.intermediate, "SILENT")
        if not spoken:
            return "SILENT"
        if ToolResult.of(frame.result).status not in _OUTCOMES:
            return "WHEN_IDLE"  # a refusal, or a question for the user: said, not scheduled
        return _SCHEDULING.get(delivery.late, "WHEN_IDLE")

    async def _respond(
        self, call_id: str, name: str, result: Any, *, scheduling: str | None, will_continue: bool
    ) -> None:
        """Send one ``FunctionResponse`` (as the service does, with our scheduling).

        ``scheduling`` None: a blocking call's answer, with neither scheduling nor
        ``will_continue`` (which only a NON_BLOCKING call takes).
        """
        llm: Any = gemini_live(self.llm)
        payload = GeminiLiveLLMAdapter.to_function_response_dict(
            json.dumps(result, ensure_ascii=False) if result else "COMPLETED"
        )
        if scheduling is None:
            response = FunctionResponse(name=name, id=call_id, response=payload)
        else:
            response = FunctionResponse(
                name=name, id=call_id, response={**payload, "scheduling": scheduling}
            )
            response.scheduling = FunctionResponseScheduling(scheduling)
            response.will_continue = will_continue
        try:
            await llm._session.send_tool_response(function_responses=response)
        except Exception as exc:
            await llm._handle_send_error(exc)

    async def _say(self, frame: FunctionCallResultFrame, *, answer: bool) -> None:
        """Tell a call's result as text (``answer``: and have the model answer it now)."""
        text = (
            f"Result of the earlier {frame.function_name} call {frame.tool_call_id}: "
            f"{json.dumps(frame.result, ensure_ascii=False)}"
        )
        await self._send_text(text, answer=answer)

    async def _send_text(self, text: str, *, answer: bool) -> None:
        llm: Any = gemini_live(self.llm)
        try:
            await llm._session.send_client_content(
                turns=[{"role": "user", "parts": [{"text": text}]}], turn_complete=False
            )
        except Exception as exc:
            await llm._handle_send_error(exc)
            return
        if answer:
            await llm._complete_turn()

    # --- late outcomes ---------------------------------------------------------------------

    async def _tell(self, told: Told) -> None:
        llm: Any = gemini_live(self.llm)
        if told.progress:
            # Not the outcome: the provider's open call stays open for it; told as text.
            await super()._tell(told)
            return
        calls = self._open.pop(told.operation.operation_id, [])
        calls = [(cid, name) for cid, name in calls if cid in llm._tool_call_id_to_name]
        if not calls:
            await super()._tell(told)
            return
        # The provider's call is still open: its outcome answers it, scheduled by policy. The
        # local mirror records it without asking for a response (the provider schedules it).
        for call_id, name in calls:
            await self._respond(
                call_id, name, told.content, scheduling=scheduling_for(told), will_continue=False
            )
        message: Any = {"role": "developer", "content": told.text}
        await self._push(
            LLMMessagesAppendFrame(messages=[message], run_llm=False), FrameDirection.DOWNSTREAM
        )

    async def interrupt(self) -> None:
        """Cut the local audio off (the provider stops itself when an INTERRUPT answer lands)."""
        await self.llm.broadcast_interruption()  # type: ignore[no-untyped-call]

    # --- server messages -------------------------------------------------------------------

    async def _server_message(self, msg: Any, handle: Any) -> None:
        """Count generations, and act on ``toolCallCancellation``; then the service's own."""
        content = getattr(msg, "server_content", None)
        speaks = content is not None and (content.model_turn or content.output_transcription)
        calls = getattr(msg, "tool_call", None)
        interrupted = content is not None and bool(content.interrupted)
        if interrupted:
            # The service broadcasts the interruption (in handle): the generation under way is
            # interrupted, and calls bundled with it are proposals of that generation.
            self._in_generation = False
        elif not self._in_generation and (speaks or calls):
            self._in_generation = True
            self._generation = self.session.start_generation()
        if calls and not interrupted:
            # The model has said what it proposes: a blocking call stops its turn until the
            # answer, so no turn_complete comes first. What it retracts later, it cancels by
            # id (toolCallCancellation, below).
            self.session.settle_generation()
            self._in_generation = False
        cancellation = getattr(msg, "tool_call_cancellation", None)
        if cancellation is not None and cancellation.ids:
            await self._cancelled(list(cancellation.ids))
        ends = content is not None and content.turn_complete and self._in_generation
        if ends:
            self._generation_done(self._generation)  # settled once its end frame is played
            self._in_generation = False
        await handle(msg)
        if ends:
            self._no_end_frame()

    async def _cancelled(self, call_ids: list[str]) -> None:
        """The provider cancelled these calls (the user spoke over them): a barge-in on each."""
        llm: Any = gemini_live(self.llm)
        running = {item.tool_call_id for item in llm._function_call_tasks.values()}
        for call_id in call_ids:
            self._cancelled_by_server.add(call_id)
            if call_id in running:
                # A blocking call whose wait Pipecat runs: cancelled like a barge-in; the
                # runtime applies on_interruption and the truth closes the call (as text).
                await llm._cancel_function_calls_by_tool_call_id(call_id)
                continue
            operation_id = self.calls.operation_for(call_id)
            if operation_id is None:
                continue
            open_calls = self._open.get(operation_id, [])
            self._open[operation_id] = [c for c in open_calls if c[0] != call_id]
            if not self._open[operation_id]:
                del self._open[operation_id]
            self._spawn(self._interrupt_operation(operation_id))

    async def _interrupt_operation(self, operation_id: str) -> None:
        try:
            await self.calls.interrupted(operation_id)
        except Exception as exc:  # the operation goes on; its outcome is told when it comes
            logger.warning("{}: on_interruption of {} failed: {}", self, operation_id, exc)
