"""What is owed names its kind: a read is never owed, so the indexes that find what is owed hold
the kind.

Issue 32: reads the caller heard were listed as "committed, never told" by `undelivered`,
`stats` and the console. A read's record is written after its answer and carries no delivery;
nobody is owed it (`pipecat_actions.ledger.records.may_be_owed`). What is owed and never told
is now ``delivered_at IS NULL AND kind = 'mutation'``:

* ``ix_pa_operations_undelivered`` (status, delivered_at, **kind**, created_at, operation_id):
  a page of `undelivered` stays one range of the index in page order, however many reads
  there are;
* on SQLite, ``ix_pa_operations_stats`` holds ``kind`` too, so `stats` still reads its one
  pass from the covering index alone.

The kind of an operation never changes: neither index moves an entry more often than before.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-07
"""

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_UNDELIVERED = ["status", "delivered_at", "created_at", "operation_id"]
_STATS = [
    "tool",
    "tenant",
    "status",
    "trail_marks",
    "refusal_reason",
    "attempt",
    "joined_calls",
    "reconcile_errors",
    "escalated_at",
    "compensates",
    "delivered_at",
    "created_at",
    "sent_at",
    "committed_at",
    "acknowledged_at",
    "operation_id",
]


def _with_kind(columns: list[str], after: str) -> list[str]:
    at = columns.index(after) + 1
    return [*columns[:at], "kind", *columns[at:]]


def _indexes(undelivered: list[str], stats: list[str]) -> None:
    op.drop_index("ix_pa_operations_undelivered", table_name="pa_operations")
    op.create_index("ix_pa_operations_undelivered", "pa_operations", undelivered)
    if op.get_bind().dialect.name == "sqlite":  # see the index in `schema`
        op.drop_index("ix_pa_operations_stats", table_name="pa_operations")
        op.create_index("ix_pa_operations_stats", "pa_operations", stats)


def upgrade() -> None:
    _indexes(_with_kind(_UNDELIVERED, "delivered_at"), _with_kind(_STATS, "delivered_at"))


def downgrade() -> None:
    _indexes(_UNDELIVERED, _STATS)
