"""The application of the durable-execution tests: ``worker --dbos --app tests.durable._app:app``.

Its system of record is a table in the test's PostgreSQL database (``provider_effects``, one
row per effect, never deduplicated: a double effect shows as two rows), named by
``PA_TEST_PROVIDER_URL``. ``PA_TEST_ANSWER_DELAY`` is the provider's latency between doing the
effect and answering (real seconds, in the worker): the window in which a killed worker leaves
an effect done and not recorded, which only reconciliation may settle. The provider applies
a request in the effect's own statement and never later: its commit horizon is 0, so "no
trace" of a request whose worker died is proof that it did not happen.

With ``PA_TEST_GATES=1`` a worker passes four gates on the way through each operation that
has an ``amount_cents``, in order: `GATE_STEP_BEGUN` (its step has begun, the write-ahead
record not written: the authorizer asked again before a handed operation runs),
`GATE_REQUEST_UNSENT` (the effect's request about to leave), `GATE_IN_FLIGHT` (inside the
provider's own statement: the request has left and the provider holds it) and
`GATE_EFFECT_DONE` (the effect done, its answer not back). A gate is a shared PostgreSQL
advisory lock on (gate, amount_cents): open unless a test holds that lock, so a test stops one
chosen operation at one chosen point, sees it there in ``pg_locks``, and kills its worker.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

import asyncpg

from pipecat_actions import ActionContext, Reconciliation, action
from pipecat_actions.admission.authorization import AuthorizationRequest, Decision
from pipecat_actions.operator import OperatorApp
from pipecat_actions.policy import load_policy_text

POLICY_TEXT = """
version: 1
tools:
  transfer:
    kind: mutation
    mode: background
    execution: durable
    deadline_secs: 3600
    reconciliation: {commit_horizon_secs: 0}
  settle_invoice:
    kind: mutation
    mode: background
    execution: durable
    durable: {global_concurrency: 2, rate_per_minute: 6000}
    deadline_secs: 3600
    reconciliation: {commit_horizon_secs: 0}
  refund:
    kind: mutation
    mode: background
    execution: durable
    confirmation: {mode: approval, approvers: [maria], expires_after_secs: 3600}
    deadline_secs: 3600
    reconciliation: {commit_horizon_secs: 0}
  refund_today:
    kind: mutation
    mode: background
    execution: durable
    confirmation: {mode: approval, approvers: [maria], expires_after_secs: 1}
    deadline_secs: 3600
    reconciliation: {commit_horizon_secs: 0}
  transfer_tracked:
    kind: mutation
    mode: background
    execution: durable
    deadline_secs: 3600
    delivery: {intermediate: in_place}
    reconciliation: {commit_horizon_secs: 0}
  refund_spoken:
    kind: mutation
    mode: background
    execution: durable
    risk: high
    confirmation: {mode: verbal, expires_after_secs: 3600}
    deadline_secs: 3600
    reconciliation: {commit_horizon_secs: 0}
  refund_spoken_now:
    kind: mutation
    mode: background
    execution: durable
    risk: high
    confirmation: {mode: verbal, expires_after_secs: 1}
    deadline_secs: 3600
    reconciliation: {commit_horizon_secs: 0}
"""
POLICY = load_policy_text(POLICY_TEXT)

GATES_TABLE = """
CREATE TABLE IF NOT EXISTS provider_gates (
    operation_id text NOT NULL,
    gate integer NOT NULL,
    PRIMARY KEY (operation_id, gate)
)
"""
"""Gates a tracked transfer waits behind, one row each, opened by the test."""

PROVIDER_TABLE = """
CREATE TABLE IF NOT EXISTS provider_effects (
    seq bigserial PRIMARY KEY,
    idem_key text NOT NULL,
    operation_id text NOT NULL,
    pid integer NOT NULL
)
"""

GATE_STEP_BEGUN = 1
GATE_REQUEST_UNSENT = 2
GATE_IN_FLIGHT = 3
GATE_EFFECT_DONE = 4

_pool: asyncpg.Pool | None = None


async def _provider() -> asyncpg.Pool:
    global _pool
    while _pool is None:
        try:
            # Both connections opened now and kept: the shared test server's 100 connections
            # may all be taken for a moment by other tests, which the fake does not play.
            _pool = await asyncpg.create_pool(
                os.environ["PA_TEST_PROVIDER_URL"], min_size=2, max_size=2
            )
        except asyncpg.TooManyConnectionsError:
            await asyncio.sleep(0.1)
    return _pool


def _gated(args: dict[str, Any]) -> int | None:
    """The gate key of an operation with these arguments, when gates are on."""
    if os.environ.get("PA_TEST_GATES") != "1" or "amount_cents" not in args:
        return None
    return int(args["amount_cents"])


async def _pass(gate: int, key: int | None) -> None:
    if key is not None:
        pool = await _provider()
        await pool.execute("SELECT pg_advisory_xact_lock_shared($1, $2)", gate, key)


class GatedAllowAll:
    """Allows every call; a handed operation's step passes `GATE_STEP_BEGUN` first."""

    async def authorize(self, request: AuthorizationRequest) -> Decision:
        if request.stage != "admission":
            await _pass(GATE_STEP_BEGUN, _gated(dict(request.args)))
        return Decision.allow()


async def find_by_key(ctx: ActionContext) -> Reconciliation:
    pool = await _provider()
    found = await pool.fetchval(
        "SELECT count(*) FROM provider_effects WHERE idem_key = $1", ctx.idempotency_key
    )
    if found:
        return Reconciliation.committed({"effects": found})
    return Reconciliation.not_found()


async def _effect(ctx: ActionContext) -> dict[str, Any]:
    pool = await _provider()
    key = _gated(dict(ctx.args))
    await _pass(GATE_REQUEST_UNSENT, key)
    if key is None:
        await pool.execute(
            "INSERT INTO provider_effects (idem_key, operation_id, pid) VALUES ($1, $2, $3)",
            ctx.idempotency_key,
            ctx.operation_id,
            os.getpid(),
        )
    else:
        # The gate is inside the provider's statement: held there, the request has left and
        # the provider applies it even if its sender dies meanwhile.
        await pool.execute(
            "INSERT INTO provider_effects (idem_key, operation_id, pid) "
            "SELECT $1, $2, $3 FROM pg_advisory_xact_lock_shared($4, $5) AS gate",
            ctx.idempotency_key,
            ctx.operation_id,
            os.getpid(),
            GATE_IN_FLIGHT,
            key,
        )
    await _pass(GATE_EFFECT_DONE, key)
    delay = float(os.environ.get("PA_TEST_ANSWER_DELAY", "0"))
    if delay:
        await asyncio.sleep(delay)  # the provider's answer is on its way
    return {"done": ctx.operation_id}


async def _gate(ctx: ActionContext, gate: int) -> None:
    """Wait until the test opens ``gate`` of this operation (a row in ``provider_gates``)."""
    pool = await _provider()
    while not await pool.fetchval(
        "SELECT count(*) FROM provider_gates WHERE operation_id = $1 AND gate = $2",
        ctx.operation_id,
        gate,
    ):
        await asyncio.sleep(0.01)  # a wait for the test's cause, guarded by the test


TRACKED_REPORTS = ("checking the account", "sending the transfer")
"""What a tracked transfer reports, each behind a gate (1, then 2) the test opens."""


@action(reconcile=find_by_key)
async def transfer_tracked(ctx: ActionContext, account: str, amount_cents: int) -> dict[str, Any]:
    """Move money between accounts, reporting how far it got."""
    await ctx.report(TRACKED_REPORTS[0], step=1)
    await _gate(ctx, 1)
    await ctx.report(TRACKED_REPORTS[1], step=2)
    await _gate(ctx, 2)
    return await _effect(ctx)


@action(reconcile=find_by_key)
async def refund_spoken(ctx: ActionContext, order: str, amount_cents: int) -> dict[str, Any]:
    """Refund an order, once the user says yes."""
    return await _effect(ctx)


@action(reconcile=find_by_key)
async def refund_spoken_now(ctx: ActionContext, order: str, amount_cents: int) -> dict[str, Any]:
    """Refund an order, if the user says yes within a second (its window)."""
    return await _effect(ctx)


@action(reconcile=find_by_key)
async def transfer(ctx: ActionContext, account: str, amount_cents: int) -> dict[str, Any]:
    """Move money between accounts."""
    return await _effect(ctx)


@action(reconcile=find_by_key)
async def settle_invoice(ctx: ActionContext, invoice: str) -> dict[str, Any]:
    """Settle an invoice."""
    return await _effect(ctx)


@action(reconcile=find_by_key)
async def refund(ctx: ActionContext, order: str, amount_cents: int) -> dict[str, Any]:
    """Refund an order, once a person approves."""
    return await _effect(ctx)


@action(reconcile=find_by_key)
async def refund_today(ctx: ActionContext, order: str, amount_cents: int) -> dict[str, Any]:
    """Refund an order, if a person approves within a second (its window)."""
    return await _effect(ctx)


ACTIONS = [
    transfer,
    settle_invoice,
    refund,
    refund_today,
    transfer_tracked,
    refund_spoken,
    refund_spoken_now,
]


def app() -> OperatorApp:
    return OperatorApp(policy=POLICY, actions=ACTIONS, authorizer=GatedAllowAll())
