"""Per-tool statistics of the operations a filter matches, in a few aggregate queries.

Exact over every matching row and never one query per operation; the one figure ever
sampled says so: the p50 and p95 of a tool with more than `EXACT_SPREAD_UP_TO` values of a
time spread are ranked among 1 in 16 (or 256) of its operations, and carry ``"sampled"``
(how many values were ranked). Their count and maximum stay exact.

1. how many operations each tool has (a count over a narrow index), which decides whose
   spreads are ranked among a sample;
2. counts and sums per tool and status, and the three time spreads' values (all of them, or
   the sample's), in one GROUP BY over ``pa_operations``: the values come back joined as
   text, and their p50 and p95 are ranked in Python;
3. one pass over the audit events that can count for something (a watchdog's, an UNKNOWN,
   a cancellation, or a detail naming a duplicate, a timeout, a late result, a handoff or a
   reconciliation), their detail JSON decoded in Python, and one over the first events of
   refusals (their reasons).

On SQLite, unfiltered, passes 2 and 3 read their table in order (``NOT INDEXED``): walking an
index whose order is not the table's costs a random read per row, a third more than the scan.

A read that committed contributes no event figure: nothing past its creation is recorded.
"""

from __future__ import annotations

__all__ = ["read_statistics"]

import json
from collections import Counter, defaultdict
from collections.abc import Iterator
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Text,
    and_,
    case,
    cast,
    func,
    literal,
    not_,
    or_,
    select,
)

from pipecat_actions.ledger.records import joined_calls
from pipecat_actions.ledger.schema import events, operations
from pipecat_actions.status import ActionStatus

S = ActionStatus
_DUPLICATE_REFUSALS = frozenset({"duplicate", "idempotency_mismatch"})
# Texts whose presence in an event's canonical detail JSON may make it count; what matches
# is decoded and checked in Python, so a false match costs a decode, never a wrong figure.
# Each is as narrow as the canonical text allows: every telling is recorded with a "late"
# field, so '"late"' alone made every operation's delivery record a candidate.
_DETAIL_MARKERS = (
    '"duplicates_joined"',
    '"duplicate_joined"',
    '"timed_out"',
    '"late":true',
    '"handoff_to"',
    '"reconcile_error"',
    '"reconciled"',
)
_SPREADS = {
    # The value is NULL (not counted) when either time is missing.
    "admission_to_commit": operations.c.committed_at - operations.c.created_at,
    "execution_to_commit": operations.c.committed_at - operations.c.sent_at,
    "commit_to_acknowledged": operations.c.acknowledged_at - operations.c.committed_at,
}
EXACT_SPREAD_UP_TO = 100_000
"""Above this many values of a tool, its p50 and p95 come from a sample (and say so)."""
_SAMPLES = (("%0", 16), ("%00", 256))
"""Operation ids ending so: ids end in random hex, so 1 in 16 (or 256) of the operations."""


def read_statistics(conn: Connection, where: list[ColumnElement[bool]]) -> dict[str, Any]:
    """Return ``{"operations": N, "tools": {tool: figures}}`` for the rows ``where`` matches."""
    samples, tools_seen = _samples(conn, where)
    totals = _operation_totals(conn, where, _in_sample(samples, tools_seen))
    spreads = {name: _spread(name, totals, samples) for name in _SPREADS}
    trails = _event_counts(conn, where)
    tools: dict[str, dict[str, Any]] = {}
    for tool in sorted(totals):
        t, counts = totals[tool], trails.get(tool, _EventCounts())
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
    return {"operations": sum(t["operations"] for t in totals.values()), "tools": tools}


def _samples(
    conn: Connection, where: list[ColumnElement[bool]]
) -> tuple[dict[str, int], list[str]]:
    """Which tools' spreads are ranked among 1 in N of their operations, and every tool.

    Returns:
        ``{tool: N}`` for the sampled tools, and the list of all the tools matched.
    """
    c = operations.c
    sizes = list(conn.execute(select(c.tool, func.count()).where(*where).group_by(c.tool)))
    chosen: dict[str, int] = {}
    for tool, size in sizes:
        if size <= EXACT_SPREAD_UP_TO:
            continue
        for _pattern, one_in in _SAMPLES:
            chosen[tool] = one_in
            if size // one_in <= EXACT_SPREAD_UP_TO:
                break
    return chosen, [tool for tool, _ in sizes]


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


def _ratio(part: int, whole: int) -> float | None:
    return None if whole <= 0 else round(part / whole, 4)


def _count_if(condition: ColumnElement[bool]) -> ColumnElement[Any]:
    return func.coalesce(func.sum(case((condition, 1), else_=0)), 0)


def _operation_totals(
    conn: Connection, where: list[ColumnElement[bool]], ranked: ColumnElement[bool]
) -> dict[str, dict[str, Any]]:
    c = operations.c
    query = (
        select(
            c.tool,
            c.status,
            func.count().label("operations"),
            _count_if(c.attempt > 0).label("executed"),
            _count_if(c.attempt > 1).label("retried"),
            func.coalesce(func.sum(case((c.attempt > 0, c.attempt - 1), else_=0)), 0).label(
                "retries"
            ),
            func.count(c.escalated_at).label("escalated"),
            func.count(c.compensates).label("compensations"),
            _count_if(and_(c.status == S.COMMITTED.value, c.delivered_at.is_(None))).label(
                "committed_undelivered"
            ),
            *(func.count(value).label(f"{name}_count") for name, value in _SPREADS.items()),
            *(func.max(value).label(f"{name}_max") for name, value in _SPREADS.items()),
            *(
                _joined(conn, case((ranked, value))).label(f"{name}_values")
                for name, value in _SPREADS.items()
            ),
        )
        .where(*where)
        .group_by(c.tool, c.status)
    )
    if conn.dialect.name == "sqlite" and not where:
        query = query.with_hint(operations, "NOT INDEXED", "sqlite")
    fields = ("operations", "executed", "retried", "retries", "escalated", "compensations")
    totals: dict[str, dict[str, Any]] = {}
    for row in conn.execute(query):
        entry = totals.setdefault(
            row.tool, {name: 0 for name in (*fields, "committed_undelivered")} | {"by_status": {}}
        )
        for name in (*fields, "committed_undelivered"):
            entry[name] += int(getattr(row, name))
        entry["by_status"][row.status] = int(row.operations)
        for name in _SPREADS:
            count, most = getattr(row, f"{name}_count"), getattr(row, f"{name}_max")
            entry[f"{name}_count"] = entry.get(f"{name}_count", 0) + int(count)
            if most is not None:
                entry[f"{name}_max"] = max(float(most), entry.get(f"{name}_max", float(most)))
            joined = getattr(row, f"{name}_values")
            if joined:
                entry.setdefault(f"{name}_values", []).extend(map(float, joined.split(",")))
    return totals


def _joined(conn: Connection, value: ColumnElement[Any]) -> ColumnElement[Any]:
    """The group's non-NULL ``value``s as one comma-joined text (NULL when there are none)."""
    if conn.dialect.name == "sqlite":
        return func.group_concat(value, ",")
    return func.string_agg(cast(value, Text), ",")


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


class _EventCounts:
    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.refusals: Counter[str] = Counter()


def _event_counts(conn: Connection, where: list[ColumnElement[bool]]) -> dict[str, _EventCounts]:
    c, e = operations.c, events.c
    # Conditions on the event alone, so that an event is joined to its operation only when
    # it may count: the events table is read once, the operations by key for a few of them.
    candidate = or_(
        e.actor == "watchdog",
        e.to_status.in_([S.UNKNOWN.value, S.CANCEL_REQUESTED.value]),
        and_(
            e.to_status == S.CANCELLED.value,
            e.from_status.in_([S.ADMITTED.value, S.FAILED_RETRYABLE.value]),
        ),
        *(_mentions(conn, e.detail_json, marker) for marker in _DETAIL_MARKERS),
    )
    query = (
        select(
            c.tool,
            c.status.label("op_status"),
            e.operation_id,
            e.seq,
            e.from_status,
            e.to_status,
            e.actor,
            e.detail_json,
        )
        .select_from(operations.join(events, events.c.operation_id == c.operation_id))
        .where(
            *where,
            not_(and_(c.kind == "read", c.status == S.COMMITTED.value)),
            candidate,
        )
        .order_by(e.operation_id, e.seq)
    )
    if conn.dialect.name == "sqlite" and not where:
        # Every operation counts: read the events in table order and sort the few
        # candidates, rather than walk every event in key order (a random read each).
        query = query.with_hint(events, "NOT INDEXED", "sqlite")
    per_tool: dict[str, _EventCounts] = defaultdict(_EventCounts)
    for trail in _trails(iter(conn.execute(query))):
        _count_trail(per_tool[trail[0].tool], trail[0].op_status, trail)
    # A refusal's reason is in its operation's first event (seq 1, written with the row).
    refusals = (
        select(c.tool, e.detail_json)
        .select_from(operations.join(events, events.c.operation_id == c.operation_id))
        .where(*where, c.status == S.REJECTED.value, e.seq == 1)
    )
    for row in conn.execute(refusals):
        into = per_tool[row.tool]
        reason = str(_decode(row.detail_json).get("reason") or "unknown")
        into.refusals[reason] += 1
        into.counts["duplicates_rejected"] += reason in _DUPLICATE_REFUSALS
    return per_tool


def _mentions(conn: Connection, text: ColumnElement[Any], marker: str) -> ColumnElement[bool]:
    if conn.dialect.name == "sqlite":
        return func.instr(text, marker) > 0  # several times cheaper than LIKE on SQLite
    return text.contains(marker, autoescape=True)


def _trails(rows: Iterator[Any]) -> Iterator[list[Any]]:
    trail: list[Any] = []
    for row in rows:
        if trail and row.operation_id != trail[0].operation_id:
            yield trail
            trail = []
        trail.append(row)
    if trail:
        yield trail


def _count_trail(into: _EventCounts, status: str, trail: list[Any]) -> None:
    counts = into.counts
    details = [_decode(row.detail_json) for row in trail]
    counts["duplicates_joined"] += sum(joined_calls(d) for d in details)
    statuses = {row.to_status for row in trail}
    counts["timeouts"] += any(row.actor == "watchdog" for row in trail) or any(
        d.get("timed_out") for d in details
    )
    counts["ever_unknown"] += S.UNKNOWN.value in statuses
    if S.CANCEL_REQUESTED.value in statuses:
        counts["cancellations_requested"] += 1
        counts["cancellations_confirmed"] += status == S.CANCELLED.value
    counts["cancelled_before_send"] += any(
        row.to_status == S.CANCELLED.value
        and row.from_status in (S.ADMITTED.value, S.FAILED_RETRYABLE.value)
        for row in trail
    )
    counts["late_results"] += any(d.get("delivered") and d.get("late") for d in details)
    counts["handoffs_with_pending"] += any("handoff_to" in d for d in details)
    counts["reconciliation_errors"] += sum(1 for d in details if "reconcile_error" in d)
    counts["reconciled"] += any(d.get("reason") == "reconciled" for d in details)


def _decode(detail_json: str | None) -> dict[str, Any]:
    value = None if detail_json is None else json.loads(detail_json)
    return value if isinstance(value, dict) else {}
