"""`PostgresLedger`: the SQL ledger on a PostgreSQL database.

The hot path (admit with a free key, transition, annotate, get, find_by_key) is one statement
each on asyncpg connections of the ledger's own (`_postgres.PostgresFastPath`); every other
write is a plain function of a SQLAlchemy `Connection`, run on the async engine through
``run_sync`` in a transaction of its own. Each write runs in a task of its own that a
cancelled caller leaves running (`PostgresLedger._handed_over`): `close` waits for it; a
hot-path write of a sheltered task (`pipecat_actions._shelter`, whose cancel waits for the
write) runs in that task itself, and `close` waits for it too. At most
half of the pool's turns go to reads (DBOS caps its polling reads the same way). Waiters of
other processes hear a settling write through ``LISTEN``/``NOTIFY`` (`_notices`): once the
write has committed, its notice goes to the ledger's `PostgresNotifier`, which sends notices in
batches in a turn of their own (never in the write's transaction: see `_notices`).

The connection budget: the hot path, SQLAlchemy's engine (which borrows the hot path's
connections, `PostgresFastPath.lend`) and the notifier's batches share one set of connections,
opened only when every open one is in use, so a ledger holds at most ``pool_size`` of them.
Besides those, a runtime's life lock holds one (`_life.PostgresLife`, one per owner) and the
listener one (`_notices.PostgresNotices`, opened once a caller waits for an operation).

This module, and asyncpg with it, is imported for PostgreSQL ledgers only.
"""

from __future__ import annotations

import builtins

__all__ = ["PostgresLedger"]

import asyncio
from collections.abc import Callable, Collection, Coroutine
from typing import Any, TypeVar

import asyncpg
from loguru import logger
from sqlalchemy import Connection, Select, select
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.engine import URL
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncEngine

from pipecat_actions._shelter import sheltered
from pipecat_actions.clock import Clock
from pipecat_actions.errors import LedgerError, LedgerUnavailable
from pipecat_actions.ledger import _owners
from pipecat_actions.ledger._counts import FOLD
from pipecat_actions.ledger._life import Life, PostgresLife
from pipecat_actions.ledger._notices import PostgresNotices, PostgresNotifier
from pipecat_actions.ledger._opening import postgres_unreachable
from pipecat_actions.ledger._postgres import PostgresFastPath, asyncpg_dsn
from pipecat_actions.ledger._rows import (
    EncodedOperation,
    RowUpdate,
    creation_arrays,
    new_row,
    operation_from_row,
)
from pipecat_actions.ledger._writer import Work, run_postgres_write
from pipecat_actions.ledger.engine import LedgerSettings, create_engine_for, redact_url
from pipecat_actions.ledger.records import AdmitResult, NewOperation, Operation, OperationFilter
from pipecat_actions.ledger.schema import operations
from pipecat_actions.ledger.sql import Change, SqlLedger, refusal
from pipecat_actions.status import ActionStatus

T = TypeVar("T")


def _fold(conn: Connection) -> None:
    """Fold `_counts`' deltas, unless another process is folding them now."""
    if conn.exec_driver_sql(f"SELECT pg_try_advisory_xact_lock({_FOLD_LOCK})").scalar():
        conn.exec_driver_sql(FOLD)


_FOLD_LOCK = 7243510932
"""An advisory lock key of the ledger's own (`migrate` holds 7243510931 while it migrates)."""


class PostgresLedger(SqlLedger):
    """`SqlLedger` on PostgreSQL: see the module docstring. Opened by `SqlLedger.create`."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        url: str,
        clock: Clock,
        settings: LedgerSettings,
        fast: PostgresFastPath,
        notices: PostgresNotices,
        life: PostgresLife | None,
        read_only: bool = False,
    ) -> None:
        super().__init__(
            engine,
            url=url,
            clock=clock,
            settings=settings,
            sqlite=False,
            read_turns=max(1, settings.pool_size // 2),
            notices=notices,
            life=life,
            read_only=read_only,
        )
        self._fast = fast
        self._notifier = PostgresNotifier(
            url=url, connect_timeout=settings.connect_timeout_secs, execute=self._send_notices
        )
        self._postgres_life = life
        self._insert_operation = (
            postgresql_insert(operations)
            .on_conflict_do_nothing(index_elements=["tenant", "key_slot"])
            .returning(operations.c.operation_id)
        )
        self._in_flight: set[asyncio.Future[Any]] = set()
        """Writes handed to the database and not yet answered (`_handed_over`)."""
        self._sheltered_writes = 0
        """Writes sheltered tasks make themselves (`_fast_write`), not yet answered."""
        self._sheltered_done: asyncio.Event | None = None
        """Set when the last of them is answered, once `close` waits for them."""

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
    ) -> PostgresLedger:
        url = redact_url(parsed)
        dsn = asyncpg_dsn(parsed)
        fast = PostgresFastPath(
            dsn=dsn,
            url=url,
            max_idle=settings.pool_size,
            connect_timeout=settings.connect_timeout_secs,
            check_durability=not settings.allow_unsafe_postgres,
        )
        ledger = cls(
            create_engine_for(parsed, settings, borrow=fast.lend),
            url=url,
            clock=clock,
            settings=settings,
            fast=fast,
            notices=PostgresNotices(dsn=dsn, url=url),
            life=None
            if read_only
            else PostgresLife(dsn=dsn, url=url, connect_timeout=settings.connect_timeout_secs),
            read_only=read_only,
        )
        try:
            await ledger._started(create_schema=create_schema, check_schema=check_schema)
        except LedgerUnavailable as exc:
            cause = exc.__cause__
            if cause is not None:
                said = postgres_unreachable(
                    cause, parsed, timeout_secs=settings.connect_timeout_secs
                )
                if said is not None:
                    raise said from cause
            raise
        return ledger

    async def _start(self) -> None:
        await self._fast.open()

    async def _drain(self) -> None:
        if self._in_flight:
            # Handed over before the close: each lands (or fails, and is reported) first.
            await asyncio.wait(set(self._in_flight))
        if self._sheltered_writes:
            # Made by sheltered tasks (`_fast_write`): they land, and their tasks hear how.
            self._sheltered_done = asyncio.Event()
            await self._sheltered_done.wait()
        await self._notifier.close()  # sends the notices of the writes just landed

    async def _release_own(self) -> None:
        await self._fast.close()

    # --- the write and read paths ----------------------------------------------------------

    async def _commit(self, work: Work[T]) -> T:
        return await self._handed_over(
            run_postgres_write(self._engine, work, url=self.url, turn=self._turns)
        )

    async def _fast_write(self, write: Coroutine[Any, Any, T]) -> T:
        """Run a one-statement write once its turn comes.

        A cancelled caller interrupts neither the wait nor the write: it was handed over.
        """
        if self._closed or self._read_only:
            write.close()
            if self._closed:
                raise LedgerUnavailable("the ledger is closed")
            self._refuse_writes()

        shelter = sheltered()
        if shelter is None:

            async def run() -> T:
                async with self._turns:
                    return await write

            return await self._handed_over(run())
        # The runtime's own task, whose cancel waits for this write (`Shelter`): it runs the
        # write itself, no task or shield needed. `close` waits for it all the same.
        shelter.writing()
        self._sheltered_writes += 1
        try:
            async with self._turns:
                return await write
        finally:
            self._sheltered_writes -= 1
            if not self._sheltered_writes and self._sheltered_done is not None:
                self._sheltered_done.set()
            shelter.wrote()

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

    async def _send_notices(self, sql: str, *params: Any) -> None:
        """Run the notifier's batch on the ledger's connections, in a turn of its own."""
        async with self._turns:
            await self._fast.execute(sql, *params)

    async def _fast_read(self, read: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            read.close()
            raise LedgerUnavailable("the ledger is closed")
        try:
            async with self._read_turns, self._turns:
                return await read
        finally:
            read.close()  # a caller cancelled while it waited for a turn never started it

    # --- the hooks of the verbs ------------------------------------------------------------

    async def _admit_at_once(
        self, encoded: EncodedOperation, new: NewOperation
    ) -> AdmitResult | None:
        # One statement when the key is free (nearly always); a taken key is looked at in
        # `admit`'s transaction.
        now = self._clock.now()
        row = new_row(encoded, now, key_slot=new.idempotency_key)
        created = await self._fast_write(
            self._fast.insert(row, creation_arrays(encoded, now), bind_key=True)
        )
        return AdmitResult(operation_from_row(row), created=True) if created else None

    def _insert_new(
        self, conn: Connection, row: dict[str, Any], creation: builtins.list[dict[str, Any]]
    ) -> bool:
        if conn.execute(self._insert_operation, row).first() is None:
            return False
        conn.execute(self._insert_events, creation)
        return True

    async def _insert_unbound(self, encoded: EncodedOperation) -> Operation:
        now = self._clock.now()
        row = new_row(encoded, now, key_slot=None)
        await self._fast_write(
            self._fast.insert(row, creation_arrays(encoded, now), bind_key=False)
        )
        return operation_from_row(row)

    async def _apply(
        self,
        operation_id: str,
        change: Change,
        *,
        expected: ActionStatus | None,
        fence: int | None,
        notify: bool,
    ) -> Operation:
        row_change = change(self._clock.now())
        updated = await self._fast_write(self._updated(row_change, notify=notify))
        if updated is None:
            found = await self._fast_read(self._fast.status_and_fence(operation_id))
            raise refusal(found, operation_id, expected=expected, fence=fence)
        return operation_from_row(updated)

    async def _updated(self, change: RowUpdate, *, notify: bool) -> asyncpg.Record | None:
        """Run ``change``; once it committed, queue its notice (``notify``).

        It runs in the write's own task (`_fast_write`): a caller cancelled meanwhile does not
        keep the notice of a write that committed from being sent.
        """
        updated = await self._fast.update(change)
        if notify and updated is not None:
            self._notifier.send(change.operation_id)
        return updated

    async def _by_id(self, operation_id: str) -> Operation | None:
        found = await self._fast_read(self._fast.get(operation_id))
        return None if found is None else operation_from_row(found)

    async def _by_slot(self, tenant: str, key_slot: str) -> Operation | None:
        found = await self._fast_read(self._fast.by_slot(tenant, key_slot))
        return None if found is None else operation_from_row(found)

    async def _keep_life(self, owner: str) -> None:
        if self._postgres_life is not None:
            await self._postgres_life.keep(owner)

    async def _gone_among(self, life: Life, holders: builtins.list[str]) -> Collection[str]:
        return await self._read(lambda conn: _owners.gone_on_postgres(conn, holders))

    def _status_first_page(
        self, page: Select[Any], f: OperationFilter, where: builtins.list[Any]
    ) -> Select[Any]:
        # The rows to find are given as a materialized CTE, which PostgreSQL plans without the
        # page's order and limit.
        found = select(operations).where(*where).cte("found").prefix_with("MATERIALIZED")
        return select(found).order_by(found.c.created_at, found.c.operation_id).limit(f.limit)

    def _before_statistics(self, conn: Connection) -> None:
        # The deltas the trigger appended since the last fold become their groups' counts,
        # so that `stats` sums a row per group, not one per change (see `_counts`). Not a
        # fact of the ledger, so a ledger opened read-only folds too; a role that may not
        # write leaves them to be summed as they are, which gives the same figures.
        try:
            _fold(conn)
            conn.commit()
        except DBAPIError:
            conn.rollback()

    async def renew_lease(  # noqa: D102 - see Ledger
        self, owner: str, *, lease_secs: float, except_ids: Collection[str] = ()
    ) -> int:
        renewed = await super().renew_lease(owner, lease_secs=lease_secs, except_ids=except_ids)
        # Each heartbeat folds the deltas appended since (see `_counts`), so that they never
        # pile up between two `stats`. Its failure is no failure of the heartbeat: the next
        # one, or `stats`, folds them.
        try:
            await self._write(_fold)
        except LedgerError as exc:
            logger.warning("ledger {}: the counts for stats were not folded: {}", self.url, exc)
        return renewed

    def _in_snapshot(self, conn: Connection, read: Callable[[], T]) -> T:
        conn.execution_options(isolation_level="REPEATABLE READ")
        return read()
