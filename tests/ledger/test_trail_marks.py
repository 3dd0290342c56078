"""`stats` reads what each trail says from its row, and says what a reading of the trail says.

Each write folds what its audit event says into its operation's row (`_trail`); migration 0004
fills those columns in from the events of an older ledger. Whatever the history (random walks
over every allowed transition, by every kind of actor, with details that mark something,
details that only mention a marker's word, refusals for any reason), the figures `stats` gives
are those a trail-by-trail reading of `Ledger.events` gives, on both backends, as written and
after the columns are dropped and filled in again by the migration.
"""

from __future__ import annotations

import itertools
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

from alembic import command
from sqlalchemy import Connection
from sqlalchemy.ext.asyncio import create_async_engine

from pipecat_actions.ledger import OperationFilter, SqlLedger, migrate
from pipecat_actions.ledger._rows import EncodedOperation, creation_arrays, creation_events
from pipecat_actions.ledger._trail import TrailMarks
from pipecat_actions.ledger.engine import normalize_url
from pipecat_actions.ledger.records import canonical_json, joined_calls
from pipecat_actions.ledger.schema import STATS_COLUMNS
from pipecat_actions.status import (
    TERMINAL_STATUSES,
    TRANSITIONS,
    ActionStatus,
    path_from_requested,
)
from tests.ledger._support import new_op, record_selects, sqlite_plans

S = ActionStatus
ACTORS = ("runtime:s1", "watchdog", "reconciler", "gate:call-1", "approver:bob")
DETAILS: tuple[dict[str, Any] | None, ...] = (
    None,
    {"duplicates_joined": [{"turn": 2}, {"turn": 3}]},
    {"duplicate_joined": {"turn": 4}},
    {"timed_out": True},
    {"timed_out": False},
    {"delivered": "COMMITTED", "late": True},
    {"delivered": "COMMITTED", "late": False},
    {"late": True},
    {"handoff_to": "billing"},
    {"reconcile_error": "hook raised"},
    {"reason": "reconciled"},
    {"reason": "user changed their mind"},
    # Only a marker's words, as values: they must count for nothing.
    {"note": '"timed_out" "late":true "handoff_to" "reconciled" "duplicates_joined"'},
    {"reason": "not reconciled", "error": "reconcile_error"},
)
REFUSALS = (
    "invalid_arguments",
    "duplicate",
    "idempotency_mismatch",
    "policy",
    None,
    "a reason of any length is counted under its whole text " * 4,
)
FIGURES = (
    "timeouts",
    "ever_unknown",
    "cancellations_requested",
    "cancellations_confirmed",
    "cancelled_before_send",
    "late_results",
    "handoffs_with_pending",
    "reconciliation_errors",
    "reconciled",
    "duplicates_joined",
    "duplicates_suppressed",
    "refused_by_reason",
    "by_status",
    "proposals",
)


async def _random_histories(ledger: SqlLedger, tenant: str, seed: int, count: int) -> None:
    """``count`` operations, each a random walk from how it was created."""
    rng = random.Random(seed)
    for i in range(count):
        key = f"{tenant}-{i}"
        detail = rng.choice(DETAILS)
        start = rng.choice([S.ADMITTED, S.RUNNING, S.AWAITING_APPROVAL, S.REJECTED])
        if start is S.REJECTED:
            reason = rng.choice(REFUSALS)
            refused = {"reason": reason} if reason else None
            await ledger.record_refusal(new_op(key, tenant=tenant, detail=refused))
            continue
        admitted = await ledger.admit(
            new_op(key, tenant=tenant, status=start, detail=detail, actor=rng.choice(ACTORS))
        )
        op = admitted.operation
        for _ in range(rng.randint(0, 6)):
            if rng.random() < 0.35 or (op.status in TERMINAL_STATUSES and rng.random() < 0.5):
                op = await ledger.annotate(
                    op.operation_id, actor=rng.choice(ACTORS), detail=rng.choice(DETAILS)
                )
                continue
            following = sorted(TRANSITIONS[op.status])
            if not following:
                break
            op = await ledger.transition(
                op.operation_id,
                expected=op.status,
                to=rng.choice(following),
                fence=op.fence,
                actor=rng.choice(ACTORS),
                detail=rng.choice(DETAILS),
            )


async def _read_trail_by_trail(ledger: SqlLedger, tenant: str) -> dict[str, Any]:
    """The figures, from every operation's events one by one (what `stats` must agree with)."""
    counts: Counter[str] = Counter()
    refusals: Counter[str] = Counter()
    by_status: Counter[str] = Counter()
    for op in await ledger.list(OperationFilter(tenant=tenant, limit=10_000)):
        trail = await ledger.events(op.operation_id)
        details = [json.loads(e.detail_json) if e.detail_json else {} for e in trail]
        details = [d if isinstance(d, dict) else {} for d in details]
        statuses = {e.to_status for e in trail}
        by_status[op.status.value] += 1
        counts["duplicates_joined"] += sum(joined_calls(d) for d in details)
        counts["timeouts"] += any(e.actor == "watchdog" for e in trail) or any(
            d.get("timed_out") for d in details
        )
        counts["ever_unknown"] += S.UNKNOWN in statuses
        counts["cancellations_requested"] += S.CANCEL_REQUESTED in statuses
        counts["cancellations_confirmed"] += (
            S.CANCEL_REQUESTED in statuses and op.status is S.CANCELLED
        )
        counts["cancelled_before_send"] += any(
            e.to_status is S.CANCELLED and e.from_status in (S.ADMITTED, S.FAILED_RETRYABLE)
            for e in trail
        )
        counts["late_results"] += any(d.get("delivered") and d.get("late") for d in details)
        counts["handoffs_with_pending"] += any("handoff_to" in d for d in details)
        counts["reconciliation_errors"] += sum("reconcile_error" in d for d in details)
        counts["reconciled"] += any(d.get("reason") == "reconciled" for d in details)
        if op.status is S.REJECTED:
            reason = str(details[0].get("reason") or "unknown")
            refusals[reason] += 1
            counts["rejected_as_duplicates"] += reason in ("duplicate", "idempotency_mismatch")
    figures: dict[str, Any] = {name: counts[name] for name in FIGURES if name in counts}
    figures.update(
        {name: 0 for name in FIGURES if name not in figures},
        refused_by_reason=dict(sorted(refusals.items())),
        by_status=dict(sorted(by_status.items())),
        proposals=sum(by_status.values()) + counts["duplicates_joined"],
        duplicates_suppressed=counts["duplicates_joined"] + counts["rejected_as_duplicates"],
    )
    return figures


async def _stats_figures(ledger: SqlLedger, tenant: str) -> dict[str, Any]:
    tools = (await ledger.statistics(OperationFilter(tenant=tenant)))["tools"]
    assert list(tools) == ["book_table"]
    return {name: tools["book_table"][name] for name in FIGURES}


async def test_stats_say_what_a_reading_of_every_trail_says_for_any_history(
    ledger: SqlLedger,
) -> None:
    reached: Counter[str] = Counter()
    for seed in range(4):
        tenant = f"t{seed}"
        await _random_histories(ledger, tenant, seed, count=80)
        expected = await _read_trail_by_trail(ledger, tenant)
        assert await _stats_figures(ledger, tenant) == expected, f"seed {seed}"
        reached.update(name for name in FIGURES if expected[name])
    # The walks reach every figure, so the comparison is not one of zeros.
    assert set(reached) == set(FIGURES), reached


def _run_migration(conn: Connection, revision: str, down: bool) -> None:
    config = migrate._config()
    config.attributes["connection"] = conn
    (command.downgrade if down else command.upgrade)(config, revision)


async def _migrate(url: str, revision: str, *, down: bool = False) -> None:
    engine = create_async_engine(normalize_url(url))
    try:
        async with engine.begin() as conn:
            await conn.run_sync(_run_migration, revision, down)
    finally:
        await engine.dispose()


async def test_the_upgrade_fills_in_from_the_events_what_the_writers_folded_in(
    ledger_url: str,
) -> None:
    ledger = await SqlLedger.create(ledger_url)
    try:
        await _random_histories(ledger, "t", seed=7, count=120)
        written = await ledger.statistics()
    finally:
        await ledger.close()
    # Back to a ledger written before the columns existed, then up again: what the upgrade
    # reads off the events is what the writers folded in as they wrote them.
    await _migrate(ledger_url, "0003", down=True)
    await _migrate(ledger_url, "head")
    ledger = await SqlLedger.create(ledger_url)
    try:
        assert await ledger.statistics() == written
        assert await _stats_figures(ledger, "t") == await _read_trail_by_trail(ledger, "t")
    finally:
        await ledger.close()


FILTERS = {
    "none": OperationFilter(),
    "tool": OperationFilter(tool="book_table"),
    "since": OperationFilter(created_from=0.0),
    "tenant and tool": OperationFilter(tenant="t", tool="book_table"),
    "status": OperationFilter(status=[S.UNKNOWN]),
    "undelivered": OperationFilter(status=[S.COMMITTED], undelivered=True),
    "session": OperationFilter(session_id="session-1"),
    "resource": OperationFilter(tenant="t", resource_key="table:7"),
    "principal": OperationFilter(principal="user:alice"),
    "lease owner": OperationFilter(lease_owner="worker-1"),
}


async def test_stats_on_sqlite_never_walk_an_index_reading_every_row(tmp_path: Path) -> None:
    # The covering index in order when it holds the filtered columns (no sort, no read of the
    # table); else the index that finds the filter's rows; else the table itself. Never an
    # index walked with a read of the table per row, which SQLite chose for a principal.
    path = tmp_path / "plans.db"
    ledger = await SqlLedger.create(f"sqlite:///{path}")
    issued: dict[str, list[tuple[str, Any]]] = {}
    try:
        await _random_histories(ledger, "t", seed=3, count=20)
        selects = record_selects(ledger)
        for name, filters in FILTERS.items():
            await ledger.statistics(filters)
            issued[name], selects[:] = selects[:], []
    finally:
        await ledger.close()

    plans = {name: sqlite_plans(path, statements) for name, statements in issued.items()}
    assert set(plans) == set(FILTERS)
    for name in ("none", "tool", "since", "tenant and tool", "status", "undelivered"):
        assert all("COVERING INDEX ix_pa_operations_stats" in p for p in plans[name]), plans
    for name in ("none", "tool", "since", "tenant and tool"):  # a status sorts only its rows
        assert not any("TEMP B-TREE" in p for p in plans[name]), (name, plans[name])
    assert all("INDEX ix_pa_operations_session (session_id=?" in p for p in plans["session"])
    # No index leads by a resource since migration 0007 (its one query names the session).
    for name in ("principal", "lease owner", "resource"):
        assert all(p.startswith("SCAN pa_operations") and "INDEX" not in p.split("|")[0]
                   for p in plans[name]), plans[name]  # fmt: skip
    assert STATS_COLUMNS[:5] == ("tool", "tenant", "status", "trail_marks", "refusal_reason")


def test_a_new_operations_marks_are_what_its_creation_events_say_for_every_status() -> None:
    # A new row's trail columns are folded from its status steps (`TrailMarks.of_steps`),
    # never from the events themselves: both readings must agree, whatever the detail says.
    for status in ActionStatus:
        path = path_from_requested(status)
        steps = tuple((a.value, b.value) for a, b in itertools.pairwise(path))
        for actor in ACTORS:
            for detail in DETAILS:
                detail_json = None if detail is None else canonical_json(detail)
                events = [
                    {"from_status": a, "to_status": b, "actor": actor, "detail_json": detail_json}
                    for a, b in steps
                ]
                said = TrailMarks.of_steps(steps, actor=actor, detail_json=detail_json)
                assert said == TrailMarks.of_trail(events), (status, actor, detail)


def test_a_new_operations_event_arrays_are_its_creation_events_column_by_column() -> None:
    for status in ActionStatus:
        encoded = EncodedOperation.of(
            new_op("k", status=status, detail={"reason": "r"}, actor="runtime:x")
        )
        rows = creation_events(encoded, 12.5)
        assert len(rows) == len(path_from_requested(status)) - 1
        columns = ("seq", "at", "kind", "from_status", "to_status", "actor", "detail_json")
        assert creation_arrays(encoded, 12.5) == [[row[c] for row in rows] for c in columns]
