"""The console's UNKNOWN list, and its reconcile action with the application's hooks."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx

from pipecat_actions.console import ConsoleSettings, create_app
from pipecat_actions.ledger import NewOperation, SqlLedger
from pipecat_actions.status import ActionStatus
from tests import _operator_app as app_module

from ._support import field, flash, write_users

S = ActionStatus


async def _unknown(ledger: SqlLedger, key: str) -> str:
    op = (
        await ledger.admit(
            NewOperation(
                tool="book_table",
                kind="mutation",
                args={"time": "21:00"},
                idempotency_key=key,
                session_id="call-1",
                principal="alice",
                status=S.RUNNING,
                lease_owner="bot-1",
            )
        )
    ).operation
    await ledger.transition(
        op.operation_id, expected=S.RUNNING, to=S.UNKNOWN, fence=op.fence, actor="bot-1"
    )
    return op.operation_id


@asynccontextmanager
async def _client(
    ledger: SqlLedger, tmp_path: Path, app: str | None
) -> AsyncIterator[httpx.AsyncClient]:
    settings = ConsoleSettings(users=write_users(tmp_path / "users"), app=app)
    asgi = create_app(settings, ledger, ledger_name="sqlite:///ledger")
    transport = httpx.ASGITransport(app=asgi)
    async with httpx.AsyncClient(transport=transport, base_url="http://console.test") as client:
        login = await client.get("/login")
        form = {"name": "rosa", "password": "rosa-secret", "csrf": field(login.text, "csrf")}
        await client.post("/login", data=form)
        yield client


async def test_an_unknown_operation_is_listed_and_reconciled_from_the_console(
    tmp_path: Path,
) -> None:
    app_module.COMMITTED.clear()
    app_module.COMMITTED["key-found"] = {"booking_id": "bk_9"}
    async with await SqlLedger.create(f"sqlite:///{tmp_path / 'ledger.db'}") as ledger:
        op_id = await _unknown(ledger, "key-found")
        async with _client(ledger, tmp_path, "tests._operator_app:app") as client:
            listed = (await client.get("/fragments/unknown")).text
            page = (await client.get(f"/operations/{op_id}")).text
            answer = await client.post(
                f"/operations/{op_id}/reconcile", data={"csrf": field(page, "csrf")}
            )
            after = (await client.get(answer.headers["location"])).text
        final = await ledger.get(op_id)
        trail = await ledger.events(op_id)
    assert op_id in listed and 'data-testid="reconcile"' in listed
    assert flash(after) == f"{op_id}: UNKNOWN → COMMITTED."
    assert final.status is S.COMMITTED and final.result == {"booking_id": "bk_9"}
    assert trail[-1].actor == "console:rosa"


async def test_without_an_operator_app_the_console_offers_no_reconcile(tmp_path: Path) -> None:
    async with await SqlLedger.create(f"sqlite:///{tmp_path / 'ledger.db'}") as ledger:
        op_id = await _unknown(ledger, "key-x")
        async with _client(ledger, tmp_path, None) as client:
            listed = (await client.get("/fragments/unknown")).text
            page = (await client.get(f"/operations/{op_id}")).text
            answer = await client.post(
                f"/operations/{op_id}/reconcile", data={"csrf": field(page, "csrf")}
            )
            after = (await client.get(answer.headers["location"])).text
        final = await ledger.get(op_id)
    assert op_id in listed and 'data-testid="reconcile"' not in listed
    assert "no operator app is configured" in flash(after)
    assert final.status is S.UNKNOWN
