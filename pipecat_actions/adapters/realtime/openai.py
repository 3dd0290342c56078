"""The adapter for OpenAI Realtime (``OpenAIRealtimeLLMService``, and Azure's subclass of it).

What the 1.14 service does and what the adapter changes (`pipecat/services/openai/realtime/
llm.py`):

* A cancelled call is answered ``function_call_output: "CANCELLED"`` by the service's
  ``push_frame`` (``_handle_function_call_cancel``). The adapter withholds the cancel and
  answers the call with the operation's real state instead (see `RealtimeAdapter`).
* A generation is one response: from ``response.created`` to ``response.done``. A response
  that is only a function call pushes no ``LLMFullResponseStartFrame``, so the server events
  are read, not the frames. A ``response.done`` that is not ``completed`` (cancelled by the
  user's speech, incomplete, failed) and the server's ``speech_started`` mark it interrupted;
  a completed one settles once its end frame has been played (see `RealtimeAdapter`).
* A late outcome goes in as a system message item; the response it asks for is created when
  the assistant aggregator pushes the context back upstream.
* **The conversation set-up.** The service sets the provider's conversation up from the local
  context at its first response, and again after ``reset_conversation``; it packs the whole
  context into one *user* message, and sends nothing appended before that. Told before the
  set-up, an outcome would reach the provider in the user's words, and a result held across
  the reconnect twice (its own item, then inside the replay). So nothing is told until the
  conversation is set up (`RealtimeAdapter.ready`): after a reconnect the adapter has the
  service set it up (and answer) at once; before the pipeline's first context, a telling that
  asks for an answer asks for that context. What is told then goes in once, as the call's
  answer or a system item.
* An ``interrupt`` delivery cancels the provider's response (``response.cancel``) and cuts the
  local audio, as a barge-in does.
"""

from __future__ import annotations

__all__ = ["OpenAIRealtimeAdapter"]

import asyncio
from typing import Any

from pipecat.services.openai.realtime import events

from pipecat_actions.adapters._pipecat_private import openai_realtime
from pipecat_actions.adapters.realtime._base import RealtimeAdapter


class OpenAIRealtimeAdapter(RealtimeAdapter):
    """`RealtimeAdapter` for ``OpenAIRealtimeLLMService`` (and ``AzureRealtimeLLMService``)."""

    service_name = "OpenAI Realtime"

    def install(self) -> None:
        """Also read the service's response and session events; see the module docstring."""
        llm: Any = openai_realtime(self.llm)
        created, done = llm._handle_evt_response_created, llm._handle_evt_response_done
        updated, disconnect = llm._handle_evt_session_updated, llm._disconnect
        receive = llm._receive_task_handler
        started = llm._handle_evt_speech_started
        create_response = llm._create_response
        self._generation = self.session.generation
        self._response_over = asyncio.Event()
        """Set at each response's end (waited for after a set-up's own response)."""

        async def creating_response() -> None:
            # The service sets the provider's conversation up from the local context here
            # (when it needs to), before it asks for the response.
            await create_response()
            if self._set_up():
                self._conversation_set_up()

        async def response_created(evt: Any) -> None:
            self._generation = self.session.start_generation()
            await created(evt)

        async def response_done(evt: Any) -> None:
            status = getattr(getattr(evt, "response", None), "status", None)
            if status in (None, "completed"):
                self._generation_done(self._generation)
            else:
                # Cancelled (the user spoke over it), incomplete or failed: what it proposed
                # was not said to the end.
                self.session.interrupt()
            await done(evt)
            self._no_end_frame()
            self._response_over.set()

        async def speech_started(evt: Any) -> None:
            # The server heard the user: a response not yet heard to its end is interrupted
            # now, before the user aggregator's interruption has come back down to the
            # tracker (the receive loop may handle the response's end first).
            self.session.interrupt()
            await started(evt)

        async def session_updated(evt: Any) -> None:
            await updated(evt)
            self._became_ready()

        async def disconnecting() -> None:
            self._went_away()
            await disconnect()
            self._response_over.set()  # no response runs in a new session

        async def receiving() -> None:
            # The receive loop ends when the provider closes the websocket (or on a fatal
            # error event): from then on nothing sent reaches it.
            try:
                await receive()
            finally:
                self._went_away()

        llm._handle_evt_response_created = response_created
        llm._handle_evt_response_done = response_done
        llm._handle_evt_session_updated = session_updated
        llm._disconnect = disconnecting
        llm._receive_task_handler = receiving
        llm._handle_evt_speech_started = speech_started
        llm._create_response = creating_response
        super().install()

    def connected(self) -> bool:
        """Whether the websocket is open and the provider's session is configured."""
        llm: Any = openai_realtime(self.llm)
        return bool(llm._websocket and llm._api_session_ready and not llm._disconnecting)

    def _set_up(self) -> bool:
        """Whether the service has set the provider's conversation up from the local context."""
        llm: Any = openai_realtime(self.llm)
        return not llm._llm_needs_conversation_setup

    async def _set_up_conversation(self, *, start: bool) -> None:
        """Have the service set the conversation up now (it asks for a response too).

        Before the pipeline's first context there is nothing to set it up from: a telling that
        asks for an answer asks for that context; anything else waits for it. Returns once the
        response the set-up asked for is over.
        """
        llm: Any = openai_realtime(self.llm)
        if llm._context is None:
            if not start:
                return  # it waits for the pipeline's first context
            await self._ask_for_context()
            await self._until(self._conversation)
        elif llm._api_session_ready and not llm._response_active:
            await llm._create_response()
        else:
            return  # a response under way sets it up when it is over
        # The set-up asked for a response; the service counts whatever is told before that
        # response starts as taken in by it. What is told next asks for its own.
        while llm._response_active:
            self._response_over.clear()
            if llm._response_active:
                await self._until(self._response_over)

    async def interrupt(self) -> None:
        """Cancel the provider's response, then cut the local audio off."""
        llm: Any = openai_realtime(self.llm)
        if llm._response_active:
            await llm.send_client_event(events.ResponseCancelEvent())
        await llm._truncate_current_audio_response()
        await super().interrupt()
