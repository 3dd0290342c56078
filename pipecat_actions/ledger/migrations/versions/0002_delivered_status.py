"""What the conversation was last told about an operation.

`delivered_status` is the status the session's conversation was told last; with
`acknowledged_at` (when that telling was heard to the end) it is what the conversation still
owes the user, durably: an outcome whose status differs from the one told, or one told and not
heard, is owed to the next pipeline of the session.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("pa_operations", sa.Column("delivered_status", sa.String(32), nullable=True))
    # Before this column, an operation was marked delivered once, with the status it had then,
    # which is the one it still has in all but a few cases.
    op.execute("UPDATE pa_operations SET delivered_status = status WHERE delivered_at IS NOT NULL")


def downgrade() -> None:
    with op.batch_alter_table("pa_operations") as batch:
        batch.drop_column("delivered_status")
