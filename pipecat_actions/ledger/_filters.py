"""The SQL conditions of an `OperationFilter`, shared by listing and statistics."""

from __future__ import annotations

__all__ = ["OWED_UNTOLD", "filter_conditions"]

from sqlalchemy import ColumnElement, and_, literal, tuple_

from pipecat_actions.ledger._trail import Mark
from pipecat_actions.ledger.records import OWED_KIND, OperationFilter
from pipecat_actions.ledger.schema import operations
from pipecat_actions.status import ActionStatus

OWED_UNTOLD: ColumnElement[bool] = and_(
    operations.c.delivered_at.is_(None),
    operations.c.kind == literal(OWED_KIND, literal_execute=True),
)
"""Owed to someone (`may_be_owed`) and never told: `OperationFilter.undelivered`, and what
`stats` counts as ``committed_undelivered``. With ``status = 'COMMITTED'`` these are the terms
of the partial ``ix_pa_operations_undelivered`` (`schema.UNDELIVERED_WHERE`); the kind is
written into the SQL, not bound, so that PostgreSQL's generic plans may use it too."""


def filter_conditions(f: OperationFilter) -> list[ColumnElement[bool]]:
    """Return the WHERE conditions on ``pa_operations`` that ``f`` asks for (``limit`` aside)."""
    c = operations.c
    conditions: list[ColumnElement[bool]] = []
    if f.status is not None:
        values = [ActionStatus(s).value for s in f.status]
        # One status is written ``status = '...'``: the term a partial index's condition names
        # (a one-value IN is not one for SQLite's planner).
        conditions.append(
            c.status == literal(values[0], literal_execute=True)
            if len(values) == 1
            else c.status.in_(values)
        )
    for column, value in (
        (c.session_id, f.session_id),
        (c.tool, f.tool),
        (c.tenant, f.tenant),
        (c.principal, f.principal),
        (c.resource_key, f.resource_key),
        (c.lease_owner, f.lease_owner),
    ):
        if value is not None:
            conditions.append(column == value)
    if f.created_from is not None:
        conditions.append(c.created_at >= f.created_from)
    if f.created_before is not None:
        conditions.append(c.created_at < f.created_before)
    if f.undelivered is not None:
        conditions.append(OWED_UNTOLD if f.undelivered else ~OWED_UNTOLD)
    if f.conflicted is not None:
        # Written as ``ix_pa_operations_conflicts``' condition, constants and all: a bound
        # parameter would keep PostgreSQL's generic plan from proving the partial index holds
        # the rows.
        flagged = c.trail_marks.op("&")(
            literal(int(Mark.CONFLICT), literal_execute=True)
        ) != literal(0, literal_execute=True)
        conditions.append(flagged if f.conflicted else ~flagged)
    if f.after is not None:
        # A row-value comparison: both backends read it as a range of the
        # (…, created_at, operation_id) indexes, where an OR of two comparisons is not.
        created_at, operation_id = f.after
        row, cursor = tuple_(c.created_at, c.operation_id), tuple_(created_at, operation_id)
        conditions.append(row < cursor if f.newest_first else row > cursor)
    return conditions
