"""The console's lists say what an operator must act on, and only that, in their tenants.

Conflicts (the system of record reported a commit for an operation the ledger held as failed)
have a list of their own; "committed, never told" holds only what someone is owed: a read
the caller heard is owed to nobody. Each list shows the operator's tenants only.
"""

from __future__ import annotations

import re
from pathlib import Path

from pipecat_actions.ledger import Ledger, NewOperation, Operation
from pipecat_actions.status import ActionStatus

from ._support import console_bench

S = ActionStatus


async def _committed(
    ledger: Ledger, key: str, *, tenant: str = "default", kind: str = "mutation"
) -> Operation:
    """An operation another process ran and committed (its telling not recorded)."""
    new = NewOperation(
        tool="refund_deposit" if kind == "mutation" else "lookup_booking",
        kind=kind,
        args={"booking_id": key, "amount": 100},
        idempotency_key=key,
        session_id=f"call-{key}",
        principal="alice",
        tenant=tenant,
        status=S.RUNNING,
    )
    op = (await ledger.admit(new)).operation
    return await ledger.transition(
        op.operation_id, expected=S.RUNNING, to=S.COMMITTED, fence=op.fence, actor="worker"
    )


async def _conflicted(ledger: Ledger, key: str, *, tenant: str = "default") -> Operation:
    """Held as failed, then reported committed by the system of record (`Executor.correct`)."""
    new = NewOperation(
        tool="refund_deposit",
        kind="mutation",
        args={"booking_id": key, "amount": 100},
        idempotency_key=key,
        session_id=f"call-{key}",
        principal="alice",
        tenant=tenant,
        status=S.RUNNING,
    )
    op = (await ledger.admit(new)).operation
    failed = await ledger.transition(
        op.operation_id,
        expected=S.RUNNING,
        to=S.FAILED_FINAL,
        fence=op.fence,
        actor="runtime",
        changes={"error": "the system of record has no trace of it"},
    )
    return await ledger.transition(
        failed.operation_id,
        expected=S.FAILED_FINAL,
        to=S.COMMITTED,
        fence=failed.fence,
        actor="operator:bob",
        detail={"reason": "conflict", "conflict": "the provider reports that it happened"},
        changes={"escalated_at": failed.updated_at},
    )


def _rows(page: str, testid: str) -> list[str]:
    """The operation ids of the rows ``testid`` of a page, in order."""
    return re.findall(rf'data-key="([^"]+)-\d+" data-testid="{testid}"', page)


async def test_conflicts_are_listed_for_the_operators_tenants_and_nothing_else_is(
    tmp_path: Path,
) -> None:
    async with console_bench(tmp_path) as bench:
        ledger = bench.runtime.ledger
        here = await _conflicted(ledger, "bk_1")
        there = await _conflicted(ledger, "bk_2", tenant="elm-st")
        fine = await _committed(ledger, "bk_3")
        bench.credentials.add("olga", "olga-secret", frozenset({"manager"}), ["elm-st"])
        await bench.sign_in("rosa")
        rosa_page = (await bench.client.get("/")).text
        rosa_fragment = (await bench.client.get("/fragments/conflicts")).text
        await bench.sign_in("olga", "olga-secret")
        olga_page = (await bench.client.get("/")).text

    assert _rows(rosa_page, "conflict") == [here.operation_id]
    assert _rows(rosa_fragment, "conflict") == [here.operation_id]
    assert "the system of record has no trace of it" in rosa_fragment  # what it was held as
    assert fine.operation_id not in rosa_fragment
    assert _rows(olga_page, "conflict") == [there.operation_id]


async def test_an_empty_conflict_list_says_so(tmp_path: Path) -> None:
    async with console_bench(tmp_path) as bench:
        await _committed(bench.runtime.ledger, "bk_1")
        await bench.sign_in("rosa")
        page = (await bench.client.get("/")).text
    assert _rows(page, "conflict") == []
    assert "No system of record has contradicted the ledger." in page


async def test_committed_never_told_lists_what_someone_is_owed_and_never_a_read(
    tmp_path: Path,
) -> None:
    async with console_bench(tmp_path) as bench:
        ledger = bench.runtime.ledger
        await _committed(ledger, "status_1", kind="read")  # answered in its call
        owed = await _committed(ledger, "bk_1")
        await _committed(ledger, "bk_2", tenant="elm-st")  # not rosa's tenant
        await bench.sign_in("rosa")
        page = (await bench.client.get("/")).text
        fragment = (await bench.client.get("/fragments/undelivered")).text
    assert _rows(page, "undelivered") == [owed.operation_id]
    assert _rows(fragment, "undelivered") == [owed.operation_id]
