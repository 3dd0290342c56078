"""Counters of work, not of time: what a stretch of code asked of asyncio and of the database.

Imported by ``bench/work.py`` as ``_counters`` (the scripts of this folder run with the folder on
their path) and by ``tests/bench``. Nothing here changes what the product does (but for SQLite's
automatic checkpoints, see `wal_bytes`), only what is recorded while it does it:

* `AsyncioCounter`: tasks created (a task factory on the loop, each task's coroutine name and
  the line of the product that created it), ``asyncio.shield`` calls, and thread hand-offs:
  ``loop.run_in_executor`` (loop to a thread) and ``loop.call_soon_threadsafe`` (a thread back
  to the loop: every reply of a thread, aiosqlite's included).
* `StatementCounter`: SQL statements. On SQLite every statement SQLite itself runs, on every
  ``sqlite3`` connection opened after `installed` (its trace callback: BEGIN and COMMIT
  included, one per row of an ``executemany``); it also keeps the ``(sql, parameters)`` that
  went through a connection's ``execute``, so that a floor can replay the same rows. On
  PostgreSQL the statements sent on asyncpg connections opened after `installed` (a subclass of
  ``asyncpg.Connection`` that records each as it is sent: the ledger's fast path, and
  SQLAlchemy's BEGIN/COMMIT) plus SQLAlchemy's own statements (``before_cursor_execute``: it
  runs them as prepared statements, which do not go through the connection's methods).
* `CallCounter`: Python function calls (``sys.setprofile``), by area of the code and by
  function: where the instructions of a call go, in a count that other processes leave alone.
* `wal_bytes`: the size of a SQLite ledger's ``-wal`` file; with every connection's automatic
  checkpoint off (`StatementCounter.installed` does that), it grows by exactly the frames
  written: ``(page size + 24)`` bytes each.
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import sys
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
from sqlalchemy import event
from sqlalchemy.engine import Engine

_HERE = os.path.abspath(__file__)
_ASYNCIO = os.path.dirname(asyncio.__file__)
_STDLIB = os.path.dirname(os.__file__)


def creation_site(skip: int = 2) -> str:
    """``path:line function`` of the first frame up the stack outside asyncio and this module."""
    frame = sys._getframe(skip)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(_ASYNCIO) and os.path.abspath(name) != _HERE:
            return f"{_short(name)}:{frame.f_lineno} {frame.f_code.co_name}"
        frame = frame.f_back  # type: ignore[assignment]
    return "?"


def _short(path: str) -> str:
    if path.startswith(_STDLIB) and "/site-packages/" not in path:
        return path[len(_STDLIB) :].lstrip("/")
    for marker in ("/site-packages/", "/pipecat_actions/", "/bench/"):
        if marker in path:
            head = "" if marker == "/site-packages/" else marker.strip("/") + "/"
            return head + path.split(marker, 1)[1]
    return path


def coroutine_name(coro: Any) -> str:
    """The qualified name of the coroutine a task runs (or its type's, for other awaitables)."""
    code = getattr(coro, "cr_code", None) or getattr(coro, "gi_code", None)
    if code is not None:
        return str(getattr(code, "co_qualname", code.co_name))
    return type(coro).__qualname__


@dataclass
class AsyncioCounter:
    """Tasks, shields and thread hand-offs made on one loop while it is `counting`."""

    tasks: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(coroutine name, creation site) -> tasks created."""
    shields: Counter[str] = field(default_factory=Counter)
    """creation site -> ``asyncio.shield`` calls."""
    executor: Counter[str] = field(default_factory=Counter)
    """site -> ``run_in_executor`` calls (a hand-off from the loop to a thread)."""
    threadsafe: Counter[str] = field(default_factory=Counter)
    """callback name -> ``call_soon_threadsafe`` calls (a hand-off from a thread to the loop)."""
    active: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def totals(self) -> dict[str, int]:
        """How many of each were counted."""
        return {
            "tasks": sum(self.tasks.values()),
            "shields": sum(self.shields.values()),
            "run_in_executor": sum(self.executor.values()),
            "call_soon_threadsafe": sum(self.threadsafe.values()),
        }

    def reset(self) -> None:
        """Forget what was counted."""
        for counter in (self.tasks, self.shields, self.executor, self.threadsafe):
            counter.clear()

    @contextmanager
    def installed(self, loop: asyncio.AbstractEventLoop) -> Iterator[AsyncioCounter]:
        """Wrap ``loop`` and ``asyncio.shield`` for as long as the block runs (counting off)."""
        previous_factory = loop.get_task_factory()
        original_shield = asyncio.shield
        run_in_executor = loop.run_in_executor
        call_soon_threadsafe = loop.call_soon_threadsafe

        def factory(loop: asyncio.AbstractEventLoop, coro: Any, **kwargs: Any) -> Any:
            if self.active:
                self.tasks[coroutine_name(coro), creation_site()] += 1
            if previous_factory is not None:
                return previous_factory(loop, coro, **kwargs)
            return asyncio.Task(coro, loop=loop, **kwargs)

        def shield(arg: Any) -> Any:
            if self.active:
                self.shields[creation_site()] += 1
            return original_shield(arg)

        def counted_executor(executor: Any, func: Callable[..., Any], *args: Any) -> Any:
            if self.active:
                self.executor[creation_site()] += 1
            return run_in_executor(executor, func, *args)

        def counted_threadsafe(callback: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
            if self.active:
                name = getattr(callback, "__qualname__", type(callback).__qualname__)
                with self._lock:  # called from other threads
                    self.threadsafe[str(name)] += 1
            return call_soon_threadsafe(callback, *args, **kwargs)

        loop.set_task_factory(factory)
        asyncio.shield = shield  # type: ignore[assignment]
        asyncio.tasks.shield = shield  # type: ignore[assignment]
        loop.run_in_executor = counted_executor  # type: ignore[method-assign]
        loop.call_soon_threadsafe = counted_threadsafe  # type: ignore[method-assign]
        try:
            yield self
        finally:
            loop.set_task_factory(previous_factory)
            asyncio.shield = original_shield
            asyncio.tasks.shield = original_shield
            del loop.run_in_executor
            del loop.call_soon_threadsafe

    @contextmanager
    def counting(self) -> Iterator[None]:
        """Count what is created while the block runs."""
        self.active = True
        try:
            yield
        finally:
            self.active = False


class _TracedConnection(sqlite3.Connection):
    """A ``sqlite3`` connection that hands what its own ``execute`` runs to a counter."""

    counter: StatementCounter | None = None

    def execute(self, sql: str, parameters: Any = (), /) -> sqlite3.Cursor:  # type: ignore[override]
        counter = self.counter
        if counter is not None and counter.active:
            counter.executed.append((sql, tuple(parameters)))
        return super().execute(sql, parameters)


@dataclass
class StatementCounter:
    """SQL statements run while `active` (see the module), by their first words."""

    statements: Counter[str] = field(default_factory=Counter)
    executed: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)
    """SQLite: ``(sql, parameters)`` of each ``Connection.execute`` (not ``executemany``)."""
    sent: list[tuple[str, tuple[Any, ...]]] = field(default_factory=list)
    """PostgreSQL: ``(sql, parameters)`` of each statement sent on an asyncpg connection."""
    active: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def total(self) -> int:
        """How many statements were counted."""
        return sum(self.statements.values())

    def reset(self) -> None:
        """Forget what was counted."""
        self.statements.clear()
        self.executed.clear()
        self.sent.clear()

    @contextmanager
    def counting(self) -> Iterator[None]:
        """Count the statements run while the block runs."""
        self.active = True
        try:
            yield
        finally:
            self.active = False

    def _sent(self, sql: str, args: tuple[Any, ...]) -> None:
        if self.active:
            self.sent.append((sql, args))
            self._count(sql)

    def _count(self, sql: str) -> None:
        if self.active:
            with self._lock:  # SQLite's writer thread and aiosqlite's threads count too
                self.statements[statement_label(sql)] += 1

    @contextmanager
    def installed(self, *, autocheckpoint: bool = False) -> Iterator[StatementCounter]:
        """Trace every ``sqlite3`` and asyncpg connection opened while the block runs.

        Args:
            autocheckpoint: Leave SQLite's automatic checkpoints on (else they are turned off
                on each connection, so that the ``-wal`` file's growth counts the frames).
        """
        sqlite_connect = sqlite3.connect
        asyncpg_connect = asyncpg.connect
        counter = self

        class Traced(_TracedConnection):
            pass

        Traced.counter = counter

        def traced_sqlite(*args: Any, **kwargs: Any) -> sqlite3.Connection:
            kwargs.setdefault("factory", Traced)
            conn = sqlite_connect(*args, **kwargs)
            conn.set_trace_callback(counter._count)
            if not autocheckpoint:
                # Frames are only ever appended, so the -wal file's growth counts them.
                conn.execute("PRAGMA wal_autocheckpoint=0")
            return conn

        class TracedAsyncpg:
            # Recorded as each statement is sent (asyncpg's own query logger answers a loop
            # iteration later, past the end of the call that sent it). Mixed into the
            # connection class the caller asks for (the ledger's own `LedgerConnection`).
            async def execute(self, query: str, *args: Any, timeout: Any = None) -> Any:
                if not args:  # with arguments, `execute` goes through `_execute`
                    counter._sent(query, ())
                return await super().execute(query, *args, timeout=timeout)  # type: ignore[misc]

            async def _execute(self, query: str, args: Any, *rest: Any, **kwargs: Any) -> Any:
                counter._sent(query, tuple(args))
                return await super()._execute(query, args, *rest, **kwargs)  # type: ignore[misc]

            async def _executemany(self, query: str, args: Any, *rest: Any, **kw: Any) -> Any:
                counter._sent(query, ())
                return await super()._executemany(query, args, *rest, **kw)  # type: ignore[misc]

        traced_classes: dict[type, type] = {}

        async def traced_asyncpg(*args: Any, **kwargs: Any) -> Any:
            base = kwargs.get("connection_class", asyncpg.Connection)
            if base not in traced_classes:
                traced_classes[base] = type(f"Traced{base.__name__}", (TracedAsyncpg, base), {})
            kwargs["connection_class"] = traced_classes[base]
            return await asyncpg_connect(*args, **kwargs)

        def before_cursor_execute(
            conn: Any, cursor: Any, statement: str, params: Any, context: Any, many: bool
        ) -> None:
            # On asyncpg, SQLAlchemy's statements are prepared ones that the connection's methods
            # do not see (its executemany they do); on SQLite the trace callback sees them all.
            if conn.dialect.name == "postgresql" and not many:
                counter._count(statement)

        # SQLAlchemy's pysqlite dialect opens connections through ``sqlite3.dbapi2``.
        sqlite3.connect = sqlite3.dbapi2.connect = traced_sqlite  # type: ignore[assignment]
        asyncpg.connect = traced_asyncpg
        event.listen(Engine, "before_cursor_execute", before_cursor_execute)
        try:
            yield self
        finally:
            sqlite3.connect = sqlite3.dbapi2.connect = sqlite_connect
            asyncpg.connect = asyncpg_connect
            event.remove(Engine, "before_cursor_execute", before_cursor_execute)


def statement_label(sql: str) -> str:
    """A statement's kind and table: ``INSERT pa_operation_events``, ``COMMIT``, ``WITH ...``."""
    words = sql.split()
    if not words:
        return "(empty)"
    head = words[0].upper()
    if head == "INSERT" and len(words) > 2:
        return f"INSERT {words[2]}"
    if head == "UPDATE" and len(words) > 1:
        return f"UPDATE {words[1]}"
    if head == "SELECT" and "FROM" in (w.upper() for w in words):
        table = words[[w.upper() for w in words].index("FROM") + 1]
        return f"SELECT ... FROM {table}"
    if head == "WITH":
        # The fast path's one-statement writes: name what its first CTE does.
        verbs = [i for i, word in enumerate(words) if word.upper() in ("INSERT", "UPDATE")]
        if verbs:
            at = verbs[0]
            verb = words[at].upper()
            table = words[at + 2] if verb == "INSERT" else words[at + 1]
            return f"WITH {verb} {table} (+ events)"
    return " ".join(words[:2]).upper() if head in ("BEGIN", "PRAGMA") else head


@dataclass
class CallCounter:
    """Python function calls made in this thread while `counting` (``sys.setprofile``).

    A count of work that no other process's load changes: where a call's instructions go,
    by the code that ran (the interpreter's own C functions are counted in total only).
    """

    calls: Counter[tuple[str, str]] = field(default_factory=Counter)
    """(file, function) -> Python calls."""
    c_calls: int = 0

    @contextmanager
    def counting(self) -> Iterator[None]:
        """Count the calls made while the block runs."""
        calls = self.calls

        def profile(frame: Any, event: str, arg: Any) -> None:
            if event == "call":
                calls[frame.f_code.co_filename, frame.f_code.co_name] += 1
            elif event == "c_call":
                self.c_calls += 1

        sys.setprofile(profile)
        try:
            yield
        finally:
            sys.setprofile(None)

    def by_area(self) -> Counter[str]:
        """Python calls by area: a package of ours, or a library, or the standard library."""
        areas: Counter[str] = Counter()
        for (file, _), n in self.calls.items():
            areas[area(file)] += n
        return areas

    def top(self, n: int) -> list[tuple[str, int]]:
        """The ``n`` functions called most, as ``area: function``."""
        named: Counter[str] = Counter()
        for (file, function), count in self.calls.items():
            named[f"{_short(file)} {function}"] += count
        return named.most_common(n)


def area(file: str) -> str:
    """``pipecat_actions/<part>``, a library's name, ``asyncio`` or ``stdlib``."""
    short = _short(file)
    if short.startswith("pipecat_actions/"):
        parts = short.split("/")
        return "/".join(parts[:2]) if len(parts) > 2 else short
    if "/site-packages/" in file:
        return short.split("/")[0]
    if file.startswith(_ASYNCIO):
        return "asyncio"
    return "bench" if short.startswith("bench/") else "stdlib (other)"


def wal_bytes(database: Path) -> int:
    """The size of ``database``'s ``-wal`` file (0 when there is none)."""
    try:
        return os.stat(f"{database}-wal").st_size
    except FileNotFoundError:
        return 0


def page_size(database: Path) -> int:
    """``database``'s page size, read from its header (bytes 16-17, big-endian; 1 means 65536)."""
    with open(database, "rb") as file:
        header = file.read(18)
    size = int.from_bytes(header[16:18], "big")
    return 65_536 if size == 1 else size


def wal_commits(database: Path, start: int, end: int) -> list[list[str]]:
    """The commits in ``database``'s ``-wal`` file between byte offsets ``start`` and ``end``:
    for each, the table or index (B-tree) that owns each page it wrote, in the order written.

    A frame is a 24-byte header (its page number first, big-endian; then, on a commit's last
    frame, the database's size in pages, 0 on the others) and a page; the owner of a page is
    read from SQLite's ``dbstat`` table after the writes (a page freed meanwhile shows as
    ``page N``). Page 1 (the header, written when the file grows) is ``sqlite_schema``'s.
    Each B-tree a commit changes is at least one page, however little of it changed: the
    frames a write costs are, first, the number of B-trees it touches.
    """
    size = page_size(database) + 24
    with open(f"{database}-wal", "rb") as file:
        file.seek(start)
        frames = file.read(end - start)
    conn = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
    try:
        owner = {page: name for name, page in conn.execute("SELECT name, pageno FROM dbstat")}
    finally:
        conn.close()
    commits: list[list[str]] = []
    current: list[str] = []
    for at in range(0, len(frames) - size + 1, size):
        page = int.from_bytes(frames[at : at + 4], "big")
        current.append(owner.get(page, f"page {page}"))
        if int.from_bytes(frames[at + 4 : at + 8], "big"):  # a commit's last frame
            commits.append(current)
            current = []
    return commits
