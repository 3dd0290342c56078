"""The tools of the crash matrix, on a `FileSystemOfRecord`, for the child and the recoverers.

The child builds them with a `Faults` object: each operation's provider behaves as its plan
says, and the target operation runs into the crash point. The recovering runtimes build them
without one: the provider answers every request (it is healthy again), so whatever the
recovery runs, reconciles or reverses is counted as it really happens.

Every side effect is committed under the operation's idempotency key (a compensation under
its own key), so the checker can count side effects per key.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from pipecat_actions.actions import ActionContext, ActionDefinition, Reconciliation, action
from pipecat_actions.execution.outcomes import EffectFailed, EffectRetryable
from pipecat_actions.policy import PolicySet, load_policy_text
from tests._file_system_of_record import FileSystemOfRecord
from tests.crash._plan import Plan, Point

HANG_SECS = 3600.0
SLOW_SECS = 0.3
APPROVAL_EXPIRES_SECS = 300.0
DEADLINE_SECS = 900.0


def policy_for(dedupes: bool) -> PolicySet:
    """The policy of the four tools; ``dedupes`` says whether the provider honours our keys.

    Only then may a booking or a refund be retried (three attempts, short backoffs).
    """
    keyed = [
        f"idempotency: {{provider_dedupes: {'true' if dedupes else 'false'}}}",
        "retry: {max_attempts: 3, initial_backoff_secs: 0.01, max_backoff_secs: 0.05}"
        if dedupes
        else "retry: {max_attempts: 1}",
    ]
    # The file system of record commits inside the effect's own call, never after it: once
    # the effect stopped (its process killed), no trace of it means it did not happen.
    deadline = f"deadline_secs: {DEADLINE_SECS}\n    reconciliation: {{commit_horizon_secs: 0}}"
    tools = {
        "book": ["kind: mutation", deadline, *keyed],
        "book_later": ["kind: mutation", "admit_when: turn_confirmed", deadline, *keyed],
        "note": ["kind: mutation", deadline],
        "refund": [
            "kind: mutation",
            "confirmation: {mode: approval, approvers: [operator], "
            f"expires_after_secs: {APPROVAL_EXPIRES_SECS}}}",
            deadline,
            *keyed,
        ],
    }
    lines = ["version: 1", "tools:"]
    for name, keys in tools.items():
        lines += [f"  {name}:", *(f"    {key}" for key in keys)]
    return load_policy_text("\n".join(lines) + "\n")


@dataclass
class Faults:
    """What the child's provider and hooks do, from the plan, and how the child dies.

    Attributes:
        plan: The case.
        crash: Says the crash line and SIGKILLs this process (never returns).
        hold: Says the crash-point line and waits for the parent's SIGKILL (never returns).
        status_of: Reads an operation's ledger status (to report it at the crash).
    """

    plan: Plan
    crash: Callable[..., None]
    hold: Callable[..., Awaitable[None]]
    status_of: Callable[[str], Awaitable[str]]
    probes: dict[str, int] = field(default_factory=dict)

    def behaviour(self, ref: str) -> str:
        """How the provider treats the operation named ``ref``."""
        return next((op.behaviour for op in self.plan.ops if op.ref == ref), "ok")


def crash_actions(sor: FileSystemOfRecord, faults: Faults | None = None) -> list[ActionDefinition]:
    """The actions ``book``, ``book_later``, ``note`` and ``refund`` (see `policy_for`)."""

    async def effect(ctx: ActionContext, ref: str, kind: str) -> dict[str, Any]:
        behaviour = faults.behaviour(ref) if faults else "ok"
        key = ctx.idempotency_key
        if behaviour == "target":
            assert faults is not None
            return await _target_effect(faults, sor, ctx, ref, kind)
        if behaviour == "not_sent_once" and ctx.attempt == 1:
            raise ConnectionRefusedError("the provider is unreachable; nothing was sent")
        if behaviour == "busy_once" and ctx.attempt == 1:
            sor.receive(key, kind)
            raise EffectRetryable("the provider is busy; try again")
        if behaviour == "rejected":
            sor.receive(key, kind)
            raise EffectFailed("the provider refused it")
        if behaviour == "hang":
            sor.receive(key, kind)
            await asyncio.sleep(HANG_SECS)
        if behaviour == "slow":
            await asyncio.sleep(SLOW_SECS)
        if behaviour == "lost_request":
            sor.receive(key, kind)
            raise TimeoutError("no answer from the provider")
        row = sor.commit(key, kind, {"ref": ref})
        if behaviour == "lost_answer":
            raise TimeoutError("the provider's answer was lost")
        return {"row": row, "ref": ref}

    async def book(ctx: ActionContext, ref: str) -> dict[str, Any]:
        """Book a table."""
        return await effect(ctx, ref, "book")

    async def note(ctx: ActionContext, ref: str) -> dict[str, Any]:
        """Send a note; it cannot be looked up afterwards."""
        return await effect(ctx, ref, "note")

    async def refund(ctx: ActionContext, ref: str) -> dict[str, Any]:
        """Refund a deposit."""
        return await effect(ctx, ref, "refund")

    async def find(ctx: ActionContext) -> Reconciliation:
        ref = str(ctx.args["ref"])
        reconciling = faults is not None and faults.plan.point is Point.DURING_RECONCILIATION
        if reconciling and faults is not None and ref == faults.plan.target:
            # The child dies at the plan's probe; the probes before it cannot tell yet.
            probe = faults.probes[ref] = faults.probes.get(ref, 0) + 1
            if faults.plan.variant.endswith(f"probe{probe}"):
                faults.crash(
                    ref=ref,
                    operation_id=ctx.operation_id,
                    status=await faults.status_of(ctx.operation_id),
                    probe=probe,
                )
            return Reconciliation.pending()
        row = sor.find(ctx.idempotency_key)
        if row is None:
            return Reconciliation.not_found()
        return Reconciliation.committed({"row": row, "ref": ref})

    async def cancel_booking(ctx: ActionContext) -> dict[str, Any]:
        original = ctx.operation
        assert original is not None and original.result is not None
        step = faults.plan.variant if faults else None
        if step == "before_cancel":
            assert faults is not None
            faults.crash(ref=original.args["ref"], operation_id=ctx.operation_id, step=step)
        row = sor.commit(ctx.idempotency_key, "cancel", {"row": original.result["row"]})
        if step == "after_cancel":
            assert faults is not None
            faults.crash(ref=original.args["ref"], operation_id=ctx.operation_id, step=step)
        return {"cancelled": original.result["row"], "row": row}

    return [
        action(name="book", reconcile=find, compensate=cancel_booking)(book),
        action(name="book_later", reconcile=find, compensate=cancel_booking)(book),
        action(name="note")(note),
        action(name="refund", reconcile=find)(refund),
    ]


async def _target_effect(
    faults: Faults, sor: FileSystemOfRecord, ctx: ActionContext, ref: str, kind: str
) -> dict[str, Any]:
    point, variant, key = faults.plan.point, faults.plan.variant, ctx.idempotency_key
    where = {"ref": ref, "operation_id": ctx.operation_id, "attempt": ctx.attempt}
    if point is Point.AFTER_RUNNING_BEFORE_SEND:
        if variant == "attempt2" and ctx.attempt == 1:
            raise ConnectionRefusedError("the provider is unreachable; nothing was sent")
        faults.crash(**where, status=await faults.status_of(ctx.operation_id))
    if point is Point.AFTER_SEND_BEFORE_ANSWER:
        sor.receive(key, kind)
        await faults.hold(**where, status=await faults.status_of(ctx.operation_id))
    if point is Point.DURING_RECONCILIATION:
        if variant.startswith("committed"):
            sor.commit(key, kind, {"ref": ref})
        else:
            sor.receive(key, kind)
        raise TimeoutError("the provider's answer was lost")
    row = sor.commit(key, kind, {"ref": ref})
    if point is Point.AFTER_PROVIDER_COMMIT:
        faults.crash(**where, row=row, status=await faults.status_of(ctx.operation_id))
    if point is Point.AFTER_COMMITTED_BEFORE_DELIVERY and variant == "reconciled":
        raise TimeoutError("the provider's answer was lost")
    return {"row": row, "ref": ref}
