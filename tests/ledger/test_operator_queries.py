"""Operator queries read every row, page by keyset, and use an index, on both backends.

`stats` counts every operation a filter matches (no cap; a sampled spread says so) with the figures
a trail-by-trail reading gives; `ledger list` and `undelivered` return each row exactly once
across pages, in (created_at, operation_id) order, even while rows of the same instant are
inserted between pages; on SQLite their queries are index range scans, never a sort.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import threading
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from sqlalchemy import insert
from sqlalchemy.ext.asyncio import create_async_engine

from pipecat_actions.actions import ActionContext, action
from pipecat_actions.cli import main
from pipecat_actions.ledger import NewOperation, OperationFilter, SqlLedger
from pipecat_actions.ledger._rows import EncodedOperation, creation_events, new_row
from pipecat_actions.ledger.engine import normalize_url
from pipecat_actions.ledger.schema import events, operations
from pipecat_actions.session import SessionState
from pipecat_actions.status import ActionStatus
from tests.ledger._support import record_selects, sqlite_plans
from tests.runtime._execution_support import running

S = ActionStatus
BULK = 2_500  # more than `OperationFilter.limit`'s default, the old reading's silent cap


def _rows(count: int, *, at: float, tool: str = "book_table", prefix: str = "op_bulk") -> Any:
    """Rows of ``count`` committed, undelivered operations created at ``at``, with events."""
    ops, trail = [], []
    for i in range(count):
        new = NewOperation(
            tool=tool,
            kind="mutation",
            args={"n": i},
            idempotency_key=f"{prefix}-{i}",
            session_id=f"call-{i % 7}",
            principal="alice",
            status=S.RUNNING,
            operation_id=f"{prefix}_{i:06d}",
        )
        encoded = EncodedOperation.of(new)
        row = new_row(encoded, at, key_slot=None)
        row.update(status=S.COMMITTED.value, committed_at=at + 0.5, event_seq=row["event_seq"] + 1)
        ops.append(row)
        trail += creation_events(encoded, at)
        trail.append(
            {
                "operation_id": new.operation_id,
                "seq": row["event_seq"],
                "at": at + 0.5,
                "kind": "transition",
                "from_status": S.RUNNING.value,
                "to_status": S.COMMITTED.value,
                "actor": "runtime:bulk",
                "detail_json": None,
            }
        )
    return ops, trail


async def _bulk_insert(url: str, ops: list[dict[str, Any]], trail: list[dict[str, Any]]) -> None:
    engine = create_async_engine(normalize_url(url))
    try:
        async with engine.begin() as conn:
            await conn.execute(insert(operations), ops)
            await conn.execute(insert(events), trail)
    finally:
        await engine.dispose()


async def _story(ledger: SqlLedger) -> None:
    """A refused duplicate, a call joined twice, an operation that went UNKNOWN."""

    def new(key: str, **extra: Any) -> NewOperation:
        fields: dict[str, Any] = {
            "tool": "book_table",
            "kind": "mutation",
            "args": {"time": key},
            "idempotency_key": key,
            "session_id": "call-x",
            "principal": "bob",
            "status": S.RUNNING,
        }
        return NewOperation(**(fields | extra))

    await ledger.record_refusal(new("dup", detail={"reason": "duplicate"}))
    joined = (await ledger.admit(new("joined"))).operation
    await ledger.annotate(
        joined.operation_id, actor="runtime", detail={"duplicates_joined": [{"c": 1}, {"c": 2}]}
    )
    lost = (await ledger.admit(new("lost"))).operation
    await ledger.transition(lost.operation_id, expected=S.RUNNING, to=S.UNKNOWN, fence=1, actor="t")


async def test_stats_count_every_operation_past_the_default_limit_exactly(
    ledger: SqlLedger, ledger_url: str
) -> None:
    await _bulk_insert(ledger_url, *_rows(BULK, at=1e9))
    await _story(ledger)

    stats = await ledger.statistics(OperationFilter())
    book = stats["tools"]["book_table"]

    assert stats["operations"] == BULK + 3
    assert book["by_status"] == {"COMMITTED": BULK, "REJECTED": 1, "RUNNING": 1, "UNKNOWN": 1}
    assert book["admission_to_commit"] == {
        "count": BULK,
        "p50_secs": 0.5,
        "p95_secs": 0.5,
        "max_secs": 0.5,
    }
    assert (book["duplicates_joined"], book["duplicates_suppressed"]) == (2, 3)
    assert book["proposals"] == BULK + 3 + 2
    assert book["refused_by_reason"] == {"duplicate": 1}
    assert (book["ever_unknown"], book["unknown_now"]) == (1, 1)
    assert book["committed_undelivered"] == BULK
    assert (book["executed"], book["retries"]) == (BULK + 2, 0)


async def test_stats_spread_is_the_median_and_the_95th_value_of_every_row(
    ledger: SqlLedger, ledger_url: str
) -> None:
    ops, trail = _rows(40, at=1e9)
    for i, row in enumerate(ops):  # admission to commit: 1, 2, ..., 40 seconds
        row["committed_at"] = row["created_at"] + i + 1
    await _bulk_insert(ledger_url, ops, trail)

    spread = (await ledger.statistics())["tools"]["book_table"]["admission_to_commit"]

    # Sorted 1..40: the median halfway between 20 and 21, p95 at index floor(0.95 * 40) = 38.
    assert spread == {"count": 40, "p50_secs": 20.5, "p95_secs": 39.0, "max_secs": 40.0}


async def test_pages_return_every_row_once_in_order_while_equal_instants_are_inserted(
    ledger: SqlLedger, ledger_url: str
) -> None:
    same_instant = 1e9 + 10
    await _bulk_insert(ledger_url, *_rows(150, at=1e9, prefix="op_a"))
    await _bulk_insert(ledger_url, *_rows(300, at=same_instant, prefix="op_b"))
    seen: list[tuple[float, str]] = []
    after: tuple[float, str] | None = None
    inserted = False
    while True:
        page = await ledger.list(OperationFilter(after=after, limit=100))
        seen += [(op.created_at, op.operation_id) for op in page]
        if len(page) < 100:
            break
        after = seen[-1]
        if not inserted and after[0] == same_instant:
            # Written between two pages at the cursor's own instant: those ordered after the
            # cursor are read on a later page, those before it were not there to be read.
            await _bulk_insert(ledger_url, *_rows(20, at=same_instant, prefix="op_c"))
            await _bulk_insert(ledger_url, *_rows(20, at=same_instant, prefix="op_0"))
            inserted = True

    assert inserted
    assert len(seen) == len(set(seen)) == 150 + 300 + 20
    assert seen == sorted(seen)
    assert not any(op_id.startswith("op_0") for _, op_id in seen)


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[str, str]:
    assert main(list(argv)) == 0
    captured = capsys.readouterr()
    return captured.out, captured.err


async def test_undelivered_pages_end_with_the_cursor_of_the_next_page(
    ledger_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    await (await SqlLedger.create(ledger_url)).close()
    await _bulk_insert(ledger_url, *_rows(5, at=1e9))
    ids: list[str] = []
    cursor: list[str] = []
    for _ in range(3):
        out, err = await asyncio.to_thread(
            _cli, capsys, "undelivered", "--ledger", ledger_url, "--limit", "2", "--json", *cursor
        )
        ids += [row["operation_id"] for row in json.loads(out)]
        more = [line for line in err.splitlines() if line.startswith("more: --after ")]
        cursor = ["--after", more[0].removeprefix("more: --after ")] if more else []
    text, _ = await asyncio.to_thread(
        _cli, capsys, "ledger", "list", "--ledger", ledger_url, "--limit", "4"
    )

    assert ids == [f"op_bulk_{i:06d}" for i in range(5)]
    assert cursor == []  # the last page is not full: no cursor
    assert text.splitlines()[-1].startswith("more: --after ")


async def test_list_and_undelivered_are_index_range_scans_without_a_sort_on_sqlite(
    tmp_path: Path,
) -> None:
    path = tmp_path / "plans.db"
    ledger = await SqlLedger.create(f"sqlite:///{path}")
    issued = record_selects(ledger)
    try:
        cursor = (1e9, "op_x")
        await ledger.list(OperationFilter(limit=200))
        await ledger.list(OperationFilter(after=cursor, limit=200))
        undelivered = OperationFilter(status=[S.COMMITTED], undelivered=True)
        await ledger.list(undelivered)
        await ledger.list(OperationFilter(status=[S.COMMITTED], undelivered=True, after=cursor))
    finally:
        await ledger.close()

    plans = sqlite_plans(path, issued)
    assert len(plans) == 4
    assert plans[0] == "SCAN pa_operations USING INDEX ix_pa_operations_created"
    assert plans[1].startswith("SEARCH pa_operations USING INDEX ix_pa_operations_created (")
    # The partial index holds exactly the undelivered rows (migration 0009): read in order.
    assert plans[2] == "SCAN pa_operations USING INDEX ix_pa_operations_undelivered"
    assert plans[3].startswith("SEARCH pa_operations USING INDEX ix_pa_operations_undelivered (")
    assert not any("TEMP B-TREE" in plan for plan in plans)


async def test_stats_say_when_a_spread_is_ranked_among_a_sample(
    ledger: SqlLedger, ledger_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipecat_actions.ledger import _statistics
    from pipecat_actions.operator import render_statistics

    monkeypatch.setattr(_statistics, "EXACT_SPREAD_UP_TO", 100)
    ops, trail = _rows(1_000, at=1e9)
    for i, row in enumerate(ops):
        row["committed_at"] = row["created_at"] + 1 + i % 10
    await _bulk_insert(ledger_url, ops, trail)

    stats = await ledger.statistics()
    spread = stats["tools"]["book_table"]["admission_to_commit"]

    # Ids end in 0..9 here: the sample (ids ending in "0") is 1 in 10 of them, all at 1 s.
    assert spread == {
        "count": 1_000,
        "p50_secs": 1.0,
        "p95_secs": 1.0,
        "max_secs": 10.0,
        "sampled": 100,
    }
    assert stats["operations"] == 1_000
    assert "p50 and p95 from a sample of 100" in render_statistics(stats)


async def test_stats_count_as_late_only_the_outcomes_told_late(ledger_url: str) -> None:
    # Every telling is recorded with its "late" field (the delivery service's own record):
    # the in-place ones must neither count nor be read as candidates for the figure.
    @action
    async def book_table(ctx: ActionContext, n: int) -> dict[str, Any]:
        """Book."""
        return {"booking_id": f"bk_{n}"}

    policy_text = "version: 1\ntools:\n  book_table: {kind: mutation, on_duplicate: allow}\n"
    async with running(policy_text, [book_table], ledger_url=ledger_url) as runtime:
        session = SessionState(session_id="s1", principal="alice")
        told = [await runtime.propose("book_table", {"n": n}, session) for n in range(3)]
        for n, result in enumerate(told):
            op = await runtime.ledger.get(result["operation_id"])
            await runtime.deliveries.mark_delivered(op, session=session, late=n == 0)
        stats = await runtime.ledger.statistics()
    assert stats["tools"]["book_table"]["late_results"] == 1


async def test_a_tools_a_sessions_and_a_principals_pages_are_range_scans_on_sqlite(
    tmp_path: Path,
) -> None:
    # `ledger list --tool/--session/--principal`: a range of an index in (created_at,
    # operation_id) order, never a scan of every row nor a sort of the filter's rows.
    path = tmp_path / "plans.db"
    ledger = await SqlLedger.create(f"sqlite:///{path}")
    issued = record_selects(ledger)
    pages = {
        "tool": {"tool": "book_table"},
        "session": {"session_id": "call-1"},
        "principal": {"principal": "alice"},
    }
    try:
        for fields in pages.values():
            await ledger.list(OperationFilter(limit=200, **fields))
            await ledger.list(OperationFilter(after=(1e9, "op_x"), limit=200, **fields))
    finally:
        await ledger.close()

    plans = sqlite_plans(path, issued)
    indexes = ("tool_created (tool=?", "session (session_id=?", "principal (principal=?")
    assert len(plans) == 2 * len(indexes)
    for index, plan in zip([i for i in indexes for _ in (0, 1)], plans, strict=True):
        assert plan.startswith(f"SEARCH pa_operations USING INDEX ix_pa_operations_{index}"), plan
    assert not any("TEMP B-TREE" in plan for plan in plans), plans


async def test_a_page_of_a_status_and_a_tool_is_right_whichever_index_reads_it(
    ledger_url: str,
) -> None:
    # A rare status among a tool's many rows is read by its own index (SQLite's planner would
    # walk every row of the tool); a common one by the tool's, in order. Either way the page
    # holds exactly the rows a filter-and-sort of the whole table gives.
    url = ledger_url
    ops, trail = _rows(400, at=1e9, tool="refund", prefix="op_r")
    for i, row in enumerate(ops):
        row["created_at"] = 1e9 + i // 3  # equal instants: the id orders them
        if i % 97 == 5:
            row["status"] = S.UNKNOWN.value
    ledger = await SqlLedger.create(url)
    await _bulk_insert(url, ops, trail)
    await _bulk_insert(url, *_rows(1_000, at=1e9, prefix="op_b"))  # more COMMITTED than refunds
    issued = record_selects(ledger, lambda statement: "ORDER BY" in statement)  # pages only
    try:
        for status in (S.UNKNOWN, S.COMMITTED):
            for after in (None, (1e9 + 40, "op_r_000121")):
                filters = OperationFilter(tool="refund", status=[status], after=after, limit=50)
                page = [op.operation_id for op in await ledger.list(filters)]
                expected = sorted(
                    (row["created_at"], row["operation_id"])
                    for row in ops
                    if row["status"] == status.value
                    and (after is None or (row["created_at"], row["operation_id"]) > after)
                )[:50]
                assert page == [operation_id for _, operation_id in expected], (status, after)
    finally:
        await ledger.close()

    assert len(issued) == 4
    if not url.startswith("sqlite"):  # the rare status's rows found first, then sorted
        assert all("MATERIALIZED" in sql for sql, _ in issued[:2])
        assert not any("MATERIALIZED" in sql for sql, _ in issued[2:])
        return
    plans = sqlite_plans(url.removeprefix("sqlite:///"), issued)
    assert all("INDEX ix_pa_operations_status_lease (status=?" in p for p in plans[:2]), plans
    assert not any("status_lease" in p for p in plans[2:]), plans


def _commit_elsewhere(url: str, sql: str) -> None:
    """Run ``sql`` and commit it on a connection of its own, as another process would."""
    if url.startswith("sqlite"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as raw:
            raw.execute(sql)
        return

    async def run() -> None:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    done = threading.Thread(target=asyncio.run, args=(run(),))
    done.start()
    done.join()


async def test_stats_read_one_snapshot_while_a_new_tools_first_commit_lands(
    ledger: SqlLedger, ledger_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Between two of stats' queries another process commits the first operation of a new
    # tool: every figure comes from before it (and nothing fails for a tool half seen).
    from pipecat_actions.ledger import _statistics

    await _bulk_insert(ledger_url, *_rows(3, at=1e9))
    columns = ", ".join(c.name for c in operations.c)
    copied = columns.replace("operation_id", "'op_new'").replace("tool", "'send_sms'")
    copied = copied.replace("idempotency_key", "'key-new'")
    new_tool = (
        f"INSERT INTO pa_operations ({columns}) SELECT {copied} FROM pa_operations "
        "WHERE operation_id = 'op_bulk_000000'"
    )
    totals = _statistics._operation_totals

    def totals_then_a_commit(*args: Any) -> Any:
        found = totals(*args)
        _commit_elsewhere(ledger_url, new_tool)
        return found

    monkeypatch.setattr(_statistics, "_operation_totals", totals_then_a_commit)
    stats = await ledger.statistics()

    assert stats["operations"] == 3 and set(stats["tools"]) == {"book_table"}
    assert stats["tools"]["book_table"]["admission_to_commit"]["count"] == 3
    monkeypatch.undo()
    assert set((await ledger.statistics())["tools"]) == {"book_table", "send_sms"}
