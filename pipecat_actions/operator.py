"""What an operator reads from the ledger and does to it.

Operations, one operation's timeline, the operations awaiting approval, statistics, and the
reconciliation of UNKNOWN operations with the application's hooks. Used by ``pipecat-actions
ledger list|show``, ``approvals list|show``, ``undelivered``, ``stats`` and ``reconcile``;
every function returns plain data (for ``--json``) and has a text rendering (``render_*``, in
`pipecat_actions._operator_text`), which shows every value of the ledger through
`pipecat_actions._printable.printable`.

Values a policy marks ``sensitive`` are stored sealed and shown masked (``••••``); `reveal`
records on the operation that an operator is shown them, then decrypts them for the views.

Reconciliation needs the application's own code (its ``reconcile`` hooks talk to its system of
record), so the operator process loads it: ``--app module:attr`` names an `OperatorApp`, or a
function (plain or async, no arguments) that returns one.
"""

from __future__ import annotations

__all__ = [
    "OperatorApp",
    "describe",
    "describe_approval",
    "ledger_line",
    "list_operations",
    "load_app",
    "reconcile",
    "render_approval",
    "render_approvals",
    "render_reconciled",
    "render_rows",
    "render_statistics",
    "render_timeline",
    "reveal",
    "statistics",
    "timeline",
]

import importlib
import inspect
import os
import sys
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from pipecat_actions._operator_text import (
    ledger_line,
    render_approval,
    render_approvals,
    render_reconciled,
    render_rows,
    render_statistics,
    render_timeline,
    when,
)
from pipecat_actions.errors import ConfigurationError, PipecatActionsError
from pipecat_actions.ledger import Ledger, Operation, OperationEvent, OperationFilter
from pipecat_actions.ledger.keys import LedgerKeys
from pipecat_actions.ledger.sealing import Sealer, holds_sealed_values, operator_view
from pipecat_actions.status import ActionStatus

if TYPE_CHECKING:
    from pipecat_actions.actions import ActionDefinition
    from pipecat_actions.admission.authorization import Authorizer
    from pipecat_actions.approvals import ApprovalRule
    from pipecat_actions.policy import PolicySet

S = ActionStatus


def describe(op: Operation, sealer: Sealer | None = None) -> dict[str, Any]:
    """Return an operation as plain data.

    Sealed values (a policy's ``sensitive`` paths) are shown masked, ``••••``; with the
    ``sealer`` of an operator who reveals them (`reveal`), decrypted.
    """
    return {
        "operation_id": op.operation_id,
        "tool": op.tool,
        "kind": op.kind,
        "status": op.status.value,
        "session_id": op.session_id,
        "principal": op.principal,
        "tenant": op.tenant,
        "args": operator_view(op, "args", sealer),
        "args_hash": op.args_hash,
        "idempotency_key": op.idempotency_key,
        "resource_key": op.resource_key,
        "attempt": op.attempt,
        "result": operator_view(op, "result", sealer),
        "error": op.error,
        "compensates": op.compensates,
        "escalated": op.escalated_at is not None,
        "created_at": when(op.created_at),
        "committed_at": when(op.committed_at),
        "finished_at": when(op.finished_at),
        "delivered_at": when(op.delivered_at),
        "acknowledged_at": when(op.acknowledged_at),
    }


def describe_approval(
    op: Operation, rule: ApprovalRule | None = None, sealer: Sealer | None = None
) -> dict[str, Any]:
    """Return what an approver decides on as plain data (times in epoch seconds).

    The console shows the same: the arguments and their hash, the before-state snapshot,
    the model's rationale and, given the request's ``rule``, what the tool does, the summary
    of what is approved (its ``confirmation.summary`` filled in, a field the request does not
    hold as ``[missing: before.x]``), its risk and who may decide. Sealed values are masked
    unless ``sealer`` reveals them (see `describe`).
    """
    data: dict[str, Any] = {
        "operation_id": op.operation_id,
        "tool": op.tool,
    }
    if rule is not None:
        # Imported here: an operator's read command never loads the policy model.
        from pipecat_actions.policy.summary import render_summary, summary_text

        data["description"] = rule.description
        data["summary"] = (
            None
            if rule.summary is None
            else summary_text(
                render_summary(
                    rule.summary,
                    operator_view(op, "args", sealer),
                    operator_view(op, "before_state", sealer),
                )
            )
        )
    data |= {
        "status": op.status.value,
        "principal": op.principal,
        "tenant": op.tenant,
        "session_id": op.session_id,
        "args": operator_view(op, "args", sealer),
        "args_hash": op.args_hash,
        "created_at": op.created_at,
        "expires_at": op.deadline_at,
        "rationale": op.rationale,
        "before_state": operator_view(op, "before_state", sealer),
    }
    if rule is not None:
        data["risk"] = rule.risk
        data["approvers"] = list(rule.approvers)
        data["approver_roles"] = list(rule.roles)
    return data


async def reveal(
    ledger: Ledger, op: Operation, *, actor: str, environ: Mapping[str, str] | None = None
) -> Sealer:
    """Let ``actor`` see ``op``'s sealed values: audit it, then return what opens them.

    The annotation (``revealed_by``) is written first: nothing is shown unless it is recorded.
    An operation with no sealed value is shown without one.

    Raises:
        LedgerKeysError: ``PIPECAT_ACTIONS_LEDGER_KEYS`` is not set (or malformed).
    """
    keys = LedgerKeys.from_environment(environ)
    keys.require(encryption=True, hashing=False, why="revealing sealed values decrypts them")
    sealer = Sealer({}, keys)
    if holds_sealed_values(op):
        await ledger.annotate(
            op.operation_id,
            actor=actor,
            detail={"revealed_by": actor, "reason": "sealed values shown to an operator"},
        )
    return sealer


async def list_operations(ledger: Ledger, filters: OperationFilter) -> list[dict[str, Any]]:
    """Return the operations matching ``filters`` as plain data, oldest first."""
    return [describe(op) for op in await ledger.list(filters)]


async def timeline(
    ledger: Ledger, operation_id: str, *, revealed_by: str | None = None
) -> dict[str, Any]:
    """Return an operation and its audit events: who did what, when and why.

    With ``revealed_by``, its sealed values are shown decrypted, and that is audited first
    (see `reveal`).
    """
    op = await ledger.get(operation_id)
    sealer = None if revealed_by is None else await reveal(ledger, op, actor=revealed_by)
    events: Sequence[OperationEvent] = await ledger.events(operation_id)
    return {
        "operation": describe(op, sealer),
        "events": [
            {
                "seq": e.seq,
                "at": when(e.at),
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
    now and ever, reconciliations and their errors, conflicts (operations the ledger held
    as failed that the system of record reports committed; their sum over the tools is
    ``"conflicts"`` beside ``"operations"``), escalations; late results; cancellations
    requested, confirmed and before sending; compensations; operations pending at a
    handoff; refusals by reason; committed operations someone is owed and was never told
    (``committed_undelivered``: reads are never owed, see `OperationFilter.undelivered`). Admission
    latency is not in the ledger: see ``runtime.metrics``.

    Exact: every matching operation is counted (``filters.limit`` does not apply), in a few
    aggregate queries whatever the number of operations. The one exception says so: above
    100,000 values of a tool, a time spread's p50 and p95 are ranked among a sample of its
    operations and the spread carries ``"sampled"`` (how many; its count and max stay exact).
    """
    return await ledger.statistics(filters)


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
        routed: The tools of the policy the bot routes instead of giving them as actions
            (``ActionRuntime.create(routed=...)``: handlers it registers on the LLM, Pipecat
            Flows functions); their operations cannot be reconciled here (no hook is loaded).
    """

    policy: PolicySet | str | os.PathLike[str]
    actions: Sequence[ActionDefinition]
    authorizer: Authorizer | None = None
    routed: Sequence[str] = ()


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
        routed=app.routed,
        ledger=ledger,
        owner=actor,
        recover=False,
        admits_calls=False,
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
