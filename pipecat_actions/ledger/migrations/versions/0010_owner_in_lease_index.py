"""The heartbeat reads its owner's own open operations, not every open one: the lease owner
joins ``ix_pa_operations_status_lease`` as its second column.

Issue 34's ledger at 10M operations: a runtime's heartbeat (`renew_lease`, every
``lease_secs / 3``) updates ``WHERE lease_owner = :me AND status IN (non-terminal)``. With the
index on (status, lease_expires_at) it found every non-terminal row and read each one's owner
from the table: at 1M operations 10,046 pages per beat to filter out 10,000 UNKNOWN rows that
are not its own, about 100,000 random reads at 10M. On (status, lease_owner,
lease_expires_at) it seeks (status, owner) once per open status: the pages of its own rows.

The index keeps one entry per row, as before: a row's insert writes the same one page, and a
change of status or of lease moves the entry as it did (a claim changes the owner and the
lease together). Its other readers keep it: a status's rows (the console, approvals), the
stale leases ``claim_stale`` takes over, and the lease holders (``gone_owners``), which now
read the owner from the index itself. ``bench/index_plans.py`` prints their plans;
``bench/heartbeat_plans.py`` the heartbeat's and recovery's before and after this migration.

No table is rebuilt; the index is made again from the rows.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-07
"""

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_INDEX = "ix_pa_operations_status_lease"
_COLUMNS = ["status", "lease_owner", "lease_expires_at"]
_OLD_COLUMNS = ["status", "lease_expires_at"]  # as 0001 made it


def upgrade() -> None:
    op.drop_index(_INDEX, table_name="pa_operations")
    op.create_index(_INDEX, "pa_operations", _COLUMNS)


def downgrade() -> None:
    op.drop_index(_INDEX, table_name="pa_operations")
    op.create_index(_INDEX, "pa_operations", _OLD_COLUMNS)
