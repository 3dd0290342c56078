"""The console's pages and decisions, on a real ledger, through its HTTP interface.

Every decision goes through the approval rules: a signed-in operator the policy names, never
the requester, with a reason, for the arguments' hash the page showed, before the request
expires; a form must carry the session's token. What the ledger holds is shown, never obeyed.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

import pytest

from pipecat_actions.console.users import Credentials
from pipecat_actions.session import SessionState
from pipecat_actions.status import ActionStatus

from ._support import CALLER, console_bench, field, flash

S = ActionStatus


async def test_every_page_needs_a_signed_in_operator(tmp_path: Path) -> None:
    async with console_bench(tmp_path) as bench:
        op = await bench.ask_refund()
        for path in ("/", f"/operations/{op.operation_id}"):
            answer = await bench.client.get(path)
            assert answer.status_code == 303
            assert answer.headers["location"] == "/login"
        for path in ("/fragments/approvals", "/events"):
            assert (await bench.client.get(path)).status_code == 401
        posted = await bench.client.post(
            f"/approvals/{op.operation_id}/approve",
            data={"reason": "x", "args_hash": op.args_hash, "csrf": ""},
        )
        assert posted.status_code == 303 and posted.headers["location"] == "/login"
        assert (await bench.runtime.ledger.get(op.operation_id)).status is S.AWAITING_APPROVAL


async def test_a_wrong_password_or_an_unknown_name_does_not_sign_in(tmp_path: Path) -> None:
    async with console_bench(tmp_path) as bench:
        for name, password in (("rosa", "guess"), ("nobody", "rosa-secret"), ("rosa", "")):
            answer = await bench.sign_in(name, password)
            assert answer.headers["location"] == "/login"
            page = await bench.client.get("/login")
            assert flash(page.text) == "Unknown name or wrong password."
            assert (await bench.client.get("/")).status_code == 303


async def test_the_page_shows_what_the_approver_decides_on(tmp_path: Path) -> None:
    async with console_bench(tmp_path) as bench:
        op = await bench.ask_refund()
        await bench.sign_in("rosa")
        page = (await bench.client.get("/")).text
    assert 'data-testid="operator">rosa<' in page
    assert "ledger: <code>sqlite:///ledger</code>" in page
    card = html.unescape(page[page.index('data-testid="approval"') :])
    assert 'data-testid="requester">alice<' in card
    assert "refund_deposit" in card and "risk high" in card
    assert op.args_hash in card
    assert '"booking_id": "bk_0001"' in card and '"amount": 2000' in card
    # The before-state the refund starts from, as the provider held it when asked.
    assert '"paid_cents": 2000' in card and '"refunded_cents": 0' in card
    assert f'data-expires-at="{op.deadline_at}"' in card
    assert "rosa or role manager" in card


async def test_an_approver_approves_with_a_reason_and_the_agent_runs_it(tmp_path: Path) -> None:
    async with console_bench(tmp_path) as bench:
        op = await bench.ask_refund()
        await bench.sign_in("rosa")
        told = await bench.decide(op, reason="regular guest")
        done = await bench.settled(op.operation_id)
        trail = await bench.runtime.ledger.events(op.operation_id)
        refunds = bench.sor.refunds("dep_bk_0001")
    assert told == f"refund_deposit {op.operation_id} approved."
    assert done.status is S.COMMITTED
    assert len(refunds) == 1
    decision = next(e for e in trail if e.to_status is S.ADMITTED)
    assert decision.actor == "approver:rosa"
    assert decision.detail["reason"] == "regular guest"
    assert decision.detail["args_hash"] == op.args_hash


@pytest.mark.parametrize(
    ("name", "reason", "args_hash", "refusal"),
    [
        ("alice", "mine", None, "a requester never decides on their own request"),
        ("sam", "fine", None, "sam may not approve refund_deposit"),
        ("rosa", "   ", None, "a decision needs a reason"),
        ("rosa", "fine", "0" * 64, "holds other arguments than the ones approved"),
        ("rosa", "fine", "", "names the arguments it approves"),
    ],
    ids=["requester", "not-allowed", "no-reason", "other-arguments", "no-hash"],
)
async def test_a_decision_the_rules_refuse_is_shown_and_changes_nothing(
    tmp_path: Path, name: str, reason: str, args_hash: str | None, refusal: str
) -> None:
    async with console_bench(tmp_path) as bench:
        op = await bench.ask_refund()
        await bench.sign_in(name)
        told = await bench.decide(op, reason=reason, args_hash=args_hash)
        after = await bench.runtime.ledger.get(op.operation_id)
    assert told.startswith("Not approved: ") and refusal in told, told
    assert after.status is S.AWAITING_APPROVAL
    assert bench.sor.refunds("dep_bk_0001") == []


async def test_the_requester_sees_that_another_approver_must_decide(tmp_path: Path) -> None:
    async with console_bench(tmp_path) as bench:
        await bench.ask_refund()
        await bench.sign_in("alice")
        page = (await bench.client.get("/")).text
    assert 'data-testid="own-request"' in page


async def test_a_form_without_the_sessions_token_is_refused(tmp_path: Path) -> None:
    async with console_bench(tmp_path) as bench:
        op = await bench.ask_refund()
        await bench.sign_in("rosa")
        told = await bench.decide(op, csrf="forged")
        assert "the form is stale or came from elsewhere" in told
        other_site = await bench.client.post(
            f"/approvals/{op.operation_id}/approve",
            data={"reason": "x", "args_hash": op.args_hash, "csrf": await bench.csrf()},
            headers={"Origin": "http://evil.example"},
        )
        assert other_site.status_code == 303
        assert "came from another site" in flash((await bench.client.get("/")).text)
        assert (await bench.runtime.ledger.get(op.operation_id)).status is S.AWAITING_APPROVAL


async def test_an_expired_request_cannot_be_approved(tmp_path: Path) -> None:
    async with console_bench(tmp_path) as bench:
        op = await bench.ask_refund()
        await bench.sign_in("rosa")
        csrf = await bench.csrf()
        bench.clock.advance(601)  # the page was open; the window closed meanwhile
        told = await bench.decide(op, csrf=csrf)
        after = await bench.runtime.ledger.get(op.operation_id)
    assert "expired before this approval" in told
    assert after.status is S.EXPIRED
    assert bench.sor.refunds("dep_bk_0001") == []


async def test_a_rejection_needs_a_reason_and_nothing_runs(tmp_path: Path) -> None:
    async with console_bench(tmp_path) as bench:
        op = await bench.ask_refund()
        await bench.sign_in("rosa")
        assert "needs a reason" in await bench.decide(op, "reject", reason="")
        told = await bench.decide(op, "reject", reason="no deposit was paid")
        done = await bench.settled(op.operation_id)
    assert told == f"refund_deposit {op.operation_id} rejected."
    assert done.status is S.REJECTED
    assert done.error == "rejected by rosa: no deposit was paid"


async def test_an_operation_page_shows_the_audit_timeline(tmp_path: Path) -> None:
    async with console_bench(tmp_path) as bench:
        op = await bench.ask_refund()
        await bench.sign_in("rosa")
        await bench.decide(op, reason="regular guest")
        await bench.settled(op.operation_id)
        page = (await bench.client.get(f"/operations/{op.operation_id}")).text
        missing = (await bench.client.get("/operations/op_nope")).text
    timeline = html.unescape(page[page.index('data-testid="timeline"') :])
    for step in ("AWAITING_APPROVAL → ADMITTED", "approver:rosa", "regular guest", "COMMITTED"):
        assert step in timeline
    assert 'data-testid="status">COMMITTED<' in page
    assert "The ledger holds no operation op_nope that you may see." in missing


@pytest.mark.parametrize(
    "operation_id", ["op_nope", "op_%ff%fe", "%00", "x" * 2000, "%1b%5d0%3bt%07"]
)
async def test_an_unknown_or_malformed_operation_id_is_a_not_found_page(
    tmp_path: Path, operation_id: str
) -> None:
    async with console_bench(tmp_path) as bench:
        await bench.sign_in("rosa")
        missing = await bench.client.get(f"/operations/{operation_id}")
    assert missing.status_code == 404
    assert "The ledger holds no operation" in missing.text
    assert "Traceback" not in missing.text


HOSTILE = "<script>alert(1)</script>\x1b]8;;http://evil.example\x07click\x1b]8;;\x07\u202eoi"


async def test_what_the_ledger_holds_is_shown_never_obeyed(tmp_path: Path) -> None:
    async with console_bench(tmp_path) as bench:
        hostile = SessionState(HOSTILE, principal=f"[/x]{HOSTILE}")
        await bench.ask_refund(hostile, booking_id=f"bk_{HOSTILE}")
        await bench.sign_in("rosa")
        page = (await bench.client.get("/")).text
    assert "<script>alert(1)</script>" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "\x1b" not in page and "\x07" not in page and "\u202e" not in page
    assert r"\x1b]8;;http://evil.example\x07click" in page
    assert r"\u202eoi" in page
    assert "[/x]&lt;script&gt;" in page  # shown as written, not read as markup


async def test_an_operator_removed_from_the_credentials_file_is_signed_out(
    tmp_path: Path,
) -> None:
    async with console_bench(tmp_path) as bench:
        await bench.sign_in("rosa")
        assert (await bench.client.get("/")).status_code == 200
        Credentials(bench.credentials.path).remove("rosa")
        assert (await bench.client.get("/")).status_code == 303


async def test_a_proxy_header_signs_operators_in_and_the_same_rules_hold(tmp_path: Path) -> None:
    async with console_bench(
        tmp_path,
        user_header="X-Forwarded-User",
        roles_header="X-Forwarded-Groups",
        tenants_header="X-Forwarded-Tenants",
    ) as bench:
        op = await bench.ask_refund()
        assert (await bench.client.get("/")).status_code == 401
        assert (await bench.client.get("/", headers={"X-Forwarded-User": "a b"})).status_code == 401
        as_alice = {
            "X-Forwarded-User": "alice",
            "X-Forwarded-Groups": "manager",
            "X-Forwarded-Tenants": "default",
        }
        page = await bench.client.get("/", headers=as_alice)
        refused = await bench.client.post(
            f"/approvals/{op.operation_id}/approve",
            data={"reason": "mine", "args_hash": op.args_hash, "csrf": field(page.text, "csrf")},
            headers=as_alice,
        )
        assert refused.status_code == 303
        shown = flash((await bench.client.get("/", headers=as_alice)).text)
        assert "their own request" in shown
        as_sam = {
            "X-Forwarded-User": "sam",
            "X-Forwarded-Groups": "cook, manager",
            "X-Forwarded-Tenants": "other, default",
        }
        page = await bench.client.get("/", headers=as_sam)
        approved = await bench.client.post(
            f"/approvals/{op.operation_id}/approve",
            data={"reason": "ok", "args_hash": op.args_hash, "csrf": field(page.text, "csrf")},
            headers=as_sam,
        )
        assert approved.status_code == 303
        done = await bench.settled(op.operation_id)
        trail = await bench.runtime.ledger.events(op.operation_id)
    assert done.status is S.COMMITTED
    decision = next(e for e in trail if e.to_status is S.ADMITTED)
    assert decision.actor == "approver:sam" and decision.detail["as_role"] == ["manager"]


async def test_fragments_list_what_waits_and_what_settled(tmp_path: Path) -> None:
    async with console_bench(tmp_path) as bench:
        await bench.sign_in("rosa")
        empty = (await bench.client.get("/fragments/approvals")).text
        op = await bench.ask_refund()
        waiting = (await bench.client.get("/fragments/approvals")).text
        recent = (await bench.client.get("/fragments/recent")).text
        unknown_name = await bench.client.get("/fragments/nope")
    assert 'data-testid="no-approvals"' in empty
    assert f'data-key="{op.operation_id}"' in waiting
    assert re.search(rf"{op.operation_id}.*AWAITING_APPROVAL", recent, re.S)
    assert unknown_name.status_code == 404
    assert CALLER.principal in waiting
