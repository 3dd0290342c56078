"""Notices that an operation settled, from the process that wrote it to those that wait for it.

A caller waiting for an operation another process runs used to re-read the ledger at 50, 100,
200 ms...: the last of 200 joined callers heard a 50 ms booking after about a second. Here each
ledger wakes its waiters when another process commits an outcome (`Ledger.notices`):

* PostgreSQL: once a settling write has committed, the writing ledger hands the operation's id
  to its `PostgresNotifier`, which sends ``NOTIFY pa_operations, '<operation id>'`` for every
  id handed to it since its last batch, in one statement on one of the ledger's connections
  (in a turn of its own, as any call of the ledger); one connection per process ``LISTEN``s,
  opened by the first waiter. The notice is not sent in the write's own transaction:
  PostgreSQL commits notifying transactions one at a time (a database-wide lock held through
  the commit's WAL flush), so a notice in every settling write denied them group commit and
  capped throughput with many callers (issue 34); the notifier's batches take that lock once
  for many notices.
* SQLite (one machine by construction): each process that waits binds a Unix datagram socket
  in a directory named for the ledger file's identity (device and inode, so every path to the
  same file meets there); a process that commits an outcome sends the operation's id to every
  socket there. A socket whose process died refuses the datagram and is removed.

Either way a notice is a hint: waiters re-read the operation, and still re-read on a slow
pause in case one is lost (a listener connection dropped, a full socket buffer).
"""

from __future__ import annotations

__all__ = ["OPEN_WAIT_SECS", "Notices", "PostgresNotices", "PostgresNotifier", "SqliteNotices"]

import asyncio
import contextlib
import os
import socket
import tempfile
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from loguru import logger

if TYPE_CHECKING:
    import asyncpg

OPEN_WAIT_SECS = 1.0
"""How long a waiter waits for listening to start before it goes on without (real time)."""


class Notices:
    """The waiters of one ledger, by operation; subclasses start listening and wake them."""

    def __init__(self, *, url: str) -> None:
        self._url = url
        self._waiters: dict[str, set[asyncio.Event]] = {}
        self._opening: asyncio.Task[None] | None = None
        self._went_on = False
        """A waiter stopped waiting for listening to start (see `subscribe`)."""
        self._closed = False

    async def subscribe(self, operation_id: str) -> asyncio.Event:
        """An event set when ``operation_id`` may have settled; `unsubscribe` it when done.

        Listening has started when this returns, so a settle committed after it is not missed;
        or, if listening cannot start within `OPEN_WAIT_SECS` (a slow server), the waiter goes
        on re-reading on its own pause, and every waiter is woken once it has started (to
        re-read what settled before). A failure to listen is logged; waiters then re-read on
        their pause.
        """
        changed = asyncio.Event()
        self._waiters.setdefault(operation_id, set()).add(changed)
        if not self._closed and not self._listening():
            if self._opening is None or self._opening.done():
                self._opening = asyncio.ensure_future(self._open())
            opening = self._opening
            done, _ = await asyncio.wait({opening}, timeout=OPEN_WAIT_SECS)
            if not done:
                self._went_on = True
        return changed

    async def _open(self) -> None:
        try:
            await self._listen()
        except Exception as exc:
            logger.debug("ledger {}: cannot listen for notices: {}", self._url, exc)
            return
        if self._went_on:
            self._went_on = False
            self._wake_all()  # waiters that went on without it re-read what settled meanwhile

    def unsubscribe(self, operation_id: str, changed: asyncio.Event) -> None:
        """Stop waking ``changed``."""
        waiters = self._waiters.get(operation_id)
        if waiters is not None:
            waiters.discard(changed)
            if not waiters:
                del self._waiters[operation_id]

    async def close(self) -> None:
        """Stop listening."""
        self._closed = True
        if self._opening is not None and not self._opening.done():
            self._opening.cancel()
            await asyncio.gather(self._opening, return_exceptions=True)

    def _wake(self, operation_id: str) -> None:
        for changed in self._waiters.get(operation_id, ()):
            changed.set()

    def _wake_all(self) -> None:
        for waiters in self._waiters.values():
            for changed in waiters:
                changed.set()

    def _listening(self) -> bool:
        raise NotImplementedError

    async def _listen(self) -> None:
        raise NotImplementedError


class PostgresNotices(Notices):
    """``LISTEN`` on one connection of its own, opened by the first waiter, kept until `close`.

    If it is lost, every waiter is woken (so that it re-reads), and the next waiter opens it
    again.

    Args:
        dsn: Where the database is (asyncpg's form).
        url: The URL to name in logs (password hidden).
    """

    def __init__(self, *, dsn: str, url: str) -> None:
        super().__init__(url=url)
        self._dsn = dsn
        self._conn: asyncpg.Connection | None = None

    async def close(self) -> None:
        await super().close()
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            from pipecat_actions.ledger._postgres import close_connection

            await close_connection(conn, within_secs=5)

    def _listening(self) -> bool:
        return self._conn is not None and not self._conn.is_closed()

    async def _listen(self) -> None:
        # Imported by PostgreSQL ledgers only: a SQLite ledger's process never loads asyncpg.
        import asyncpg

        from pipecat_actions.ledger._postgres import CHANNEL

        conn = await asyncpg.connect(self._dsn, timeout=10)
        try:
            conn.add_termination_listener(self._lost)
            await conn.add_listener(CHANNEL, self._notified)
        except BaseException:
            conn.terminate()
            raise
        if self._closed:
            conn.terminate()
            return
        self._conn = conn

    def _notified(self, _conn: Any, _pid: int, _channel: str, payload: str) -> None:
        self._wake(payload)

    def _lost(self, _conn: Any) -> None:
        self._conn = None
        self._wake_all()


_NOTIFY = (
    "SELECT pg_notify($1, n.id) FROM unnest($2::text[]) WITH ORDINALITY AS n(id, i) ORDER BY n.i"
)
"""One batch of notices, sent in the order given (one transaction: listeners get them in it)."""

MAX_BATCH = 1000
"""The most notices one statement sends."""

MAX_PENDING = 100_000
"""The most notices waiting for a batch; more are dropped (waiters re-read on their pause)."""

CLOSE_WITHIN_SECS = 5.0
"""How long `PostgresNotifier.close` may take to send what is pending (real time)."""


class PostgresNotifier:
    """Sends a PostgreSQL ledger's notices after their writes commit, in batches.

    `send` queues an operation's id (once: an id already waiting is not queued twice, its one
    notice is sent after every write that queued it); one long-lived task, started by the
    first `send`, sends everything queued as one statement (`_NOTIFY`, in the order queued)
    outside any transaction, through ``execute`` (on the ledger's connections) or else on a
    connection of its own, and while that batch is in flight the next ones gather. A batch
    that fails (the server unreachable, the connection lost) is dropped: its notices are
    hints, and waiters re-read on their own pause. The first failure of a run of them is
    logged as a warning, the rest at debug level, and a recovery at info.

    Args:
        dsn: Where the database is (asyncpg's form), for a connection of its own.
        url: The URL to name in logs (password hidden).
        connect_timeout: How long opening its connection may take.
        execute: Runs a statement with its parameters on a connection of the ledger: the
            batches go there, and the notifier opens no connection (the ledger's budget).
    """

    def __init__(
        self,
        *,
        url: str,
        connect_timeout: float,
        dsn: str | None = None,
        execute: Callable[..., Awaitable[Any]] | None = None,
    ) -> None:
        if (dsn is None) == (execute is None):
            raise ValueError("give the notifier a dsn or an execute, not both")
        self._dsn = dsn
        self._execute = execute
        self._url = url
        self._connect_timeout = connect_timeout
        self._pending: dict[str, None] = {}
        """The ids to send, in the order queued (a dict: each id once)."""
        self._queued = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._conn: asyncpg.Connection | None = None
        self._closing = False
        self._failing = False
        """The last batch failed (its failure was logged; the next ones log at debug level)."""
        self._unsent = 0
        """Notices dropped since `close` began (reported by it in one line)."""
        self._last_error: BaseException | None = None

    def send(self, operation_id: str) -> None:
        """Queue the notice of ``operation_id``, whose write has committed (never raises)."""
        if self._closing:
            return  # `close` waits for the writes first: only a write after it lands here
        if len(self._pending) >= MAX_PENDING and operation_id not in self._pending:
            logger.debug("ledger {}: notice dropped, too many queued: {}", self._url, operation_id)
            return
        self._pending[operation_id] = None
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())
        self._queued.set()

    async def close(self, *, within_secs: float = CLOSE_WITHIN_SECS) -> None:
        """Send what is queued (within ``within_secs``), then close the connection.

        Notices that could not be sent are reported in one log line.
        """
        self._closing = True
        self._queued.set()
        task = self._task
        if task is not None:
            done, _ = await asyncio.wait({task}, timeout=within_secs)
            if not done:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                self._last_error = TimeoutError(f"not sent within {within_secs:g} s")
                if self._conn is not None:
                    self._conn.terminate()  # cancelled mid-statement
                    self._conn = None
        self._unsent += len(self._pending)
        self._pending.clear()
        if self._unsent:
            logger.warning(
                "ledger {}: {} notice(s) not sent at close ({}); waiters re-read on their pause",
                self._url,
                self._unsent,
                _said(self._last_error),
            )
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            from pipecat_actions.ledger._postgres import close_connection

            await close_connection(conn, within_secs=self._connect_timeout)

    async def _run(self) -> None:
        if self._execute is None and self._conn is None:
            try:
                await self._connect()
            except Exception as exc:  # the first batch tries again, and logs its failure
                logger.debug("ledger {}: notices' connection not opened: {}", self._url, exc)
        while True:
            if not self._pending:
                if self._closing:
                    return
                self._queued.clear()
                await self._queued.wait()
                continue
            batch = list(self._pending)[:MAX_BATCH]
            if len(batch) == len(self._pending):
                self._pending.clear()
            else:
                for operation_id in batch:
                    del self._pending[operation_id]
            await self._send_batch(batch)

    async def _send_batch(self, batch: list[str]) -> None:
        try:
            await self._deliver(batch)
        except Exception as exc:
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.terminate()
            self._last_error = exc
            if self._closing:
                self._unsent += len(batch)
            elif not self._failing:
                logger.warning(
                    "ledger {}: notices not sent ({}); dropped until it recovers, waiters "
                    "re-read on their pause",
                    self._url,
                    _said(exc),
                )
            else:
                logger.debug("ledger {}: {} notice(s) dropped: {}", self._url, len(batch), exc)
            self._failing = True
            return
        if self._failing:
            self._failing = False
            logger.info("ledger {}: notices are sent again", self._url)

    async def _deliver(self, batch: list[str]) -> None:
        """Send ``batch`` as one statement, opening the connection first if needed."""
        from pipecat_actions.ledger._postgres import CHANNEL

        if self._execute is not None:
            await self._execute(_NOTIFY, CHANNEL, batch)
            return
        conn = self._conn
        if conn is None or conn.is_closed():
            conn = await self._connect()
        await conn.execute(_NOTIFY, CHANNEL, batch)

    async def _connect(self) -> asyncpg.Connection:
        import asyncpg

        conn: asyncpg.Connection = await asyncpg.connect(self._dsn, timeout=self._connect_timeout)
        self._conn = conn
        return conn


def _said(error: BaseException | None) -> str:
    if error is None:
        return "unknown cause"
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


class SqliteNotices(Notices):
    """Unix datagram sockets beside a SQLite ledger file (see the module docstring).

    Args:
        path: The ledger file (already open, so it exists).
        url: The URL to name in logs.
    """

    def __init__(self, path: Path, *, url: str) -> None:
        super().__init__(url=url)
        found = path.stat()
        self.directory = (
            Path(tempfile.gettempdir())
            / f"pipecat-actions-{os.getuid()}"
            / f"{found.st_dev:x}-{found.st_ino:x}"
        )
        self._socket: socket.socket | None = None
        self._address: Path | None = None
        self._sender: socket.socket | None = None

    def send(self, operation_id: str) -> None:
        """Tell every waiting process that ``operation_id`` settled (best effort, never raises)."""
        try:
            peers = list(os.scandir(self.directory))
        except OSError:
            return  # nobody ever waited on this ledger
        if not peers:
            return
        if self._sender is None:
            self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sender.setblocking(False)
        payload = operation_id.encode()
        for peer in peers:
            try:
                self._sender.sendto(payload, peer.path)
            except (ConnectionRefusedError, FileNotFoundError):
                with contextlib.suppress(OSError):
                    os.unlink(peer.path)  # its process is gone
            except OSError as exc:  # a full buffer: that waiter re-reads on its own pause
                logger.debug("ledger {}: notice to {} dropped: {}", self._url, peer.name, exc)

    async def close(self) -> None:
        await super().close()
        if self._socket is not None:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self._socket.fileno())
            self._socket.close()
            self._socket = None
        if self._address is not None:
            with contextlib.suppress(OSError):
                self._address.unlink()
            self._address = None
        if self._sender is not None:
            self._sender.close()
            self._sender = None

    def _listening(self) -> bool:
        return self._socket is not None

    async def _listen(self) -> None:
        for directory in (self.directory.parent, self.directory):
            # Private to this user: only its processes may wake its waiters.
            directory.mkdir(mode=0o700, exist_ok=True)
            found = directory.lstat()
            if not directory.is_dir() or directory.is_symlink() or found.st_uid != os.getuid():
                raise OSError(f"{directory} is not a directory of this user's own")
        address = self.directory / f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        if len(os.fsencode(address)) > 100:  # the limit of a Unix socket's address
            raise OSError(f"socket path too long: {address}")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            listener.setblocking(False)
            listener.bind(os.fspath(address))
            asyncio.get_running_loop().add_reader(listener.fileno(), self._readable)
        except BaseException:
            listener.close()
            with contextlib.suppress(OSError):
                address.unlink()
            raise
        self._socket, self._address = listener, address

    def _readable(self) -> None:
        listener = self._socket
        while listener is not None:
            try:
                payload = listener.recv(256)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                logger.debug("ledger {}: notice socket failed: {}", self._url, exc)
                self._wake_all()
                return
            self._wake(payload.decode(errors="replace"))
