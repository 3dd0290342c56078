"""Reading a SQLite ledger file without writing to it: what the operator's read commands open.

A reader leaves the file and its folder as it found them: no ``.lock`` sidecar, no switch to
WAL, no ``-wal`` or ``-shm`` of its making, not a byte changed. The file is looked at before
SQLite opens it: a directory, a file that cannot be read and one that is not a SQLite database
are refused (`open_reader`); SQLite then opens it read-only (``mode=ro``) with no PRAGMA that
writes, and `SqlLedger` refuses one without the ledger's tables.

WAL needs care. A read-only connection to a WAL database whose ``-wal`` and ``-shm`` are
missing (its writers all closed: the last one removes them) creates both, and leaves them
behind: removing them takes the exclusive lock a read-only connection cannot take (SQLite
3.22+ documents it: a read-only WAL database opens "if the -shm and -wal files already exist or
those files can be created or the database is immutable"). A reader that is alone with the
file opens it ``immutable=1`` instead, which creates nothing and locks nothing. "Alone" must
hold for the whole read, so the reader holds a shared lock of its own on the database file, on
the bytes SQLite's readers lock (an open file description lock: SQLite closing one of its own
descriptors of the file cannot drop it). While it holds that lock:

* a writer that opens the file creates its ``-shm`` and cannot remove it again (that takes the
  exclusive lock), so a ``-shm`` or ``-wal`` found after a read means a writer may have
  written during it: the read is made again through the WAL, read-only (`SqliteReader.alone`
  turns False for good);
* a database with no ``-wal`` holds every committed transaction in the file itself, and no
  checkpoint can change the file without a writer's ``-shm`` existing.

Where that lock cannot be taken (no open file description locks on this system, or a
connection holds the file exclusively), or where only one of ``-wal`` and ``-shm`` is there,
the reader uses ``mode=ro``, and SQLite may create the missing one. A writer that closes while
the reader holds the lock skips its checkpoint on close and leaves its ``-wal`` and ``-shm``
(as it does beside any other reader); the next writer to close tidies them up.
"""

from __future__ import annotations

__all__ = ["SqliteReader", "create_reader_engine", "open_reader"]

import contextlib
import fcntl
import os
import stat
import struct
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiosqlite
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from pipecat_actions.errors import LedgerConfigurationError
from pipecat_actions.ledger._opening import in_directory, is_denied, not_a_ledger, sqlite_denied
from pipecat_actions.ledger.engine import (
    SQLITE_HEADER,
    LedgerSettings,
    allow_table_hints,
    damaged_file,
    kept_at,
    lost_file,
    not_found,
)

_WAL = 2
"""The file format version bytes (18 and 19 of the header) of a database in WAL mode."""
_SHARED_FIRST = 0x40000000 + 2
_SHARED_SIZE = 510
"""The bytes a SQLite reader locks shared, and a connection locks exclusively to checkpoint
and remove a WAL database's ``-wal`` and ``-shm`` when it closes (``os_unix.c``)."""
_FLOCK = "hhqqi0q"
"""Linux's ``struct flock``: l_type, l_whence, l_start, l_len (64-bit), l_pid, padded."""


class SqliteReader:
    """An existing SQLite ledger file, held open to be read and never written.

    Made by `open_reader`; `connect` opens each connection of the reader's engine. Blocking
    methods, but each is a few system calls.

    Args:
        path: The file, as the ledger was given it (named in errors).
        fd: A descriptor of it, open read-only: it holds the lock, if any, until `close`.
        guarded: The shared lock is held on ``fd`` (the database is in WAL mode).
        busy_timeout_ms: How long a connection waits for another process's lock.
    """

    def __init__(self, path: Path, fd: int, *, guarded: bool, busy_timeout_ms: int) -> None:
        self.path = path
        self._fd = fd
        real = os.path.realpath(path)  # where SQLite puts the -wal and -shm: beside the target
        self._sidecars = (f"{real}-wal", f"{real}-shm")
        self._uri = f"file:{quote(real)}?mode=ro"
        self._busy_timeout_secs = busy_timeout_ms / 1000
        self.empty = os.fstat(fd).st_size == 0
        """The file was empty (an empty database to SQLite) when the reader opened it."""
        self._alone = guarded and not any(map(os.path.lexists, self._sidecars))
        if guarded and not self._alone:
            _unlock(fd)  # the WAL's own files are there: a writer's, or left by a crash

    def alone(self) -> bool:
        """Whether every read so far saw the file as no writer had it: True until one has.

        Reads made while it is True are made ``immutable``: one is trusted only if this is
        still True after it ended.
        """
        if self._alone and any(map(os.path.lexists, self._sidecars)):
            self._alone = False
        return self._alone

    async def connect(self) -> aiosqlite.Connection:
        """A new read-only connection: ``immutable`` while `alone`, else ``mode=ro``."""
        uri = self._uri + ("&immutable=1" if self.alone() else "")
        return await aiosqlite.connect(uri, uri=True, timeout=self._busy_timeout_secs)

    def close(self) -> None:
        """Let go of the file (and of the lock)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def open_reader(path: Path, settings: LedgerSettings) -> SqliteReader:
    """Look at ``path`` without changing it; return a reader for it if SQLite can read it.

    Blocking: call it from a thread.

    Raises:
        LedgerNotFound: Nothing at ``path``, or a directory, or not a SQLite database.
        LedgerLost: The file is missing, empty or not a database where a ledger was kept.
        LedgerConfigurationError: The file cannot be read (its mode, say).
    """
    lock_path = path.with_name(path.name + ".lock")
    try:
        # Non-blocking: a FIFO left at the path must not hang the command.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        raise (lost_file(path) if kept_at(lock_path) else not_found(path)) from None
    except OSError as exc:
        if is_denied(exc):
            raise sqlite_denied(path, exc, doing="read") from None
        raise LedgerConfigurationError(
            f"cannot read the ledger file {path}: {exc.strerror or exc}"
        ) from None
    try:
        found = os.fstat(fd)
        if stat.S_ISDIR(found.st_mode):
            raise not_a_ledger(path, "it is a directory", hint=in_directory(path))
        if not stat.S_ISREG(found.st_mode):
            raise not_a_ledger(path, "not a regular file")
        if found.st_size == 0:
            if kept_at(lock_path):
                raise lost_file(path)
            # An empty database to SQLite, which reads it as one and writes nothing.
            return SqliteReader(
                path, fd, guarded=False, busy_timeout_ms=settings.sqlite_busy_timeout_ms
            )
        guarded = _lock_shared(fd)
        # Read under the lock: leaving WAL mode (or entering it) takes the exclusive lock.
        header = os.pread(fd, 100, 0)
        if len(header) < 100 or not header.startswith(SQLITE_HEADER):
            if kept_at(lock_path):
                raise damaged_file(path, "file is not a database")
            raise not_a_ledger(path, "not a SQLite database")
        wal = header[18] == _WAL and header[19] == _WAL
        if guarded and not wal:
            _unlock(fd)  # a rollback-journal database: mode=ro reads it creating nothing
        return SqliteReader(
            path, fd, guarded=guarded and wal, busy_timeout_ms=settings.sqlite_busy_timeout_ms
        )
    except BaseException:
        os.close(fd)
        raise


def create_reader_engine(reader: SqliteReader, settings: LedgerSettings) -> AsyncEngine:
    """An async engine whose connections come from ``reader``, each read-only and checked.

    No pool: a connection lives for one read, so one opened while the reader was `alone`
    serves no read made after it no longer is.
    """
    engine = create_async_engine(
        "sqlite+aiosqlite://", async_creator=reader.connect, poolclass=NullPool
    )
    allow_table_hints(engine.sync_engine)

    @event.listens_for(engine.sync_engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Each setting is the connection's own: none writes to the file (journal_mode would).
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout={int(settings.sqlite_busy_timeout_ms)}")
            cursor.execute("PRAGMA query_only=ON")
            cursor.execute("PRAGMA query_only")
            row = cursor.fetchone()
            if not row or row[0] != 1:
                raise LedgerConfigurationError(
                    f"SQLite refused PRAGMA query_only=ON for {reader.path} (it reports "
                    f"{row[0] if row else None!r}); a reader will not run without it"
                )
        finally:
            cursor.close()

    return engine


def _lock_shared(fd: int) -> bool:
    """Lock SQLite's reader bytes of ``fd`` shared, without waiting; False if it cannot."""
    return _set_lock(fd, fcntl.F_RDLCK)


def _unlock(fd: int) -> None:
    _set_lock(fd, fcntl.F_UNLCK)


def _set_lock(fd: int, kind: int) -> bool:
    command = getattr(fcntl, "F_OFD_SETLK", None)  # Linux only
    if command is None:
        return False
    lock = struct.pack(_FLOCK, kind, os.SEEK_SET, _SHARED_FIRST, _SHARED_SIZE, 0)
    with contextlib.suppress(OSError):  # EAGAIN: a connection holds the file exclusively
        fcntl.fcntl(fd, command, lock)
        return True
    return False
