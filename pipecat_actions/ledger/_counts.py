"""What `stats` counts, kept as the rows change: PostgreSQL's per-hour groups (migration 0011).

A ledger of 10M operations is 4 GB of rows: no aggregate that reads each of them answers in
2 s. On PostgreSQL a trigger on ``pa_operations`` appends, for each insert and for each update
that changes what `stats` reads, a row to ``pa_operation_deltas``: the row's old figures
subtracted (-1 operation) and its new ones added (+1), under its group (tool, tenant, hour of
creation, status, trail marks, refusal reason). Appended, never updated: 50 writers of one tool
never wait for one another's counter row (an UPDATE of a shared row would hold its lock until
each one's commit). `fold` moves the deltas into ``pa_operation_counts`` (one row per group,
summed); `stats` folds, then sums both tables, so what it reads is exact whether a delta is
folded yet or not, in the same snapshot as the rows themselves (the trigger writes in the
writer's own transaction).

Exact, not estimated: each figure is a sum of per-row terms, and an update subtracts exactly
what the row's previous version added. The time spreads' maxima are kept per group as the
greatest value a row of the group ever had: a row keeps its spreads once they are set
(``committed_at`` is stamped once, ``acknowledged_at`` first-wins, ``sent_at`` is not moved
after the commit) and its tool, tenant and creation time never change, so the greatest of a
tool's groups is a value one of its rows has now. Rows are never deleted (the audit trail is
append-only); a group whose rows all moved on counts 0 operations and is left out.

SQLite keeps the two tables empty and has no trigger: a trigger's rows would be WAL written by
every propose there, where the covering index ``ix_pa_operations_stats`` answers `stats`.
"""

from __future__ import annotations

__all__ = [
    "BACKFILL",
    "FOLD",
    "HOUR_SECS",
    "TRIGGERS",
    "UNTRIGGER",
    "counted_totals",
]

from typing import Any

from sqlalchemy import ColumnElement, Select, and_, func, literal, select, union_all

from pipecat_actions.ledger.schema import COUNTED_FIGURES, COUNTED_GROUP, counts, deltas

HOUR_SECS = 3600
"""The width of a group's slice of time: `stats --since` reads the rows of its first
(partial) hour, the groups of the hours after."""

_SPREADS = {
    "admission_to_commit": ("committed_at", "created_at"),
    "execution_to_commit": ("committed_at", "sent_at"),
    "commit_to_acknowledged": ("acknowledged_at", "committed_at"),
}


def _terms(r: str, sign: str) -> dict[str, str]:
    """The value of each column of a delta for row ``r`` (OLD or NEW), signed ``sign``."""
    spreads = {f"{n}_count": f"{sign} * ({r}.{a} - {r}.{b} IS NOT NULL)::int"
               for n, (a, b) in _SPREADS.items()}  # fmt: skip
    most = {f"{n}_max": f"CASE WHEN {sign} > 0 THEN {r}.{a} - {r}.{b} END"
            for n, (a, b) in _SPREADS.items()}  # fmt: skip
    return {
        "tool": f"{r}.tool",
        "tenant": f"{r}.tenant",
        "hour": f"floor({r}.created_at / {HOUR_SECS})::bigint",
        "status": f"{r}.status",
        "trail_marks": f"{r}.trail_marks",
        "refusal_reason": f"coalesce({r}.refusal_reason, '')",
        "operations": sign,
        "executed": f"{sign} * ({r}.attempt > 0)::int",
        "retried": f"{sign} * ({r}.attempt > 1)::int",
        "retries": f"{sign} * greatest({r}.attempt - 1, 0)",
        "escalated": f"{sign} * ({r}.escalated_at IS NOT NULL)::int",
        "compensations": f"{sign} * ({r}.compensates IS NOT NULL)::int",
        "owed_untold": f"{sign} * ({r}.delivered_at IS NULL AND {r}.kind = 'mutation')::int",
        "joined_calls": f"{sign} * {r}.joined_calls",
        "reconcile_errors": f"{sign} * {r}.reconcile_errors",
        **spreads,
        **most,
    }


_COLUMNS = list(_terms("r", "1"))
_READ_BY_STATS = (
    "tool", "tenant", "created_at", "status", "trail_marks", "refusal_reason", "attempt",
    "escalated_at", "compensates", "delivered_at", "kind", "joined_calls", "reconcile_errors",
    "sent_at", "committed_at", "acknowledged_at",
)  # fmt: skip
"""The columns of ``pa_operations`` a delta is made of: an update that changes none of them
(a lease renewed, a result stored) appends nothing."""


def _insert(*rows: tuple[str, str]) -> str:
    """One INSERT of a delta per (row, sign): an update's two in one statement."""
    values = ", ".join(f"({', '.join(_terms(r, sign).values())})" for r, sign in rows)
    return f"INSERT INTO pa_operation_deltas ({', '.join(_COLUMNS)}) VALUES {values};"


_OLD = ", ".join(f"OLD.{c}" for c in _READ_BY_STATS)
_NEW = ", ".join(f"NEW.{c}" for c in _READ_BY_STATS)
TRIGGERS = (
    f"""CREATE FUNCTION pa_count_operation() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'UPDATE' THEN
        {_insert(("OLD", "-1"), ("NEW", "1"))}
    ELSIF TG_OP = 'INSERT' THEN
        {_insert(("NEW", "1"))}
    ELSE
        {_insert(("OLD", "-1"))}
    END IF;
    RETURN NULL;
END
$$""",
    """CREATE FUNCTION pa_count_nothing() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    TRUNCATE pa_operation_counts, pa_operation_deltas;
    RETURN NULL;
END
$$""",
    # TRUNCATE fires no row trigger: the counts go with the rows.
    "CREATE TRIGGER pa_count_truncate AFTER TRUNCATE ON pa_operations"
    " FOR EACH STATEMENT EXECUTE FUNCTION pa_count_nothing()",
    "CREATE TRIGGER pa_count_insert AFTER INSERT OR DELETE ON pa_operations"
    " FOR EACH ROW EXECUTE FUNCTION pa_count_operation()",
    "CREATE TRIGGER pa_count_update AFTER UPDATE ON pa_operations FOR EACH ROW"
    f" WHEN (({_OLD}) IS DISTINCT FROM ({_NEW})) EXECUTE FUNCTION pa_count_operation()",
)
"""PostgreSQL's triggers (migration 0011): the WHEN keeps the function from running at all
for an update that changes nothing counted."""
UNTRIGGER = (
    "DROP TRIGGER IF EXISTS pa_count_update ON pa_operations",
    "DROP TRIGGER IF EXISTS pa_count_insert ON pa_operations",
    "DROP TRIGGER IF EXISTS pa_count_truncate ON pa_operations",
    "DROP FUNCTION IF EXISTS pa_count_operation()",
    "DROP FUNCTION IF EXISTS pa_count_nothing()",
)

_GROUP = ", ".join(COUNTED_GROUP)
_SUMS = ", ".join(f"max({f})" if f.endswith("_max") else f"sum({f})" for f in COUNTED_FIGURES)
_MERGED = ", ".join(
    f"{f} = greatest(pa_operation_counts.{f}, EXCLUDED.{f})"
    if f.endswith("_max")
    else f"{f} = pa_operation_counts.{f} + EXCLUDED.{f}"
    for f in COUNTED_FIGURES
)
FOLD = (
    "WITH moved AS (DELETE FROM pa_operation_deltas RETURNING *)"
    f" INSERT INTO pa_operation_counts ({_GROUP}, {', '.join(COUNTED_FIGURES)})"
    f" SELECT {_GROUP}, {_SUMS} FROM moved GROUP BY {_GROUP}"
    f" ON CONFLICT ({_GROUP}) DO UPDATE SET {_MERGED}"
)
"""Move every delta this transaction sees into its group's row. A delta committed meanwhile is
not seen, so not deleted: the next fold moves it. Two folds at once delete each delta once (the
second skips what the first deleted), so each is added once."""
_NEW_ROW = _terms("p", "1")
BACKFILL = (
    f"INSERT INTO pa_operation_counts ({', '.join(_COLUMNS)})"
    f" SELECT {_GROUP}, {_SUMS} FROM (SELECT "
    + ", ".join(f"{v} AS {k}" for k, v in _NEW_ROW.items())
    + f" FROM pa_operations p) r GROUP BY {_GROUP}"
)
"""The groups of the rows already there (migration 0011; `bench/ten_million.py` after a load
with the trigger off)."""


def counted_totals(
    tool: str | None, tenant: str | None, hours: tuple[int | None, int | None]
) -> Select[Any]:
    """The figures of ``_statistics``' first pass, from `_counts`' groups, folded or not.

    The groups of ``tool`` and ``tenant`` created in the hours ``[hours[0], hours[1])``
    (None: unbounded).

    Its rows have the labels of the pass over the table (refusal reason NULL for none), one
    per group that counts at least one operation.
    """
    figures = [*COUNTED_FIGURES]
    both = union_all(
        *(
            select(*(t.c[g] for g in COUNTED_GROUP), *(t.c[f] for f in figures)).where(
                *_within(t, tool, tenant, hours)
            )
            for t in (counts, deltas)
        )
    ).subquery("counted")
    c = both.c
    added = [(func.max(c[f]) if f.endswith("_max") else func.sum(c[f])).label(f) for f in figures]
    return (
        select(
            c.tool,
            c.status,
            c.trail_marks,
            func.nullif(c.refusal_reason, literal("", literal_execute=True)).label(
                "refusal_reason"
            ),
            *added,
        )
        .group_by(c.tool, c.tenant, c.status, c.trail_marks, c.refusal_reason)
        .having(func.sum(c.operations) != 0)
    )


def _within(
    t: Any, tool: str | None, tenant: str | None, hours: tuple[int | None, int | None]
) -> list[ColumnElement[bool]]:
    conditions: list[ColumnElement[bool]] = []
    if tool is not None:
        conditions.append(t.c.tool == tool)
    if tenant is not None:
        conditions.append(t.c.tenant == tenant)
    if hours[0] is not None:
        conditions.append(t.c.hour >= hours[0])
    if hours[1] is not None:
        conditions.append(t.c.hour < hours[1])
    return [and_(*conditions)] if conditions else []
