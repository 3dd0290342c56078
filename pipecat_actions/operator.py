"""What an operator reads from the ledger and does to it.

Operations, one operation's timeline, statistics, and the reconciliation of UNKNOWN operations
with the application's hooks. Used by ``pipecat-actions ledger list|show``, ``undelivered``,
``stats`` and ``reconcile``; every function returns plain data (for ``--json``) and has a text
rendering.

Reconciliation needs the application's own code (its ``reconcile`` hooks talk to its system of
record), so the operator process loads it: ``--app module:attr`` names an `OperatorApp`, or a
function (plain or async, no arguments) that returns one.
"""

from __future__ import annotations

__all__ = [
    "OperatorApp",
    "describe",
    "list_operations",
    "load_app",
    "reconcile",
    "render_reconciled",
    "render_rows",
    "render_statistics",
    "statistics",
    "timeline",
]

import asyncio
import importlib
import inspect
import os
import statistics as stats_
import sys
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pipecat_actions.errors import ConfigurationError, PipecatActionsError
from pipecat_actions.ledger import Ledger, Operation, OperationEvent, OperationFilter
from pipecat_actions.ledger.records import joined_calls
from pipecat_actions.status import ActionStatus

if TYPE_CHECKING:
    from pipecat_actions.actions import ActionDefinition
    from pipecat_actions.admission.authorization import Authorizer
    from pipecat_actions.policy import PolicySet

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
        counts["duplicates_joined"] += sum(joined_calls(d) for d in details)
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
    return _table(
        ["operation", "tool", "status", "principal", "created"],
        [
            [row["operation_id"], row["tool"], row["status"], row["principal"], row["created_at"]]
            for row in rows
        ],
    )


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    """Render a table with rich: no colours, never wrapped or cut (ids stay whole)."""
    import io

    from rich import box
    from rich.console import Console
    from rich.table import Table

    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for header in headers:
        table.add_column(header, no_wrap=True)
    cells = [[str(cell) for cell in row] for row in rows]
    for row in cells:
        table.add_row(*row)
    widths = [
        max([len(header)] + [len(row[i]) for row in cells]) for i, header in enumerate(headers)
    ]
    buffer = io.StringIO()
    console = Console(
        file=buffer, width=sum(widths) + 3 * len(widths) + 2, color_system=None, highlight=False
    )
    console.print(table)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()).strip("\n")


# --- reconciliation ---------------------------------------------------------------------------


@dataclass(frozen=True)
class OperatorApp:
    """What an operator process needs of the application to reconcile its operations.

    Attributes:
        policy: The tool policies (a loaded `PolicySet` or a file path), as the bot uses them.
        actions: The bot's actions, with their ``reconcile`` hooks bound to the same system of
            record the bot uses (never a fresh in-memory fake: it would find nothing).
        authorizer: The application's authorizer (not asked by reconciliation; default
            `AllowAll`).
    """

    policy: PolicySet | str | os.PathLike[str]
    actions: Sequence[ActionDefinition]
    authorizer: Authorizer | None = None


async def load_app(spec: str) -> OperatorApp:
    """Import ``module:attr`` and return the `OperatorApp` it is or its factory returns.

    Raises:
        ConfigurationError: The spec is malformed, cannot be imported, or gives something else.
    """
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ConfigurationError(f"--app {spec!r}: write module:attribute, e.g. bots.ops:app")
    if os.getcwd() not in sys.path:
        # As other module:attr loaders do (uvicorn, gunicorn): the application's package is
        # found from where the command runs, not only from where it was installed.
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # the application's import may fail in any way: one line
        raise ConfigurationError(f"--app {spec!r}: cannot import {module_name}: {exc}") from exc
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise ConfigurationError(f"--app {spec!r}: {module_name} has no {attr}")
        target = getattr(target, part)
    if callable(target) and not isinstance(target, OperatorApp):
        try:
            target = target()
            if inspect.isawaitable(target):
                target = await target
        except PipecatActionsError:
            raise
        except Exception as exc:
            raise ConfigurationError(f"--app {spec!r}: the factory failed: {exc}") from exc
    if not isinstance(target, OperatorApp):
        raise ConfigurationError(
            f"--app {spec!r} gives a {type(target).__name__}, not an OperatorApp"
        )
    return target


async def reconcile(
    ledger: Ledger,
    app: OperatorApp,
    *,
    operation_ids: Sequence[str] = (),
    actor: str,
    probes: int = 1,
) -> list[dict[str, Any]]:
    """Reconcile UNKNOWN operations with the application's hooks; return what happened.

    With ``operation_ids`` each must be UNKNOWN and reconcilable (else `ConfigurationError`);
    without, every UNKNOWN operation is tried and those that cannot be (tool not loaded, no
    hook) are reported as skipped. Outcomes are written by an `ActionRuntime` built on the
    same ledger (it recovers nothing of other processes), through its normal transitions,
    audited with ``actor``.
    """
    from pipecat_actions.admission.authorization import AllowAll
    from pipecat_actions.runtime import ActionRuntime

    named = list(operation_ids)
    targets = named or [
        op.operation_id
        for op in await ledger.list(OperationFilter(status=[S.UNKNOWN], limit=100_000))
    ]
    runtime = await ActionRuntime.create(
        app.policy,
        authorizer=app.authorizer or AllowAll(),
        actions=app.actions,
        ledger=ledger,
        owner=actor,
        recover=False,
    )
    rows: list[dict[str, Any]] = []
    try:
        for operation_id in targets:
            before = await ledger.get(operation_id)
            row: dict[str, Any] = {
                "operation_id": operation_id,
                "tool": before.tool,
                "before": before.status.value,
            }
            try:
                after = await runtime.reconcile_unknown(operation_id, actor=actor, probes=probes)
            except ConfigurationError as exc:
                if named:
                    raise
                rows.append({**row, "after": before.status.value, "changed": False,
                             "escalated": before.escalated_at is not None,
                             "note": f"skipped: {exc}"})  # fmt: skip
                continue
            rows.append(
                {
                    **row,
                    "after": after.status.value,
                    "changed": after.status is not before.status,
                    "escalated": after.escalated_at is not None,
                    "note": after.error if after.status is S.FAILED_FINAL else None,
                }
            )
    finally:
        await runtime.close(grace_secs=0)
    return rows


def render_reconciled(rows: list[dict[str, Any]]) -> str:
    """Render the outcome of `reconcile` as a text table."""
    if not rows:
        return "no operation is UNKNOWN"
    return _table(
        ["operation", "tool", "before", "after", "changed", "note"],
        [
            [
                row["operation_id"],
                row["tool"],
                row["before"],
                row["after"],
                "yes" if row["changed"] else "no" + (" (escalated)" if row["escalated"] else ""),
                row["note"] or "",
            ]
            for row in rows
        ],
    )
