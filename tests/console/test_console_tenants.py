"""The console shows an operator the operations of their tenants, and decides only there.

Each list and page holds the operations of the signed-in operator's tenants only; the requests
waiting for approval, only those they may decide (tenant and the policy's rule). A decision
posted by hand for another tenant's request is refused, says why, and is recorded on that
request without changing it.
"""

from __future__ import annotations

import html
from pathlib import Path

import pytest

from pipecat_actions.ledger.records import EventKind
from pipecat_actions.session import SessionState
from pipecat_actions.status import ActionStatus

from ._support import console_bench, field, flash

S = ActionStatus

ELM_ST = SessionState("call-elm", principal="bob", tenant="elm-st")
"""A caller of another tenant (the bench's own caller is of tenant default)."""


def _cards(page: str) -> list[str]:
    """The operation ids of the approval cards on a page."""
    return [
        part.split('"', 1)[0] for part in page.split('data-testid="approval" data-operation="')[1:]
    ]


async def test_each_operator_is_shown_the_requests_they_may_decide_and_no_others(
    tmp_path: Path,
) -> None:
    async with console_bench(tmp_path) as bench:
        here = await bench.ask_refund()
        there = await bench.ask_refund(ELM_ST, booking_id="bk_0002")
        bench.credentials.add("olga", "olga-secret", frozenset({"manager"}), ["elm-st"])
        bench.credentials.add("ivan", "ivan-secret", frozenset({"manager"}), ["*"])
        seen = {}
        for name, password in (
            ("rosa", None),
            ("sam", None),
            ("olga", "olga-secret"),
            ("ivan", "ivan-secret"),
        ):
            await bench.sign_in(name, password)
            page = (await bench.client.get("/")).text
            recent = (await bench.client.get("/fragments/recent")).text
            seen[name] = (_cards(page), there.operation_id in recent, here.operation_id in recent)
    assert seen == {
        "rosa": ([here.operation_id], False, True),
        "sam": ([], False, True),  # of the tenant, but the rule names neither him nor cook
        "olga": ([there.operation_id], True, False),
        "ivan": ([here.operation_id, there.operation_id], True, True),  # expiring first
    }


async def test_another_tenants_operation_and_conversation_are_not_found(tmp_path: Path) -> None:
    async with console_bench(tmp_path) as bench:
        here = await bench.ask_refund()
        there = await bench.ask_refund(ELM_ST, booking_id="bk_0002")
        await bench.sign_in("rosa")
        answers = {
            path: await bench.client.get(path)
            for path in (
                f"/operations/{there.operation_id}",
                f"/sessions/{ELM_ST.session_id}",
                f"/operations/{here.operation_id}",
                f"/sessions/{here.session_id}",
            )
        }
    codes = {path: answer.status_code for path, answer in answers.items()}
    assert list(codes.values()) == [404, 404, 200, 200]
    assert there.operation_id not in answers[f"/sessions/{ELM_ST.session_id}"].text
    assert "that you may see" in answers[f"/operations/{there.operation_id}"].text


@pytest.mark.parametrize("decision", ["approve", "reject"])
async def test_a_decision_posted_for_another_tenants_request_is_refused_and_recorded(
    tmp_path: Path, decision: str
) -> None:
    async with console_bench(tmp_path) as bench:
        there = await bench.ask_refund(ELM_ST, booking_id="bk_0002")
        await bench.sign_in("rosa")
        told = await bench.decide(there, decision, reason="looks fine")
        after = await bench.runtime.ledger.get(there.operation_id)
        notes = [
            e
            for e in await bench.runtime.ledger.events(there.operation_id)
            if e.kind is EventKind.ANNOTATION
        ]
    verb = "approved" if decision == "approve" else "rejected"
    assert told == (
        f"Not {verb}: rosa may not {decision} operation {there.operation_id}: it belongs to "
        "tenant &#39;elm-st&#39;, and rosa decides in tenant default only"
    )
    assert after.status is S.AWAITING_APPROVAL
    (note,) = notes
    assert note.actor == "approver:rosa"
    assert note.detail["decision_refused"] == decision
    assert note.detail["via"] == "console: credentials file"
    assert note.detail["tenants"] == ["default"]


async def test_an_operator_in_no_tenant_sees_nothing_and_is_told_how_to_get_one(
    tmp_path: Path,
) -> None:
    async with console_bench(tmp_path) as bench:
        op = await bench.ask_refund()
        bench.credentials.add("nick", "nick-secret", frozenset({"manager"}))
        await bench.sign_in("nick", "nick-secret")
        page = html.unescape((await bench.client.get("/")).text)
        csrf = field((await bench.client.get("/")).text, "csrf")
        told = await bench.decide(op, reason="ok", csrf=csrf)
        after = await bench.runtime.ledger.get(op.operation_id)
    assert 'data-testid="no-tenant"' in page
    assert "pipecat-actions users tenants nick --tenant TENANT" in page
    assert _cards(page) == [] and op.operation_id not in page
    assert told.startswith("Not approved: nick belongs to no tenant, so may approve nothing")
    assert after.status is S.AWAITING_APPROVAL


async def test_an_operator_the_proxy_names_no_tenant_for_decides_nothing(tmp_path: Path) -> None:
    async with console_bench(
        tmp_path,
        user_header="X-Forwarded-User",
        roles_header="X-Forwarded-Groups",
        tenants_header="X-Forwarded-Tenants",
    ) as bench:
        op = await bench.ask_refund()
        as_rosa = {"X-Forwarded-User": "rosa", "X-Forwarded-Groups": "manager"}
        # The form as the page gave it while the proxy still named her tenant: the token is
        # the browser session's, the identity the proxy's at each request.
        page = (
            await bench.client.get("/", headers={**as_rosa, "X-Forwarded-Tenants": "default"})
        ).text
        posted = await bench.client.post(
            f"/approvals/{op.operation_id}/approve",
            data={"reason": "ok", "args_hash": op.args_hash, "csrf": field(page, "csrf")},
            headers=as_rosa,
        )
        shown = flash((await bench.client.get("/", headers=as_rosa)).text)
        after = await bench.runtime.ledger.get(op.operation_id)
    assert posted.status_code == 303
    assert "rosa belongs to no tenant" in shown and "--tenants-header" in shown
    assert after.status is S.AWAITING_APPROVAL
