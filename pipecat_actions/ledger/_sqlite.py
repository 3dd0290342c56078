"""The hot path of a SQLite ledger: its writes as plain ``sqlite3`` statements in the writer.

The writer thread (`_writer.SqliteWriter`) runs each write inside its group's transaction on
one connection. Measured on ``055ff8b``, SQLAlchemy's execution of a prebuilt statement (its
compiled-cache look-up, parameter processing and result rows) cost more than the statement
itself: the ledger's admit was 1.45x a raw aiosqlite insert+commit, of which the SQL replayed
raw was 0.9x. Here the writes on a call's critical path (a new operation, a transition, an
annotation) run as the same SQL through the driver's own cursor, in the same transaction.
SQLAlchemy keeps the schema, the migrations, the reads and every rarer write.
"""

from __future__ import annotations

__all__ = ["insert", "update"]

import sqlite3
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

from sqlalchemy import Connection

from pipecat_actions.ledger._rows import RowUpdate
from pipecat_actions.ledger._trail import NO_MARKS, TRAIL_COLUMNS
from pipecat_actions.ledger.schema import events, operations

_OPERATION_COLUMNS = tuple(c.name for c in operations.c)
_EVENT_COLUMNS = tuple(c.name for c in events.c)
_COLUMNS = ", ".join(_OPERATION_COLUMNS)

_ADMIT = (
    f"INSERT INTO pa_operations ({_COLUMNS}) VALUES ({', '.join('?' * len(_OPERATION_COLUMNS))}) "
    "ON CONFLICT (tenant, key_slot) DO NOTHING RETURNING operation_id"
)
_INSERT = (
    f"INSERT INTO pa_operations ({_COLUMNS}) VALUES ({', '.join('?' * len(_OPERATION_COLUMNS))})"
)
_EVENT = (
    f"INSERT INTO pa_operation_events ({', '.join(_EVENT_COLUMNS)}) "
    f"VALUES ({', '.join('?' * len(_EVENT_COLUMNS))})"
)


def _driver(conn: Connection) -> sqlite3.Connection:
    raw = conn.connection.driver_connection
    assert isinstance(raw, sqlite3.Connection)
    return raw


def insert(
    conn: Connection,
    row: Mapping[str, Any],
    events_rows: Sequence[Mapping[str, Any]],
    *,
    bind_key: bool,
) -> bool:
    """Insert ``row`` and its creation events; False (nothing written) if its key was taken.

    ``bind_key``: the row binds its idempotency key (an admit). Otherwise every conflict is an
    error.
    """
    raw = _driver(conn)
    values = [row[name] for name in _OPERATION_COLUMNS]
    if bind_key:
        if raw.execute(_ADMIT, values).fetchone() is None:
            return False
    else:
        raw.execute(_INSERT, values)
    if events_rows:
        # One statement for the whole trail (a mutation is created with two events).
        raw.execute(
            _events_sql(len(events_rows)),
            [event[name] for event in events_rows for name in _EVENT_COLUMNS],
        )
    return True


@lru_cache(maxsize=16)
def _events_sql(count: int) -> str:
    """An insert of ``count`` events in one statement."""
    row = f"({', '.join('?' * len(_EVENT_COLUMNS))})"
    return f"INSERT INTO pa_operation_events ({', '.join(_EVENT_COLUMNS)}) VALUES " + ", ".join(
        [row] * count
    )


@lru_cache(maxsize=512)
def _update_sql(
    columns: tuple[str, ...],
    *,
    starts_attempt: bool,
    match_status: bool,
    match_fence: bool,
    marks: bool,
    firsts: tuple[str, ...] = (),
) -> str:
    sets = [
        f"{column} = COALESCE({column}, ?)" if column in firsts else f"{column} = ?"
        for column in columns
    ]
    if marks:
        sets += [f"{name} = {name} {op} ?" for name, op in zip(TRAIL_COLUMNS, "|++", strict=True)]
    sets.append("event_seq = event_seq + 1")
    if starts_attempt:
        sets += ["attempt = attempt + 1", "started_at = COALESCE(started_at, ?)"]
    where = ["operation_id = ?"]
    if match_status:
        where.append("status = ?")
    if match_fence:
        where.append("fence = ?")
    return (
        f"UPDATE pa_operations SET {', '.join(sets)} WHERE {' AND '.join(where)} "
        f"RETURNING {_COLUMNS}"
    )


def update(conn: Connection, change: RowUpdate) -> dict[str, Any] | None:
    """Run ``change`` in ``conn``'s transaction; the operation's new row, or None if no match."""
    raw = _driver(conn)
    audit, marks = change.audit, change.audit.marks
    columns, firsts, params = change.binding()
    has_marks = marks is not NO_MARKS and bool(marks)
    sql = _update_sql(
        columns,
        starts_attempt=audit.starts_attempt,
        match_status=change.expected is not None,
        match_fence=change.fence is not None,
        marks=has_marks,
        firsts=firsts,
    )
    if has_marks:
        params += [marks.marks, marks.joined_calls, marks.reconcile_errors]
    if audit.starts_attempt:
        params.append(change.now)
    params.append(change.operation_id)
    if change.expected is not None:
        params.append(change.expected)
    if change.fence is not None:
        params.append(change.fence)
    found = raw.execute(sql, params).fetchone()
    if found is None:
        return None
    row = dict(zip(_OPERATION_COLUMNS, found, strict=True))
    status = row["status"]
    raw.execute(
        _EVENT,
        (
            change.operation_id,
            row["event_seq"],
            change.now,
            audit.kind.value,
            change.expected or status,
            status,
            audit.actor,
            audit.detail_json,
        ),
    )
    return row
