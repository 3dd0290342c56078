"""What is owed and never told in a partial index: no page of it written until an operation
commits untold.

Issue 34 counts the SQLite WAL frames a ``propose`` writes: every index entry an insert adds is
a page, and every entry a change moves is up to two (the page it leaves and the page it
enters). ``ix_pa_operations_undelivered`` (status, delivered_at, kind, created_at,
operation_id) held every operation: a page at the insert, and a move at every change of status
and at the telling. Its one query (`undelivered`: recovery, the console, ``pipecat-actions
undelivered``) asks for the operations committed, owed and never told, in (created_at,
operation_id) order. It is now a partial index of (created_at, operation_id) over exactly
those rows (``status = 'COMMITTED' AND delivered_at IS NULL AND kind = 'mutation'``, the terms
the query names, see ``schema.UNDELIVERED_WHERE``): an operation enters it when it commits
untold, leaves it when told, and no other write touches it. Both backends.

On SQLite, ``ix_pa_operations_stats`` (what `stats` reads, led by what it groups by) had the
operation's created_at and id near its end, after attempt, delivered_at and the rest: telling
an operation moved its entry to another place in its group (two pages). Now (created_at,
operation_id) follow the five columns grouped by, so that only a change of status or trail
marks moves the entry; the telling, an escalation, a joined call rewrite it where it is.
`stats` still reads it in its GROUP BY order, without a sort.

No table is rebuilt: no operation or event is touched. ``bench/index_plans.py`` prints the plan
of each query that reads these indexes.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-07
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_UNDELIVERED_WHERE = "status = 'COMMITTED' AND delivered_at IS NULL AND kind = 'mutation'"
_OLD_UNDELIVERED = ["status", "delivered_at", "kind", "created_at", "operation_id"]
_GROUPED = ["tool", "tenant", "status", "trail_marks", "refusal_reason"]
_READ = [
    "attempt",
    "joined_calls",
    "reconcile_errors",
    "escalated_at",
    "compensates",
    "delivered_at",
    "kind",
]
_TIMES = ["sent_at", "committed_at", "acknowledged_at"]
_STATS = [*_GROUPED, "created_at", "operation_id", *_READ, *_TIMES]
_OLD_STATS = [*_GROUPED, *_READ, "created_at", *_TIMES, "operation_id"]  # as 0008 left it


def upgrade() -> None:
    op.drop_index("ix_pa_operations_undelivered", table_name="pa_operations")
    where = sa.text(_UNDELIVERED_WHERE)
    op.create_index(
        "ix_pa_operations_undelivered",
        "pa_operations",
        ["created_at", "operation_id"],
        sqlite_where=where,
        postgresql_where=where,
    )
    _stats(_STATS)


def downgrade() -> None:
    op.drop_index("ix_pa_operations_undelivered", table_name="pa_operations")
    op.create_index("ix_pa_operations_undelivered", "pa_operations", _OLD_UNDELIVERED)
    _stats(_OLD_STATS)


def _stats(columns: list[str]) -> None:
    if op.get_bind().dialect.name == "sqlite":  # SQLite only (see the index in `schema`)
        op.drop_index("ix_pa_operations_stats", table_name="pa_operations")
        op.create_index("ix_pa_operations_stats", "pa_operations", columns)
