"""Indexes for keyset pages of operations in (created_at, operation_id) order.

`ledger list` reads the oldest operations first, `undelivered` the oldest COMMITTED ones never
delivered; with these indexes a page is a range scan of its size, not a sort of the table.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_pa_operations_created", "pa_operations", ["created_at", "operation_id"])
    op.create_index(
        "ix_pa_operations_undelivered",
        "pa_operations",
        ["status", "delivered_at", "created_at", "operation_id"],
    )


def downgrade() -> None:
    op.drop_index("ix_pa_operations_undelivered", table_name="pa_operations")
    op.drop_index("ix_pa_operations_created", table_name="pa_operations")
