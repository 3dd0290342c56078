"""A fake Gemini Live API server, for running the real ``GeminiLiveLLMService`` offline.

It speaks the BidiGenerateContent JSON protocol over a local websocket: it takes the client's
``setup`` message, answers ``setupComplete``, records every later client message, and sends what
a test tells it to (text turns, tool calls, cancellations, interruptions, a dropped connection).

google-genai turns ``HttpOptions.base_url`` into a ``wss://`` URL whatever its scheme (with an API
key, ``BaseApiClient._websocket_base_url`` replaces the scheme), so the fake serves TLS with a
self-signed certificate made on the spot, and `FakeGeminiServer.http_options` carries an SSL
context that trusts it (``async_client_args={"ssl": ...}``, which the SDK passes to its websocket
``connect``). Give the service those options::

    async with FakeGeminiServer() as fake:
        llm = GeminiLiveLLMService(api_key="x", http_options=fake.http_options, ...)

The client connects to ``/ws/google.ai.generativelanguage.v1beta.GenerativeService.
BidiGenerateContent``; the fake accepts any path (`FakeGeminiServer.paths` records them).

Wire casing, as google-genai 2.34 sends it, is mixed (the server's protobuf JSON parser takes
both spellings): top-level keys are snake_case (``client_content``, ``realtime_input``,
``tool_response``); inside, mostly camelCase (``functionResponses``, ``turnComplete``,
``functionDeclarations``) but not all (``will_continue`` in a function response,
``response_modalities`` in the setup's ``generationConfig``). The helpers here read either
spelling. The server's messages are sent camelCase (``serverContent``, ``toolCall``,
``usageMetadata``), as the real API does and the SDK parses.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import itertools
import json
import ssl
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from google.genai.types import HttpOptions
from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

Message = dict[str, Any]

USAGE = {"promptTokenCount": 1, "responseTokenCount": 1, "totalTokenCount": 2}
"""The ``usageMetadata`` sent with a turnComplete (the service warns about one without it)."""


def field(message: Message, snake: str) -> Any:
    """``message[snake]``, or its camelCase spelling (``tool_response`` / ``toolResponse``)."""
    if snake in message:
        return message[snake]
    head, *rest = snake.split("_")
    return message.get(head + "".join(word.title() for word in rest))


def _tls_contexts() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server TLS context for 127.0.0.1, and a client context that trusts only it.

    The server's certificate is self-signed and made fresh for each server.
    """
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fake-gemini")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    with tempfile.TemporaryDirectory() as folder:
        cert_file, key_file = Path(folder, "cert.pem"), Path(folder, "key.pem")
        cert_file.write_bytes(cert_pem)
        key_file.write_bytes(key_pem)
        server.load_cert_chain(cert_file, key_file)
    client = ssl.create_default_context(cadata=cert_pem.decode())
    return server, client


class FakeGeminiServer:
    """A fake Gemini Live API on 127.0.0.1, speaking the Live websocket protocol over TLS.

    ``async with FakeGeminiServer() as server: ...``; ``server.base_url`` is
    ``'http://127.0.0.1:<port>'`` and ``server.http_options`` is what to give the service.

    Attributes:
        received: Every client message after its ``setup`` (parsed JSON), in order, over all
            connections.
        received_on: For each message in ``received``, the number of its connection (1-based).
        connections: How many connections have been opened (setups received).
        setups: The ``setup`` message of each connection, in order.
        paths: The request path of each connection (any path is accepted).
    """

    def __init__(self) -> None:
        self._server_tls, self._client_tls = _tls_contexts()
        self._server: Server | None = None
        self._current: ServerConnection | None = None
        self._changed = asyncio.Condition()
        self._call_ids = itertools.count(1)
        self.base_url = ""
        self.received: list[Message] = []
        self.received_on: list[int] = []
        self.connections = 0
        self.setups: list[Message] = []
        self._current_setup: Message | None = None
        self.paths: list[str] = []
        self._admit = asyncio.Event()
        self._admit.set()

    def hold_connections(self) -> None:
        """Leave new connections waiting for ``setupComplete`` until `admit_connections`.

        The service has no session meanwhile: a reconnect under way.
        """
        self._admit.clear()

    def admit_connections(self) -> None:
        """Complete the setup of connections that wait, and of new ones."""
        self._admit.set()

    async def __aenter__(self) -> FakeGeminiServer:
        self._server = await serve(self._serve, "127.0.0.1", 0, ssl=self._server_tls)
        port = self._server.sockets[0].getsockname()[1]
        self.base_url = f"http://127.0.0.1:{port}"
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()

    @property
    def http_options(self) -> HttpOptions:
        """Options that point a google-genai ``Client`` (and so the service) at this server."""
        return HttpOptions(base_url=self.base_url, async_client_args={"ssl": self._client_tls})

    async def _serve(self, ws: ServerConnection) -> None:
        """One connection: the setup handshake, then record client messages until it closes."""
        try:
            setup = json.loads(await ws.recv())
            await self._admit.wait()
            async with self._changed:
                self.connections += 1
                number = self.connections
                self.setups.append(setup.get("setup", setup))
                self.paths.append(ws.request.path if ws.request else "")
                self._current = ws
                self._current_setup = self.setups[-1]
                await ws.send(json.dumps({"setupComplete": {}}))
                self._changed.notify_all()
            async for raw in ws:
                async with self._changed:
                    self.received.append(json.loads(raw))
                    self.received_on.append(number)
                    self._changed.notify_all()
        except ConnectionClosed:
            pass
        finally:
            async with self._changed:
                if self._current is ws:
                    self._current = None
                self._changed.notify_all()

    # --- sending -------------------------------------------------------------------------

    async def send(self, message: Message) -> None:
        """Send one raw server message on the current connection."""
        if self._current is None:
            raise AssertionError("the fake Gemini server has no open connection to send on")
        await self._current.send(json.dumps(message))

    async def call(self, name: str, args: Message, *, call_id: str | None = None) -> str:
        """Send a ``toolCall`` for one function; return its call id."""
        call_id = call_id or f"call-{next(self._call_ids)}"
        await self.send(
            {"toolCall": {"functionCalls": [{"id": call_id, "name": name, "args": args}]}}
        )
        return call_id

    async def cancel_calls(self, *ids: str) -> None:
        """Send a ``toolCallCancellation`` for the given call ids."""
        await self.send({"toolCallCancellation": {"ids": list(ids)}})

    async def say(self, text: str) -> None:
        """Send a model turn with ``text``, then its ``turnComplete`` (with usage metadata)."""
        await self.send(
            {"serverContent": {"modelTurn": {"role": "model", "parts": [{"text": text}]}}}
        )
        await self.send({"serverContent": {"turnComplete": True}, "usageMetadata": USAGE})

    async def interrupted(self) -> None:
        """Send ``serverContent.interrupted`` (the user barged in)."""
        await self.send({"serverContent": {"interrupted": True}})

    async def resumption_update(self, handle: str) -> None:
        """Send a ``sessionResumptionUpdate`` offering ``handle`` for the next connection."""
        await self.send({"sessionResumptionUpdate": {"newHandle": handle, "resumable": True}})

    async def drop(self, code: int = 1011, reason: str = "fake drop") -> None:
        """Close the current connection from the server side (1011: an internal error)."""
        if self._current is None:
            raise AssertionError("the fake Gemini server has no open connection to drop")
        ws, self._current = self._current, None
        await ws.close(code, reason)

    # --- waiting and reading ---------------------------------------------------------------

    async def wait_for(
        self,
        predicate: Callable[[Message], bool],
        within: float = 5.0,
        *,
        connection: int | None = None,
    ) -> Message:
        """Return the first client message (already received or still to come) that matches.

        ``connection``: only among those of one connection (numbered as `received_on`).

        Raises:
            AssertionError: None came within ``within``; the message lists what was received.
        """
        found: list[Message] = []

        def match() -> bool:
            found[:] = [
                message
                for message, number in zip(self.received, self.received_on, strict=True)
                if (connection is None or number == connection) and predicate(message)
            ][:1]
            return bool(found)

        where = "" if connection is None else f" on connection {connection}"
        await self._wait(match, within, f"client message matching the predicate{where}")
        return found[0]

    async def wait_for_connections(self, count: int, within: float = 5.0) -> None:
        """Wait until ``count`` connections have completed setup and the last is still open."""
        await self._wait(
            lambda: self.connections >= count and self._current is not None,
            within,
            f"{count} connection(s), the last one open",
        )

    async def wait_for_tools(self, within: float = 5.0) -> None:
        """Wait until the open connection is one whose setup declared the tools.

        Pipecat connects at start-up, then again once the context brings the tools; on a busy
        machine a start-up handshake can fail and be retried, so the number of connections is
        no sign of the tools having arrived: this is.
        """

        def tooled() -> bool:
            setup = self._current_setup if self._current is not None else None
            return bool(setup and setup.get("tools"))

        await self._wait(tooled, within, "open connection whose setup declares the tools")

    async def _wait(self, ready: Callable[[], bool], within: float, what: str) -> None:
        try:
            async with asyncio.timeout(within):
                async with self._changed:
                    await self._changed.wait_for(ready)
        except TimeoutError:
            raise AssertionError(
                f"no {what} within {within}s; connections={self.connections}, "
                f"received={json.dumps(self.received, indent=1)}"
            ) from None

    def received_from(self, connection: int) -> list[Message]:
        """The client messages of one connection (numbered from 1, as `received_on`)."""
        return [m for m, n in zip(self.received, self.received_on, strict=True) if n == connection]

    def tool_responses(self, call_id: str | None = None) -> list[Message]:
        """Every ``functionResponse`` sent (optionally only those for ``call_id``), as received."""
        responses = [
            response
            for message in self.received
            if (tool_response := field(message, "tool_response")) is not None
            for response in field(tool_response, "function_responses") or []
        ]
        return [r for r in responses if call_id is None or r.get("id") == call_id]

    def client_texts(self) -> list[str]:
        """The text parts of every ``clientContent`` turn, in order."""
        return [
            part["text"]
            for message in self.received
            if (content := field(message, "client_content")) is not None
            for turn in content.get("turns") or []
            for part in turn.get("parts") or []
            if "text" in part
        ]

    def declared_functions(self, connection: int = -1) -> list[Message]:
        """The function declarations in one connection's ``setup`` (the last by default)."""
        setup = self.setups[connection]
        return [
            declaration
            for tool in setup.get("tools") or []
            for declaration in field(tool, "function_declarations") or []
        ]
