"""Owner life: whether the runtime that holds a lease is still alive, as the database tells it.

A lease says "this owner renewed me lately"; it cannot say "this owner is gone" until it runs
out. A runtime that holds leases therefore also holds a lock for as long as it lives, and
registers in ``pa_owners`` with the lock's key:

* PostgreSQL: a session-level advisory lock on a connection of its own. The server releases
  it the moment that session ends: the process died, was killed, or lost its connection.
* SQLite: ``flock`` on a file of its own beside the ledger (``<ledger>.owners/``). The kernel
  releases it the moment the process ends, however it ends.

A registered owner whose lock is free is gone (`Life.gone`): another runtime takes over its
operations at once (fenced, so that a stale writer's writes are refused) and reconciles them.
An owner that is not registered (a runtime that never held its life here) is never called
gone: its lease running out stays the last line. A false "alive" (a hash shared by two owners)
only falls back to the lease; a false "gone" cannot come from this, since a lock that is held
is seen held.
"""

from __future__ import annotations

__all__ = ["Life", "PostgresLife", "SqliteLife", "life_key"]

import asyncio
import contextlib
import errno
import fcntl
import hashlib
import time
from collections.abc import Collection
from pathlib import Path
from typing import IO, TYPE_CHECKING, Protocol

from loguru import logger

if TYPE_CHECKING:
    import asyncpg

_HOLD_TRIES = 20
"""How often `SqliteLife.hold` tries a lock another runtime is testing at that very moment."""


def life_key(owner: str) -> int:
    """The 64-bit key of ``owner``'s lock (signed, as PostgreSQL's ``bigint``)."""
    digest = hashlib.sha256(f"pipecat_actions.life:{owner}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


class Life(Protocol):
    """An owner's lock for as long as it lives, and the test of other owners' locks."""

    async def hold(self, owner: str) -> bool:
        """Take ``owner``'s lock; False when a live runtime holds it already."""
        ...

    async def release(self, owner: str) -> None:
        """Let go of ``owner``'s lock (a clean close)."""
        ...

    async def gone(self, owners: Collection[str]) -> set[str]:
        """Those of ``owners`` registered in ``pa_owners`` whose lock is free: they are gone.

        (On SQLite the caller passes registered owners only.)
        """
        ...

    async def forget(self, owners: Collection[str]) -> None:
        """Drop what is kept beside the registry for gone ``owners`` (their lock files)."""
        ...

    async def close(self) -> None:
        """Let go of every lock held (as a process end would)."""
        ...


class PostgresLife:
    """`Life` on PostgreSQL: a session advisory lock per owner, on a connection of its own.

    Args:
        dsn: The database to connect to (asyncpg DSN).
        url: The ledger's URL with its password hidden, for messages.
        connect_timeout: Seconds a connection may take.
    """

    def __init__(self, *, dsn: str, url: str, connect_timeout: float) -> None:
        self._dsn = dsn
        self._url = url
        self._timeout = connect_timeout
        self._held: dict[str, asyncpg.Connection] = {}
        self._lock = asyncio.Lock()

    async def hold(self, owner: str) -> bool:
        import asyncpg  # a SQLite ledger's process never imports it

        from pipecat_actions.ledger._postgres import close_connection

        async with self._lock:
            conn = await asyncpg.connect(self._dsn, timeout=self._timeout)
            try:
                if not await conn.fetchval("SELECT pg_try_advisory_lock($1)", life_key(owner)):
                    await close_connection(conn, within_secs=1.0)
                    return False
            except BaseException:
                conn.terminate()
                raise
            self._held[owner] = conn
            return True

    async def keep(self, owner: str) -> bool:
        """Take ``owner``'s lock again if its connection was lost (a database restart).

        Returns:
            True while it holds the lock (again); False when it could not.
        """
        conn = self._held.get(owner)
        if conn is not None and not conn.is_closed():
            return True
        self._held.pop(owner, None)
        try:
            return await self.hold(owner)
        except Exception as exc:  # tried again at the next heartbeat
            logger.warning(
                "ledger {}: could not take the lock of {} again: {}", self._url, owner, exc
            )
            return False

    async def release(self, owner: str) -> None:
        from pipecat_actions.ledger._postgres import close_connection

        async with self._lock:
            conn = self._held.pop(owner, None)
            if conn is None or conn.is_closed():
                return
            try:
                await conn.fetchval("SELECT pg_advisory_unlock($1)", life_key(owner))
            finally:
                await close_connection(conn, within_secs=1.0)

    async def gone(self, owners: Collection[str]) -> set[str]:
        """Not asked here: the ledger reads it on its own connections (`_owners`)."""
        raise NotImplementedError("read by the ledger: `_owners.gone_on_postgres`")

    async def forget(self, owners: Collection[str]) -> None:
        return  # nothing of theirs outside the registry

    async def close(self) -> None:
        for owner in list(self._held):
            conn = self._held.pop(owner)
            conn.terminate()


class SqliteLife:
    """`Life` on SQLite: ``flock`` on a file per owner beside the ledger.

    ``flock`` locks belong to an open file, not to a process, so two runtimes of one process
    see each other's locks too. Registration is in the ledger (``pa_owners``); this class
    keeps the files.

    Args:
        database: The ledger's SQLite file.
    """

    def __init__(self, database: Path) -> None:
        self._folder = database.with_name(f"{database.name}.owners")
        self._held: dict[str, IO[bytes]] = {}

    def path(self, owner: str) -> Path:
        """The lock file of ``owner``."""
        return self._folder / f"{life_key(owner) & (2**64 - 1):016x}.life"

    async def hold(self, owner: str) -> bool:
        return await asyncio.to_thread(self._hold, owner)

    def _hold(self, owner: str) -> bool:
        self._folder.mkdir(mode=0o700, exist_ok=True)
        handle = open(self.path(owner), "ab")  # noqa: SIM115 - held open while the owner lives
        for attempt in range(_HOLD_TRIES):
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                # Another runtime may be testing it this instant (`gone`), or a live runtime
                # holds this owner name: only the first lasts.
                if attempt + 1 == _HOLD_TRIES:
                    handle.close()
                    return False
                _pause(attempt)
                continue
            self._held[owner] = handle
            return True
        return False  # pragma: no cover - the loop returns

    async def release(self, owner: str) -> None:
        handle = self._held.pop(owner, None)
        if handle is None:
            return
        with contextlib.suppress(OSError):
            self.path(owner).unlink()
        handle.close()

    async def gone(self, owners: Collection[str]) -> set[str]:
        return await asyncio.to_thread(lambda: {o for o in owners if self._is_gone(o)})

    def _is_gone(self, owner: str) -> bool:
        if owner in self._held:
            return False
        try:
            handle = open(self.path(owner), "rb")  # noqa: SIM115 - closed below
        except FileNotFoundError:
            return True  # registered, and its file is gone with it
        except OSError:
            return False  # cannot tell: the lease decides
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return False  # held: alive
            return False
        finally:
            handle.close()  # closing lets go of the shared lock taken to test it
        return True

    async def forget(self, owners: Collection[str]) -> None:
        for owner in owners:
            if owner not in self._held:
                with contextlib.suppress(OSError):
                    self.path(owner).unlink()

    async def close(self) -> None:
        for owner in list(self._held):
            self._held.pop(owner).close()


def _pause(attempt: int) -> None:
    """A short pause between tries of a lock another runtime tests this instant."""
    time.sleep(0.005 * (attempt + 1))
