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
  the assistant aggregator pushes the context back upstream. After ``reset_conversation`` the
  service sets the conversation up again from the local context at its next response: a told
  outcome is in that context, and the adapter makes sure the response is asked for.
* An ``interrupt`` delivery cancels the provider's response (``response.cancel``) and cuts the
  local audio, as a barge-in does.
"""

from __future__ import annotations

__all__ = ["OpenAIRealtimeAdapter"]

from typing import Any

from pipecat.services.openai.realtime import events

from pipecat_actions.realtime._base import RealtimeAdapter
from pipecat_actions.runtime.deliveries import Told


class OpenAIRealtimeAdapter(RealtimeAdapter):
    """`RealtimeAdapter` for ``OpenAIRealtimeLLMService`` (and ``AzureRealtimeLLMService``)."""

    service_name = "OpenAI Realtime"

    def install(self) -> None:
        """Also read the service's response and session events; see the module docstring."""
        llm: Any = self.llm
        created, done = llm._handle_evt_response_created, llm._handle_evt_response_done
        updated, disconnect = llm._handle_evt_session_updated, llm._disconnect
        receive = llm._receive_task_handler
        started = llm._handle_evt_speech_started
        self._generation = self.session.generation

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
        super().install()

    def connected(self) -> bool:
        """Whether the websocket is open and the provider's session is configured."""
        llm: Any = self.llm
        return bool(llm._websocket and llm._api_session_ready and not llm._disconnecting)

    async def _tell(self, told: Told) -> None:
        llm: Any = self.llm
        if told.run_llm and llm._llm_needs_conversation_setup:
            # The service skips appends until it sets the conversation up from the local
            # context (after a reset); the told outcome is recorded there, and the response
            # asked for now is the one that sets it up.
            llm._results_awaiting_response = True
        await super()._tell(told)

    async def interrupt(self) -> None:
        """Cancel the provider's response, then cut the local audio off."""
        llm: Any = self.llm
        if llm._response_active:
            await llm.send_client_event(events.ResponseCancelEvent())
        await llm._truncate_current_audio_response()
        await super().interrupt()
