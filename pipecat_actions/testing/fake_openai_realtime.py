"""A fake OpenAI Realtime websocket server, for running the real Pipecat service offline.

Point ``OpenAIRealtimeLLMService(api_key="x", base_url=server.url)`` at it. It answers what the
API answers on its own (``session.created`` on connect, ``session.updated`` for each
``session.update``, the item echo for each ``conversation.item.create``, an empty response for
each ``response.create``) and the test scripts the rest: a function call, a short reply, server
VAD's speech events, a dropped connection. Every event it sends validates against Pipecat's
``events.parse_server_event`` (an invalid one would end the service's receive loop).

Unlike the real API it never answers by itself after ``speech_stopped``: the test says what the
model does next.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
from collections.abc import Awaitable, Callable
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

Event = dict[str, Any]


class FakeRealtimeServer:
    """``async with FakeRealtimeServer() as server: ...``; ``server.url`` is ``ws://127.0.0.1:<port>``.

    Attributes:
        url: The address to give the service as ``base_url``.
        received: Every client event received (parsed JSON), in order, over all connections.
        sent: Every server event sent, in order, over all connections.
        connections: How many websocket connections were accepted so far.
        paths: The request path of each connection (``/?model=...``).
    """

    def __init__(self) -> None:
        self.url = ""
        self.received: list[Event] = []
        self.sent: list[Event] = []
        self.connections = 0
        self.paths: list[str] = []
        self._server: Server | None = None
        self._ws: ServerConnection | None = None
        self._response_active = False
        self._changed = asyncio.Condition()
        self._ids = itertools.count(1)

    async def __aenter__(self) -> FakeRealtimeServer:
        self._server = await serve(self._serve, "127.0.0.1", 0)
        port = self._server.sockets[0].getsockname()[1]
        self.url = f"ws://127.0.0.1:{port}"
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()

    # -- scripting the model ---------------------------------------------------------------------

    async def send(self, event: Event) -> None:
        """Send one raw server event on the current connection (waiting for one if there is none).

        An ``event_id`` is added when missing.
        """
        async with self._changed:
            if not await self._wait(lambda: self._ws is not None, 5.0):
                raise AssertionError(f"no connection to send {event.get('type')} on")
            ws = self._ws
        assert ws is not None
        await self._send_on(ws, event)

    async def call(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        call_id: str | None = None,
        meanwhile: Callable[[], Awaitable[None]] | None = None,
        before_done: Callable[[], Awaitable[None]] | None = None,
        done_status: str = "completed",
    ) -> str:
        """Have the model call function ``name`` with ``arguments``, as the API does.

        ``meanwhile`` runs after the response was created and before the arguments are done
        (the user barges in while the model is still proposing the call, say);
        ``before_done`` after the arguments and before ``response.done``, which carries
        ``done_status`` (``cancelled`` when the user's speech cut the response off).

        Returns:
            The call id (``call_id``, or a new one).
        """
        call_id = call_id or self._id("call")
        response_id, item_id = self._id("resp"), self._id("item")
        item = {
            "id": item_id,
            "object": "realtime.item",
            "type": "function_call",
            "status": "in_progress",
            "call_id": call_id,
            "name": name,
            "arguments": "",
        }
        done_item = {**item, "status": "completed", "arguments": json.dumps(arguments)}
        await self.send({"type": "response.created", "response": realtime_response(response_id)})
        await self.send({"type": "conversation.item.added", "item": item})
        if meanwhile is not None:
            await meanwhile()
        await self.send(
            {
                "type": "response.function_call_arguments.done",
                "response_id": response_id,
                "item_id": item_id,
                "output_index": 0,
                "call_id": call_id,
                "arguments": done_item["arguments"],
            }
        )
        await self.send({"type": "conversation.item.done", "item": done_item})
        if before_done is not None:
            await before_done()
        await self.send(
            {
                "type": "response.done",
                "response": realtime_response(response_id, done_status, [done_item]),
            }
        )
        return call_id

    async def say(self, text: str, *, audio: bool = False) -> None:
        """Have the model answer ``text`` in a short response, as a few deltas.

        The deltas are audio transcript deltas, or text deltas when the session asked for text
        output only. With ``audio``, a little silence is sent too (so the service has audio to
        truncate on a barge-in).
        """
        response_id, item_id = self._id("resp"), self._id("item")
        text_only = self._output_modalities() == ["text"]
        item = {
            "id": item_id,
            "object": "realtime.item",
            "type": "message",
            "status": "in_progress",
            "role": "assistant",
            "content": [],
        }
        part = (
            {"type": "output_text", "text": text}
            if text_only
            else {"type": "output_audio", "transcript": text}
        )
        place = {
            "response_id": response_id,
            "item_id": item_id,
            "output_index": 0,
            "content_index": 0,
        }
        await self.send({"type": "response.created", "response": realtime_response(response_id)})
        await self.send({"type": "conversation.item.added", "item": item})
        if audio and not text_only:
            silence = base64.b64encode(bytes(4800)).decode()  # 100 ms of 24 kHz 16-bit PCM
            await self.send({"type": "response.output_audio.delta", **place, "delta": silence})
        delta_type = (
            "response.output_text.delta" if text_only else "response.output_audio_transcript.delta"
        )
        first, *rest = text.split(" ")
        for delta in [first, *(f" {word}" for word in rest)]:  # together, exactly ``text``
            await self.send({"type": delta_type, **place, "delta": delta})
        done_item = {**item, "status": "completed", "content": [part]}
        await self.send({"type": "conversation.item.done", "item": done_item})
        await self.send(
            {
                "type": "response.done",
                "response": realtime_response(response_id, "completed", [done_item]),
            }
        )

    async def speech_started(self) -> None:
        """Server VAD heard the user start (``input_audio_buffer.speech_started``)."""
        await self.send(
            {
                "type": "input_audio_buffer.speech_started",
                "audio_start_ms": 0,
                "item_id": self._id("item"),
            }
        )

    async def speech_stopped(self) -> None:
        """Server VAD heard the user stop (``input_audio_buffer.speech_stopped``)."""
        await self.send(
            {
                "type": "input_audio_buffer.speech_stopped",
                "audio_end_ms": 0,
                "item_id": self._id("item"),
            }
        )

    async def drop(self, code: int = 1011) -> None:
        """Close the current connection from the server side (1011: the server failed)."""
        ws = self._ws
        if ws is not None:
            await ws.close(code, "fake server dropped the connection")

    # -- reading what the client sent ------------------------------------------------------------

    async def wait_for(
        self, predicate: Callable[[Event], bool], within: float = 5.0, *, since: int = 0
    ) -> Event:
        """Return the first client event (from ``received[since]`` on) matching ``predicate``.

        Ones already received count. Raises AssertionError naming what was received if none
        matches within ``within`` (a failure bound only: matching ones return at once).
        """

        def found() -> Event | None:
            return next((e for e in self.received[since:] if predicate(e)), None)

        async with self._changed:
            if not await self._wait(lambda: found() is not None, within):
                raise AssertionError(f"no matching client event; received: {self._summary()}")
        event = found()
        assert event is not None
        return event

    def function_outputs(self, call_id: str) -> list[str]:
        """The ``output`` of every ``function_call_output`` item created for ``call_id``."""
        return [
            item.get("output", "")
            for item in self._created_items("function_call_output")
            if item.get("call_id") == call_id
        ]

    def messages(self) -> list[str]:
        """The text of every ``message`` item created (any role), content parts joined."""
        return [
            "".join(
                part.get("text") or part.get("transcript") or "" for part in item.get("content", [])
            )
            for item in self._created_items("message")
        ]

    def count(self, type_: str) -> int:
        """How many client events of type ``type_`` were received."""
        return sum(1 for e in self.received if e.get("type") == type_)

    # -- the connection --------------------------------------------------------------------------

    async def _serve(self, ws: ServerConnection) -> None:
        async with self._changed:
            self.connections += 1
            self.paths.append(ws.request.path if ws.request else "")
            self._ws, self._response_active = ws, False
            self._changed.notify_all()
        try:
            session = {"type": "realtime", "object": "realtime.session", "id": self._id("sess")}
            await self._send_on(ws, {"type": "session.created", "session": session})
            async for raw in ws:
                event = json.loads(raw)
                async with self._changed:
                    self.received.append(event)
                    self._changed.notify_all()
                await self._answer(ws, event)
        except ConnectionClosed:
            pass
        finally:
            async with self._changed:
                if self._ws is ws:
                    self._ws = None
                self._changed.notify_all()

    async def _answer(self, ws: ServerConnection, event: Event) -> None:
        """Reply to a client event as the API does, for the events that get a reply."""
        kind = event.get("type")
        if kind == "session.update":
            session = {"object": "realtime.session", "id": "sess", **event.get("session", {})}
            await self._send_on(ws, {"type": "session.updated", "session": session})
        elif kind == "conversation.item.create":
            item = {"id": self._id("item"), "status": "completed", **event["item"]}
            item["object"] = "realtime.item"
            await self._send_on(ws, {"type": "conversation.item.added", "item": item})
            await self._send_on(ws, {"type": "conversation.item.done", "item": item})
        elif kind == "response.create" and self._response_active:
            await self._error(ws, "conversation_already_has_active_response", event)
        elif kind == "response.create":
            response_id = self._id("resp")
            await self._send_on(
                ws, {"type": "response.created", "response": realtime_response(response_id)}
            )
            await self._send_on(
                ws,
                {
                    "type": "response.done",
                    "response": realtime_response(response_id, "completed", []),
                },
            )
        elif kind == "response.cancel" and not self._response_active:
            await self._error(ws, "response_cancel_not_active", event)
        # response.cancel during a scripted response: the script's own response.done ends it.

    async def _error(self, ws: ServerConnection, code: str, cause: Event) -> None:
        """Send an ``error`` event (one of the two the service takes calmly) about ``cause``."""
        message = {
            "conversation_already_has_active_response": "Conversation already has a response",
            "response_cancel_not_active": "Cancellation failed: no active response found",
        }[code]
        error: Event = {"type": "invalid_request_error", "code": code, "message": message}
        error["event_id"] = cause.get("event_id")  # the client event it is about
        await self._send_on(ws, {"type": "error", "error": error})

    async def _send_on(self, ws: ServerConnection, event: Event) -> None:
        event = {"event_id": self._id("event"), **event}
        if event["type"] == "response.created":
            self._response_active = True
        elif event["type"] == "response.done":
            self._response_active = False
        self.sent.append(event)
        await ws.send(json.dumps(event))

    # -- helpers ---------------------------------------------------------------------------------

    async def _wait(self, ready: Callable[[], bool], within: float) -> bool:
        """With ``_changed`` held: wait until ``ready()``; False if ``within`` ran out first."""
        try:
            async with asyncio.timeout(within):
                await self._changed.wait_for(ready)
        except TimeoutError:
            return False
        return True

    def _id(self, prefix: str) -> str:
        return f"{prefix}_{next(self._ids)}"

    def _created_items(self, item_type: str) -> list[Event]:
        return [
            e["item"]
            for e in self.received
            if e.get("type") == "conversation.item.create" and e["item"].get("type") == item_type
        ]

    def _output_modalities(self) -> list[str] | None:
        """The output modalities of the latest ``session.update`` that set them."""
        for e in reversed(self.received):
            modalities = e.get("session", {}).get("output_modalities")
            if e.get("type") == "session.update" and modalities:
                return list(modalities)
        return None

    def _summary(self) -> str:
        """The received events, by type (and item type), for failure messages."""
        names = [
            f"{e.get('type')}({e['item'].get('type')})" if "item" in e else str(e.get("type"))
            for e in self.received
        ]
        return ", ".join(names) or "nothing"


def realtime_response(
    response_id: str, status: str = "in_progress", output: list[Event] | None = None
) -> Event:
    """A ``realtime.response`` object, as ``response.created`` / ``response.done`` carry it."""
    return {
        "id": response_id,
        "object": "realtime.response",
        "status": status,
        "output": output or [],
    }
