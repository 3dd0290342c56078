"""The ledger's tables, as SQLAlchemy Core metadata (the one place the schema is written down).

The Alembic migrations in ``migrations/versions`` create exactly this; a test compares them.

Times are stored as float seconds since the Unix epoch (UTC), read from the ledger's `Clock`,
so a fake clock drives every timestamp and deadline the same way on SQLite and PostgreSQL.
JSON values are stored as canonical JSON text (sorted keys) so hashes and comparisons are
stable across backends.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "CONFLICTS_INDEX",
    "CONFLICTS_WHERE",
    "COUNTED_FIGURES",
    "COUNTED_GROUP",
    "LEASE_COLUMNS",
    "LEASE_INDEX",
    "OPEN_STATUSES_WHERE",
    "STATS_COLUMNS",
    "UNDELIVERED_INDEX",
    "UNDELIVERED_WHERE",
    "counts",
    "deltas",
    "events",
    "metadata",
    "operations",
    "owners",
]

from sqlalchemy import (
    BigInteger,
    Column,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
    text,
)

from pipecat_actions.status import TERMINAL_STATUSES, ActionStatus

metadata = MetaData()

STATS_COLUMNS = (
    "tool",
    "tenant",
    "status",
    "trail_marks",
    "refusal_reason",
    "created_at",
    "operation_id",
    "attempt",
    "joined_calls",
    "reconcile_errors",
    "escalated_at",
    "compensates",
    "delivered_at",
    "kind",
    "sent_at",
    "committed_at",
    "acknowledged_at",
)
"""The columns of ``ix_pa_operations_stats``, in its order: what `stats` groups by, then the
operation's own place (created_at, operation_id), then the rest it reads. A change of a column
after the place (telling, an escalation, a joined call) rewrites the entry where it is, one page;
only a change of status or marks moves it (migration 0009)."""

LEASE_INDEX = "ix_pa_operations_status_lease"
LEASE_COLUMNS = ("status", "lease_owner", "lease_expires_at")
"""``ix_pa_operations_status_lease``'s columns (migration 0010 put the owner second)."""

UNDELIVERED_INDEX = "ix_pa_operations_undelivered"
UNDELIVERED_WHERE = "status = 'COMMITTED' AND delivered_at IS NULL AND kind = 'mutation'"
"""The rows ``ix_pa_operations_undelivered`` holds: committed, owed and never told (the query
repeats these terms, see `_filters.OWED_UNTOLD`, so that both planners use the index)."""

CONFLICTS_INDEX = "ix_pa_operations_conflicts"
CONFLICTS_WHERE = "(trail_marks & 128) <> 0"
"""The rows ``ix_pa_operations_conflicts`` holds: those marked ``Mark.CONFLICT`` (the filter of
``ledger list --conflicts`` repeats the term, see `_filters`)."""
OPEN_STATUSES_WHERE = "status::text = ANY ('{{{}}}'::text[])".format(
    ",".join(s.value for s in ActionStatus if s not in TERMINAL_STATUSES)
)
"""The rows PostgreSQL's ``ix_pa_operations_tool_open`` holds: those not in a terminal status
(an array constant: PostgreSQL shows an IN list back in a form it then reads differently)."""

operations = Table(
    "pa_operations",
    metadata,
    Column("operation_id", String(64), primary_key=True),
    Column("tenant", String(128), nullable=False),
    Column("session_id", String(128), nullable=False),
    Column("principal", String(256), nullable=False),
    Column("tool", String(64), nullable=False),
    Column("kind", String(16), nullable=False),
    Column("args_json", Text, nullable=False),
    Column("args_hash", String(64), nullable=False),
    Column("idempotency_key", String(512), nullable=False),
    # Holds the idempotency key while its retention window is open, NULL once released. The
    # unique constraint on (tenant, key_slot) is what makes concurrent admits of one intent
    # collapse to one row; NULLs never conflict, so released keys can be bound again.
    Column("key_slot", String(512), nullable=True),
    Column("key_expires_at", Double, nullable=False),
    Column("resource_key", String(512), nullable=True),
    Column("turn_id", String(64), nullable=True),
    Column("provider_call_id", String(128), nullable=True),
    Column("model_response_id", String(128), nullable=True),
    Column("rationale", Text, nullable=True),
    Column("agent", String(128), nullable=True),
    Column("delivered_agent", String(128), nullable=True),
    Column("status", String(32), nullable=False),
    Column("attempt", Integer, nullable=False, default=0),
    Column("result_json", Text, nullable=True),
    Column("error", Text, nullable=True),
    Column("before_state_json", Text, nullable=True),
    Column("compensates", String(64), ForeignKey("pa_operations.operation_id"), nullable=True),
    Column("deadline_at", Double, nullable=True),
    Column("lease_owner", String(128), nullable=True),
    Column("lease_expires_at", Double, nullable=True),
    Column("fence", Integer, nullable=False, default=1),
    Column("event_seq", Integer, nullable=False, default=0),
    Column("escalated_at", Double, nullable=True),
    Column("created_at", Double, nullable=False),
    Column("updated_at", Double, nullable=False),
    Column("admitted_at", Double, nullable=True),
    Column("started_at", Double, nullable=True),
    Column("sent_at", Double, nullable=True),
    Column("committed_at", Double, nullable=True),
    Column("finished_at", Double, nullable=True),
    Column("delivered_at", Double, nullable=True),
    Column("acknowledged_at", Double, nullable=True),
    # The status the conversation was told last (see migration 0002).
    Column("delivered_status", String(32), nullable=True),
    # What the operation's audit trail says for `stats`, folded in by every write that appends
    # an event (see `_trail` and migration 0004).
    Column("trail_marks", Integer, nullable=False, default=0, server_default="0"),
    Column("joined_calls", Integer, nullable=False, default=0, server_default="0"),
    Column("reconcile_errors", Integer, nullable=False, default=0, server_default="0"),
    # The reason its creation event gives, kept for an operation created refused or waiting
    # for a person (the reason `stats` counts a refusal under).
    Column("refusal_reason", Text, nullable=True),
    UniqueConstraint("tenant", "key_slot", name="uq_pa_operations_key_slot"),
    # Each index below is a page more to write when a row is inserted (and when a change
    # moves its entry): only those a query plan reads are kept (migration 0007;
    # ``bench/index_plans.py`` prints the plans).
    # A status's rows (operators, approvals), the stale leases `claim_stale` takes over and,
    # with the owner second, one owner's own open operations: the heartbeat (`renew_lease`)
    # seeks (status, owner) for each open status instead of reading every open row's owner
    # from the table (migration 0010). The same one entry per row as before: no page more
    # per write; a change of owner always changes the lease too, so it moved anyway.
    Index(LEASE_INDEX, *LEASE_COLUMNS),
    # A session's, a tool's or a principal's keyset pages: ranges in (created_at,
    # operation_id) order, never a sort of all its rows (migration 0005).
    Index("ix_pa_operations_session", "session_id", "created_at", "operation_id"),
    Index("ix_pa_operations_tool_created", "tool", "created_at", "operation_id"),
    Index("ix_pa_operations_principal", "principal", "created_at", "operation_id"),
    # Keyset pages of `ledger list` in (created_at, operation_id) order (migration 0003).
    Index("ix_pa_operations_created", "created_at", "operation_id"),
    # Keyset pages of what is committed, owed and never told (`undelivered`, recovery, the
    # console), in (created_at, operation_id) order. Partial (migration 0009): an operation
    # enters it when it commits untold and leaves it when told, and no other write touches it
    # (it held every row before, keyed by status: a page at the insert, two at each change of
    # status).
    Index(
        UNDELIVERED_INDEX,
        "created_at",
        "operation_id",
        sqlite_where=text(UNDELIVERED_WHERE),
        # PostgreSQL's copy has the same condition (migration 0009 creates it). Naming it here
        # (`postgresql_where`) would make SQLAlchemy import its PostgreSQL dialect in every
        # process that imports the schema, SQLite commands included (tests/test_cli_startup).
    ),
    # Everything `stats` reads of an operation, grouped as it groups them: on SQLite its one
    # pass is a scan of this index in order, with no sort and no read of the table (without
    # it, a sort of every row or a random read per row: 2 s and more at 1M operations).
    # PostgreSQL's hash aggregate over the table is as fast (1.0-1.2 s at 1M operations, with
    # the index or without), so there the index would only cost writes (migration 0004).
    Index("ix_pa_operations_stats", *STATS_COLUMNS).ddl_if(dialect="sqlite"),
    # `ledger list --conflicts`: only the conflicts (a few in 10,000), so a range read instead
    # of a walk of the created index filtering every row (808 ms at 10M operations); no write
    # but a conflict's own touches it (migration 0011).
    Index(CONFLICTS_INDEX, "created_at", "operation_id", sqlite_where=text(CONFLICTS_WHERE)),
    # PostgreSQL only (migration 0011 creates them with their conditions; see the undelivered
    # index for why they are not named here). `ledger list --tool T --status S` for an open
    # status, rare for T and common overall (4.1 s at 10M: every refund read to find none
    # UNKNOWN): a range of (T, S) in page order, holding only the open rows, so a propose
    # writes one entry at its insert and none when it settles. SQLite's WAL would pay for the
    # entry's removal too; it keeps the status-first probe (`sql._status_first`).
    Index("ix_pa_operations_tool_open", "tool", "status", "created_at", "operation_id").ddl_if(
        dialect="postgresql"
    ),
    # The spreads' sample of `stats` (operation ids ending in 0: 1 in 16 rows; the sample of
    # 1 in 256 is the part of it ending in 00) with every column its pass reads: an index-only
    # scan of a sixteenth of the ledger instead of a pass over the table.
    Index("ix_pa_operations_spread_sample", "tool", "tenant", "created_at").ddl_if(
        dialect="postgresql"
    ),
)

events = Table(
    "pa_operation_events",
    metadata,
    Column(
        "operation_id",
        String(64),
        ForeignKey("pa_operations.operation_id"),
        primary_key=True,
    ),
    Column("seq", Integer, primary_key=True, autoincrement=False),
    Column("at", Double, nullable=False),
    Column("kind", String(32), nullable=False),
    Column("from_status", String(32), nullable=True),
    Column("to_status", String(32), nullable=False),
    Column("actor", String(256), nullable=False),
    Column("detail_json", Text, nullable=True),
    # On SQLite the rows live in the primary key's B-tree: an event appended is one page
    # written, not a page of the table and one of a separate key index (migration 0007).
    sqlite_with_rowid=False,
)

COUNTED_GROUP = ("tool", "tenant", "hour", "status", "trail_marks", "refusal_reason")
"""What `stats` counts per group is kept under (``refusal_reason`` '' for none)."""
COUNTED_FIGURES = (
    "operations", "executed", "retried", "retries", "escalated", "compensations",
    "owed_untold", "joined_calls", "reconcile_errors",
    "admission_to_commit_count", "execution_to_commit_count", "commit_to_acknowledged_count",
    "admission_to_commit_max", "execution_to_commit_max", "commit_to_acknowledged_max",
)  # fmt: skip
"""Per group: sums of each operation's terms, then the spreads' greatest values (see `_counts`)."""


def _counted_columns() -> list[Column[Any]]:
    return [
        Column("tool", String(64), nullable=False),
        Column("tenant", String(128), nullable=False),
        Column("hour", BigInteger, nullable=False),
        Column("status", String(32), nullable=False),
        Column("trail_marks", Integer, nullable=False),
        Column("refusal_reason", Text, nullable=False),
        *(
            Column(f, Double, nullable=True)
            if f.endswith("_max")
            else Column(f, BigInteger, nullable=False)
            for f in COUNTED_FIGURES
        ),
    ]


counts = Table(
    "pa_operation_counts",
    metadata,
    *_counted_columns(),
    # One row per group, folded into by `_counts.FOLD` (``ON CONFLICT`` of this key).
    UniqueConstraint(*COUNTED_GROUP, name="uq_pa_operation_counts_group"),
)
"""`stats`' figures per group, as of the last fold (PostgreSQL; empty on SQLite: `_counts`)."""

deltas = Table(
    "pa_operation_deltas",
    metadata,
    # Appended by PostgreSQL's trigger on pa_operations, in the writer's transaction; no
    # index and no key, so an append is one heap row and nothing else.
    *_counted_columns(),
)
"""Each change of what `stats` counts, signed, until a fold moves it into `counts`."""

owners = Table(
    "pa_owners",
    metadata,
    # A runtime that holds leases registers here while it lives, with the key of the lock it
    # holds for as long as it lives (see `_life`): a registered owner whose lock is free is
    # gone, and its leases are taken over at once instead of when they run out.
    Column("owner", String(128), primary_key=True),
    Column("life_key", BigInteger, nullable=False),
    Column("started_at", Double, nullable=False),
    Column("host", String(256), nullable=True),
    Column("pid", Integer, nullable=True),
)
"""The runtimes that hold leases now, or that died holding them (see `_life`)."""
