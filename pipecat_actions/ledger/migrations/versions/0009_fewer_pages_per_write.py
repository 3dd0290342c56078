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

No table is rebuilt: no operation or event is touched. ``bench/index_plans.py`` prints the plan
of the query that reads it.

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


def downgrade() -> None:
    op.drop_index("ix_pa_operations_undelivered", table_name="pa_operations")
    op.create_index("ix_pa_operations_undelivered", "pa_operations", _OLD_UNDELIVERED)
