"""`stats` and two pages of `ledger list` at 10M operations without reading the table.

Issue 34's ledger at 10M operations on PostgreSQL: `stats` read the 4 GB table twice (28 s),
``ledger list --conflicts`` walked the created index past 1.3M rows (808 ms) and
``--tool refund --status UNKNOWN`` read every refund to find none (4.1 s).

* ``pa_operation_counts`` and ``pa_operation_deltas``: what `stats` counts, per group (tool,
  tenant, hour of creation, status, trail marks, refusal reason). On PostgreSQL a trigger
  appends each insert's and each counted change's delta in the writer's transaction and
  `stats` folds them into the counts, then sums a few thousand rows (see `_counts`); the
  groups of the rows already there are counted here. On SQLite the tables stay empty and no
  trigger is made (its covering index answers `stats`; a trigger would add WAL to each write).
* ``ix_pa_operations_conflicts`` (both): the conflicts alone, in page order.
* ``ix_pa_operations_tool_open`` (PostgreSQL): a tool's open rows by status, in page order.
* ``ix_pa_operations_spread_sample`` (PostgreSQL): the 1 in 16 operations whose ids end in 0,
  with the columns of the spreads' pass, read by an index-only scan.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-07
"""

from typing import Any

import sqlalchemy as sa
from alembic import op

from pipecat_actions.ledger._counts import BACKFILL, TRIGGERS, UNTRIGGER
from pipecat_actions.ledger.schema import (
    CONFLICTS_INDEX,
    CONFLICTS_WHERE,
    COUNTED_FIGURES,
    COUNTED_GROUP,
    OPEN_STATUSES_WHERE,
)

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def _columns() -> list[sa.Column[Any]]:
    return [
        sa.Column("tool", sa.String(64), nullable=False),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("hour", sa.BigInteger, nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("trail_marks", sa.Integer, nullable=False),
        sa.Column("refusal_reason", sa.Text, nullable=False),
        *(
            sa.Column(f, sa.Double, nullable=True)
            if f.endswith("_max")
            else sa.Column(f, sa.BigInteger, nullable=False)
            for f in COUNTED_FIGURES
        ),
    ]


def upgrade() -> None:
    postgres = op.get_bind().dialect.name == "postgresql"
    op.create_table(
        "pa_operation_counts",
        *_columns(),
        sa.UniqueConstraint(*COUNTED_GROUP, name="uq_pa_operation_counts_group"),
    )
    op.create_table("pa_operation_deltas", *_columns())
    where = sa.text(CONFLICTS_WHERE)
    op.create_index(
        CONFLICTS_INDEX,
        "pa_operations",
        ["created_at", "operation_id"],
        sqlite_where=where,
        postgresql_where=where,
    )
    if not postgres:
        return
    op.create_index(
        "ix_pa_operations_tool_open",
        "pa_operations",
        ["tool", "status", "created_at", "operation_id"],
        postgresql_where=sa.text(OPEN_STATUSES_WHERE),
    )
    op.create_index(
        "ix_pa_operations_spread_sample",
        "pa_operations",
        ["tool", "tenant", "created_at"],
        postgresql_include=["operation_id", "sent_at", "committed_at", "acknowledged_at"],
        postgresql_where=sa.text("operation_id LIKE '%0'"),
    )
    # The trigger first, in this transaction: the table is locked against writes (CREATE
    # TRIGGER) until it commits, so no row changes between the trigger and the count.
    for statement in TRIGGERS:
        op.execute(statement)
    op.execute(BACKFILL)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        for statement in UNTRIGGER:
            op.execute(statement)
        op.drop_index("ix_pa_operations_spread_sample", table_name="pa_operations")
        op.drop_index("ix_pa_operations_tool_open", table_name="pa_operations")
    op.drop_index(CONFLICTS_INDEX, table_name="pa_operations")
    op.drop_table("pa_operation_deltas")
    op.drop_table("pa_operation_counts")
