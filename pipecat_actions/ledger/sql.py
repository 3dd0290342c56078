"""The SQL ledger, for SQLite (the default) and PostgreSQL, on SQLAlchemy Core (no ORM).

`SqlLedger` holds what both dialects do alike, as template methods: each verb checks and
encodes its input, builds a work function (``_writer.Work``) of a SQLAlchemy `Connection` and
hands it to ``_write`` or ``_read``; the few steps a dialect does its own way are hooks,
filled in by `pipecat_actions.ledger.sqlite.SqliteLedger` and
`pipecat_actions.ledger.postgresql.PostgresLedger`. `SqlLedger.create` opens either one,
chosen by the URL. Schema work (create, check, upgrade, the refusal of what is not a ledger)
is `migrate.SchemaAdmin`'s, beside the migrations.

Several processes may share one database: on SQLite they take turns on the file lock
(``busy_timeout``), on PostgreSQL row locks and ``FOR UPDATE SKIP LOCKED`` keep them apart.
"""

from __future__ import annotations

import builtins

__all__ = ["CHANGEABLE_FIELDS", "SqlLedger"]

import asyncio
import contextlib
import importlib
from abc import abstractmethod
from collections.abc import AsyncIterator, Callable, Collection, Coroutine, Mapping
from dataclasses import replace
from typing import Any, Final, TypeVar

from loguru import logger
from sqlalchemy import (
    ColumnElement,
    Connection,
    Select,
    Update,
    bindparam,
    func,
    insert,
    literal,
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
    StaleFence,
    UnexpectedStatus,
)
from pipecat_actions.ledger import _owners, migrate
from pipecat_actions.ledger._claims import StaleQuery
from pipecat_actions.ledger._filters import filter_conditions
from pipecat_actions.ledger._life import Life
from pipecat_actions.ledger._notices import Notices
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
from pipecat_actions.ledger._writer import Work, guard_database_errors
from pipecat_actions.ledger.base import Ledger
from pipecat_actions.ledger.engine import LedgerSettings, default_ledger_url, normalize_url
from pipecat_actions.ledger.records import (
    PROGRESS,
    AdmitResult,
    EventKind,
    NewOperation,
    Operation,
    OperationEvent,
    OperationFilter,
    canonical_json,
)
from pipecat_actions.ledger.schema import UNDELIVERED_INDEX, events, operations
from pipecat_actions.status import (
    IN_FLIGHT_STATUSES,
    REPEATABLE_STATUSES,
    TERMINAL_STATUSES,
    ActionStatus,
    check_transition,
)

T = TypeVar("T")
_TEXT: Final = {status: status.value for status in ActionStatus}
"""Each status's text (``.value`` is a descriptor call per read, on every write)."""
_ADMIT_RETRIES = 5
_STATUS_FIRST_UP_TO = 25_000
"""The most rows a page reads by their status's index, then sorts (see `_status_first`)."""

Change = Callable[[float], RowUpdate]
"""An operation's row change as of a time (``now``), built when the write runs."""


class SqlLedger(Ledger):
    """`Ledger` on SQLite or PostgreSQL through SQLAlchemy.

    Create it with `SqlLedger.create` (it opens the dialect's own class); close it with
    `close` (or ``async with``). Writes run through ``_write`` (each in a transaction of its
    own), reads through ``_read``, on the async engine; a dialect may run its hot path
    (a new operation, a transition, an annotation, a read by id or key) its own way.

    At most ``pool_size`` calls are on the database at once, reads at most ``read_turns``
    of them: a burst of callers waits its turn here, in order, instead of timing out on the
    connection pool.
    """

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        url: str,
        clock: Clock,
        settings: LedgerSettings,
        sqlite: bool,
        read_turns: int,
        notices: Notices | None = None,
        life: Life | None = None,
        read_only: bool = False,
    ) -> None:
        self._engine = engine
        self.url = url
        self._clock = clock
        self._settings = settings
        self._notices = notices
        self._life = life
        self._read_only = read_only
        self._schema = migrate.SchemaAdmin(url=url, sqlite=sqlite)
        self._row_locks = not sqlite
        """Writers lock rows (PostgreSQL) and may pass over another's; SQLite runs one at a time."""
        self._insert_events = insert(events)
        self._select_slot = select(operations).where(
            operations.c.tenant == bindparam("tenant"),
            operations.c.key_slot == bindparam("key_slot"),
        )
        self._turns = asyncio.Semaphore(settings.pool_size)
        self._read_turns = asyncio.Semaphore(read_turns)
        self._closed = False

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
        dialect = _dialect(parsed.get_backend_name())
        must_exist = must_exist or read_only
        return await dialect._open_at(
            parsed,
            clock=clock or SystemClock(),
            settings=settings or LedgerSettings(),
            create_schema=create_schema and not must_exist,
            check_schema=check_schema,
            must_exist=must_exist,
            read_only=read_only,
        )

    @classmethod
    @abstractmethod
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
    ) -> SqlLedger:
        """Open this dialect's ledger at ``parsed`` (`create` chose the dialect by it)."""

    async def _started(self, *, create_schema: bool, check_schema: bool) -> None:
        """Start the ledger and check (or create) its schema; closed again if that fails."""
        try:
            await self._start()
            if self._read_only:
                state = await self._read(self._schema.reading(check_schema=check_schema))
                logger.debug("ledger {} (read-only) at schema {}", self.url, state.current)
            elif check_schema:
                state = await self._write(self._schema.checking(create_schema=create_schema))
                logger.debug("ledger {} at schema {}", self.url, state.current)
        except BaseException:
            await self.close()
            raise

    async def _start(self) -> None:
        """Start what the dialect runs beside the engine, before the first read or write."""
        return None

    async def schema_state(self) -> migrate.SchemaState:
        """Return where the database's schema stands against this code's."""
        return await self._read(migrate.read_schema_state)

    async def upgrade_schema(self) -> tuple[str | None, str]:
        """Bring the schema to this code's revision; return (revision before, revision after)."""
        return await self._write(self._schema.upgrading())

    async def close(self) -> None:
        """Finish the writes already handed to the database, then release every connection."""
        if self._closed:
            return
        self._closed = True
        await self._drain()
        if self._notices is not None:
            await self._notices.close()
        if self._life is not None:
            await self._life.close()
        await self._engine.dispose()
        await self._release_own()

    async def _drain(self) -> None:
        """Land (or fail) the writes handed over before `close`."""
        return None

    async def _release_own(self) -> None:
        """Release what the dialect holds beside the engine, once it is disposed."""
        return None

    # --- the write and read paths ----------------------------------------------------------

    def _refuse_writes(self) -> None:
        if self._read_only:
            raise LedgerConfigurationError(
                f"the ledger {self.url} was opened read-only: it records nothing"
            )

    async def _write(self, work: Work[T]) -> T:
        if self._closed:
            raise LedgerUnavailable("the ledger is closed")
        self._refuse_writes()
        return await self._commit(work)

    @abstractmethod
    async def _commit(self, work: Work[T]) -> T:
        """Run ``work`` in a write transaction of its own; answer once it committed."""

    async def _read(self, work: Work[T]) -> T:
        if self._closed:
            raise LedgerUnavailable("the ledger is closed")
        return await guard_database_errors(self._on_engine(work), url=self.url)

    async def _on_engine(self, work: Work[T]) -> T:
        """Run ``work`` on a connection of the async engine, once its turn comes."""
        async with self._read_turns, self._turns, self._engine.connect() as conn:
            return await conn.run_sync(work)

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
        if within is None:
            # One statement when the key is free (nearly always), where the dialect has one; a
            # hand-off (within) needs the transaction below.
            at_once = await self._admit_at_once(encoded, new)
            if at_once is not None:
                return at_once

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

    async def _admit_at_once(
        self, encoded: EncodedOperation, new: NewOperation
    ) -> AdmitResult | None:
        """Admit ``new`` in one step when its key is free, if the dialect can; else None.

        None sends the admit to the transaction of `admit`, which looks at a taken key.
        """
        return None

    @abstractmethod
    async def _insert_unbound(self, encoded: EncodedOperation) -> Operation:
        """Insert an operation that binds no idempotency key, with its creation events."""

    @abstractmethod
    def _insert_new(
        self, conn: Connection, row: dict[str, Any], creation: builtins.list[dict[str, Any]]
    ) -> bool:
        """Insert a new operation binding its key, in ``conn``'s transaction; False if taken."""

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
        expected, to = check_transition(expected, to, operation_id=operation_id)
        src, dst = _TEXT[expected], _TEXT[to]
        # Everything that can fail to encode is encoded before the write starts.
        columns = column_changes(changes)
        detail_json = encode_detail(detail)

        def values_at(now: float) -> dict[str, Any]:
            values: dict[str, Any] = {"status": dst, "updated_at": now, **columns}
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
                from_status=src, to_status=dst, actor=actor, detail_json=detail_json
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
            # A progress report: the call that waits in another process hears it.
            notify=detail is not None and PROGRESS in detail,
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

    def _update(
        self,
        operation_id: str,
        values_at: Callable[[float], dict[str, Any]],
        *,
        expected: ActionStatus | None,
        fence: int | None,
        audit: Audit,
    ) -> Coroutine[Any, Any, Operation]:
        """Set ``values_at(now)`` on the operation if it matches, with its audit event.

        Not a coroutine itself: it returns `_apply`'s, a coroutine layer less per write.
        """

        def change(now: float) -> RowUpdate:
            return RowUpdate(
                operation_id,
                values_at(now),
                expected=None if expected is None else _TEXT[expected],
                fence=fence,
                audit=audit,
                now=now,
            )

        return self._apply(
            operation_id, change, expected=expected, fence=fence, notify=audit.notify
        )

    @abstractmethod
    async def _apply(
        self,
        operation_id: str,
        change: Change,
        *,
        expected: ActionStatus | None,
        fence: int | None,
        notify: bool,
    ) -> Operation:
        """Write ``change`` if the operation still matches; refuse it (`refusal`) if not.

        ``notify``: the change is an outcome, or a wait for a person (waiters hear of it).
        """

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
            query = StaleQuery(owner, now=now, limit=limit, except_ids=left, gone=dead)
            previous = self._lock_stale(conn, query)
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
            claimed = sorted(
                (to_operation(r) for r in rows), key=lambda o: (o.created_at, o.operation_id)
            )
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

    def _lock_stale(self, conn: Connection, query: StaleQuery) -> dict[str, str | None]:
        """Lock a batch of ``query``'s stale operations; return their previous owners.

        One that another transaction holds (a claimer's, or a dead process's the server has
        not ended yet) is passed over while there are others. When it is all that is left it
        is waited for, then taken if still stale: a pass of batches never leaves it to the
        next heartbeat. This transaction holds no row while it waits: no deadlock.
        """
        while True:
            found = {r.operation_id: r.lease_owner for r in conn.execute(query.locking())}
            if found or not self._row_locks:
                return found
            held = conn.execute(query.candidates().limit(1)).scalar()
            if held is None:
                return {}
            found = {r.operation_id: r.lease_owner for r in conn.execute(query.waiting_for(held))}
            if found:
                return found

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
        await self._keep_life(besides)
        now = self._clock.now()
        if among is not None:
            holders = [owner for owner in among if owner != besides]
        else:
            holders = await self._read(
                lambda conn: _owners.lease_holders(conn, besides=besides, now=now)
            )
        if not holders:
            return []
        return sorted(await self._gone_among(life, holders))

    async def _keep_life(self, owner: str) -> None:
        """Make sure ``owner`` (this process) still holds its life, before judging others."""
        return None

    @abstractmethod
    async def _gone_among(self, life: Life, holders: builtins.list[str]) -> Collection[str]:
        """Which of ``holders`` (lease owners) are gone: their process no longer lives."""

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

    async def end_leases(  # noqa: D102 - see Ledger
        self, owner: str, *, except_ids: Collection[str] = ()
    ) -> int:
        return await self._set_leases(owner, except_ids, lease_secs=0.0)

    async def renew_lease(  # noqa: D102 - see Ledger
        self, owner: str, *, lease_secs: float, except_ids: Collection[str] = ()
    ) -> int:
        return await self._set_leases(owner, except_ids, lease_secs=lease_secs)

    async def _set_leases(
        self, owner: str, except_ids: Collection[str], *, lease_secs: float
    ) -> int:
        """Make the leases of ``owner``'s open operations end ``lease_secs`` from now.

        (status, owner) sought once per open status in ix_pa_operations_status_lease: the
        owner's own open rows, never the others' (migration 0010).
        """
        left = list(except_ids)
        own = [
            operations.c.lease_owner == owner,
            operations.c.status.in_([s.value for s in NON_TERMINAL]),
        ]
        if left:
            own.append(operations.c.operation_id.not_in(left))
        query = self._renewal(own)

        def work(conn: Connection) -> int:
            now = self._clock.now()
            result = conn.execute(query.values(lease_expires_at=now + lease_secs))
            return int(result.rowcount)

        return await self._write(work)

    def _renewal(self, own: builtins.list[Any]) -> Update:
        """The heartbeat's UPDATE of the rows ``own`` selects (an owner's open operations)."""
        return update(operations).where(*own)

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

    async def get(self, operation_id: str) -> Operation:  # noqa: D102 - see Ledger
        found = await self._by_id(operation_id)
        if found is None:
            raise OperationNotFound(operation_id=operation_id)
        return found

    async def _by_id(self, operation_id: str) -> Operation | None:
        """The operation ``operation_id``, or None."""

        def work(conn: Connection) -> Operation | None:
            query = select(operations).where(operations.c.operation_id == operation_id)
            row = conn.execute(query).first()
            return None if row is None else to_operation(row)

        return await self._read(work)

    async def find_by_key(  # noqa: D102 - see Ledger
        self, tenant: str, idempotency_key: str
    ) -> Operation | None:
        held = await self._by_slot(tenant, idempotency_key)
        if held is None:
            return None
        live = held.key_expires_at > self._clock.now()
        return held if live and held.status not in REPEATABLE_STATUSES else None

    async def _by_slot(self, tenant: str, key_slot: str) -> Operation | None:
        """The operation bound to ``key_slot`` in ``tenant``, alive or not, or None."""

        def work(conn: Connection) -> Operation | None:
            row = conn.execute(self._select_slot, {"tenant": tenant, "key_slot": key_slot}).first()
            return None if row is None else to_operation(row)

        return await self._read(work)

    async def list(  # noqa: D102 - see Ledger
        self, filters: OperationFilter | None = None
    ) -> builtins.list[Operation]:
        f = filters or OperationFilter()
        where = filter_conditions(f)
        query = select(operations).where(*where)
        by = (operations.c.created_at, operations.c.operation_id)
        query = query.order_by(*(c.desc() for c in by) if f.newest_first else by).limit(f.limit)
        if f.undelivered and f.status is not None and set(f.status) == {ActionStatus.COMMITTED}:
            # Exactly the rows of the partial index, in page order: SQLite's planner, which
            # cannot know how few they are, would rather read every COMMITTED row by status.
            query = query.with_hint(operations, f"INDEXED BY {UNDELIVERED_INDEX}", "sqlite")

        def work(conn: Connection) -> builtins.list[Operation]:
            page = query
            walked = f.tool or f.session_id or f.principal  # an index in page order
            if f.status and walked and not f.newest_first and _status_first(conn, f):
                page = self._status_first_page(query, f, where)
            return [to_operation(r) for r in conn.execute(page)]

        return await self._read(work)

    async def statistics(  # noqa: D102 - see Ledger
        self, filters: OperationFilter | None = None
    ) -> dict[str, Any]:
        wanted = replace(filters or OperationFilter(), after=None)
        where = filter_conditions(wanted)

        def work(conn: Connection) -> dict[str, Any]:
            self._before_statistics(conn)
            # Its few queries read one snapshot, so that their figures agree with each other
            # while writes go on (a tool's first commit between two of them, say).
            return self._in_snapshot(conn, lambda: read_statistics(conn, where, wanted))

        return await self._read(work)

    @abstractmethod
    def _status_first_page(
        self, page: Select[Any], f: OperationFilter, where: builtins.list[Any]
    ) -> Select[Any]:
        """``page``, its rows found first by their status's index, then sorted.

        Used when `_status_first` says so (a page of a status and a tool, say).
        """

    def _before_statistics(self, conn: Connection) -> None:
        """Work on ``conn`` before `statistics`' snapshot, in a transaction of its own."""

    @abstractmethod
    def _in_snapshot(self, conn: Connection, read: Callable[[], T]) -> T:
        """Run ``read``'s queries on ``conn`` in one snapshot of the database."""

    async def events(self, operation_id: str) -> builtins.list[OperationEvent]:  # noqa: D102
        return await self._trail(events.c.operation_id == operation_id)

    async def events_after(  # noqa: D102 - see Ledger
        self, operation_id: str, seq: int
    ) -> builtins.list[OperationEvent]:
        # A range of the primary key (operation_id, seq): only the rows after ``seq`` are read.
        return await self._trail(events.c.operation_id == operation_id, events.c.seq > seq)

    async def _trail(self, *where: ColumnElement[bool]) -> builtins.list[OperationEvent]:
        query = select(events).where(*where).order_by(events.c.seq)

        def work(conn: Connection) -> builtins.list[OperationEvent]:
            return [to_event(r) for r in conn.execute(query)]

        return await self._read(work)


def refusal(
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


_DIALECTS: Final = {
    "sqlite": ("pipecat_actions.ledger.sqlite", "SqliteLedger"),
    "postgresql": ("pipecat_actions.ledger.postgresql", "PostgresLedger"),
}
"""Each dialect's ledger class by backend name, as SQLAlchemy's own dialect registry names its
dialects: the base imports none of the classes that subclass it (no import circle), and a
dialect's module is loaded for its own ledgers only (the PostgreSQL one brings every
PostgreSQL driver's module: a SQLite ledger's command starts without them)."""


def _dialect(backend: str) -> type[SqlLedger]:
    """The ledger class of ``backend`` (`normalize_url` let through only those known here)."""
    module, name = _DIALECTS["sqlite" if backend == "sqlite" else "postgresql"]
    found = getattr(importlib.import_module(module), name)
    if not (isinstance(found, type) and issubclass(found, SqlLedger)):
        raise TypeError(f"{module}.{name} is not a SqlLedger")  # a registry mistake, never input
    return found
