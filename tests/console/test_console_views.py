"""What an approver reads: the tool in words, the request in words, decisions, the conversation.

The card says what the tool does (the policy's description, else the action's docstring) and
exactly what is being approved (the policy's ``confirmation.summary`` over the arguments and
the before-state, escaped, a missing field marked); every decision made or refused is a line
with its reason; and one click opens the conversation as a timeline drawn from the ledger,
where a telling that differs from what the ledger holds stands out.
"""

from __future__ import annotations

import html
import re
from pathlib import Path

from pipecat_actions.session import SessionState
from pipecat_actions.status import ActionStatus

from ._support import console_bench, flash

S = ActionStatus

DOCSTRING = "Refund the deposit of a booking (amount in cents) to the card it was paid with."


def _between(page: str, testid: str) -> str:
    """The markup of the first element with ``data-testid=testid``, up to its line's end."""
    start = page.index(f'data-testid="{testid}"')
    return page[start : page.index("\n", start)]


async def test_the_card_says_what_the_tool_does_and_what_exactly_is_approved(
    tmp_path: Path,
) -> None:
    async with console_bench(tmp_path) as bench:
        await bench.ask_refund(amount=1500)
        await bench.sign_in("rosa")
        page = (await bench.client.get("/")).text
    assert DOCSTRING in _between(page, "description")
    summary = _between(page, "summary")
    text = html.unescape(re.sub(r"<[^>]+>", "", summary.split(">", 1)[1]))
    assert text.startswith("Refund 1500 cents for booking bk_0001 (paid 2000)")
    assert "<strong>1500</strong>" in summary and "<strong>2000</strong>" in summary
    assert 'href="/sessions/call-1" data-testid="conversation"' in page


async def test_a_summary_field_the_request_does_not_hold_is_marked_missing(
    tmp_path: Path,
) -> None:
    async with console_bench(tmp_path) as bench:
        # No deposit was paid for this booking: the before-state holds no paid_cents.
        await bench.ask_refund(booking_id="bk_9999")
        await bench.sign_in("rosa")
        page = (await bench.client.get("/")).text
    missing = _between(page, "summary-missing")
    assert "before.paid_cents: missing" in missing


async def test_hostile_argument_text_in_a_summary_is_shown_as_text(tmp_path: Path) -> None:
    hostile = '<img src=x onerror="alert(1)">\x1b[2J'
    async with console_bench(tmp_path) as bench:
        await bench.ask_refund(booking_id=hostile)
        await bench.sign_in("rosa")
        page = (await bench.client.get("/")).text
    summary = _between(page, "summary")
    assert "<img" not in page
    assert "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;\\x1b[2J" in summary


async def test_a_refused_attempt_and_the_decision_are_lines_with_their_reasons(
    tmp_path: Path,
) -> None:
    async with console_bench(tmp_path) as bench:
        op = await bench.ask_refund()
        await bench.sign_in("sam")  # a cook: the rule names neither him nor his role
        refused = await bench.decide(op, reason="I know the guest")
        await bench.sign_in("rosa")
        card = html.unescape(_card(await bench.client.get("/")))
        told = await bench.decide(op, reason="deposit policy: cancelled in time")
        await bench.settled(op.operation_id)
        page = html.unescape((await bench.client.get(f"/operations/{op.operation_id}")).text)
    assert refused.startswith("Not approved: sam may not approve refund_deposit")
    assert told.endswith("approved.")
    # On the card, before the decision: who asked, and the attempt that was refused.
    assert re.search(r'data-verdict="asked">.*Asked</span> by <strong>alice</strong>', card, re.S)
    assert re.search(
        r'data-verdict="refused">.*<strong>sam</strong> tried to approve: '
        r'<span class="verdict">refused</span>, <span class="reason">sam may not approve',
        card,
        re.S,
    )
    # On the operation's page, after it: the approval's reason in words, not in a JSON box.
    decisions = page[page.index("<h2>Decisions</h2>") : page.index("<h2>Audit timeline</h2>")]
    assert re.search(
        r'data-verdict="approved">.*Approved</span> by <strong>rosa</strong>: '
        r'<q class="reason" data-testid="decision-reason">deposit policy: cancelled in time</q>'
        r'\s*<small class="via">\(console: credentials file\)</small>',
        decisions,
        re.S,
    )


def _card(answer: object) -> str:
    page = answer.text  # type: ignore[attr-defined]
    return page[page.index('data-testid="approval"') :]


async def test_the_conversation_is_drawn_lane_by_lane_and_a_wrong_telling_stands_out(
    tmp_path: Path,
) -> None:
    async with console_bench(tmp_path) as bench:
        session = SessionState("call-9", principal="alice")
        session.start_user_turn()
        approved = await bench.ask_refund(session)
        session.start_user_turn()
        rejected = await bench.ask_refund(session, booking_id="bk_0002")
        await bench.sign_in("rosa")
        await bench.decide(approved, reason="ok")
        await bench.decide(rejected, "reject", reason="no deposit paid")
        await bench.settled(approved.operation_id)
        ledger = bench.runtime.ledger
        # As the delivery service records a telling and its hearing; the second telling says
        # COMMITTED of an operation the ledger holds as REJECTED.
        for op, told in ((approved, S.COMMITTED), (rejected, S.COMMITTED)):
            await ledger.annotate(
                op.operation_id,
                actor="gate:call-9",
                detail={"delivered": told.value, "agent": None, "late": True},
                changes={"delivered_at": bench.clock.now(), "delivered_status": told.value},
            )
            await ledger.annotate(
                op.operation_id,
                actor="gate:call-9",
                detail={"acknowledged": True},
                changes={"acknowledged_at": bench.clock.now()},
            )
        page = (await bench.client.get("/sessions/call-9")).text
        assert flash(page) == ""
    svg = page[page.index("<svg") : page.index("</svg>")]
    lanes = svg.split('data-testid="lane"')[1:]
    assert [re.search(r'data-operation="([^"]+)"', lane).group(1) for lane in lanes] == [
        approved.operation_id,
        rejected.operation_id,
    ]
    kinds = [re.findall(r'data-testid="mark" data-kind="([a-z_]+)"', lane) for lane in lanes]
    assert kinds[0] == [
        "proposed", "waiting", "approved", "running", "committed", "told", "heard",
    ]  # fmt: skip
    assert kinds[1] == ["proposed", "waiting", "rejected", "told", "heard"]
    assert 'data-testid="mismatch"' not in lanes[0] and 'data-mismatch="true"' not in lanes[0]
    assert 'data-testid="mismatch"' in lanes[1] and 'data-mismatch="true"' in lanes[1]
    mismatch = re.sub(r"<[^>]+>", "|", lanes[1][lanes[1].index('data-testid="mismatch-text"') :])
    assert "|told COMMITTED;||the ledger holds REJECTED|" in mismatch
    assert re.findall(r"turn (\d+)</text>", svg) == ["1", "2"]
    assert "1 operation told the caller something other than what the ledger holds" in page


async def test_a_conversation_whose_ledger_holds_hostile_text_is_drawn_as_text(
    tmp_path: Path,
) -> None:
    hostile = "<script>alert(1)</script>/../x\x1b]0;owned\x07\u202e"
    async with console_bench(tmp_path) as bench:
        op = await bench.ask_refund(SessionState(hostile, principal=f"<b>{hostile}"))
        await bench.sign_in("rosa")
        card = (await bench.client.get("/")).text
        link = re.search(r'href="(/sessions/[^"]+)" data-testid="conversation"', card)
        assert link is not None
        answer = await bench.client.get(html.unescape(link.group(1)))
    page = answer.text
    assert answer.status_code == 200
    assert op.operation_id in page
    assert "<script>" not in page and "<b>" not in page
    assert "\x1b" not in page and "\x07" not in page and "\u202e" not in page
    assert r"&lt;script&gt;alert(1)&lt;/script&gt;/../x\x1b]0;owned\x07\u202e" in page
