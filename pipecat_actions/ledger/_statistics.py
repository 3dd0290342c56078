"""Per-tool statistics of the operations a filter matches, in two aggregate queries.

Exact over every matching row and never one query per operation, and never a read of the
audit events: what each operation's trail says is on its row (`_trail`), and
``ix_pa_operations_stats`` holds every column read here, in the order of the GROUP BY. The one
figure ever sampled says so: the p50 and p95 of a tool with more than `EXACT_SPREAD_UP_TO`
values of a time spread are ranked among 1 in 16 (or 256) of its operations, and carry
``"sampled"`` (how many values were ranked). Their count and maximum stay exact.

1. counts, sums and maxima per tool, tenant, status, trail marks and refusal reason, in one
   GROUP BY (on SQLite, a scan of the covering index in its order: no sort, no read of the
   table; see `_sqlite_index` for filters); how many operations each tool has there decides
   whose spreads are ranked among a sample;
2. the three time spreads' values of the committed operations ranked (all of them, or the
   sample's), gathered per tool, whose p50 and p95 are ranked in Python.

A refusal counts under the reason its creation gave (``refusal_reason``, see `_rows`).
"""

from __future__ import annotations

__all__ = ["read_statistics"]

import math
from collections import Counter, defaultdict
from typing import Any

from sqlalchemy import (
    Column,
    ColumnElement,
    Connection,
    Select,
    and_,
    case,
    func,
    literal,
    or_,
    select,
)
from sqlalchemy.sql import visitors

from pipecat_actions.ledger._counts import HOUR_SECS, counted_totals
from pipecat_actions.ledger._filters import OWED_UNTOLD
from pipecat_actions.ledger._trail import Mark
from pipecat_actions.ledger.records import OperationFilter
from pipecat_actions.ledger.schema import STATS_COLUMNS, operations
from pipecat_actions.status import ActionStatus

S = ActionStatus
_DUPLICATE_REFUSALS = frozenset({"duplicate", "idempotency_mismatch"})
_SPREADS = {
    # The value is NULL (not counted) when either time is missing.
    "admission_to_commit": operations.c.committed_at - operations.c.created_at,
    "execution_to_commit": operations.c.committed_at - operations.c.sent_at,
    "commit_to_acknowledged": operations.c.acknowledged_at - operations.c.committed_at,
}
_WORK_MEM = "32MB"
"""PostgreSQL's work_mem while `stats` reads: enough to plan its GROUP BY as a hash."""
EXACT_SPREAD_UP_TO = 100_000
"""Above this many values of a tool, its p50 and p95 come from a sample (and say so)."""
_SAMPLES = (("%0", 16), ("%00", 256))
"""Operation ids ending so: ids end in random hex, so 1 in 16 (or 256) of the operations."""


def read_statistics(
    conn: Connection, where: list[ColumnElement[bool]], filters: OperationFilter | None = None
) -> dict[str, Any]:
    """Return ``{"operations": N, "tools": {tool: figures}}`` for the rows ``where`` matches.

    ``filters``: what ``where`` was made of; on PostgreSQL, when it names at most a tool, a
    tenant and a time range, the counts come from `_counts`' groups.
    """
    hint = _sqlite_index(where) if conn.dialect.name == "sqlite" else None
    if conn.dialect.name == "postgresql":
        # PostgreSQL plans the GROUP BY for thousands of groups (it cannot know that tool,
        # status, trail marks and refusal reason make a few dozen) and, with the default 4 MB
        # of work_mem, sorts 1M rows on disk (1.5-1.8 s at 1M operations) rather than hash
        # them (0.4 s); JIT compiling the aggregates costs another 0.1 s. For this read's
        # transaction only.
        conn.exec_driver_sql(f"SET LOCAL work_mem = '{_WORK_MEM}'")
        conn.exec_driver_sql("SET LOCAL jit = off")
    if conn.dialect.name == "postgresql" and filters is not None and _countable(filters):
        queries = _counted_queries(where, filters)
    else:
        queries = [_totals_query(where)]
    totals, trails = _operation_totals(conn, [_hinted(q, hint) for q in queries])
    samples = _samples({tool: t["operations"] for tool, t in totals.items()})
    if conn.dialect.name == "postgresql":
        for ranked in _sample_parts(samples, list(totals)):
            _spread_values(conn, where, ranked, totals, hint)
    else:
        _spread_values(conn, where, _in_sample(samples, list(totals)), totals, hint)
    spreads = {name: _spread(name, totals, samples) for name in _SPREADS}
    tools: dict[str, dict[str, Any]] = {}
    for tool in sorted(totals):
        t, counts = totals[tool], trails.get(tool, _TrailCounts())
        by_status = t["by_status"]
        joined = counts.counts["duplicates_joined"]
        rejected = counts.counts["duplicates_rejected"]
        proposals = t["operations"] + joined
        duplicates = joined + rejected
        tools[tool] = {
            "operations": t["operations"],
            "proposals": proposals,
            "by_status": dict(sorted(by_status.items())),
            **{name: spread.get(tool) for name, spread in spreads.items()},
            "executed": t["executed"],
            "retried": t["retried"],
            "retries": t["retries"],
            "retry_rate": _ratio(t["retries"], t["executed"]),
            "timeouts": counts.counts["timeouts"],
            "timeout_rate": _ratio(counts.counts["timeouts"], t["executed"]),
            "duplicates_suppressed": duplicates,
            "duplicates_joined": joined,
            "duplicate_rate": _ratio(duplicates, proposals),
            "unknown_now": by_status.get(S.UNKNOWN.value, 0),
            "ever_unknown": counts.counts["ever_unknown"],
            "reconciled": counts.counts["reconciled"],
            "reconciliation_errors": counts.counts["reconciliation_errors"],
            "conflicts": counts.counts["conflicts"],
            "escalated": t["escalated"],
            "late_results": counts.counts["late_results"],
            "cancellations_requested": counts.counts["cancellations_requested"],
            "cancellations_confirmed": counts.counts["cancellations_confirmed"],
            "cancelled_before_send": counts.counts["cancelled_before_send"],
            "compensations": t["compensations"],
            "compensated": by_status.get(S.COMPENSATED.value, 0),
            "handoffs_with_pending": counts.counts["handoffs_with_pending"],
            "refused_by_reason": dict(sorted(counts.refusals.items())),
            "committed_undelivered": t["committed_undelivered"],
        }
    return {
        "operations": sum(t["operations"] for t in totals.values()),
        "conflicts": sum(t["conflicts"] for t in tools.values()),
        "tools": tools,
    }


_SEARCHED_BY = (({"session_id"}, "ix_pa_operations_session"),)
"""Filters on columns outside the covering index that an index of theirs finds."""


def _sqlite_index(where: list[ColumnElement[bool]]) -> str:
    """The table access SQLite is told to use, for every query here.

    Left to choose, its planner (which knows nothing of how many rows a principal has) walked
    an index in GROUP BY order and read every row of the table to test the filter: 3 to 5 s
    at 1M operations for a principal's 200. So: the covering index when it holds every column
    filtered on (a scan without reads of the table, 1 s at most at 1M operations, a range of
    it with a tenant or a tool); else the index that finds the filter's rows; else the table
    in order, one read per row.
    """
    filtered = {
        node.name for condition in where for node in visitors.iterate(condition)
        if isinstance(node, Column)
    }  # fmt: skip
    if filtered <= _COVERED:
        return "INDEXED BY ix_pa_operations_stats"
    for columns, index in _SEARCHED_BY:
        if columns <= filtered:
            return f"INDEXED BY {index}"
    return "NOT INDEXED"


_COVERED = frozenset(STATS_COLUMNS)


def _hinted(query: Select[Any], hint: str | None) -> Select[Any]:
    return query if hint is None else query.with_hint(operations, hint, "sqlite")


def _samples(sizes: dict[str, int]) -> dict[str, int]:
    """Which tools' spreads are ranked among 1 in N of their operations: ``{tool: N}``.

    ``sizes``: how many operations each tool has (the totals' own count: no pass of its own).
    """
    chosen: dict[str, int] = {}
    for tool, size in sizes.items():
        if size <= EXACT_SPREAD_UP_TO:
            continue
        for _pattern, one_in in _SAMPLES:
            chosen[tool] = one_in
            if size // one_in <= EXACT_SPREAD_UP_TO:
                break
    return chosen


def _in_sample(samples: dict[str, int], tools: list[str]) -> ColumnElement[bool]:
    """True for the rows whose spread values are ranked (every row of an exact tool)."""
    c = operations.c
    by_pattern = {
        pattern: sorted(t for t, n in samples.items() if n == one_in)
        for pattern, one_in in _SAMPLES
    }
    if not samples:
        return literal(True)
    if len(samples) == len(tools) and len([p for p, t in by_pattern.items() if t]) == 1:
        # One rule for every tool (a large ledger): no per-row test of the tool.
        return c.operation_id.like(next(p for p, t in by_pattern.items() if t))
    sampled = [and_(c.tool.in_(t), c.operation_id.like(p)) for p, t in by_pattern.items() if t]
    return or_(c.tool.not_in(sorted(samples)), *sampled)


def _sample_parts(samples: dict[str, int], tools: list[str]) -> list[ColumnElement[bool]]:
    """`_in_sample` on PostgreSQL, one condition per pass.

    The tools ranked whole, then each sample's tools, read from
    ``ix_pa_operations_spread_sample`` (ids ending in 0), whose condition each repeats in
    full, constants and all, for the planner to prove the index holds the rows.
    """
    c = operations.c
    exact = [t for t in tools if t not in samples]
    parts: list[ColumnElement[bool]] = [c.tool.in_(sorted(exact))] if exact else []
    for pattern, one_in in _SAMPLES:
        sampled = sorted(t for t, n in samples.items() if n == one_in)
        if sampled:
            parts.append(
                and_(
                    c.tool.in_(sampled),
                    c.operation_id.like(literal("%0", literal_execute=True)),
                    c.operation_id.like(literal(pattern, literal_execute=True)),
                )
            )
    return parts


def _ratio(part: int, whole: int) -> float | None:
    return None if whole <= 0 else round(part / whole, 4)


def _count_if(condition: ColumnElement[bool]) -> ColumnElement[Any]:
    return func.coalesce(func.sum(case((condition, 1), else_=0)), 0)


_EVENT_MARKS = {
    "timeouts": Mark.TIMED_OUT,
    "ever_unknown": Mark.WENT_UNKNOWN,
    "cancellations_requested": Mark.CANCEL_REQUESTED,
    "cancelled_before_send": Mark.CANCELLED_BEFORE_SEND,
    "late_results": Mark.TOLD_LATE,
    "handoffs_with_pending": Mark.HANDED_OFF_PENDING,
    "reconciled": Mark.RECONCILED,
    "conflicts": Mark.CONFLICT,
}
"""The figures that count the operations whose trail has a mark."""


def _countable(f: OperationFilter) -> bool:
    """Whether `_counts`' groups answer ``f``: it names a tool, a tenant, a time range at most."""
    return all(
        getattr(f, name) is None
        for name in (
            "status", "session_id", "principal", "resource_key", "lease_owner", "undelivered",
            "conflicted",
        )
    )  # fmt: skip


def _counted_queries(where: list[ColumnElement[bool]], f: OperationFilter) -> list[Select[Any]]:
    """The first pass: groups for the whole hours of ``f``'s range, rows for the rest.

    The rows are those of the partial hours at its ends (`stats --since`).
    """
    lo, hi = f.created_from, f.created_before
    first = None if lo is None else math.ceil(lo / HOUR_SECS)
    last = None if hi is None else math.floor(hi / HOUR_SECS)
    if first is not None and last is not None and first >= last:
        return [_totals_query(where)]  # within an hour: its rows
    c = operations.c
    # A row's hour as the trigger computes it, so that each row is in exactly one part; the
    # bound on created_at beside it is the index's range.
    hour = func.floor(c.created_at / HOUR_SECS)
    queries = [counted_totals(f.tool, f.tenant, (first, last))]
    if first is not None:
        edge = [c.created_at < (first + 1) * HOUR_SECS, hour < first]
        queries.append(_totals_query([*where, *edge]))
    if last is not None:
        edge = [c.created_at >= (last - 1) * HOUR_SECS, hour >= last]
        queries.append(_totals_query([*where, *edge]))
    return queries


def _totals_query(where: list[ColumnElement[bool]]) -> Select[Any]:
    c = operations.c
    return (
        select(
            c.tool,
            c.status,
            c.trail_marks,
            c.refusal_reason,
            func.count().label("operations"),
            _count_if(c.attempt > 0).label("executed"),
            _count_if(c.attempt > 1).label("retried"),
            func.coalesce(func.sum(case((c.attempt > 0, c.attempt - 1), else_=0)), 0).label(
                "retries"
            ),
            func.count(c.escalated_at).label("escalated"),
            func.count(c.compensates).label("compensations"),
            _count_if(OWED_UNTOLD).label("owed_untold"),
            func.coalesce(func.sum(c.joined_calls), 0).label("joined_calls"),
            func.coalesce(func.sum(c.reconcile_errors), 0).label("reconcile_errors"),
            *(func.count(value).label(f"{name}_count") for name, value in _SPREADS.items()),
            *(func.max(value).label(f"{name}_max") for name, value in _SPREADS.items()),
        )
        .where(*where)
        .group_by(c.tool, c.tenant, c.status, c.trail_marks, c.refusal_reason)
    )


def _operation_totals(
    conn: Connection, queries: list[Select[Any]]
) -> tuple[dict[str, dict[str, Any]], dict[str, _TrailCounts]]:
    """Per tool: the counts and sums of its rows, and what their trails say."""
    fields = ("operations", "executed", "retried", "retries", "escalated", "compensations")
    totals: dict[str, dict[str, Any]] = {}
    trails: dict[str, _TrailCounts] = defaultdict(_TrailCounts)
    rows = (row for query in queries for row in conn.execute(query))
    for row in rows:
        entry = totals.setdefault(
            row.tool, {name: 0 for name in (*fields, "committed_undelivered")} | {"by_status": {}}
        )
        size = int(row.operations)
        for name in fields:
            entry[name] += int(getattr(row, name))
        if row.status == S.COMMITTED.value:
            entry["committed_undelivered"] += int(row.owed_untold)
        by_status = entry["by_status"]
        by_status[row.status] = by_status.get(row.status, 0) + size
        for name in _SPREADS:
            count, most = getattr(row, f"{name}_count"), getattr(row, f"{name}_max")
            entry[f"{name}_count"] = entry.get(f"{name}_count", 0) + int(count)
            if most is not None:
                entry[f"{name}_max"] = max(float(most), entry.get(f"{name}_max", float(most)))
        counts = trails[row.tool].counts
        counts["duplicates_joined"] += int(row.joined_calls)
        counts["reconciliation_errors"] += int(row.reconcile_errors)
        marks = Mark(row.trail_marks)
        for figure, mark in _EVENT_MARKS.items():
            counts[figure] += size if mark in marks else 0
        if Mark.CANCEL_REQUESTED in marks and row.status == S.CANCELLED.value:
            counts["cancellations_confirmed"] += size
        if row.status == S.REJECTED.value:
            reason = row.refusal_reason or "unknown"
            trails[row.tool].refusals[reason] += size
            counts["duplicates_rejected"] += size if reason in _DUPLICATE_REFUSALS else 0
    return totals, trails


def _spread_values(
    conn: Connection,
    where: list[ColumnElement[bool]],
    ranked: ColumnElement[bool],
    totals: dict[str, dict[str, Any]],
    hint: str | None,
) -> None:
    """Add to ``totals`` the spreads' values to rank: every committed row's, or the sample's.

    One row per tool, each spread's values aggregated: an array on PostgreSQL (decoded in
    binary), a comma-joined text on SQLite; row by row, SQLAlchemy's result rows cost more
    than the query.
    """
    c = operations.c
    sqlite = conn.dialect.name == "sqlite"
    gather = (lambda v: func.group_concat(v, ",")) if sqlite else func.array_agg
    query = (
        select(c.tool, *(gather(value) for value in _SPREADS.values()))
        .where(*where, c.committed_at.is_not(None), ranked)
        .group_by(c.tool, c.tenant)
    )
    for tool, *spreads in conn.execute(_hinted(query, hint)):
        for name, found in zip(_SPREADS, spreads, strict=True):
            if sqlite:
                values = [float(v) for v in found.split(",")] if found else []
            else:
                values = [float(v) for v in found or () if v is not None]
            totals[tool].setdefault(f"{name}_values", []).extend(values)


def _spread(
    name: str, totals: dict[str, dict[str, Any]], samples: dict[str, int]
) -> dict[str, dict[str, Any]]:
    """Return p50 (the median, halfway between the two middle values when even), p95, max.

    The count and the maximum are exact. A tool in ``samples`` has its p50 and p95 ranked
    among a sample of its operations (their id's last hex digits), and its figures say
    ``"sampled": <values ranked>``.
    """
    spreads: dict[str, dict[str, Any]] = {}
    for tool, t in totals.items():
        values = sorted(t.get(f"{name}_values", ()))
        if not t[f"{name}_count"] or not values:
            continue
        # 1-based ranks: p95 is the value at index floor(0.95 n) of the sorted values
        # (clamped to the last), as the in-process metrics say.
        size = len(values)
        median = (values[(size + 1) // 2 - 1] + values[size // 2]) / 2
        spreads[tool] = {
            "count": t[f"{name}_count"],
            "p50_secs": round(median, 4),
            "p95_secs": round(values[min(size, size * 95 // 100 + 1) - 1], 4),
            "max_secs": round(t[f"{name}_max"], 4),
        }
        if tool in samples:
            spreads[tool]["sampled"] = size
    return spreads


class _TrailCounts:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.refusals: Counter[str] = Counter()
