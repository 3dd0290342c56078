"""What an operator reads from the ledger: operations, one operation's timeline, statistics.

Used by ``pipecat-actions ledger list|show``, ``undelivered`` and ``stats``; every function
returns plain data (for ``--json``) and has a text rendering.
"""

from __future__ import annotations

__all__ = [
    "describe",
    "list_operations",
    "render_rows",
    "render_statistics",
    "statistics",
    "timeline",
]

import asyncio
import statistics as stats_
from collections import Counter, defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from pipecat_actions.ledger import Ledger, Operation, OperationEvent, OperationFilter
from pipecat_actions.status import ActionStatus

S = ActionStatus


def _when(at: float | None) -> str | None:
    return (
        None if at is None else datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds")
    )


def describe(op: Operation) -> dict[str, Any]:
    """Return an operation as plain data."""
    return {
        "operation_id": op.operation_id,
        "tool": op.tool,
        "kind": op.kind,
        "status": op.status.value,
        "session_id": op.session_id,
        "principal": op.principal,
        "tenant": op.tenant,
        "args": op.args,
        "args_hash": op.args_hash,
        "idempotency_key": op.idempotency_key,
        "resource_key": op.resource_key,
        "attempt": op.attempt,
        "result": op.result,
        "error": op.error,
        "compensates": op.compensates,
        "escalated": op.escalated_at is not None,
        "created_at": _when(op.created_at),
        "committed_at": _when(op.committed_at),
        "finished_at": _when(op.finished_at),
        "delivered_at": _when(op.delivered_at),
        "acknowledged_at": _when(op.acknowledged_at),
    }


async def list_operations(ledger: Ledger, filters: OperationFilter) -> list[dict[str, Any]]:
    """Return the operations matching ``filters`` as plain data, oldest first."""
    return [describe(op) for op in await ledger.list(filters)]


async def timeline(ledger: Ledger, operation_id: str) -> dict[str, Any]:
    """Return an operation and its audit events: who did what, when and why."""
    op = await ledger.get(operation_id)
    events: Sequence[OperationEvent] = await ledger.events(operation_id)
    return {
        "operation": describe(op),
        "events": [
            {
                "seq": e.seq,
                "at": _when(e.at),
                "kind": e.kind.value,
                "from": None if e.from_status is None else e.from_status.value,
                "to": e.to_status.value,
                "actor": e.actor,
                "detail": e.detail,
            }
            for e in events
        ],
    }


def _spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    ordered = sorted(values)
    return {
        "count": len(ordered),
        "p50_secs": round(stats_.median(ordered), 4),
        "p95_secs": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))], 4),
        "max_secs": round(ordered[-1], 4),
    }


_DUPLICATE_REFUSALS = frozenset({"duplicate", "idempotency_mismatch"})
_RUN = frozenset({S.RUNNING, S.CANCEL_REQUESTED})
"""Statuses an operation is in while its effect may be running."""


def _ratio(part: int, whole: int) -> float | None:
    return None if whole <= 0 else round(part / whole, 4)


async def _trails(ledger: Ledger, ops: Sequence[Operation]) -> dict[str, Sequence[OperationEvent]]:
    # A read that committed has nothing past its creation events; every other operation's
    # trail is read, a few at a time.
    wanted = [op for op in ops if op.kind != "read" or op.status is not S.COMMITTED]
    trails: dict[str, Sequence[OperationEvent]] = {}
    for start in range(0, len(wanted), 16):
        chunk = wanted[start : start + 16]
        found = await asyncio.gather(*(ledger.events(op.operation_id) for op in chunk))
        trails.update(zip((op.operation_id for op in chunk), found, strict=True))
    return trails


def _tool_statistics(
    tool_ops: Sequence[Operation], trails: dict[str, Sequence[OperationEvent]]
) -> dict[str, Any]:
    by_status = Counter(op.status.value for op in tool_ops)
    refusals: Counter[str] = Counter()
    counts: Counter[str] = Counter()
    for op in tool_ops:
        trail = trails.get(op.operation_id, ())
        details = [e.detail if isinstance(e.detail, dict) else {} for e in trail]
        if op.status is S.REJECTED and trail:
            reason = str(details[0].get("reason") or "unknown")  # the refusal's own event
            refusals[reason] += 1
            counts["duplicates_rejected"] += reason in _DUPLICATE_REFUSALS
        counts["duplicates_joined"] += sum(1 for d in details if "duplicate_joined" in d)
        statuses = [e.to_status for e in trail]
        counts["timeouts"] += any(e.actor == "watchdog" for e in trail) or any(
            d.get("timed_out") for d in details
        )
        counts["ever_unknown"] += S.UNKNOWN in statuses
        if S.CANCEL_REQUESTED in statuses:
            counts["cancellations_requested"] += 1
            counts["cancellations_confirmed"] += op.status is S.CANCELLED
        counts["cancelled_before_send"] += any(
            e.to_status is S.CANCELLED and e.from_status in (S.ADMITTED, S.FAILED_RETRYABLE)
            for e in trail
        )
        counts["late_results"] += any(d.get("delivered") and d.get("late") for d in details)
        counts["handoffs_with_pending"] += any("handoff_to" in d for d in details)
        counts["reconciliation_errors"] += sum(1 for d in details if "reconcile_error" in d)
        counts["reconciled"] += any(d.get("reason") == "reconciled" for d in details)
    executed = [op for op in tool_ops if op.attempt > 0]
    retries = sum(op.attempt - 1 for op in executed)
    committed = [op for op in tool_ops if op.committed_at is not None]
    proposals = len(tool_ops) + counts["duplicates_joined"]
    duplicates = counts["duplicates_joined"] + counts["duplicates_rejected"]
    return {
        "operations": len(tool_ops),
        "proposals": proposals,
        "by_status": dict(sorted(by_status.items())),
        "admission_to_commit": _spread(
            [op.committed_at - op.created_at for op in committed if op.committed_at]
        ),
        "execution_to_commit": _spread(
            [
                op.committed_at - op.sent_at
                for op in committed
                if op.committed_at and op.sent_at is not None
            ]
        ),
        "commit_to_acknowledged": _spread(
            [
                op.acknowledged_at - op.committed_at
                for op in committed
                if op.acknowledged_at and op.committed_at
            ]
        ),
        "executed": len(executed),
        "retried": sum(1 for op in executed if op.attempt > 1),
        "retries": retries,
        "retry_rate": _ratio(retries, len(executed)),
        "timeouts": counts["timeouts"],
        "timeout_rate": _ratio(counts["timeouts"], len(executed)),
        "duplicates_suppressed": duplicates,
        "duplicates_joined": counts["duplicates_joined"],
        "duplicate_rate": _ratio(duplicates, proposals),
        "unknown_now": by_status.get(S.UNKNOWN.value, 0),
        "ever_unknown": counts["ever_unknown"],
        "reconciled": counts["reconciled"],
        "reconciliation_errors": counts["reconciliation_errors"],
        "escalated": sum(1 for op in tool_ops if op.escalated_at is not None),
        "late_results": counts["late_results"],
        "cancellations_requested": counts["cancellations_requested"],
        "cancellations_confirmed": counts["cancellations_confirmed"],
        "cancelled_before_send": counts["cancelled_before_send"],
        "compensations": sum(1 for op in tool_ops if op.compensates is not None),
        "compensated": by_status.get(S.COMPENSATED.value, 0),
        "handoffs_with_pending": counts["handoffs_with_pending"],
        "refused_by_reason": dict(sorted(refusals.items())),
        "committed_undelivered": sum(
            1 for op in tool_ops if op.status is S.COMMITTED and op.delivered_at is None
        ),
    }


async def statistics(ledger: Ledger, filters: OperationFilter) -> dict[str, Any]:
    """Per-tool statistics of the operations matching ``filters``, from the ledger alone.

    What a process that did not run the bot can see: counts by status; admission to commit,
    execution (the committing attempt's send) to commit and commit to acknowledgement
    times; retries, timeouts (deadlines the watchdog enforced, reads past theirs) and their
    rates per executed operation; duplicates joined or rejected per call proposed; UNKNOWN
    now and ever, reconciliations and their errors, escalations; late results; cancellations
    requested, confirmed and before sending; compensations; operations pending at a
    handoff; refusals by reason; operations committed but never delivered. Admission
    latency is not in the ledger: see ``runtime.metrics``.
    """
    ops = await ledger.list(filters)
    trails = await _trails(ledger, ops)
    grouped: dict[str, list[Operation]] = defaultdict(list)
    for op in ops:
        grouped[op.tool].append(op)
    per_tool = {
        tool: _tool_statistics(tool_ops, trails) for tool, tool_ops in sorted(grouped.items())
    }
    return {"operations": len(ops), "tools": per_tool}


def render_statistics(data: dict[str, Any]) -> str:
    """Render `statistics` as text: one block per tool."""
    if not data["tools"]:
        return "no operation matches"
    lines: list[str] = []
    for tool, entry in data["tools"].items():
        lines.append(f"{tool}: {entry['operations']} operations, {entry['proposals']} proposals")
        for key, value in entry.items():
            if key in ("operations", "proposals") or value in (None, {}, 0):
                continue
            if isinstance(value, dict) and "p50_secs" in value:
                shown = (
                    f"p50 {value['p50_secs']:.3f} s  p95 {value['p95_secs']:.3f} s  "
                    f"max {value['max_secs']:.3f} s  (n={value['count']})"
                )
            elif isinstance(value, dict):
                shown = ", ".join(f"{k} {v}" for k, v in value.items())
            elif key.endswith("_rate"):
                shown = f"{value:.1%}"
            else:
                shown = str(value)
            lines.append(f"  {key.replace('_', ' '):<26} {shown}")
    return "\n".join(lines)


def render_rows(rows: list[dict[str, Any]]) -> str:
    """Render operations as a text table."""
    if not rows:
        return "no operation matches"
    lines = [f"{'operation':<30} {'tool':<22} {'status':<16} {'principal':<16} created"]
    for row in rows:
        lines.append(
            f"{row['operation_id']:<30} {row['tool'][:22]:<22} {row['status']:<16} "
            f"{row['principal'][:16]:<16} {row['created_at']}"
        )
    return "\n".join(lines)
