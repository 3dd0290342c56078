"""Opening the ledger's database: URL rules and the durability settings checked on every connection.

SQLite (the default, a file under ``.pipecat_actions/`` in the working directory):

* ``journal_mode=WAL`` so readers never block the writer;
* ``synchronous=FULL`` by default: a commit is on disk (WAL fsynced) before the call returns.
  ``NORMAL`` is an explicit opt-in (``sqlite_synchronous="NORMAL"``): in WAL mode it cannot
  corrupt the database, but the last commits before a power loss (not a process crash) can be
  lost, which for this ledger means an operation the user was told about may vanish;
* ``busy_timeout`` so several processes sharing one file wait for the write lock;
* ``foreign_keys=ON``.

Each setting is read back after it is set; a connection that does not take it is refused.
A ledger opened read-only sets none of them: its connections write nothing (see `_reader`).

A SQLite ledger holds every tool call's arguments: the directory it creates for one is its
owner's alone (0700), the files it creates (the database, its ``.lock`` sidecar) are 0600, and
SQLite gives its ``-wal`` and ``-shm`` files the database file's mode. What already exists keeps
the mode it has (a team may share a ledger on purpose).

PostgreSQL: the server must not run with ``synchronous_commit=off`` or ``fsync=off`` (a
committed admission could be lost on a crash) unless ``allow_unsafe_postgres=True``.
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_LEDGER_DIR",
    "ENV_LEDGER_URL",
    "SQLITE_HEADER",
    "LedgerSettings",
    "SqliteFile",
    "allow_table_hints",
    "create_engine_for",
    "create_sqlite_writer_engine",
    "damaged_file",
    "default_ledger_url",
    "kept_at",
    "lost_file",
    "normalize_url",
    "not_found",
    "prepare_sqlite_file",
    "redact_url",
]

import contextlib
import fcntl
import os
import re
import sqlite3
import stat
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from loguru import logger
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.dialects.sqlite.base import SQLiteCompiler
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from pipecat_actions.errors import (
    LedgerConfigurationError,
    LedgerLost,
    LedgerNotFound,
    LedgerUnavailable,
)
from pipecat_actions.ledger._opening import in_directory, is_denied, not_a_ledger, sqlite_denied

DEFAULT_LEDGER_DIR = ".pipecat_actions"
SQLITE_HEADER = b"SQLite format 3\x00"
"""The first bytes of every SQLite database file."""
_KEPT_MARKER = b"pipecat_actions ledger"
"""First bytes of a SQLite ledger's lock file once the ledger has been opened there."""
ENV_LEDGER_URL = "PIPECAT_ACTIONS_LEDGER_URL"
_PRIVATE_DIRECTORY = 0o700
_PRIVATE_FILE = 0o600


@dataclass(frozen=True, slots=True)
class LedgerSettings:
    """How the ledger talks to its database.

    Attributes:
        sqlite_synchronous: ``FULL`` (default, durable on power loss) or ``NORMAL`` (opt-in).
        sqlite_busy_timeout_ms: How long a SQLite connection waits for another process's lock.
        allow_unsafe_postgres: Accept a server with ``synchronous_commit=off`` or ``fsync=off``.
        pool_size: The connection budget of a ledger: the most calls it runs on the
            database at once and, on PostgreSQL, the most connections it opens for them. On
            PostgreSQL reads take at most half of the turns, so polling waiters never starve
            writes (SQLite's writes have a thread of their own). Further calls wait their turn
            in order: a busy ledger makes callers wait, it never fails them (a caller's own
            deadline still ends its wait). On PostgreSQL the hot path, SQLAlchemy's rarer
            calls and the notices' batches share these connections (a new one is opened only
            when every open one is in use); besides them a runtime holds one for its life lock,
            and one listens for notices once a caller waits for another process's operation.
            So a process with one runtime holds at most ``pool_size + 2``: keep the sum over
            every process sharing the server under its ``max_connections`` (100 by default).
        max_overflow: Not used by a ledger any more (its engine keeps no pool of its own);
            accepted so that settings naming it still load.
        pool_timeout_secs: Not used by a ledger any more: a call that holds its turn always
            finds an idle connection or opens one (`connect_timeout_secs` bounds that);
            accepted so that settings naming it still load.
        connect_timeout_secs: How long opening a new PostgreSQL connection may take (a
            network's and a server's pace, unrelated to waiting for a turn).
    """

    sqlite_synchronous: Literal["FULL", "NORMAL"] = "FULL"
    sqlite_busy_timeout_ms: int = 10_000
    allow_unsafe_postgres: bool = False
    pool_size: int = 5
    max_overflow: int = 5
    pool_timeout_secs: float = 10.0
    connect_timeout_secs: float = 10.0

    def __post_init__(self) -> None:
        if not self.connect_timeout_secs > 0 or not self.pool_timeout_secs > 0:
            raise LedgerConfigurationError(
                f"pool_timeout_secs and connect_timeout_secs must be positive "
                f"(got {self.pool_timeout_secs} and {self.connect_timeout_secs})"
            )
        if self.pool_size < 1 or self.max_overflow < 0:
            raise LedgerConfigurationError(
                f"pool_size must be at least 1 and max_overflow at least 0 "
                f"(got {self.pool_size} and {self.max_overflow})"
            )


def default_ledger_url() -> str:
    """Return ``$PIPECAT_ACTIONS_LEDGER_URL``, or a SQLite file under ``./.pipecat_actions/``."""
    from_env = os.environ.get(ENV_LEDGER_URL)
    if from_env:
        return from_env
    return f"sqlite+aiosqlite:///{Path(DEFAULT_LEDGER_DIR, 'ledger.db').resolve()}"


def normalize_url(url: str) -> URL:
    """Parse ``url`` and pick the async driver (``aiosqlite`` or ``asyncpg``).

    A plain path (``ledger.db``, ``./data/ledger.db``, ``/srv/ledger.db``, ``~/ledger.db``) is
    a SQLite file, made absolute from the working directory. Every URL has a colon and a
    plain path is a value without one: a path that has one is written ``sqlite:///PATH``.

    Raises:
        LedgerConfigurationError: Not a SQLite or PostgreSQL URL, or an in-memory SQLite one
            (nothing in memory survives a crash, and WAL cannot be used there).
    """
    if ":" not in url:
        path = os.path.abspath(os.path.expanduser(url))
        return URL.create("sqlite+aiosqlite", database=path)
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError) as exc:  # ValueError: a port that is not a number
        raise LedgerConfigurationError(
            f"not a database URL: {redact_url(url)!r}: write sqlite:///PATH for a SQLite file "
            "(a path without a colon also works as it is) or postgresql://USER@HOST/DB"
        ) from exc
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        database = parsed.database or ""
        if database in ("", ":memory:") or database.startswith("file::memory:"):
            raise LedgerConfigurationError(
                "an in-memory SQLite ledger cannot survive a crash: give a file path, "
                "e.g. sqlite:///.pipecat_actions/ledger.db"
            )
        return parsed.set(drivername="sqlite+aiosqlite")
    if backend in ("postgresql", "postgres"):
        return parsed.set(drivername="postgresql+asyncpg")
    raise LedgerConfigurationError(
        f"unsupported ledger database {backend!r} in {redact_url(url)!r}: "
        "use sqlite:///PATH or postgresql://USER@HOST/DB"
    )


_PASSWORD_IN_URL = re.compile(r"(://[^/@:]*:)[^@]*@")


def redact_url(url: str | URL) -> str:
    """Return ``url`` with any password hidden, for messages and logs."""
    try:
        return (
            make_url(url).render_as_string(hide_password=True)
            if isinstance(url, str)
            else (url.render_as_string(hide_password=True))
        )
    except (ArgumentError, ValueError):
        # Shown as written, but for what sits between the user name and the host.
        return _PASSWORD_IN_URL.sub(r"\1***@", url) if isinstance(url, str) else "<URL>"


class _HintingSqliteCompiler(SQLiteCompiler):
    """SQLite's statement compiler, with table hints: ``with_hint(t, "NOT INDEXED", "sqlite")``.

    SQLite reads ``INDEXED BY <index>`` and ``NOT INDEXED`` after a table's name; SQLAlchemy's
    SQLite compiler drops every table hint without a word. Set on the ledger's own engine only.
    """

    def get_from_hint_text(self, table: Any, text: str | None) -> str | None:
        return text


def allow_table_hints(engine: Engine) -> None:
    """Let the statements of ``engine`` (a SQLite one) carry table hints (``NOT INDEXED``)."""
    engine.dialect.statement_compiler = _HintingSqliteCompiler


def create_engine_for(
    url: URL,
    settings: LedgerSettings,
    *,
    borrow: Callable[[], Awaitable[Any]] | None = None,
) -> AsyncEngine:
    """Create an async engine whose every new connection is checked for durability.

    Args:
        url: A URL from `normalize_url`.
        settings: Durability and pool settings.
        borrow: PostgreSQL (required there): where the engine gets its connections (the
            ledger's own, `_postgres.PostgresFastPath.lend`, which checks their durability
            settings itself), instead of a pool of its own: it keeps none, and gives each
            back when done with it.
    """
    if url.get_backend_name() == "sqlite":
        # Opens nothing yet: `prepare_sqlite_file` makes (or finds) the file first.
        engine = create_async_engine(url)
        allow_table_hints(engine.sync_engine)
        _install_sqlite_checks(engine.sync_engine, settings)
        return engine
    if borrow is None:
        raise ValueError("a PostgreSQL ledger's engine borrows its connections: pass borrow")
    return create_async_engine(url, poolclass=NullPool, async_creator=borrow)


def prepare_sqlite_file(url: URL, settings: LedgerSettings, *, must_exist: bool = False) -> None:
    """Create the SQLite file if needed and switch it to WAL, one process at a time.

    WAL mode is stored in the file, so this happens once per file. Switching needs an exclusive
    lock that SQLite refuses at once (without waiting) when several new connections race for
    it; an advisory lock on a sidecar file (``<file>.lock``) serialises the processes doing it.
    The sidecar also remembers that a ledger was kept there: a ledger file found missing or
    empty next to it was deleted or truncated, and is refused rather than silently started
    anew. What it creates is private to its owner: a missing directory 0700, the file and
    the sidecar 0600. Blocking: call it from a thread.

    Args:
        url: A SQLite URL from `normalize_url`.
        settings: The busy timeout.
        must_exist: Create nothing: a missing file (or directory) is `LedgerNotFound`.

    Raises:
        LedgerNotFound: ``must_exist`` and no file is there; or what is there is not a ledger
            (a directory, a file that is not a SQLite database where no ledger was kept).
        LedgerLost: The file is missing or empty where a ledger was kept, or is not a SQLite
            database.
        LedgerConfigurationError: The directory cannot be created; the file, its folder or its
            sidecar may not be read or written by this user.
        LedgerUnavailable: SQLite could not open it (locked, I/O).
    """
    path = Path(url.database or "")
    lock_path = path.with_name(path.name + ".lock")
    if path.is_dir():
        raise not_a_ledger(path, "it is a directory", hint=in_directory(path))
    if not must_exist:
        _make_private_directory(path.parent)
    elif not path.exists() and not kept_at(lock_path):  # else: lost, said under the lock
        raise not_found(path)
    _refuse_foreign_file(path, lock_path)
    try:
        created = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_APPEND, _PRIVATE_FILE)
    except OSError as exc:
        if is_denied(exc):
            raise sqlite_denied(path, exc, doing="open") from None
        raise
    with os.fdopen(created, "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            lock.seek(0)
            kept = lock.read().startswith(_KEPT_MARKER)
            if kept and (not path.exists() or path.stat().st_size == 0):
                raise lost_file(path)
            if not path.exists():
                if must_exist:
                    raise not_found(path)
                _create_private_file(path)
            try:
                connection = sqlite3.connect(path, timeout=settings.sqlite_busy_timeout_ms / 1000)
                try:
                    mode = connection.execute("PRAGMA journal_mode=WAL").fetchone()[0]
                finally:
                    connection.close()
            except sqlite3.OperationalError as exc:
                if "unable to open" in str(exc) or "readonly" in str(exc):
                    # Its folder or its -wal and -shm, which SQLite makes beside it.
                    raise LedgerConfigurationError(
                        f"SQLite cannot open the ledger file {path} for writing ({exc}): check "
                        "the owner and mode of the file and its folder (ls -l), and run as a "
                        "user who may write both"
                    ) from exc
                raise LedgerUnavailable(f"ledger database {path} failed: {exc}") from exc
            except sqlite3.DatabaseError as exc:
                raise damaged_file(path, str(exc)) from exc
            if not kept:
                lock.write(_KEPT_MARKER + f" {path.name}\n".encode())
                lock.flush()
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    if str(mode).lower() != "wal":
        raise LedgerConfigurationError(
            f"SQLite refused WAL mode for {path} (it reports {mode!r}); the ledger needs it"
        )


def _refuse_foreign_file(path: Path, lock_path: Path) -> None:
    """Refuse a file that is not a SQLite database, before anything is written beside it.

    Where a ledger was kept (`kept_at`) it is one damaged, said under the lock (`damaged_file`).
    """
    try:
        # Non-blocking: a FIFO left at the path must not hang the command.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return
    except OSError as exc:
        if is_denied(exc):
            raise sqlite_denied(path, exc, doing="read") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise not_a_ledger(path, "not a regular file")
        header = os.pread(fd, len(SQLITE_HEADER), 0)
    finally:
        os.close(fd)
    if header and header != SQLITE_HEADER and not kept_at(lock_path):
        raise not_a_ledger(path, "not a SQLite database")


def kept_at(lock_path: Path) -> bool:
    """Whether the sidecar ``lock_path`` says a ledger was kept next to it (read, not locked)."""
    try:
        with open(lock_path, "rb") as lock:
            return lock.read(len(_KEPT_MARKER)) == _KEPT_MARKER
    except (FileNotFoundError, NotADirectoryError):
        return False


def lost_file(path: Path) -> LedgerLost:
    """The error for a ledger file found missing or empty where `kept_at` says one was kept."""
    lock_name = path.name + ".lock"
    return LedgerLost(
        f"the ledger file {path} is missing or empty, but {lock_name} shows that a ledger was "
        f"kept there: its operations are lost. Restore {path.name} from a backup, or delete "
        f"{lock_name} to start a new, empty ledger"
    )


def damaged_file(path: Path, why: str) -> LedgerLost:
    """The error for a ledger file that SQLite cannot read as a database."""
    return LedgerLost(
        f"{path} is not a usable SQLite database ({why}): restore it from a backup, or point "
        "the ledger at another file"
    )


def not_found(path: Path) -> LedgerNotFound:
    """The error for no ledger file at ``path`` (or no directory for it), naming the fix."""
    where = os.path.abspath(path)
    directory = os.path.dirname(where)
    why = "no such file" if os.path.isdir(directory) else f"no directory {directory}"
    return LedgerNotFound(
        f"no ledger at {where} ({why}): create one with "
        f"`pipecat-actions db upgrade --ledger sqlite:///{where}`",
        path=where,
    )


def _make_private_directory(directory: Path) -> None:
    """Create ``directory`` and its missing parents, each 0700; leave existing ones alone."""
    missing: list[Path] = []
    while not directory.exists() and directory != directory.parent:
        missing.append(directory)
        directory = directory.parent
    for each in reversed(missing):
        try:
            each.mkdir(mode=_PRIVATE_DIRECTORY, exist_ok=True)
        except OSError as exc:
            raise LedgerConfigurationError(
                f"cannot create the ledger directory {each}: {exc.strerror or exc}: check the "
                f"owner and mode of {each.parent} (ls -ld), or run as a user who may write there"
            ) from exc


def _create_private_file(path: Path) -> None:
    """Create ``path`` empty and 0600, for SQLite to make a database of (and its -wal, -shm)."""
    # Made meanwhile by a process that does not take the lock: it keeps the mode it has.
    with contextlib.suppress(FileExistsError):
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _PRIVATE_FILE))


class SqliteFile:
    """The identity of an open SQLite ledger file, checked before the ledger trusts it again.

    A connection keeps writing to a file that was deleted (or renamed over) under it, and a new
    connection to the path would open a fresh, empty one: either way, operations would be
    "recorded" where nobody will find them. `check` notices, once, says so in one log line, and
    from then on every call of the ledger fails with the same `LedgerLost`.

    Args:
        path: The ledger file, just opened (its device and inode are taken now).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        found = os.stat(path)
        self._identity = (found.st_dev, found.st_ino)
        self._lost: LedgerLost | None = None

    def check(self) -> None:
        """Raise `LedgerLost` if the file was deleted, replaced or emptied since it was opened."""
        if self._lost is not None:
            raise self._lost
        try:
            found = os.stat(self.path)
        except FileNotFoundError:
            why = "was deleted"
        else:
            if (found.st_dev, found.st_ino) != self._identity:
                why = "was replaced by another file"
            elif found.st_size == 0:
                why = "was emptied"
            else:
                return
        self._lost = LedgerLost(
            f"the ledger file {self.path} {why} while in use: nothing more is recorded and no "
            "operation is admitted. Restore it from a backup and restart"
        )
        logger.error("{}", self._lost)
        raise self._lost


def create_sqlite_writer_engine(url: URL, settings: LedgerSettings) -> Engine:
    """Create the synchronous engine of the SQLite writer thread (stdlib ``sqlite3``).

    It opens the same file with the same checked settings as the async engine.
    """
    engine = create_engine(url.set(drivername="sqlite+pysqlite"), poolclass=NullPool)
    allow_table_hints(engine)  # the heartbeat's UPDATE names its index (`SqliteLedger`)
    _install_sqlite_checks(engine, settings)
    return engine


def _install_sqlite_checks(engine: Engine, settings: LedgerSettings) -> None:
    want_sync = {"FULL": 2, "NORMAL": 1}[settings.sqlite_synchronous]

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Autocommit at the driver level: the ledger emits BEGIN IMMEDIATE itself for writes,
        # so a write transaction takes the lock up front instead of failing to upgrade later.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            checks = (
                (
                    "busy_timeout",
                    f"PRAGMA busy_timeout={int(settings.sqlite_busy_timeout_ms)}",
                    int(settings.sqlite_busy_timeout_ms),
                ),
                ("journal_mode", "PRAGMA journal_mode=WAL", "wal"),
                ("synchronous", f"PRAGMA synchronous={want_sync}", want_sync),
                ("foreign_keys", "PRAGMA foreign_keys=ON", 1),
            )
            for name, statement, expected in checks:
                cursor.execute(statement)
                cursor.execute(f"PRAGMA {name}")
                row = cursor.fetchone()
                found = row[0] if row else None
                if isinstance(found, str):
                    found = found.lower()
                if found != expected:
                    raise LedgerConfigurationError(
                        f"SQLite refused PRAGMA {name}={expected} (it reports {found!r}); "
                        "the ledger will not run without it"
                    )
        finally:
            cursor.close()
