"""Fewer pages written per mutation: two indexes no query needs dropped; on SQLite, the
audit events stored in their primary key's own B-tree.

Issue 34 counted the SQLite WAL frames a ``propose`` writes (24.6, against 4.3 for the row
inserted then updated in a table without secondary indexes): every index a row change touches
is a page more to write at each of its two commits. ``bench/index_plans.py`` prints the plan
of each query that reads a kept index, on both backends. Dropped:

* ``ix_pa_operations_key`` (tenant, idempotency_key): no query reads it; a key is found
  through ``uq_pa_operations_key_slot`` (tenant, key_slot).
* ``ix_pa_operations_resource`` (tenant, resource_key): the only query of a resource also
  names its session (`Supersession`), which ``ix_pa_operations_session`` finds.

Kept, though an operation's change of status moves its entry: ``ix_pa_operations_status_lease``
(status, lease_expires_at). Without it SQLite's planner reads the whole table for the lease
holders (``gone_owners``), where ``ix_pa_operations_undelivered``'s status prefix is not
selective enough for it.

On SQLite, ``pa_operation_events`` becomes a ``WITHOUT ROWID`` table: its rows live in its
primary key's B-tree (operation_id, seq), so appending an event writes one page, not a page
of the table and one of the key's separate index. Its rows are copied over in one statement.
PostgreSQL's tables are unchanged there (a heap and its primary key, as before).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-07
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_DROPPED = {
    "ix_pa_operations_key": ["tenant", "idempotency_key"],
    "ix_pa_operations_resource": ["tenant", "resource_key"],
}
_EVENT_COLUMNS = "operation_id, seq, at, kind, from_status, to_status, actor, detail_json"


def upgrade() -> None:
    for name in _DROPPED:
        op.drop_index(name, table_name="pa_operations")
    if op.get_bind().dialect.name == "sqlite":
        _rebuild_events(with_rowid=False)


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        _rebuild_events(with_rowid=True)
    for name, columns in _DROPPED.items():
        op.create_index(name, "pa_operations", columns)


def _rebuild_events(*, with_rowid: bool) -> None:
    """Copy the events into a new table (with or without a rowid) that takes their name."""
    op.create_table(
        "pa_operation_events_new",
        sa.Column(
            "operation_id",
            sa.String(64),
            sa.ForeignKey("pa_operations.operation_id"),
            primary_key=True,
        ),
        sa.Column("seq", sa.Integer, primary_key=True, autoincrement=False),
        sa.Column("at", sa.Double, nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("from_status", sa.String(32), nullable=True),
        sa.Column("to_status", sa.String(32), nullable=False),
        sa.Column("actor", sa.String(256), nullable=False),
        sa.Column("detail_json", sa.Text, nullable=True),
        sqlite_with_rowid=with_rowid,
    )
    op.execute(
        f"INSERT INTO pa_operation_events_new ({_EVENT_COLUMNS}) "
        f"SELECT {_EVENT_COLUMNS} FROM pa_operation_events ORDER BY operation_id, seq"
    )
    op.drop_table("pa_operation_events")
    op.rename_table("pa_operation_events_new", "pa_operation_events")
