"""The SQL ledger, for SQLite (the default) and PostgreSQL, on SQLAlchemy Core (no ORM).

Each public method builds a work function (``_writer.Work``) and hands it to the write path of
its backend (`_writer`); reads run on the async engine (aiosqlite or asyncpg). The calls on a
tool call's critical path skip SQLAlchemy's execution: on PostgreSQL (admit, transition,
annotate, get, find_by_key) they run as one statement each on asyncpg (`_postgres`); on SQLite
the writes run their SQL on the writer's own ``sqlite3`` cursor (`_sqlite`). Several processes
may share one database: on SQLite they take turns on the file lock (``busy_timeout``), on
PostgreSQL row locks and ``FOR UPDATE SKIP LOCKED`` keep them apart.
"""

from __future__ import annotations

import builtins

__all__ = ["CHANGEABLE_FIELDS", "SqlLedger"]

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Collection, Coroutine, Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from loguru import logger
from sqlalchemy import (
    Connection,
    Engine,
    Select,
    bindparam,
    func,
    insert,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from pipecat_actions.clock import Clock, SystemClock
from pipecat_actions.errors import (
    IdempotencyMismatch,
    LedgerConfigurationError,
    LedgerError,
    LedgerUnavailable,
    OperationNotFound,
    SchemaVersionMismatch,
    StaleFence,
    UnexpectedStatus,
)
from pipecat_actions.ledger import _owners, _sqlite, migrate
from pipecat_actions.ledger._filters import filter_conditions
from pipecat_actions.ledger._life import Life, PostgresLife, SqliteLife
from pipecat_actions.ledger._notices import Notices, PostgresNotices, SqliteNotices
from pipecat_actions.ledger._opening import other_tables, postgres_unreachable
from pipecat_actions.ledger._reader import SqliteReader, create_reader_engine, open_reader
from pipecat_actions.ledger._rows import (
    ADMIT_STATUSES,
    CHANGEABLE_FIELDS,
    NON_TERMINAL,
    Audit,
    EncodedOperation,
    RowUpdate,
    column_changes,
    creation_events,
    encode_detail,
    new_row,
    operation_from_row,
    to_event,
    to_operation,
)
from pipecat_actions.ledger._statistics import read_statistics
from pipecat_actions.ledger._trail import TrailMarks
from pipecat_actions.ledger._writer import (
    SqliteWriter,
    Work,
    as_ledger_error,
    guard_database_errors,
    run_postgres_write,
)
from pipecat_actions.ledger.base import Ledger
from pipecat_actions.ledger.engine import (
    LedgerSettings,
    SqliteFile,
    create_engine_for,
    create_sqlite_writer_engine,
    default_ledger_url,
    normalize_url,
    prepare_sqlite_file,
    redact_url,
)
from pipecat_actions.ledger.records import (
    AdmitResult,
    EventKind,
    NewOperation,
    Operation,
    OperationEvent,
    OperationFilter,
    canonical_json,
)
from pipecat_actions.ledger.schema import events, operations
from pipecat_actions.status import (
    IN_FLIGHT_STATUSES,
    REPEATABLE_STATUSES,
    TERMINAL_STATUSES,
    ActionStatus,
    check_transition,
)

if TYPE_CHECKING:
    from pipecat_actions.ledger._postgres import PostgresFastPath

T = TypeVar("T")
_ADMIT_RETRIES = 5
_STATUS_FIRST_UP_TO = 25_000
"""The most rows a page reads by their status's index, then sorts (see `_status_first`)."""
_BY_STATUS = "ix_pa_operations_status_lease"
"""The status's index on SQLite (a page of a status and a tool, say: `_status_first`)."""


class SqlLedger(Ledger):
    """`Ledger` on SQLite or PostgreSQL through SQLAlchemy.

    Create it with `SqlLedger.create`; close it with `close` (or ``async with``).

    On PostgreSQL the hot path (admit with a free key, transition, annotate, get, find_by_key)
    is one statement each on asyncpg connections of the ledger's own (`_postgres`); every other
    write is a plain function of a SQLAlchemy `Connection`, run on the async engine through
    ``run_sync`` in a transaction of its own. On SQLite every write runs in the ledger's writer
    thread on the one write connection, in group commits; the hot path's statements go to the
    driver's own cursor (`_sqlite`). Measured on this machine, aiosqlite through SQLAlchemy costs
    three to four thread hand-offs per statement (~0.12 ms each), so a transaction run as one
    hand-off is what keeps a write near the raw aiosqlite insert+commit. Other reads use the
    async engine. Waiters hear other processes' outcomes through `notices`.

    Opened ``read_only``, a SQLite ledger has no writer: its file is read through a
    `SqliteReader`, which writes nothing to disk (see `_reader`).
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        url: str,
        clock: Clock,
        settings: LedgerSettings,
        sqlite_writer: Engine | None,
        sqlite_file: SqliteFile | None = None,
        postgres: PostgresFastPath | None = None,
        notices: Notices | None = None,
        sqlite_reader: SqliteReader | None = None,
        read_only: bool = False,
        life: Life | None = None,
    ) -> None:
        self._engine = engine
        self._life = life
        self.url = url
        self._clock = clock
        self._settings = settings
        self._sqlite_writer = sqlite_writer
        self._reader = sqlite_reader
        self._read_only = read_only or sqlite_reader is not None
        self._sqlite = sqlite_writer is not None or sqlite_reader is not None
        # Each dialect's module is imported for its own ledgers only (the PostgreSQL one brings
        # every PostgreSQL driver's module: a SQLite ledger's command starts without them).
        if self._sqlite:
            from sqlalchemy.dialects.sqlite import insert as sqlite_insert

            self._insert_operation: Any = sqlite_insert(operations).on_conflict_do_nothing(
                index_elements=["tenant", "key_slot"]
            )
        else:
            from sqlalchemy.dialects.postgresql import insert as postgresql_insert

            self._insert_operation = postgresql_insert(operations).on_conflict_do_nothing(
                index_elements=["tenant", "key_slot"]
            )
        self._insert_operation = self._insert_operation.returning(operations.c.operation_id)
        self._insert_events = insert(events)
        self._select_slot = select(operations).where(
            operations.c.tenant == bindparam("tenant"),
            operations.c.key_slot == bindparam("key_slot"),
        )
        self._file = sqlite_file
        self._fast = postgres
        self._notices = notices
        self._announce = notices.send if isinstance(notices, SqliteNotices) else None
        """Sends a SQLite ledger's notices once a settling write committed (PostgreSQL's
        writes send their own)."""
        self._writer = (
            None
            if sqlite_writer is None
            else SqliteWriter(
                sqlite_writer, url=url, check_file=sqlite_file.check if sqlite_file else _no_check
            )
        )
        # At most pool_size calls on the database at once, and on PostgreSQL at most half of
        # them reads (DBOS caps its polling reads the same way): a burst of callers waits its
        # turn here, in order, instead of timing out on the connection pool.
        self._turns = asyncio.Semaphore(settings.pool_size)
        self._read_turns = asyncio.Semaphore(
            settings.pool_size if self._sqlite else max(1, settings.pool_size // 2)
        )
        self._closed = False
        self._in_flight: set[asyncio.Future[Any]] = set()
        """PostgreSQL writes handed to the database and not yet answered (`_handed_over`)."""

    # --- construction ----------------------------------------------------------------------

    @classmethod
    async def create(
        cls,
        url: str | None = None,
        *,
        clock: Clock | None = None,
        settings: LedgerSettings | None = None,
        create_schema: bool = True,
        check_schema: bool = True,
        must_exist: bool = False,
        read_only: bool = False,
    ) -> SqlLedger:
        """Open the ledger at ``url`` and check its schema version.

        Args:
            url: ``sqlite:///PATH`` (or the path itself) or ``postgresql://...``; default
                `default_ledger_url`.
            clock: Source of every timestamp; default the system clock.
            settings: Durability and pool settings.
            create_schema: Create the tables in an empty database. A database at another
                schema version is always refused, never changed here.
            check_schema: Refuse a database whose schema is not this code's. Only the
                ``db`` commands turn this off, to look at or upgrade such a database.
            must_exist: Open an existing ledger only: a SQLite file that is not there (or
                whose directory is not), or that is not a ledger (a directory, not a SQLite
                database, a database with other tables only) is `LedgerNotFound`, and an
                empty database is never given the schema (``create_schema`` is not applied).
                A SQLite file is proved a ledger (at this code's schema, with
                ``check_schema``) by reading it as ``read_only`` does, before anything is
                written to it or beside it.
            read_only: Read, never write (implies ``must_exist``), as the operator's read
                commands do: on SQLite nothing on disk changes, neither the file nor its
                folder (no ``.lock``, no WAL switch, no ``-wal`` or ``-shm`` of its own:
                see `_reader`). Every write raises `LedgerConfigurationError`.

        Raises:
            LedgerNotFound: ``must_exist`` and no SQLite ledger is there.
            LedgerConfigurationError: Bad URL or unsafe durability settings.
            SchemaVersionMismatch: The schema is older or newer than this code.
            LedgerUnavailable: The database cannot be reached.
        """
        parsed = normalize_url(url or default_ledger_url())
        settings = settings or LedgerSettings()
        is_sqlite = parsed.get_backend_name() == "sqlite"
        must_exist = must_exist or read_only
        create_schema = create_schema and not must_exist

        if is_sqlite and must_exist:
            # Read first: what is not a ledger is refused before a byte is written beside it.
            reading = await cls._open_sqlite_reader(
                parsed, clock=clock, settings=settings, check_schema=check_schema
            )
            if read_only:
                return reading
            await reading.close()
        engine = create_engine_for(parsed, settings)
        if is_sqlite:
            try:
                await guard_database_errors(
                    asyncio.to_thread(prepare_sqlite_file, parsed, settings, must_exist=must_exist),
                    url=redact_url(parsed),
                )
            except BaseException:
                await engine.dispose()
                raise
        fast: PostgresFastPath | None = None
        notices: Notices | None = None
        if is_sqlite:
            notices = SqliteNotices(Path(parsed.database or ""), url=redact_url(parsed))
        else:
            # Imported for PostgreSQL ledgers only: a SQLite ledger's process never loads asyncpg.
            from pipecat_actions.ledger._postgres import PostgresFastPath, asyncpg_dsn

            dsn = asyncpg_dsn(parsed)
            fast = PostgresFastPath(
                dsn=dsn,
                url=redact_url(parsed),
                max_idle=settings.pool_size,
                connect_timeout=settings.connect_timeout_secs,
                check_durability=not settings.allow_unsafe_postgres,
            )
            notices = PostgresNotices(dsn=dsn, url=redact_url(parsed))
        life: Life | None = None
        if not read_only:
            life = (
                SqliteLife(Path(parsed.database or ""))
                if is_sqlite
                else PostgresLife(
                    dsn=asyncpg_dsn(parsed),
                    url=redact_url(parsed),
                    connect_timeout=settings.connect_timeout_secs,
                )
            )
        ledger = cls(
            engine,
            url=redact_url(parsed),
            clock=clock or SystemClock(),
            settings=settings,
            sqlite_writer=create_sqlite_writer_engine(parsed, settings) if is_sqlite else None,
            sqlite_file=SqliteFile(Path(parsed.database or "")) if is_sqlite else None,
            postgres=fast,
            notices=notices,
            read_only=read_only,
            life=life,
        )
        try:
            await ledger._open(create_schema=create_schema, check_schema=check_schema)
        except BaseException as exc:
            await ledger.close()
            cause = exc.__cause__
            if isinstance(exc, LedgerUnavailable) and not is_sqlite and cause is not None:
                said = postgres_unreachable(
                    cause, parsed, timeout_secs=settings.connect_timeout_secs
                )
                if said is not None:
                    raise said from cause
            raise
        return ledger

    @classmethod
    async def _open_sqlite_reader(
        cls, parsed: URL, *, clock: Clock | None, settings: LedgerSettings, check_schema: bool
    ) -> SqlLedger:
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
            clock=clock or SystemClock(),
            settings=settings,
            sqlite_writer=None,
            sqlite_file=sqlite_file,
            sqlite_reader=reader,
        )
        try:
            await ledger._open(create_schema=False, check_schema=check_schema)
        except BaseException:
            await ledger.close()
            raise
        return ledger

    async def _open(self, *, create_schema: bool, check_schema: bool) -> None:
        if self._sqlite_writer is not None:
            assert self._writer is not None
            await self._writer.start()
        if self._fast is not None:
            await self._fast.open()
        if self._read_only:
            state = await self._read(self._read_schema_work(check_schema))
            logger.debug("ledger {} (read-only) at schema {}", self.url, state.current)
        elif check_schema:
            state = await self._write(self._check_schema_work(create_schema))
            logger.debug("ledger {} at schema {}", self.url, state.current)

    def _read_schema_work(self, check_schema: bool) -> Work[migrate.SchemaState]:
        """Read the schema's state, refusing what a reader cannot use.

        A SQLite file with tables but none of the ledger's is not a ledger; with
        ``check_schema``, a database at another revision is refused.
        """

        def work(conn: Connection) -> migrate.SchemaState:
            state = migrate.read_schema_state(conn)
            if state.empty and state.other_tables:
                raise self._not_a_ledger(state)
            if check_schema and not state.up_to_date:
                raise self._schema_error(state)
            return state

        return work

    def _check_schema_work(self, create_schema: bool) -> Work[migrate.SchemaState]:
        def work(conn: Connection) -> migrate.SchemaState:
            if not self._sqlite:
                # Serialises the migrations of several processes that start at once.
                conn.exec_driver_sql("SELECT pg_advisory_xact_lock(7243510931)")
            state = migrate.read_schema_state(conn)
            if state.up_to_date:
                return state
            if state.empty and create_schema:
                # A database the application shares (PostgreSQL, often) gets the ledger's
                # tables beside its own: the application asked for this ledger there.
                migrate.upgrade_connection(conn)
                return migrate.read_schema_state(conn)
            if state.empty and state.other_tables:
                raise self._not_a_ledger(state)
            raise self._schema_error(state)

        return work

    def _not_a_ledger(self, state: migrate.SchemaState) -> LedgerError:
        """The refusal of a database with tables, none of them the ledger's: someone else's.

        Said without a hint to create the ledger there (`db upgrade` would, beside them).
        """
        if self._sqlite:
            where = self.url.partition(":///")[2]  # the file's path
        else:
            scheme, _, rest = self.url.partition("://")
            where = f"{scheme.partition('+')[0]}://{rest}"
        return other_tables(where, state.other_tables, sqlite=self._sqlite)

    def _schema_error(self, state: migrate.SchemaState) -> SchemaVersionMismatch:
        # The command as a person types it: without the async driver, and saying where the
        # hidden password goes rather than printing *** as if it were one.
        scheme, _, rest = self.url.partition("://")
        command = f"run `pipecat-actions db upgrade --ledger {scheme.partition('+')[0]}://{rest}`"
        if ":***@" in rest:
            command += " (its password in place of ***)"
        if state.empty:
            hint = f"{command} to create it"
        elif not state.known:
            hint = "it was written by a newer pipecat_actions: upgrade the package"
        else:
            hint = command
        return SchemaVersionMismatch(
            url=self.url, found=state.current, expected=state.head, hint=hint
        )

    async def schema_state(self) -> migrate.SchemaState:
        """Return where the database's schema stands against this code's."""
        return await self._read(migrate.read_schema_state)

    async def upgrade_schema(self) -> tuple[str | None, str]:
        """Bring the schema to this code's revision; return (revision before, revision after)."""

        def work(conn: Connection) -> tuple[str | None, str]:
            if not self._sqlite:
                conn.exec_driver_sql("SELECT pg_advisory_xact_lock(7243510931)")
            before = migrate.read_schema_state(conn)
            if not before.known:
                raise self._schema_error(before)
            if not before.up_to_date:
                migrate.upgrade_connection(conn)
            return before.current, migrate.read_schema_state(conn).head

        return await self._write(work)

    async def close(self) -> None:
        """Finish the writes already handed to the database, then release every connection."""
        if self._closed:
            return
        self._closed = True
        if self._in_flight:
            # Handed over before the close: each lands (or fails, and is reported) first.
            await asyncio.wait(set(self._in_flight))
        if self._writer is not None:
            await self._writer.close()
        if self._notices is not None:
            await self._notices.close()
        if self._fast is not None:
            await self._fast.close()
        if self._life is not None:
            await self._life.close()
        await self._engine.dispose()
        if self._reader is not None:
            self._reader.close()

    def _refuse_writes(self) -> None:
        if self._read_only:
            raise LedgerConfigurationError(
                f"the ledger {self.url} was opened read-only: it records nothing"
            )

    async def _write(self, work: Work[T]) -> T:
        if self._closed:
            raise LedgerUnavailable("the ledger is closed")
        self._refuse_writes()
        if self._writer is not None:
            return await self._writer.run(work)
        return await self._handed_over(
            run_postgres_write(self._engine, work, url=self.url, turn=self._turns)
        )

    async def _fast_write(self, write: Coroutine[Any, Any, T]) -> T:
        """Run a PostgreSQL one-statement write once its turn comes.

        A cancelled caller interrupts neither the wait nor the write: it was handed over.
        """
        if self._closed or self._read_only:
            write.close()
            if self._closed:
                raise LedgerUnavailable("the ledger is closed")
            self._refuse_writes()

        async def run() -> T:
            async with self._turns:
                return await write

        return await self._handed_over(run())

    async def _handed_over(self, write: Coroutine[Any, Any, T]) -> T:
        """Run ``write`` in a task of its own that a cancelled caller leaves running.

        `close` waits for it; if it fails after its caller left, the failure is logged (never
        asyncio's "Task exception was never retrieved", never silence).
        """
        task = asyncio.get_running_loop().create_task(write)
        self._in_flight.add(task)
        task.add_done_callback(self._in_flight.discard)
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            task.add_done_callback(self._unheard)
            raise

    def _unheard(self, task: asyncio.Future[Any]) -> None:
        """Report the failure of a write whose caller was cancelled while it ran."""
        if task.cancelled():
            logger.warning("ledger {}: a write whose caller had left was cancelled", self.url)
            return
        error = task.exception()
        if error is not None:
            logger.warning(
                "ledger {}: a write whose caller had left failed: {}: {}",
                self.url,
                type(error).__name__,
                error,
            )

    async def _fast_read(self, read: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            read.close()
            raise LedgerUnavailable("the ledger is closed")
        try:
            async with self._read_turns, self._turns:
                return await read
        finally:
            read.close()  # a caller cancelled while it waited for a turn never started it

    # --- admit -----------------------------------------------------------------------------

    async def admit(  # noqa: D102 - see Ledger
        self, new: NewOperation, *, within: Callable[[Connection, Operation], None] | None = None
    ) -> AdmitResult:
        # within: run in the insert's own transaction once the operation is created (not for a
        # key already bound), so that what it writes commits with the row or not at all: the
        # hand-off of a durable operation to its workflow (`pipecat_actions.durable`).
        if new.status not in ADMIT_STATUSES:
            raise ValueError(
                f"admit inserts operations as {', '.join(sorted(ADMIT_STATUSES))}, "
                f"not {new.status}; use record_refusal for REJECTED"
            )
        encoded = EncodedOperation.of(new)
        args_hash = encoded.args_hash
        if self._fast is not None and within is None:
            # One statement when the key is free (nearly always); a taken key is looked at
            # below, in a transaction, like on SQLite.
            now = self._clock.now()
            row = new_row(encoded, now, key_slot=new.idempotency_key)
            created = await self._fast_write(
                self._fast.insert(row, creation_events(encoded, now), bind_key=True)
            )
            if created:
                return AdmitResult(operation_from_row(row), created=True)

        def work(conn: Connection) -> AdmitResult:
            now = self._clock.now()
            row = new_row(encoded, now, key_slot=new.idempotency_key)
            for _ in range(_ADMIT_RETRIES):
                if self._insert_new(conn, row, creation_events(encoded, now)):
                    created = operation_from_row(row)
                    if within is not None:
                        within(conn, created)
                    return AdmitResult(created, created=True)
                slot = {"tenant": new.tenant, "key_slot": new.idempotency_key}
                existing = (conn.execute(self._select_slot, slot)).first()
                if existing is None:
                    continue  # the holder rolled back or was released meanwhile
                held = to_operation(existing)
                if held.key_expires_at <= now:
                    self._release_key(conn, held, now, reason="idempotency window closed")
                    continue
                if held.status in REPEATABLE_STATUSES:
                    reason = f"a repeat of an intent that ended {held.status.value}"
                    self._release_key(conn, held, now, reason=reason)
                    continue
                if held.args_hash != args_hash or held.tool != new.tool:
                    raise IdempotencyMismatch(
                        tenant=new.tenant,
                        idempotency_key=new.idempotency_key,
                        operation_id=held.operation_id,
                        expected_args_hash=held.args_hash,
                        given_args_hash=args_hash,
                    )
                return AdmitResult(held, created=False)
            raise LedgerUnavailable(
                f"could not bind idempotency key {new.idempotency_key!r}: it kept changing hands"
            )

        return await self._write(work)

    async def record_refusal(self, new: NewOperation) -> Operation:  # noqa: D102 - see Ledger
        refused = replace(new, status=ActionStatus.REJECTED)
        # A refusal records what was proposed even when it is not valid JSON: whatever part
        # cannot be encoded is kept as its repr, the rest as it is.
        if not _encodes(refused.args):
            refused = replace(refused, args={"unencodable_arguments": _shown(dict(refused.args))})
        if not _encodes(refused.detail):
            refused = replace(refused, detail={"unencodable_detail": _shown(refused.detail)})
        if not _encodes(refused.before_state):
            refused = replace(refused, before_state=None)
        return await self._insert_unbound(EncodedOperation.of(refused))

    async def record_completed(self, new: NewOperation) -> Operation:  # noqa: D102 - see Ledger
        if new.status not in (ActionStatus.COMMITTED, ActionStatus.FAILED_FINAL):
            raise ValueError(f"record_completed takes COMMITTED or FAILED_FINAL, not {new.status}")
        return await self._insert_unbound(EncodedOperation.of(new))

    async def _insert_unbound(self, encoded: EncodedOperation) -> Operation:
        """Insert an operation that binds no idempotency key, with its creation events."""
        if self._fast is not None:
            now = self._clock.now()
            row = new_row(encoded, now, key_slot=None)
            await self._fast_write(
                self._fast.insert(row, creation_events(encoded, now), bind_key=False)
            )
            return operation_from_row(row)

        def work(conn: Connection) -> Operation:
            now = self._clock.now()
            row = new_row(encoded, now, key_slot=None)
            _sqlite.insert(conn, row, creation_events(encoded, now), bind_key=False)
            return operation_from_row(row)

        return await self._write(work)

    def _insert_new(
        self, conn: Connection, row: dict[str, Any], creation: builtins.list[dict[str, Any]]
    ) -> bool:
        """Insert a new operation binding its key, in ``conn``'s transaction; False if taken."""
        if self._sqlite:
            return _sqlite.insert(conn, row, creation, bind_key=True)
        if conn.execute(self._insert_operation, row).first() is None:
            return False
        conn.execute(self._insert_events, creation)
        return True

    def _release_key(self, conn: Connection, held: Operation, now: float, *, reason: str) -> None:
        detail_json = encode_detail({"reason": reason, "key_expires_at": held.key_expires_at})
        released = (
            conn.execute(
                update(operations)
                .where(
                    operations.c.operation_id == held.operation_id,
                    operations.c.key_slot == held.idempotency_key,
                )
                .values(
                    key_slot=None,
                    event_seq=operations.c.event_seq + 1,
                    updated_at=now,
                    **_folded(
                        TrailMarks.of_event(
                            from_status=None,
                            to_status=None,
                            actor="ledger",
                            detail_json=detail_json,
                        )
                    ),
                )
                .returning(operations.c.event_seq, operations.c.status)
            )
        ).first()
        if released is None:
            return
        self._append_event(
            conn,
            held.operation_id,
            seq=released.event_seq,
            at=now,
            kind=EventKind.KEY_RELEASED,
            from_status=released.status,
            to_status=released.status,
            actor="ledger",
            detail_json=detail_json,
        )

    async def reseal(
        self,
        operation_id: str,
        texts: Mapping[str, tuple[str, str]],
        *,
        actor: str,
        detail: Mapping[str, Any],
    ) -> bool:
        """Rewrite sealed JSON columns of an operation, with an annotation, if unchanged.

        For key rotation (`pipecat_actions.ledger.rotation`): ``texts`` maps each of
        ``args_json``, ``result_json``, ``before_state_json`` to (the text read, the text
        to store). Nothing is written, and False returned, when a column no longer holds the
        text read (the operation moved on meanwhile: read it again).
        """
        unknown = set(texts) - {"args_json", "result_json", "before_state_json"}
        if unknown:
            raise ValueError(f"reseal rewrites sealed JSON columns only, not {sorted(unknown)}")
        detail_json = encode_detail(detail)

        def work(conn: Connection) -> bool:
            now = self._clock.now()
            c = operations.c
            row = conn.execute(
                update(operations)
                .where(
                    c.operation_id == operation_id,
                    *(c[column] == stored for column, (stored, _) in texts.items()),
                )
                .values(
                    **{column: new for column, (_, new) in texts.items()},
                    event_seq=c.event_seq + 1,
                    updated_at=now,
                    **_folded(
                        TrailMarks.of_event(
                            from_status=None, to_status=None, actor=actor, detail_json=detail_json
                        )
                    ),
                )
                .returning(c.event_seq, c.status)
            ).first()
            if row is None:
                return False
            self._append_event(
                conn,
                operation_id,
                seq=row.event_seq,
                at=now,
                kind=EventKind.ANNOTATION,
                from_status=row.status,
                to_status=row.status,
                actor=actor,
                detail_json=detail_json,
            )
            return True

        return await self._write(work)

    # --- transitions -----------------------------------------------------------------------

    async def transition(  # noqa: D102 - see Ledger
        self,
        operation_id: str,
        *,
        expected: ActionStatus,
        to: ActionStatus,
        fence: int,
        actor: str,
        detail: Mapping[str, Any] | None = None,
        changes: Mapping[str, Any] | None = None,
    ) -> Operation:
        check_transition(expected, to, operation_id=operation_id)
        expected, to = ActionStatus(expected), ActionStatus(to)
        # Everything that can fail to encode is encoded before the write starts.
        columns = column_changes(changes)
        detail_json = encode_detail(detail)

        def values_at(now: float) -> dict[str, Any]:
            values: dict[str, Any] = {"status": to.value, "updated_at": now, **columns}
            if to is ActionStatus.ADMITTED:
                values["admitted_at"] = now
            elif to is ActionStatus.RUNNING:
                values.setdefault("sent_at", now)
            if to is ActionStatus.COMMITTED and expected is not ActionStatus.COMPENSATING:
                # A failed compensation returns to COMMITTED: the effect's time stays.
                values["committed_at"] = now
            if to in TERMINAL_STATUSES:
                values["finished_at"] = now
            return values

        audit = Audit(
            kind=EventKind.TRANSITION,
            actor=actor,
            detail_json=detail_json,
            starts_attempt=to is ActionStatus.RUNNING,
            notify=to not in IN_FLIGHT_STATUSES,  # an outcome, or a wait for a person
            marks=TrailMarks.of_event(
                from_status=expected.value,
                to_status=to.value,
                actor=actor,
                detail_json=detail_json,
            ),
        )
        return await self._update(
            operation_id, values_at, expected=expected, fence=fence, audit=audit
        )

    async def annotate(  # noqa: D102 - see Ledger
        self,
        operation_id: str,
        *,
        actor: str,
        detail: Mapping[str, Any] | None = None,
        changes: Mapping[str, Any] | None = None,
        expected: ActionStatus | None = None,
        fence: int | None = None,
    ) -> Operation:
        columns = column_changes(changes)
        detail_json = encode_detail(detail)

        audit = Audit(
            kind=EventKind.ANNOTATION,
            actor=actor,
            detail_json=detail_json,
            marks=TrailMarks.of_event(
                from_status=None, to_status=None, actor=actor, detail_json=detail_json
            ),
        )
        return await self._update(
            operation_id,
            lambda now: {"updated_at": now, **columns},
            expected=expected,
            fence=fence,
            audit=audit,
        )

    async def _update(
        self,
        operation_id: str,
        values_at: Callable[[float], dict[str, Any]],
        *,
        expected: ActionStatus | None,
        fence: int | None,
        audit: Audit,
    ) -> Operation:
        """Set ``values_at(now)`` on the operation if it matches, with its audit event."""

        def change(now: float) -> RowUpdate:
            return RowUpdate(
                operation_id,
                values_at(now),
                expected=None if expected is None else expected.value,
                fence=fence,
                audit=audit,
                now=now,
            )

        if self._fast is not None:
            updated = await self._fast_write(self._fast.update(change(self._clock.now())))
            if updated is None:
                found = await self._fast_read(self._fast.status_and_fence(operation_id))
                raise _refusal(found, operation_id, expected=expected, fence=fence)
            return operation_from_row(updated)

        def work(conn: Connection) -> Operation:
            updated = _sqlite.update(conn, change(self._clock.now()))
            if updated is None:
                raise self._refusal(conn, operation_id, expected=expected, fence=fence)
            return operation_from_row(updated)

        written = await self._write(work)
        if audit.notify and self._announce is not None:
            self._announce(operation_id)
        return written

    def _refusal(
        self,
        conn: Connection,
        operation_id: str,
        *,
        expected: ActionStatus | None,
        fence: int | None,
    ) -> LedgerError:
        found = (
            conn.execute(
                select(operations.c.status, operations.c.fence).where(
                    operations.c.operation_id == operation_id
                )
            )
        ).first()
        return _refusal(
            None if found is None else found._mapping, operation_id, expected=expected, fence=fence
        )

    def _append_event(
        self,
        conn: Connection,
        operation_id: str,
        *,
        seq: int,
        at: float,
        kind: EventKind,
        from_status: str | None,
        to_status: str,
        actor: str,
        detail_json: str | None,
    ) -> None:
        conn.execute(
            self._insert_events,
            {
                "operation_id": operation_id,
                "seq": seq,
                "at": at,
                "kind": kind.value,
                "from_status": from_status,
                "to_status": to_status,
                "actor": actor,
                "detail_json": detail_json,
            },
        )

    # --- leases ----------------------------------------------------------------------------

    async def claim_stale(  # noqa: D102 - see Ledger
        self,
        owner: str,
        *,
        lease_secs: float,
        limit: int,
        except_ids: Collection[str] = (),
        gone: Collection[str] = (),
    ) -> list[Operation]:
        left = list(except_ids)
        dead = list(gone)

        def work(conn: Connection) -> list[Operation]:
            now = self._clock.now()
            stale = select(operations.c.operation_id, operations.c.lease_owner).where(
                operations.c.status.in_([s.value for s in NON_TERMINAL]),
                or_(
                    operations.c.lease_expires_at.is_(None),
                    operations.c.lease_expires_at <= now,
                    *([operations.c.lease_owner.in_(dead)] if dead else []),
                ),
            )
            if left:
                stale = stale.where(operations.c.operation_id.not_in(left))
            candidates = (
                stale.order_by(operations.c.created_at)
                .limit(limit)
                .with_for_update(skip_locked=True)
            )
            previous = {r.operation_id: r.lease_owner for r in conn.execute(candidates)}
            if not previous:
                return []
            # Its events say only who claimed it (and a claimant may be the watchdog).
            marks = _folded(
                TrailMarks.of_event(from_status=None, to_status=None, actor=owner, detail_json=None)
            )
            rows = conn.execute(
                update(operations)
                .where(operations.c.operation_id.in_(list(previous)))
                .values(
                    lease_owner=owner,
                    lease_expires_at=now + lease_secs,
                    fence=operations.c.fence + 1,
                    event_seq=operations.c.event_seq + 1,
                    updated_at=now,
                    **marks,
                )
                .returning(*operations.c)
            )
            claimed = sorted((to_operation(r) for r in rows), key=lambda o: o.created_at)
            conn.execute(
                self._insert_events,
                [
                    {
                        "operation_id": op.operation_id,
                        "seq": op.event_seq,
                        "at": now,
                        "kind": EventKind.LEASE_CLAIMED.value,
                        "from_status": op.status.value,
                        "to_status": op.status.value,
                        "actor": owner,
                        "detail_json": encode_detail(
                            {"previous_owner": previous[op.operation_id], "fence": op.fence}
                        ),
                    }
                    for op in claimed
                ],
            )
            return claimed

        return await self._write(work)

    async def hold_life(self, owner: str) -> bool:  # noqa: D102 - see Ledger
        if self._life is None:
            return True
        if not await self._life.hold(owner):
            return False
        try:
            now = self._clock.now()
            await self._write(lambda conn: _owners.register(conn, owner, now=now))
        except BaseException:
            await self._life.release(owner)
            raise
        return True

    async def release_life(  # noqa: D102 - see Ledger
        self, owner: str, *, unregister: bool = True
    ) -> None:
        if self._life is None:
            return
        try:
            if unregister:
                await self._write(lambda conn: _owners.unregister(conn, owner))
        finally:
            await self._life.release(owner)

    async def gone_owners(  # noqa: D102 - see Ledger
        self, *, besides: str, among: Collection[str] | None = None
    ) -> builtins.list[str]:
        life = self._life
        if life is None:
            return []
        if isinstance(life, PostgresLife):
            await life.keep(besides)
        now = self._clock.now()
        if among is not None:
            holders = [owner for owner in among if owner != besides]
        else:
            holders = await self._read(
                lambda conn: _owners.lease_holders(conn, besides=besides, now=now)
            )
        if not holders:
            return []
        known = holders
        if isinstance(life, PostgresLife):
            return sorted(await self._read(lambda conn: _owners.gone_on_postgres(conn, known)))
        registered = await self._read(lambda conn: _owners.registered(conn, known))
        return sorted(await life.gone(registered))

    async def forget_owners(self, owners: Collection[str]) -> None:  # noqa: D102 - see Ledger
        if self._life is None or not owners:
            return
        done = await self._write(lambda conn: _owners.forget(conn, owners))
        await self._life.forget(done)

    async def release_leases(  # noqa: D102 - see Ledger
        self, owner: str, operation_ids: Collection[str]
    ) -> int:
        ids = list(operation_ids)
        if not ids:
            return 0

        def work(conn: Connection) -> int:
            result = conn.execute(
                update(operations)
                .where(
                    operations.c.lease_owner == owner,
                    operations.c.operation_id.in_(ids),
                    operations.c.status.in_([s.value for s in NON_TERMINAL]),
                )
                .values(lease_expires_at=self._clock.now())
            )
            return int(result.rowcount)

        return await self._write(work)

    async def renew_lease(  # noqa: D102 - see Ledger
        self, owner: str, *, lease_secs: float, except_ids: Collection[str] = ()
    ) -> int:
        left = list(except_ids)

        def work(conn: Connection) -> int:
            now = self._clock.now()
            query = update(operations).where(
                operations.c.lease_owner == owner,
                operations.c.status.in_([s.value for s in NON_TERMINAL]),
            )
            if left:
                query = query.where(operations.c.operation_id.not_in(left))
            result = conn.execute(query.values(lease_expires_at=now + lease_secs))
            return int(result.rowcount)

        return await self._write(work)

    # --- notices ---------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def notices(  # noqa: D102 - see Ledger
        self, operation_id: str
    ) -> AsyncIterator[asyncio.Event | None]:
        if self._notices is None or self._closed:
            yield None
            return
        changed = await self._notices.subscribe(operation_id)
        try:
            yield changed
        finally:
            self._notices.unsubscribe(operation_id, changed)

    # --- reads -----------------------------------------------------------------------------

    async def _read(self, work: Work[T]) -> T:
        if self._closed:
            raise LedgerUnavailable("the ledger is closed")
        if self._file is not None:
            self._file.check()  # a new connection to a deleted file's path would open a new one

        async def run() -> T:
            async with self._read_turns, self._turns, self._engine.connect() as conn:
                return await conn.run_sync(work)

        reader = self._reader
        if reader is None or not reader.alone():
            return await guard_database_errors(run(), url=self.url)
        # An immutable read (see `_reader`) is trusted only if no writer had the file
        # meanwhile; a writer's checkpoint under it could also be why it failed.
        try:
            result = await run()
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
        return await guard_database_errors(run(), url=self.url)

    async def get(self, operation_id: str) -> Operation:  # noqa: D102 - see Ledger
        if self._fast is not None:
            found = await self._fast_read(self._fast.get(operation_id))
            if found is None:
                raise OperationNotFound(operation_id=operation_id)
            return operation_from_row(found)

        def work(conn: Connection) -> Operation:
            row = (
                conn.execute(select(operations).where(operations.c.operation_id == operation_id))
            ).first()
            if row is None:
                raise OperationNotFound(operation_id=operation_id)
            return to_operation(row)

        return await self._read(work)

    async def find_by_key(  # noqa: D102 - see Ledger
        self, tenant: str, idempotency_key: str
    ) -> Operation | None:
        def alive(held: Operation) -> Operation | None:
            live = held.key_expires_at > self._clock.now()
            return held if live and held.status not in REPEATABLE_STATUSES else None

        if self._fast is not None:
            found = await self._fast_read(self._fast.by_slot(tenant, idempotency_key))
            return None if found is None else alive(operation_from_row(found))

        def work(conn: Connection) -> Operation | None:
            slot = {"tenant": tenant, "key_slot": idempotency_key}
            row = (conn.execute(self._select_slot, slot)).first()
            return None if row is None else alive(to_operation(row))

        return await self._read(work)

    async def list(  # noqa: D102 - see Ledger
        self, filters: OperationFilter | None = None
    ) -> builtins.list[Operation]:
        f = filters or OperationFilter()
        where = filter_conditions(f)
        query = select(operations).where(*where)
        by = (operations.c.created_at, operations.c.operation_id)
        query = query.order_by(*(c.desc() for c in by) if f.newest_first else by).limit(f.limit)

        def work(conn: Connection) -> builtins.list[Operation]:
            page = query
            walked = f.tool or f.session_id or f.principal  # an index in page order
            if f.status and walked and not f.newest_first and _status_first(conn, f):
                page = _status_first_page(query, f, where, sqlite=self._sqlite)
            return [to_operation(r) for r in conn.execute(page)]

        return await self._read(work)

    async def statistics(  # noqa: D102 - see Ledger
        self, filters: OperationFilter | None = None
    ) -> dict[str, Any]:
        where = filter_conditions(replace(filters or OperationFilter(), after=None))

        def work(conn: Connection) -> dict[str, Any]:
            # Its few queries read one snapshot, so that their figures agree with each other
            # while writes go on (a tool's first commit between two of them, say).
            if not self._sqlite:
                conn.execution_options(isolation_level="REPEATABLE READ")
                return read_statistics(conn, where)
            conn.exec_driver_sql("BEGIN")  # deferred: the snapshot of its first read (WAL)
            try:
                return read_statistics(conn, where)
            finally:
                conn.exec_driver_sql("ROLLBACK")

        return await self._read(work)

    async def events(self, operation_id: str) -> builtins.list[OperationEvent]:  # noqa: D102
        query = select(events).where(events.c.operation_id == operation_id).order_by(events.c.seq)

        def work(conn: Connection) -> builtins.list[OperationEvent]:
            return [to_event(r) for r in conn.execute(query)]

        return await self._read(work)


def _refusal(
    found: Any, operation_id: str, *, expected: ActionStatus | None, fence: int | None
) -> LedgerError:
    """Why an update matched no row: ``found`` is the row's (status, fence), or None."""
    if found is None:
        return OperationNotFound(operation_id=operation_id)
    if fence is not None and found["fence"] != fence:
        return StaleFence(
            operation_id=operation_id,
            given_fence=fence,
            actual_fence=found["fence"],
            actual_status=found["status"],
        )
    return UnexpectedStatus(
        operation_id=operation_id,
        expected_status=str(expected),
        actual_status=found["status"],
    )


def _no_check() -> None:
    return None


def _shown(value: Any) -> str:
    """The repr of what a refusal could not encode, bounded; never an error of its own."""
    try:
        return repr(value)[:4096]
    except (ValueError, RecursionError):
        # A whole number past Python's digit limit, or nesting too deep, has no repr.
        return f"({type(value).__name__} that cannot be shown)"


def _encodes(value: Any) -> bool:
    try:
        canonical_json(dict(value) if isinstance(value, Mapping) else value)
    except (TypeError, ValueError, RecursionError):
        return False
    return True


def _status_first(conn: Connection, f: OperationFilter) -> bool:
    """Whether a page of a status and other filters reads the status's rows first.

    ``ledger list --tool refund --status UNKNOWN``: both planners may walk the tool's index
    in page order, expecting to fill the page early, and read every refund when few are
    UNKNOWN (at 1M operations, an empty page: 400 to 950 ms on SQLite, 260 ms on PostgreSQL
    with the bench's statistics, 20 ms with others). So both sides are counted, each only up
    to the other's size (a few ms over their indexes), and the status's rows are read first
    (then sorted) when they are fewer, and at most `_STATUS_FIRST_UP_TO`.
    """
    in_status = _at_most(
        conn, filter_conditions(OperationFilter(status=f.status)), _STATUS_FIRST_UP_TO
    )
    if in_status > _STATUS_FIRST_UP_TO:
        return False
    return _at_most(conn, filter_conditions(replace(f, status=None)), in_status) > in_status


def _status_first_page(
    page: Select[Any], f: OperationFilter, where: list[Any], *, sqlite: bool
) -> Select[Any]:
    """``page``, its rows found first by their status's index, then sorted.

    SQLite is told the index (``INDEXED BY``); PostgreSQL is given the rows to find as a
    materialized CTE, which it plans without the page's order and limit.
    """
    if sqlite:
        return page.with_hint(operations, f"INDEXED BY {_BY_STATUS}", "sqlite")
    found = select(operations).where(*where).cte("found").prefix_with("MATERIALIZED")
    return select(found).order_by(found.c.created_at, found.c.operation_id).limit(f.limit)


def _at_most(conn: Connection, where: list[Any], most: int) -> int:
    """How many operations ``where`` matches, counted up to ``most + 1``."""
    matched = select(literal(1)).where(*where).limit(most + 1).subquery()
    return int(conn.execute(select(func.count()).select_from(matched)).scalar_one())


def _folded(said: TrailMarks) -> dict[str, Any]:
    """The column changes that fold ``said`` into a row (see `_trail`); none when it is empty."""
    if not said:
        return {}
    c = operations.c
    return {
        "trail_marks": c.trail_marks.op("|")(said.marks),
        "joined_calls": c.joined_calls + said.joined_calls,
        "reconcile_errors": c.reconcile_errors + said.reconcile_errors,
    }
