"""The hot path of a PostgreSQL ledger on asyncpg itself: each write one statement, one trip.

Measured on ``055ff8b``: 59 % of a PostgreSQL ``propose`` went to SQLAlchemy's
``engine.connect()`` / ``conn.begin()`` / ``run_sync`` dance, once per write, and each write
took four round trips (BEGIN, two statements, COMMIT). Here the writes on a call's critical
path (a new operation, a transition, an annotation) and the reads the runtime makes while a
call waits are each **one statement** on asyncpg connections the ledger keeps itself (a
plain stack, see `PostgresFastPath`): the row change and its audit event are one
``WITH ... INSERT/UPDATE ... RETURNING`` statement, which PostgreSQL runs as one transaction of
its own, so a write is one round trip and is answered only once it committed.
SQLAlchemy keeps the schema, the migrations, the operator queries and every rarer write, on
the same connections: its engine opens none of its own but borrows an idle one of the stack
(`PostgresFastPath.lend`), which comes back to the stack when SQLAlchemy closes it. The
notifier's batches run on them too (`PostgresFastPath.execute`). So the ledger's calls, whatever
runs them, share one set of connections, as many as the calls on the database at once
(``pool_size``): the connection budget of a process.

A transition that leaves the in-flight statuses is announced on ``NOTIFY pa_operations`` with
the operation's id once it has committed, not in its own statement: the ledger hands the id to
its `_notices.PostgresNotifier`, which sends notices in batches on a connection of its own
(PostgreSQL commits notifying transactions one at a time, so a notice in each write cost
group commit). `_notices` wakes the waiters of other processes (`Ledger.notices`).
"""

from __future__ import annotations

__all__ = ["CHANNEL", "LedgerConnection", "PostgresFastPath", "asyncpg_dsn", "close_connection"]

import asyncio
from collections.abc import Awaitable, Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any, TypeVar

import asyncpg

from pipecat_actions.errors import LedgerConfigurationError, LedgerUnavailable
from pipecat_actions.ledger._rows import RowUpdate
from pipecat_actions.ledger._trail import NO_MARKS, TRAIL_COLUMNS
from pipecat_actions.ledger._writer import as_ledger_error, guard_database_errors
from pipecat_actions.ledger.records import EventKind
from pipecat_actions.ledger.schema import events, operations

T = TypeVar("T")

CHANNEL = "pa_operations"
"""The notification channel: its payload is the id of an operation that got an outcome."""

_OPERATION_COLUMNS = tuple(c.name for c in operations.c)
_KIND_TEXT = {kind: kind.value for kind in EventKind}
_EVENT_COLUMNS = tuple(c.name for c in events.c)


def asyncpg_dsn(url: Any) -> str:
    """The asyncpg DSN of a SQLAlchemy ``postgresql+asyncpg`` URL (password kept)."""
    rendered: str = url.set(drivername="postgresql").render_as_string(hide_password=False)
    return rendered


_CONNECTION_ERRORS = (asyncpg.InterfaceError, asyncpg.InternalClientError, OSError)
"""What asyncpg raises when a connection is lost or in a broken state (its protocol caught
mid-operation by the server's goodbye, say), besides the server's own errors."""


async def close_connection(conn: asyncpg.Connection, *, within_secs: float) -> None:
    """Close ``conn`` politely within ``within_secs``, else cut it off."""
    try:
        await asyncio.wait_for(conn.close(), timeout=within_secs)
    except (TimeoutError, *_CONNECTION_ERRORS):
        conn.terminate()


class LedgerConnection(asyncpg.Connection):  # type: ignore[misc]  # asyncpg is untyped
    """An asyncpg connection of the ledger's stack, which SQLAlchemy may borrow.

    SQLAlchemy closes a connection when it is done with it (its pool is a `NullPool`): a
    borrowed one goes back to its stack instead, if it is sound (open, no transaction left
    open). Closed with a timeout (SQLAlchemy's graceful end of a connection it found broken),
    or when not borrowed, it is really closed.
    """

    _lent_by: PostgresFastPath | None = None

    async def close(self, *, timeout: float | None = None) -> None:  # noqa: ASYNC109 - asyncpg's
        """Give a borrowed connection back to its stack; else close it."""
        lender, self._lent_by = self._lent_by, None
        if lender is not None and timeout is None and not self.is_in_transaction():
            lender.given_back(self)
            return
        await super().close(timeout=timeout)


def _columns(names: Sequence[str]) -> str:
    return ", ".join(names)


def _insert_sql(on_conflict: str) -> str:
    """One statement: insert an operation (``on_conflict`` applied) and its creation events.

    Parameters: one per operation column, then the events as seven arrays (seq, at, kind,
    from_status, to_status, actor, detail_json). It returns how many operations it inserted.
    """
    first_array = len(_OPERATION_COLUMNS) + 1
    types = ("int", "float8", "text", "text", "text", "text", "text")
    arrays = ", ".join(f"${first_array + i}::{kind}[]" for i, kind in enumerate(types))
    return f"""
WITH ins AS (
    INSERT INTO pa_operations ({_columns(_OPERATION_COLUMNS)})
    VALUES ({", ".join(f"${i}" for i in range(1, len(_OPERATION_COLUMNS) + 1))}){on_conflict}
    RETURNING operation_id
), ev AS (
    INSERT INTO pa_operation_events ({_columns(_EVENT_COLUMNS)})
    SELECT ins.operation_id, e.seq, e.at, e.kind, e.from_status, e.to_status, e.actor,
           e.detail_json
    FROM ins, unnest({arrays}) AS e(seq, at, kind, from_status, to_status, actor, detail_json)
)
SELECT count(*) FROM ins
"""


_ADMIT = _insert_sql("\n    ON CONFLICT (tenant, key_slot) DO NOTHING")
"""Insert a new operation and its creation events if its key is free."""
_INSERT = _insert_sql("")
"""Insert an operation that binds no key (a refusal, a recorded read)."""

_GET = f"SELECT {_columns(_OPERATION_COLUMNS)} FROM pa_operations WHERE operation_id = $1"
_BY_SLOT = (
    f"SELECT {_columns(_OPERATION_COLUMNS)} FROM pa_operations WHERE tenant = $1 AND key_slot = $2"
)
_STATUS_AND_FENCE = "SELECT status, fence FROM pa_operations WHERE operation_id = $1"


@lru_cache(maxsize=512)
def update_sql(
    columns: tuple[str, ...],
    *,
    starts_attempt: bool,
    match_status: bool,
    match_fence: bool,
    marks: bool,
    firsts: tuple[str, ...] = (),
) -> str:
    """The one statement of a conditional update and its audit event; see `PostgresFastPath`.

    Parameters: $1 operation id, $2 expected status (or NULL: any, and the event's
    from-status is the row's), $3 fence (or NULL), $4 now, $5 event kind, $6 actor, $7 detail
    JSON, then one per column of ``columns``, in order, then (``marks``) the three of the
    event's `TrailMarks`. It returns the updated row, or nothing when no row matched.
    """
    sets = [
        f"{column} = COALESCE({column}, ${i})" if column in firsts else f"{column} = ${i}"
        for i, column in enumerate(columns, start=8)
    ]
    if marks:
        first = 8 + len(columns)
        sets += [
            f"{name} = {name} {op} ${first + i}::int"
            for i, (name, op) in enumerate(zip(TRAIL_COLUMNS, "|++", strict=True))
        ]
    sets.append("event_seq = event_seq + 1")
    if starts_attempt:
        sets += ["attempt = attempt + 1", "started_at = COALESCE(started_at, $4::float8)"]
    where = ["operation_id = $1"]
    where.append("status = $2::text" if match_status else "$2::text IS NULL")
    where.append("fence = $3::int" if match_fence else "$3::int IS NULL")
    return f"""
WITH upd AS (
    UPDATE pa_operations SET {", ".join(sets)}
    WHERE {" AND ".join(where)}
    RETURNING {_columns(_OPERATION_COLUMNS)}
), ev AS (
    INSERT INTO pa_operation_events ({_columns(_EVENT_COLUMNS)})
    SELECT operation_id, event_seq, $4::float8, $5::text, COALESCE($2::text, status), status,
           $6::text, $7::text
    FROM upd
)
SELECT upd.* FROM upd
"""


def _event_arrays(rows: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
    return [
        [row[name] for row in rows]
        for name in ("seq", "at", "kind", "from_status", "to_status", "actor", "detail_json")
    ]


class PostgresFastPath:
    """One-statement writes and reads on asyncpg connections of its own (see the module).

    Its connections are a plain stack, not an `asyncpg.Pool`: the ledger already bounds its
    calls on the database (``pool_size`` turns), so a call always finds an idle connection or
    opens one, and the pool's acquire timeout, reset query (a second round trip per write) and
    futures would be overhead only. A connection that fails or whose call was cancelled
    mid-statement is closed, never reused. SQLAlchemy's calls borrow from the same stack
    (`lend`), within their turns too: a connection is opened only when every open one is in
    use, so the ledger never holds more than the calls it runs at once (``pool_size``).

    Args:
        dsn: Where the database is (asyncpg's form).
        url: The URL to name in errors (password hidden).
        max_idle: The most idle connections kept open.
        connect_timeout: How long opening a connection may take.
        check_durability: Refuse a server that runs with ``synchronous_commit`` or ``fsync``
            off (checked on every new connection).
    """

    def __init__(
        self,
        *,
        dsn: str,
        url: str,
        max_idle: int,
        connect_timeout: float,
        check_durability: bool,
    ) -> None:
        self._dsn = dsn
        self.url = url
        self._max_idle = max_idle
        self._connect_timeout = connect_timeout
        self._check_durability = check_durability
        self._idle: list[asyncpg.Connection] = []
        self._closed = False

    async def open(self) -> None:
        """Open a first connection: a server that cannot be reached or is unsafe is refused."""
        self._idle.append(await guard_database_errors(self._connect(), url=self.url))

    async def close(self) -> None:
        """Close every idle connection (calls under way close theirs when they end)."""
        self._closed = True
        idle, self._idle = self._idle, []
        for conn in idle:
            await close_connection(conn, within_secs=self._connect_timeout)

    async def _connect(self) -> asyncpg.Connection:
        conn: asyncpg.Connection = await asyncpg.connect(
            self._dsn, timeout=self._connect_timeout, connection_class=LedgerConnection
        )
        if self._check_durability:
            try:
                for name in ("synchronous_commit", "fsync"):
                    value = str(await conn.fetchval(f"SHOW {name}")).lower()
                    if value == "off":
                        raise LedgerConfigurationError(
                            f"PostgreSQL runs with {name}=off: a committed operation could be "
                            "lost on a crash. Turn it on, or pass allow_unsafe_postgres=True "
                            "(--allow-unsafe-postgres) if you accept that"
                        )
            except BaseException:
                conn.terminate()
                raise
        return conn

    async def _call(
        self,
        method: Callable[..., Awaitable[T]],
        sql: str,
        params: Sequence[Any],
        *,
        read: bool = False,
    ) -> T:
        """Run ``method(conn, sql, *params)`` on an idle connection (or a new one).

        ``method``: ``asyncpg.Connection.fetchrow`` or ``fetchval``. A lost connection means
        the server's others are likely lost too (a restart, a failover): the idle ones are
        dropped with it. A read found a lost connection is tried once more on a new one; a
        write never is (it may have been sent and committed: the caller learns the ledger
        failed, and the runtime treats the write as not known). Database failures become
        ledger errors (`as_ledger_error`), in this one coroutine: it is on every statement.
        """
        if self._closed:
            raise LedgerUnavailable("the ledger is closed")
        try:
            for attempt in (1, 2):
                conn = self._idle.pop() if self._idle else await self._connect()
                try:
                    result = await method(conn, sql, *params)
                except (*_CONNECTION_ERRORS, asyncpg.PostgresError) as exc:
                    # The server refused the statement (the connection is fine: a statement
                    # that fails outside a transaction leaves none open), or it was lost.
                    lost = conn.is_closed() or not isinstance(exc, asyncpg.PostgresError)
                    if lost:
                        conn.terminate()
                        self._drop_idle()
                        if read and attempt == 1:
                            continue
                    else:
                        self._release(conn)
                    raise
                except BaseException:
                    conn.terminate()  # cancelled mid-statement: never reused
                    raise
                self._release(conn)
                return result
        except Exception as exc:
            mapped = as_ledger_error(exc, url=self.url)
            if mapped is exc:
                raise
            raise mapped from exc
        raise AssertionError("unreachable")  # pragma: no cover

    async def lend(self) -> asyncpg.Connection:
        """An idle connection (or a new one) for SQLAlchemy, back on the stack when it closes it.

        The engine's ``async_creator``: SQLAlchemy's calls hold a turn of the ledger as the
        hot path's do, so they open no connection beyond the budget.
        """
        if self._closed:
            raise LedgerUnavailable("the ledger is closed")
        conn = self._idle.pop() if self._idle else await self._connect()
        if isinstance(conn, LedgerConnection):
            conn._lent_by = self
        return conn

    def given_back(self, conn: asyncpg.Connection) -> None:
        """Take back a connection `lend` gave out (see `LedgerConnection.close`)."""
        self._release(conn)

    def _drop_idle(self) -> None:
        idle, self._idle = self._idle, []
        for conn in idle:
            conn.terminate()

    def _release(self, conn: asyncpg.Connection) -> None:
        if self._closed or conn.is_closed() or len(self._idle) >= self._max_idle:
            conn.terminate()
        else:
            self._idle.append(conn)

    # --- writes ----------------------------------------------------------------------------

    async def insert(
        self, row: Mapping[str, Any], event_arrays: list[list[Any]], *, bind_key: bool
    ) -> bool:
        """Insert ``row`` and its creation events; return False if its key was taken.

        ``event_arrays``: the events column by column (`_rows.creation_arrays`).
        ``bind_key``: the row binds its idempotency key (an admit): a taken key inserts
        nothing. Otherwise every conflict is an error.
        """
        params = [row[name] for name in _OPERATION_COLUMNS]
        params += event_arrays
        sql = _ADMIT if bind_key else _INSERT

        inserted: int = await self._call(asyncpg.Connection.fetchval, sql, params)
        return inserted == 1

    async def update(self, change: RowUpdate) -> asyncpg.Record | None:
        """Run ``change`` (one statement); the updated row, or None when nothing matched."""
        audit, marks = change.audit, change.audit.marks
        columns, firsts, bound = change.binding()
        has_marks = marks is not NO_MARKS and bool(marks)
        sql = update_sql(
            columns,
            starts_attempt=audit.starts_attempt,
            match_status=change.expected is not None,
            match_fence=change.fence is not None,
            marks=has_marks,
            firsts=firsts,
        )
        params = [change.operation_id, change.expected, change.fence, change.now]
        params += [_KIND_TEXT[audit.kind], audit.actor, audit.detail_json]
        params += bound
        if has_marks:
            params += [marks.marks, marks.joined_calls, marks.reconcile_errors]
        # `_call` itself rather than `_fetchrow`: a coroutine layer less on every transition.
        row: asyncpg.Record | None = await self._call(asyncpg.Connection.fetchrow, sql, params)
        return row

    async def execute(self, sql: str, *params: Any) -> None:
        """Run a statement whose result is not read (the notifier's batches), never again."""
        await self._call(asyncpg.Connection.execute, sql, params)

    # --- reads -----------------------------------------------------------------------------

    async def get(self, operation_id: str) -> asyncpg.Record | None:
        """The row of ``operation_id``, or None."""
        return await self._fetchrow(_GET, operation_id)

    async def by_slot(self, tenant: str, key_slot: str) -> asyncpg.Record | None:
        """The row holding ``key_slot`` for ``tenant``, or None."""
        return await self._fetchrow(_BY_SLOT, tenant, key_slot)

    async def status_and_fence(self, operation_id: str) -> asyncpg.Record | None:
        """``(status, fence)`` of ``operation_id``, or None (why an update matched nothing)."""
        return await self._fetchrow(_STATUS_AND_FENCE, operation_id)

    async def _fetchrow(self, sql: str, *params: Any, read: bool = True) -> asyncpg.Record | None:
        row: asyncpg.Record | None = await self._call(
            asyncpg.Connection.fetchrow, sql, params, read=read
        )
        return row
