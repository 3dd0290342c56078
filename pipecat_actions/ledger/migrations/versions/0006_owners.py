"""The owners of leases, so that a dead owner's leases are taken over at once.

A runtime registers in ``pa_owners`` while it lives and holds a lock for as long as it lives
(a PostgreSQL session advisory lock; on SQLite, a lock on a file beside the ledger). Another
runtime that finds a registered owner's lock free knows that owner is gone and takes over its
operations at once; the lease running out stays the last line.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-07
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "pa_owners",
        sa.Column("owner", sa.String(128), primary_key=True),
        sa.Column("life_key", sa.BigInteger, nullable=False),
        sa.Column("started_at", sa.Double, nullable=False),
        sa.Column("host", sa.String(256), nullable=True),
        sa.Column("pid", sa.Integer, nullable=True),
    )


def downgrade() -> None:
    op.drop_table("pa_owners")
