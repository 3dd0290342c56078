"""What each operation's audit trail says, on its row; on SQLite, a covering index for `stats`.

`stats` read every operation's audit events; now each write folds what its event says into
``trail_marks``, ``joined_calls`` and ``reconcile_errors`` (see `pipecat_actions.ledger._trail`),
an operation created refused or waiting for a person keeps its creation's reason in
``refusal_reason``, and on SQLite ``ix_pa_operations_stats`` holds every column `stats` reads,
in the order it groups them. The upgrade fills the columns in from the events already
recorded: only the events that can say something are read (a wider test than the writers'),
and the rows are updated in batches.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from collections import defaultdict

import sqlalchemy as sa
from alembic import op

from pipecat_actions.ledger._rows import refusal_reason
from pipecat_actions.ledger._trail import TrailMarks

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_COLUMNS = ("trail_marks", "joined_calls", "reconcile_errors")
_STATS_INDEX = (
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
)
_BATCH = 5_000


def upgrade() -> None:
    for name in _COLUMNS:
        op.add_column(
            "pa_operations", sa.Column(name, sa.Integer, nullable=False, server_default="0")
        )
    op.add_column("pa_operations", sa.Column("refusal_reason", sa.Text, nullable=True))
    _fill_in_from_events()
    _fill_in_refusal_reasons()
    if op.get_bind().dialect.name == "sqlite":  # see the index in `schema`
        op.create_index("ix_pa_operations_stats", "pa_operations", list(_STATS_INDEX))


def _fill_in_from_events() -> None:
    conn = op.get_bind()
    markers = ("duplicate", "timed_out", '"late":true', "handoff_to", "reconcile")
    likes = " OR ".join(f"detail_json LIKE :m{i}" for i in range(len(markers)))
    candidates = conn.execute(
        sa.text(
            "SELECT operation_id, from_status, to_status, actor, detail_json "
            "FROM pa_operation_events WHERE actor = 'watchdog' "
            "OR to_status IN ('UNKNOWN', 'CANCEL_REQUESTED', 'CANCELLED') "
            f"OR {likes}"
        ),
        {f"m{i}": f"%{marker}%" for i, marker in enumerate(markers)},
    ).mappings()
    per_operation: dict[str, TrailMarks] = defaultdict(TrailMarks)
    for event in candidates:
        per_operation[event["operation_id"]] |= TrailMarks.of_trail([event])
    update = sa.text(
        "UPDATE pa_operations SET trail_marks = :trail_marks, joined_calls = :joined_calls, "
        "reconcile_errors = :reconcile_errors WHERE operation_id = :operation_id"
    )
    rows = [{"operation_id": k, **v.columns()} for k, v in per_operation.items() if v]
    for start in range(0, len(rows), _BATCH):
        conn.execute(update, rows[start : start + _BATCH])


def _fill_in_refusal_reasons() -> None:
    conn = op.get_bind()
    firsts = conn.execute(
        sa.text(
            "SELECT o.operation_id, e.detail_json FROM pa_operations o "
            "JOIN pa_operation_events e ON e.operation_id = o.operation_id AND e.seq = 1 "
            "WHERE o.status IN ('REJECTED', 'AWAITING_CONFIRMATION', 'AWAITING_APPROVAL')"
        )
    )
    rows = [
        {"operation_id": operation_id, "reason": reason}
        for operation_id, detail_json in firsts
        if (reason := refusal_reason(detail_json)) is not None
    ]
    update = sa.text(
        "UPDATE pa_operations SET refusal_reason = :reason WHERE operation_id = :operation_id"
    )
    for start in range(0, len(rows), _BATCH):
        conn.execute(update, rows[start : start + _BATCH])


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        op.drop_index("ix_pa_operations_stats", table_name="pa_operations")
    op.drop_column("pa_operations", "refusal_reason")
    for name in reversed(_COLUMNS):
        op.drop_column("pa_operations", name)
