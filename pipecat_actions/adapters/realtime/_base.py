"""The part every realtime adapter shares: it works at the service, where the provider listens.

A speech-to-speech service sends each function call's result to the provider inside its own
``push_frame``, before any downstream processor sees it, and the provider keeps its own
conversation (Pipecat's context is a local mirror). So the guarantees the cascade gate gives
before the assistant aggregator are given here, on the service instance:

* **Truthful cancel.** The service's downstream ``FunctionCallCancelFrame`` for a call of the
  runtime's (a barge-in on a blocking tool, Pipecat's ``timeout_secs``) never reaches the
  service's own ``push_frame``, which would tell the provider ``"CANCELLED"``. The call is
  closed instead with the operation's real state (still running, committed, unknown, really
  cancelled), pushed as the call's result *through* the service: the provider hears it on its
  function-call channel, and the local mirror gets it too. The runtime's ``on_interruption``
  policy decides what happens to the action, as in the cascade.
* **Late outcomes through the service.** What the delivery service tells later goes into the
  service as an ``LLMMessagesAppendFrame`` (as if from before it), which the service sends to
  the provider as a conversation item; the assistant aggregator records it and asks for a
  response when the delivery says so. A telling waits while the service is not connected, so
  an outcome owed across a reconnect is told once the session is back.
* **Told once, into the conversation that lives.** A service sets the provider's
  conversation up from the local context (at its first context, after a reconnect), and
  replays whatever that context holds by then; a session opened before the pipeline's first
  context may be replaced by one made for it. So nothing is told (no telling, no result
  held across a reconnect) until the provider's conversation is the pipeline's, set up from
  the local context (`ready`): the setup then carries only what was told before, and what is
  told after reaches the provider once, as an outcome (a call's answer, or a note of the
  service's, never the user's words). A telling that comes before the pipeline's first
  context, and asks for an answer, asks for that context (an ``LLMRunFrame`` to the user
  aggregator): the model answers the outcome, in the conversation the pipeline keeps.
* **Nothing lost while the session is away.** A result of the runtime's call that comes while
  the service has no session with the provider (it would drop it) waits until the session is
  back; only then does it reach the gate, which records it as told. If the session never comes
  back, the outcome stays owed and the session's next pipeline tells it.
* **Turns and generations from the provider.** A generation is one response of the
  provider's (each adapter knows the events); an interruption the service broadcasts marks
  it interrupted. It settles when its end frame, which follows its audio through the output
  transport, reaches the gate: when the user has heard it to the end, as in the cascade.
  Stale proposals are refused on that basis, and ``admit_when: turn_confirmed`` waits for it.
"""

from __future__ import annotations

__all__ = ["RealtimeAdapter"]

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from loguru import logger
from pipecat.frames.frames import (
    Frame,
    FunctionCallCancelFrame,
    FunctionCallInProgressFrame,
    FunctionCallResultFrame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMMessagesAppendFrame,
    LLMRunFrame,
)
from pipecat.processors.frame_processor import FrameDirection
from pipecat.services.llm_service import LLMService

from pipecat_actions._recent import remember
from pipecat_actions.adapters._closing import closing_frame
from pipecat_actions.errors import ConfigurationError
from pipecat_actions.runtime.calls import CONFIRM_TOOL, Told
from pipecat_actions.session import SessionState

if TYPE_CHECKING:
    from pipecat_actions.adapters.result_gate import ActionResultGate
    from pipecat_actions.runtime import ActionRuntime

ADAPTER_ATTRIBUTE = "_pipecat_actions_realtime"
"""The attribute of a service that holds its adapter (`adapter_of`, `check_placement`)."""

Push = Callable[[Frame, FrameDirection], Awaitable[None]]
_KEEP_ENDS = 64
"""End frames remembered until the gate sees them (one an interruption dropped is forgotten)."""


class RealtimeAdapter:
    """Gives a speech-to-speech service the cascade's guarantees; see the module docstring.

    Built by `pipecat_actions.adapters.realtime.adapt_realtime`, which picks the subclass for the
    service. It replaces methods on the one service instance it adapts (Pipecat offers no
    public seam at the service boundary), calling the originals for everything it leaves be.

    Args:
        runtime: The runtime whose actions the service calls.
        llm: The speech-to-speech service.
        session: The session the pipeline serves.
        gate: The pipeline's `ActionResultGate`: its delivery is the one spoken through here.
    """

    service_name = "speech-to-speech"

    def __init__(
        self,
        runtime: ActionRuntime,
        llm: LLMService,
        session: SessionState,
        gate: ActionResultGate,
    ) -> None:
        self.runtime = runtime
        self.calls = runtime.calls
        self.llm = llm
        self.session = session
        self.gate = gate
        self.delivery = gate.delivery
        self._push: Push = llm.push_frame
        self._confirms: dict[str, str] = {}
        """confirm_action call → the operation it is about (told if the call is cancelled)."""
        self._ready = asyncio.Event()
        """Set while the service has a session with the provider."""
        self._conversation = asyncio.Event()
        """Set when the service has set the provider's conversation up (see `_set_up`)."""
        self._setting_up = asyncio.Lock()
        self._gone = asyncio.Event()
        """Set when the service is cleaned up: nothing waits for its session any more."""
        self._tasks: set[asyncio.Task[Any]] = set()
        self._ending: int | None = None
        """A generation the provider finished: its end frame is the next one pushed."""
        self._played: OrderedDict[int, int] = OrderedDict()
        """End frame id → the generation it ends (settled once the frame passed the gate)."""

    # --- installation ----------------------------------------------------------------------

    def install(self) -> None:
        """Replace the service's methods this adapter works through; idempotent per service."""
        if getattr(self.llm, ADAPTER_ATTRIBUTE, None) is not None:
            raise ConfigurationError(f"{type(self.llm).__name__} already has a realtime adapter")
        setattr(self.llm, ADAPTER_ATTRIBUTE, self)
        self.llm.push_frame = self._push_frame  # type: ignore[method-assign]
        cleanup = self.llm.cleanup

        async def cleaning_up() -> None:
            # The pipeline ends: what waits for the session is given up (a telling stays owed
            # in the ledger for the session's next pipeline; a held result was not told).
            self._gone.set()
            for task in list(self._tasks):
                await self.llm.cancel_task(task)
            await cleanup()  # type: ignore[no-untyped-call]

        self.llm.cleanup = cleaning_up  # type: ignore[method-assign]
        if self.connected():
            self._ready.set()
        self.gate.speak_through(self)

    def connected(self) -> bool:
        """Whether the service can send to the provider now (a subclass reads the service)."""
        raise NotImplementedError

    # --- generations -------------------------------------------------------------------------

    def _generation_done(self, generation: int) -> None:
        """The provider finished ``generation``; it settles once its end has been played.

        The end frame the service pushes next travels behind the response's audio through the
        output transport; when it reaches the gate (`played`), the user heard the reply to its
        end, as in the cascade. With no end frame (`_no_end_frame`), it settles at once.
        """
        self._ending = generation

    def _no_end_frame(self) -> None:
        if self._ending is not None:
            self.session.settle_generation(self._ending)
            self._ending = None

    def played(self, frame: Frame) -> None:
        """The gate saw ``frame`` (a response's end) after the output: settle its generation."""
        generation = self._played.pop(frame.id, None)
        if generation is not None:
            self.session.settle_generation(generation)

    def _became_ready(self) -> None:
        """The service's session with the provider is (again) ready: waiting tellings go."""
        self._ready.set()

    def _went_away(self) -> None:
        """The service lost its session (a disconnect, a reconnect under way)."""
        self._ready.clear()

    # --- the provider's conversation ---------------------------------------------------------

    def _set_up(self) -> bool:
        """Whether the provider's conversation is the pipeline's, set up from the local context.

        Until then a telling would be lost with a session the service replaces, or told again
        when the service replays the local context into the provider's conversation.
        """
        return True

    def _conversation_set_up(self) -> None:
        """The service set the provider's conversation up: tellings that wait may go."""
        self._conversation.set()

    async def _set_up_conversation(self, *, start: bool) -> None:
        """Have the service set the provider's conversation up, if it can now (a subclass).

        ``start``: a telling that asks for an answer waits; if the service has not had the
        pipeline's first context yet, ask for it (`_ask_for_context`).
        """

    async def _ask_for_context(self) -> None:
        """Ask the user aggregator for the pipeline's context (it pushes it to the service)."""
        await self._push(LLMRunFrame(), FrameDirection.UPSTREAM)

    def _can_tell(self) -> bool:
        """Whether something told now reaches the provider's conversation once."""
        return self._ready.is_set() and self._set_up()

    # --- the service's push_frame ----------------------------------------------------------

    async def _push_frame(
        self, frame: Frame, direction: FrameDirection = FrameDirection.DOWNSTREAM
    ) -> None:
        if isinstance(frame, InterruptionFrame):
            # The service's own barge-in (the provider said the user interrupted).
            self.session.interrupt()
        elif direction is FrameDirection.DOWNSTREAM:
            if isinstance(frame, LLMFullResponseEndFrame) and self._ending is not None:
                remember(self._played, frame.id, self._ending, keep=_KEEP_ENDS)
                self._ending = None
            owned = isinstance(frame, (FunctionCallCancelFrame, FunctionCallResultFrame)) and (
                self.calls.owns(frame.function_name)
            )
            if owned and isinstance(frame, FunctionCallCancelFrame):
                self._spawn(self._close(frame))
                return  # the provider is told the truth instead (see _close)
            if owned and not self._can_tell():
                # The service would drop it (no session), or send it and then replay it with
                # the local context it is about to set the provider's conversation up from:
                # it goes once that is done, and only then reaches the gate, which records it
                # as told.
                self._spawn(self._push_when_ready(frame))
                return
            if isinstance(frame, FunctionCallInProgressFrame):
                self._note_call(frame)
        await self._push(frame, direction)

    async def _push_when_ready(self, frame: Frame) -> None:
        await self.ready()
        await self._push_frame(frame)

    def _note_call(self, frame: FunctionCallInProgressFrame) -> None:
        """A call of the service's is under way (a subclass may note more of it)."""
        confirmed = (frame.arguments or {}).get("operation_id")
        if frame.function_name == CONFIRM_TOOL and isinstance(confirmed, str):
            self._confirms[frame.tool_call_id] = confirmed

    def _spawn(self, coroutine: Coroutine[Any, Any, Any]) -> None:
        """Run ``coroutine`` as a task of the service (cancelled when the pipeline ends)."""
        what = getattr(coroutine, "__qualname__", "task")
        task = self.llm.create_task(coroutine, name=f"{self}::{what}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _close(self, cancel: FunctionCallCancelFrame) -> None:
        """Close a cancelled call with its operation's real state, through the service."""
        closed = await self.calls.close_cancelled(
            self.delivery,
            cancel.function_name,
            cancel.tool_call_id,
            timed_out=bool(cancel.run_llm),  # Pipecat sets run_llm only after its timeout
            about=self._confirms.get(cancel.tool_call_id),
        )
        await self._closed(cancel, closed.result)

    async def _closed(self, cancel: FunctionCallCancelFrame, result: dict[str, Any]) -> None:
        """Push the result that closes ``cancel``'s call (a subclass may route it)."""
        await self._push_frame(closing_frame(cancel, result))

    # --- the delivery service's speaker ----------------------------------------------------

    async def tell(self, told: Told) -> None:
        """Tell ``told`` to the provider through the service, once the service is `ready`."""
        await self.ready(start=told.run_llm)
        await self._tell(told)

    async def _tell(self, told: Told) -> None:
        await self.append({"role": "developer", "content": told.text}, run_llm=told.run_llm)

    async def append(self, message: dict[str, Any], *, run_llm: bool) -> None:
        """Put ``message`` into the provider's conversation through the service (and the mirror).

        It goes into the service as if from before it: the service sends it to the provider,
        and the assistant aggregator records it (and asks for a response if ``run_llm``).
        """
        await self.ready()
        entry: Any = message
        await self.llm.queue_frame(LLMMessagesAppendFrame(messages=[entry], run_llm=run_llm))

    async def interrupt(self) -> None:
        """Cut the bot off for an ``interrupt`` delivery: locally and at the provider."""
        await self.llm.broadcast_interruption()  # type: ignore[no-untyped-call]

    async def ready(self, *, start: bool = False) -> None:
        """Wait until what is sent reaches the provider's conversation once (`_can_tell`).

        The service has a session with the provider, and has set the provider's conversation
        up from the local context (a subclass has it do so when it can: see the module
        docstring). ``start``: a telling that asks for an answer; it may ask for the
        pipeline's first context.

        Raises:
            ConnectionError: The service was cleaned up first (the pipeline ended).
        """
        while True:
            if not self._ready.is_set():
                logger.bind(session_id=self.session.session_id).debug(
                    "{}: waiting for the provider's session before telling an outcome", self
                )
                await self._until(self._ready)
            if self._set_up():
                return
            async with self._setting_up:
                if self._set_up() or not self._ready.is_set():
                    continue
                self._conversation.clear()
                await self._set_up_conversation(start=start)
                if not self._set_up():
                    logger.bind(session_id=self.session.session_id).debug(
                        "{}: waiting for the provider's conversation to be set up", self
                    )
                    await self._until(self._conversation)

    async def _until(self, event: asyncio.Event) -> None:
        """Wait until ``event`` is set; raise ConnectionError if the service is gone first."""
        if not event.is_set() and not self._gone.is_set():
            waiting = asyncio.ensure_future(event.wait())
            gone = asyncio.ensure_future(self._gone.wait())
            try:
                await asyncio.wait({waiting, gone}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                waiting.cancel()
                gone.cancel()
        if self._gone.is_set() or not event.is_set():
            raise ConnectionError(f"{type(self.llm).__name__} ended before its session was back")

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.session.session_id})"
