"""Serving the console: in this event loop (`start_console`), or as a command (`serve`)."""

from __future__ import annotations

__all__ = ["RunningConsole", "serve", "start_console"]

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pipecat_actions.console.app import ConsoleSettings, create_app
from pipecat_actions.ledger import Ledger


@dataclass
class RunningConsole:
    """A console serving in this process's event loop (see `start_console`)."""

    url: str
    """Where it listens, e.g. ``http://127.0.0.1:8321``."""
    _server: Any
    _task: asyncio.Task[Any]

    async def stop(self) -> None:
        """Stop serving (open pages lose their live updates) and wait until it has."""
        self._server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def wait(self) -> None:
        """Wait until it stops (Ctrl-C, or `stop`)."""
        await self._task


async def start_console(
    settings: ConsoleSettings,
    ledger: Ledger,
    *,
    ledger_name: str,
    host: str = "127.0.0.1",
    port: int = 8321,
) -> RunningConsole:
    """Serve the console on ``ledger`` in this event loop; return once it listens.

    Args:
        settings: Sign-in and behaviour.
        ledger: The agent's ledger (closed by the caller, after `RunningConsole.stop`).
        ledger_name: How the pages name it.
        host: Where to listen: keep 127.0.0.1 unless a proxy in front of it needs otherwise.
        port: The port (0: a free one).

    Raises:
        OSError: The port cannot be listened on.
    """
    import uvicorn

    app = create_app(settings, ledger, ledger_name=ledger_name)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        lifespan="on",
        timeout_graceful_shutdown=1,
        # The client's address is the socket's: X-Forwarded-For is the client's to choose.
        proxy_headers=False,
    )
    server = uvicorn.Server(config)
    app.state.stopping = lambda: server.should_exit
    task = asyncio.ensure_future(server.serve())
    # uvicorn says it listens by a flag only.
    while not server.started and not task.done():  # noqa: ASYNC110
        await asyncio.sleep(0.02)
    if task.done():
        task.result()  # raises what stopped it
        raise OSError(f"the console could not listen on {host}:{port}")
    bound = server.servers[0].sockets[0].getsockname()[1]
    return RunningConsole(url=f"http://{host}:{bound}", _server=server, _task=task)


async def serve(
    settings: ConsoleSettings,
    *,
    ledger_url: str | None,
    host: str = "127.0.0.1",
    port: int = 8321,
    on_started: Callable[[str, str], None] | None = None,
) -> None:
    """Open the ledger at ``ledger_url`` (it must exist) and serve the console until stopped.

    ``on_started(url, ledger_name)`` is called once it listens.
    """
    from pipecat_actions.ledger import SqlLedger

    ledger = await SqlLedger.create(ledger_url, create_schema=False, must_exist=True)
    try:
        running = await start_console(
            settings, ledger, ledger_name=ledger.url, host=host, port=port
        )
        if on_started is not None:
            on_started(running.url, ledger.url)
        await running.wait()
    finally:
        await ledger.close()
