"""`SqliteLedger`: the SQL ledger on a SQLite file, the default.

Every write runs in the ledger's writer thread on the one write connection, in group commits
(`_writer.SqliteWriter`); the hot path's statements (a new operation, a transition, an
annotation) go to the driver's own cursor (`_sqlite`). aiosqlite through SQLAlchemy costs
three to four thread hand-offs per statement, so a transaction run as one hand-off is what
keeps a write near the raw aiosqlite insert+commit. Reads use the async engine. Waiters of
other processes hear a settling write through the file notices (`_notices.SqliteNotices`),
sent once it committed.

Opened ``read_only``, a SQLite ledger has no writer: its file is read through a
`SqliteReader`, which writes nothing to disk (see `_reader`).
"""

from __future__ import annotations

import builtins

__all__ = ["SqliteLedger"]

import asyncio
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, TypeVar

from loguru import logger
from sqlalchemy import Connection, Engine, Select, Update, select, update
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from pipecat_actions.clock import Clock
from pipecat_actions.errors import LedgerError, LedgerUnavailable
from pipecat_actions.ledger import _owners, _sqlite
from pipecat_actions.ledger._life import Life, SqliteLife
from pipecat_actions.ledger._notices import SqliteNotices
from pipecat_actions.ledger._reader import SqliteReader, create_reader_engine, open_reader
from pipecat_actions.ledger._rows import EncodedOperation, creation_events, new_row
from pipecat_actions.ledger._rows import operation_from_row as _operation
from pipecat_actions.ledger._writer import (
    SqliteWriter,
    Work,
    as_ledger_error,
    guard_database_errors,
)
from pipecat_actions.ledger.engine import (
    LedgerSettings,
    SqliteFile,
    create_engine_for,
    create_sqlite_writer_engine,
    prepare_sqlite_file,
    redact_url,
)
from pipecat_actions.ledger.records import Operation, OperationFilter
from pipecat_actions.ledger.schema import operations
from pipecat_actions.ledger.sql import Change, SqlLedger, refusal
from pipecat_actions.status import ActionStatus

T = TypeVar("T")
_BY_STATUS = "ix_pa_operations_status_lease"
"""The status's index (a page of a status and a tool, say: `SqlLedger._status_first_page`)."""


class SqliteLedger(SqlLedger):
    """`SqlLedger` on a SQLite file: see the module docstring. Opened by `SqlLedger.create`."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        url: str,
        clock: Clock,
        settings: LedgerSettings,
        sqlite_writer: Engine | None,
        sqlite_file: SqliteFile | None,
        notices: SqliteNotices | None = None,
        life: Life | None = None,
        sqlite_reader: SqliteReader | None = None,
    ) -> None:
        super().__init__(
            engine,
            url=url,
            clock=clock,
            settings=settings,
            sqlite=True,
            read_turns=settings.pool_size,
            notices=notices,
            life=life,
            read_only=sqlite_reader is not None,
        )
        self._sqlite_writer = sqlite_writer
        self._reader = sqlite_reader
        self._file = sqlite_file
        self._announce = notices.send if notices is not None else None
        """Sends the ledger's notices once a settling write committed."""
        self._writer = (
            None
            if sqlite_writer is None
            else SqliteWriter(
                sqlite_writer, url=url, check_file=sqlite_file.check if sqlite_file else _no_check
            )
        )

    # --- construction ----------------------------------------------------------------------

    @classmethod
    async def _open_at(
        cls,
        parsed: URL,
        *,
        clock: Clock,
        settings: LedgerSettings,
        create_schema: bool,
        check_schema: bool,
        must_exist: bool,
        read_only: bool,
    ) -> SqliteLedger:
        if must_exist:
            # Read first: what is not a ledger is refused before a byte is written beside it.
            reading = await cls._open_reader(
                parsed, clock=clock, settings=settings, check_schema=check_schema
            )
            if read_only:
                return reading
            await reading.close()
        engine = create_engine_for(parsed, settings)
        try:
            await guard_database_errors(
                asyncio.to_thread(prepare_sqlite_file, parsed, settings, must_exist=must_exist),
                url=redact_url(parsed),
            )
        except BaseException:
            await engine.dispose()
            raise
        path = Path(parsed.database or "")
        ledger = cls(
            engine,
            url=redact_url(parsed),
            clock=clock,
            settings=settings,
            sqlite_writer=create_sqlite_writer_engine(parsed, settings),
            sqlite_file=SqliteFile(path),
            notices=SqliteNotices(path, url=redact_url(parsed)),
            life=SqliteLife(path),
        )
        await ledger._started(create_schema=create_schema, check_schema=check_schema)
        return ledger

    @classmethod
    async def _open_reader(
        cls, parsed: URL, *, clock: Clock, settings: LedgerSettings, check_schema: bool
    ) -> SqliteLedger:
        path = Path(parsed.database or "")
        url = redact_url(parsed)
        reader = await guard_database_errors(
            asyncio.to_thread(open_reader, path, settings), url=url
        )
        try:
            # An empty file is read as an empty database; SqliteFile would call it emptied.
            sqlite_file = None if reader.empty else SqliteFile(path)
        except BaseException:
            reader.close()
            raise
        ledger = cls(
            create_reader_engine(reader, settings),
            url=url,
            clock=clock,
            settings=settings,
            sqlite_writer=None,
            sqlite_file=sqlite_file,
            sqlite_reader=reader,
        )
        await ledger._started(create_schema=False, check_schema=check_schema)
        return ledger

    async def _start(self) -> None:
        if self._writer is not None:
            await self._writer.start()

    async def _drain(self) -> None:
        if self._writer is not None:
            await self._writer.close()

    async def _release_own(self) -> None:
        if self._reader is not None:
            self._reader.close()

    # --- the write and read paths ----------------------------------------------------------

    async def _commit(self, work: Work[T]) -> T:
        assert self._writer is not None  # a ledger without one is read-only: refused before
        return await self._writer.run(work)

    async def _read(self, work: Work[T]) -> T:
        if self._closed:
            raise LedgerUnavailable("the ledger is closed")
        if self._file is not None:
            self._file.check()  # a new connection to a deleted file's path would open a new one
        reader = self._reader
        if reader is None or not reader.alone():
            return await guard_database_errors(self._on_engine(work), url=self.url)
        # An immutable read (see `_reader`) is trusted only if no writer had the file
        # meanwhile; a writer's checkpoint under it could also be why it failed.
        try:
            result = await self._on_engine(work)
        except Exception as exc:
            if reader.alone():
                mapped = as_ledger_error(exc, url=self.url)
                if mapped is exc:
                    raise
                raise mapped from exc
        else:
            if reader.alone():
                return result
        logger.debug("ledger {}: a writer opened it during a read, read again", self.url)
        return await guard_database_errors(self._on_engine(work), url=self.url)

    # --- the hooks of the verbs ------------------------------------------------------------

    def _insert_new(
        self, conn: Connection, row: dict[str, Any], creation: builtins.list[dict[str, Any]]
    ) -> bool:
        return _sqlite.insert(conn, row, creation, bind_key=True)

    async def _insert_unbound(self, encoded: EncodedOperation) -> Operation:
        def work(conn: Connection) -> Operation:
            now = self._clock.now()
            row = new_row(encoded, now, key_slot=None)
            _sqlite.insert(conn, row, creation_events(encoded, now), bind_key=False)
            return _operation(row)

        return await self._write(work)

    async def _apply(
        self,
        operation_id: str,
        change: Change,
        *,
        expected: ActionStatus | None,
        fence: int | None,
        notify: bool,
    ) -> Operation:
        def work(conn: Connection) -> Operation:
            updated = _sqlite.update(conn, change(self._clock.now()))
            if updated is None:
                raise _refusal(conn, operation_id, expected=expected, fence=fence)
            return _operation(updated)

        written = await self._write(work)
        if notify and self._announce is not None:
            self._announce(operation_id)
        return written

    async def _gone_among(self, life: Life, holders: builtins.list[str]) -> Collection[str]:
        registered = await self._read(lambda conn: _owners.registered(conn, holders))
        return await life.gone(registered)

    def _status_first_page(
        self, page: Select[Any], f: OperationFilter, where: builtins.list[Any]
    ) -> Select[Any]:
        # SQLite is told the index.
        return page.with_hint(operations, f"INDEXED BY {_BY_STATUS}", "sqlite")

    def _renewal(self, own: builtins.list[Any]) -> Update:
        # SQLite is told the index: from ANALYZE's averages (rows per status, over a table
        # mostly settled) eight open statuses look like most of the table, and it would read
        # every row. Its UPDATE takes no index hint; the subquery does.
        rows = (
            select(operations.c.operation_id)
            .with_hint(operations, f"INDEXED BY {_BY_STATUS}", "sqlite")
            .where(*own)
        )
        return update(operations).where(operations.c.operation_id.in_(rows))

    def _in_snapshot(self, conn: Connection, read: Callable[[], T]) -> T:
        conn.exec_driver_sql("BEGIN")  # deferred: the snapshot of its first read (WAL)
        try:
            return read()
        finally:
            conn.exec_driver_sql("ROLLBACK")


def _refusal(
    conn: Connection, operation_id: str, *, expected: ActionStatus | None, fence: int | None
) -> LedgerError:
    """Why an update in ``conn``'s transaction matched no row."""
    found = conn.execute(
        select(operations.c.status, operations.c.fence).where(
            operations.c.operation_id == operation_id
        )
    ).first()
    return refusal(
        None if found is None else found._mapping, operation_id, expected=expected, fence=fence
    )


def _no_check() -> None:
    return None
