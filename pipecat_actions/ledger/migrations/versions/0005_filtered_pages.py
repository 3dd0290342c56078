"""Keyset pages of one session's, tool's or principal's operations, without a sort.

`ledger list --tool/--session/--principal` reads in (created_at, operation_id) order. The
session and tool indexes stopped at created_at, so SQLite sorted every row of the tool to
order equal instants by id (65 ms for a tool's first page at 1M operations), and nothing
indexed a principal (a scan: 190 to 380 ms). Each index now ends in operation_id.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01
"""

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

_PAGES = {
    "ix_pa_operations_session": "session_id",
    "ix_pa_operations_tool_created": "tool",
    "ix_pa_operations_principal": "principal",
}
_BEFORE = {"ix_pa_operations_session": "session_id", "ix_pa_operations_tool_created": "tool"}


def upgrade() -> None:
    for name, column in _PAGES.items():
        if name in _BEFORE:
            op.drop_index(name, table_name="pa_operations")
        op.create_index(name, "pa_operations", [column, "created_at", "operation_id"])


def downgrade() -> None:
    for name in _PAGES:
        op.drop_index(name, table_name="pa_operations")
    for name, column in _BEFORE.items():
        op.create_index(name, "pa_operations", [column, "created_at"])
