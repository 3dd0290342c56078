"""What an operator reads from the ledger: operations, one operation's timeline, statistics.

Used by ``pipecat-actions ledger list|show``, ``undelivered`` and ``stats``; every function
returns plain data (for ``--json``) and has a text rendering.
"""

from __future__ import annotations

__all__ = ["describe", "list_operations", "render_rows", "statistics", "timeline"]

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


async def statistics(ledger: Ledger, filters: OperationFilter) -> dict[str, Any]:
    """Per-tool statistics of the operations matching ``filters``, from the ledger.

    Counts by status; admission to commit and commit to acknowledgement times; retried,
    unknown, escalated and compensated operations; cancellations requested against confirmed;
    refusals by reason; operations committed but never delivered.
    """
    ops = await ledger.list(filters)
    per_tool: dict[str, dict[str, Any]] = {}
    grouped: dict[str, list[Operation]] = defaultdict(list)
    for op in ops:
        grouped[op.tool].append(op)
    for tool, tool_ops in sorted(grouped.items()):
        by_status = Counter(op.status.value for op in tool_ops)
        refusals: Counter[str] = Counter()
        cancel_requested = cancelled_after_request = 0
        for op in tool_ops:
            if op.status is S.REJECTED:
                events = await ledger.events(op.operation_id)
                detail = events[0].detail if events else None  # the refusal's own event
                reason = detail.get("reason") if isinstance(detail, dict) else None
                refusals[str(reason or "unknown")] += 1
            if op.status in (S.CANCEL_REQUESTED, S.CANCELLED, S.COMMITTED, S.UNKNOWN):
                trail = [e.to_status for e in await ledger.events(op.operation_id)]
                if S.CANCEL_REQUESTED in trail:
                    cancel_requested += 1
                    cancelled_after_request += op.status is S.CANCELLED
        committed = [op for op in tool_ops if op.committed_at is not None]
        per_tool[tool] = {
            "operations": len(tool_ops),
            "by_status": dict(sorted(by_status.items())),
            "admission_to_commit": _spread(
                [op.committed_at - op.created_at for op in committed if op.committed_at]
            ),
            "commit_to_acknowledged": _spread(
                [
                    op.acknowledged_at - op.committed_at
                    for op in committed
                    if op.acknowledged_at and op.committed_at
                ]
            ),
            "retried": sum(1 for op in tool_ops if op.attempt > 1),
            "unknown_now": by_status.get(S.UNKNOWN.value, 0),
            "escalated": sum(1 for op in tool_ops if op.escalated_at is not None),
            "compensated": by_status.get(S.COMPENSATED.value, 0),
            "cancellations_requested": cancel_requested,
            "cancellations_confirmed": cancelled_after_request,
            "refused_by_reason": dict(sorted(refusals.items())),
            "committed_undelivered": sum(
                1 for op in tool_ops if op.status is S.COMMITTED and op.delivered_at is None
            ),
        }
    return {"operations": len(ops), "tools": per_tool}


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
