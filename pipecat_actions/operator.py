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

import importlib
import inspect
import os
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pipecat_actions.errors import ConfigurationError, PipecatActionsError
from pipecat_actions.ledger import Ledger, Operation, OperationEvent, OperationFilter
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

    Exact: every matching operation is counted (``filters.limit`` does not apply), in a few
    aggregate queries whatever the number of operations. The one exception says so: above
    100,000 values of a tool, a time spread's p50 and p95 are ranked among a sample of its
    operations and the spread carries ``"sampled"`` (how many; its count and max stay exact).
    """
    return await ledger.statistics(filters)


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
                sample = (
                    f", p50 and p95 from a sample of {value['sampled']}"
                    if "sampled" in value
                    else ""
                )
                shown = (
                    f"p50 {value['p50_secs']:.3f} s  p95 {value['p95_secs']:.3f} s  "
                    f"max {value['max_secs']:.3f} s  (n={value['count']}{sample})"
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
    targets = named or [op.operation_id async for op in _every(ledger, [S.UNKNOWN])]
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


async def _every(
    ledger: Ledger, status: Sequence[ActionStatus], *, page: int = 1000
) -> AsyncIterator[Operation]:
    """Yield every operation in ``status``, oldest first, a keyset page at a time."""
    wanted = OperationFilter(status=status, limit=page)
    while True:
        ops = await ledger.list(wanted)
        for op in ops:
            yield op
        if len(ops) < page:
            return
        wanted = replace(wanted, after=(ops[-1].created_at, ops[-1].operation_id))


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
