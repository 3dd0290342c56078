"""Operations and their audit events.

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "pa_operations",
        sa.Column("operation_id", sa.String(64), primary_key=True),
        sa.Column("tenant", sa.String(128), nullable=False),
        sa.Column("session_id", sa.String(128), nullable=False),
        sa.Column("principal", sa.String(256), nullable=False),
        sa.Column("tool", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("args_json", sa.Text, nullable=False),
        sa.Column("args_hash", sa.String(64), nullable=False),
        sa.Column("idempotency_key", sa.String(512), nullable=False),
        sa.Column("key_slot", sa.String(512), nullable=True),
        sa.Column("key_expires_at", sa.Double, nullable=False),
        sa.Column("resource_key", sa.String(512), nullable=True),
        sa.Column("turn_id", sa.String(64), nullable=True),
        sa.Column("provider_call_id", sa.String(128), nullable=True),
        sa.Column("model_response_id", sa.String(128), nullable=True),
        sa.Column("rationale", sa.Text, nullable=True),
        sa.Column("agent", sa.String(128), nullable=True),
        sa.Column("delivered_agent", sa.String(128), nullable=True),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("attempt", sa.Integer, nullable=False),
        sa.Column("result_json", sa.Text, nullable=True),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("before_state_json", sa.Text, nullable=True),
        sa.Column(
            "compensates",
            sa.String(64),
            sa.ForeignKey("pa_operations.operation_id"),
            nullable=True,
        ),
        sa.Column("deadline_at", sa.Double, nullable=True),
        sa.Column("lease_owner", sa.String(128), nullable=True),
        sa.Column("lease_expires_at", sa.Double, nullable=True),
        sa.Column("fence", sa.Integer, nullable=False),
        sa.Column("event_seq", sa.Integer, nullable=False),
        sa.Column("escalated_at", sa.Double, nullable=True),
        sa.Column("created_at", sa.Double, nullable=False),
        sa.Column("updated_at", sa.Double, nullable=False),
        sa.Column("admitted_at", sa.Double, nullable=True),
        sa.Column("started_at", sa.Double, nullable=True),
        sa.Column("sent_at", sa.Double, nullable=True),
        sa.Column("committed_at", sa.Double, nullable=True),
        sa.Column("finished_at", sa.Double, nullable=True),
        sa.Column("delivered_at", sa.Double, nullable=True),
        sa.Column("acknowledged_at", sa.Double, nullable=True),
        sa.UniqueConstraint("tenant", "key_slot", name="uq_pa_operations_key_slot"),
    )
    op.create_index("ix_pa_operations_key", "pa_operations", ["tenant", "idempotency_key"])
    op.create_index(
        "ix_pa_operations_status_lease", "pa_operations", ["status", "lease_expires_at"]
    )
    op.create_index("ix_pa_operations_session", "pa_operations", ["session_id", "created_at"])
    op.create_index("ix_pa_operations_tool_created", "pa_operations", ["tool", "created_at"])
    op.create_index("ix_pa_operations_resource", "pa_operations", ["tenant", "resource_key"])
    op.create_table(
        "pa_operation_events",
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
    )


def downgrade() -> None:
    op.drop_table("pa_operation_events")
    op.drop_table("pa_operations")
