"""The console in a real browser: Debian's headless Chromium, driven by Playwright.

A manager signs in, sees the refund the agent is waiting on appear without a reload, reads it
in words, approves it with a reason, and the conversation (a real offline Pipecat pipeline on
the same ledger) hears the outcome; the conversation's timeline then shows it all. A
pharmacist reads a prescription transfer as a sentence and opens the conversation it came
from, where a barge-in and a telling that differs from the ledger stand out. The requester
cannot approve their own request, and an expired request cannot be approved. Playwright never
downloads a browser here: it drives /usr/bin/chromium (``apt-get install chromium``; `make
test` installs it where it can). Set ``PIPECAT_ACTIONS_SCREENSHOT=PATH`` to keep the
screenshot of the approval docs/cli.md shows, ``PIPECAT_ACTIONS_SCREENSHOT_DIR=DIR`` for those
of the summary and the timelines (docs/images/ keeps the ones the documentation shows).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pipecat_actions import attach, tools_schema
from pipecat_actions.admission.authorization import AllowAll
from pipecat_actions.console import ConsoleSettings, RunningConsole, start_console
from pipecat_actions.console.users import Credentials
from pipecat_actions.ledger import Operation, SqlLedger
from pipecat_actions.policy import load_policy
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.session import SessionState
from pipecat_actions.status import ActionStatus
from pipecat_actions.testing.restaurant import build_actions, new_system_of_record
from tests._waiting import HANG_GUARD_SECS, eventually, guarded

from ._support import PASSWORDS, ROLES, TENANTS

S = ActionStatus
CONFIGS = Path(__file__).resolve().parents[2] / "configs"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SKIP = os.environ.get("PIPECAT_ACTIONS_SKIP_BROWSER") == "1"
GUARD_MS = HANG_GUARD_SECS * 1000

pytestmark = pytest.mark.browser


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    if SKIP:
        pytest.skip("PIPECAT_ACTIONS_SKIP_BROWSER=1")
    if not Path(CHROMIUM).exists():
        pytest.fail(
            "the console's browser tests need Debian's chromium: apt-get install chromium "
            "(or set PIPECAT_ACTIONS_SKIP_BROWSER=1)",
            pytrace=False,
        )
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        pytest.fail("Playwright is not installed: make install (it is a dev dependency)")

    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        try:
            yield launched
        finally:
            await launched.close()


@dataclass
class Agent:
    """The bot's side: a runtime on the ledger, its restaurant, the console on the same file."""

    runtime: ActionRuntime
    sor: Any
    console: RunningConsole


@asynccontextmanager
async def agent_and_console(
    tmp_path: Path, *, console_now: Any = time.time
) -> AsyncIterator[Agent]:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    sor = new_system_of_record()
    runtime = await ActionRuntime.create(
        load_policy(CONFIGS / "restaurant.yaml"),
        authorizer=AllowAll(),
        actions=build_actions(sor),
        ledger_url=url,
        lease_secs=1.5,  # the heartbeat that picks up an approval comes round every 0.5 s
    )
    credentials = Credentials(tmp_path / "users")
    for name, password in PASSWORDS.items():
        roles = ROLES[name] | ({"manager"} if name == "rosa" else set())
        credentials.add(name, password, roles, TENANTS[name])
    console_ledger = await SqlLedger.create(url, must_exist=True)
    console = await start_console(
        ConsoleSettings(users=credentials, poll_secs=0.2, now=console_now),
        console_ledger,
        ledger_name=console_ledger.url,
        port=0,
    )
    try:
        yield Agent(runtime, sor, console)
    finally:
        await console.stop()
        await console_ledger.close()
        await runtime.close(grace_secs=0)


async def sign_in(page: Any, base: str, name: str) -> None:
    await page.goto(f"{base}/")
    await page.wait_for_url(f"{base}/login")
    await page.fill("input[name=name]", name)
    await page.fill("input[name=password]", PASSWORDS[name])
    await page.click("button[type=submit]")
    await page.wait_for_url(f"{base}/")
    assert await page.inner_text("[data-testid=operator]") == name


async def _kinds(lane: Any) -> list[str]:
    """The kinds of the marks of a lane of the timeline, left to right."""
    return list(
        await lane.locator("[data-testid=mark]").evaluate_all(
            "marks => marks.map(m => m.getAttribute('data-kind'))"
        )
    )


async def _shoot(page: Any, tmp_path: Path, name: str) -> bytes:
    """A full-page screenshot (kept in ``$PIPECAT_ACTIONS_SCREENSHOT_DIR`` when set)."""
    where = Path(os.environ.get("PIPECAT_ACTIONS_SCREENSHOT_DIR") or tmp_path)
    return bytes(await page.screenshot(path=str(where / name), full_page=True))


async def waiting_refund(runtime: ActionRuntime) -> Operation:
    async def asked() -> bool:
        return bool(await runtime.pending_approvals())

    await eventually(asked, what="the agent to ask for the refund's approval")
    (op,) = await runtime.pending_approvals()
    return op


async def test_a_manager_approves_in_the_browser_and_the_caller_hears_the_outcome(
    tmp_path: Path, browser: Any
) -> None:
    from pipecat.processors.aggregators.llm_context import LLMContext

    from pipecat_actions.adapters import ActionResultGate, ActionTurnTracker
    from pipecat_actions.testing import (
        Call,
        FakeTTS,
        Say,
        ScriptedLLM,
        ToolCalls,
        UserSays,
        WaitUntilIdle,
        run_conversation,
    )

    async with agent_and_console(tmp_path) as agent:
        page = await browser.new_page(viewport={"width": 1180, "height": 900})
        page.set_default_timeout(GUARD_MS)
        await sign_in(page, agent.console.url, "rosa")
        assert await page.is_visible("[data-testid=no-approvals]")
        await page.wait_for_selector("[data-testid=live]:has-text('Live updates: on')")

        # The host agent may hear refund outcomes (visible_to in configs/restaurant.yaml).
        session = SessionState(session_id="call-alice", principal="alice", active_agent="host")
        llm = ScriptedLLM(
            [
                ToolCalls([("refund_deposit", {"booking_id": "bk_0001", "amount": 2000})]),
                Say("A manager needs to approve the refund; I will tell you as soon as I hear."),
                Say("Good news: your refund of twenty euros has been approved and sent."),
            ]
        )
        attach(agent.runtime, llm, session)
        context = LLMContext(
            messages=[{"role": "system", "content": "You take restaurant bookings."}],
            tools=tools_schema(agent.runtime),
        )

        async def told_the_outcome() -> None:
            async def delivered() -> bool:
                (op,) = await agent.runtime.ledger.list()
                return op.status is S.COMMITTED and op.delivered_at is not None

            await eventually(delivered, what="the refund's outcome to be told")

        conversation = asyncio.ensure_future(
            run_conversation(
                [
                    UserSays("Please refund the deposit for booking bk_0001."),
                    WaitUntilIdle(quiet_secs=0.5, timeout_secs=HANG_GUARD_SECS),
                    Call(told_the_outcome),
                    WaitUntilIdle(quiet_secs=0.5, timeout_secs=HANG_GUARD_SECS),
                ],
                llm=llm,
                tts=FakeTTS(secs_per_char=0.005),
                context=context,
                after_user_aggregator=[ActionTurnTracker(session)],
                before_assistant_aggregator=[ActionResultGate(agent.runtime, session)],
                timeout_secs=HANG_GUARD_SECS * 2,
            )
        )
        try:
            op = await waiting_refund(agent.runtime)
            # The card appears on the open page, without a reload.
            card = page.locator(f"[data-testid=approval][data-key='{op.operation_id}']")
            await card.wait_for()
            assert await card.locator("[data-testid=requester]").inner_text() == "alice"
            assert await card.locator("[data-testid=args-hash]").inner_text() == op.args_hash
            assert (
                '"booking_id": "bk_0001"' in await card.locator("[data-testid=args]").inner_text()
            )
            before = await card.locator("[data-testid=before-state]").inner_text()
            assert '"paid_cents": 2000' in before and '"refunded_cents": 0' in before
            countdown = card.locator("[data-testid=countdown]")
            await page.wait_for_function(
                "el => /^in \\d+:\\d\\d$/.test(el.textContent)",
                arg=await countdown.element_handle(),
            )
            assert "risk high" in (await card.inner_text()).lower()
            # What is approved, in words, from the policy's summary over the arguments and
            # the before-state; what the tool does, from the policy.
            assert await card.locator("[data-testid=summary]").inner_text() == (
                "Refund 2000 cents of the deposit for booking bk_0001 "
                "(paid 2000 cents, 0 refunded so far)"
            )
            assert await card.locator("[data-testid=description]").inner_text() == (
                "Refunds the deposit paid for a booking to the card it was paid with."
            )
            await card.locator("[data-testid=reason]").fill("deposit policy: cancelled in time")
            shot = os.environ.get("PIPECAT_ACTIONS_SCREENSHOT")
            await page.screenshot(path=shot or str(tmp_path / "console.png"), full_page=True)
            await card.locator("[data-testid=approve]").click()
            await page.wait_for_selector("[data-testid=flash]:has-text('approved')")
            result = await guarded(conversation, what="the conversation to end")
        finally:
            if not conversation.done():
                conversation.cancel()
        done = await agent.runtime.ledger.get(op.operation_id)
        trail = await agent.runtime.ledger.events(op.operation_id)
        # The page follows: the approval is gone, the operation shows as committed.
        await page.wait_for_selector("[data-testid=no-approvals]")
        await page.wait_for_selector(
            f"[data-testid=recent]:has-text('{op.operation_id}'):has-text('COMMITTED')"
        )

        async def heard() -> bool:
            return (await agent.runtime.ledger.get(op.operation_id)).acknowledged_at is not None

        await eventually(heard, what="the outcome to be heard to the end")
        # One click from the operation to the conversation it came from, drawn from the ledger.
        await page.goto(f"{agent.console.url}/operations/{op.operation_id}")
        await page.click("[data-testid=conversation]")
        await page.wait_for_url(f"{agent.console.url}/sessions/call-alice")
        lane = page.locator(f"[data-testid=lane][data-operation='{op.operation_id}']")
        kinds = await _kinds(lane)
        await _shoot(page, tmp_path, "refund-timeline.png")

    assert kinds == ["proposed", "waiting", "approved", "running", "committed", "told", "heard"]
    assert done.status is S.COMMITTED and done.delivered_at is not None
    assert len(agent.sor.refunds("dep_bk_0001")) == 1
    decision = next(e for e in trail if e.to_status is S.ADMITTED)
    assert decision.actor == "approver:rosa"
    assert decision.detail["reason"] == "deposit policy: cancelled in time"
    assert result.heard_texts[-1] == (
        "Good news: your refund of twenty euros has been approved and sent."
    )


async def test_the_requester_cannot_approve_their_own_request_in_the_browser(
    tmp_path: Path, browser: Any
) -> None:
    async with agent_and_console(tmp_path) as agent:
        told = await agent.runtime.propose(
            "refund_deposit",
            {"booking_id": "bk_0001", "amount": 2000},
            SessionState("call-alice", principal="alice"),
        )
        page = await browser.new_page()
        page.set_default_timeout(GUARD_MS)
        await sign_in(page, agent.console.url, "alice")  # alice is a manager as well
        card = page.locator("[data-testid=approval]")
        await card.wait_for()
        assert await card.locator("[data-testid=own-request]").is_visible()
        await card.locator("[data-testid=reason]").fill("it is mine, trust me")
        await card.locator("[data-testid=approve]").click()
        flash = await page.locator("[data-testid=flash]").inner_text()
        after = await agent.runtime.ledger.get(str(told["operation_id"]))
    assert flash.startswith("Not approved:")
    assert "a requester never decides on their own request" in flash
    assert after.status is S.AWAITING_APPROVAL
    assert agent.sor.refunds("dep_bk_0001") == []


async def test_an_expired_request_cannot_be_approved_in_the_browser(
    tmp_path: Path, browser: Any
) -> None:
    policy = load_policy(CONFIGS / "restaurant.yaml")
    # The console's clock is an hour ahead of the agent's: the 30-minute window is over there.
    async with agent_and_console(tmp_path, console_now=lambda: time.time() + 3600) as agent:
        told = await agent.runtime.propose(
            "refund_deposit",
            {"booking_id": "bk_0001", "amount": 2000},
            SessionState("call-alice", principal="alice"),
        )
        page = await browser.new_page()
        page.set_default_timeout(GUARD_MS)
        await sign_in(page, agent.console.url, "rosa")
        card = page.locator("[data-testid=approval]")
        await card.wait_for()
        await page.wait_for_selector("[data-testid=countdown]:has-text('expired')")
        await card.locator("[data-testid=reason]").fill("fine")
        await card.locator("[data-testid=approve]").click()
        flash = await page.locator("[data-testid=flash]").inner_text()
        after = await agent.runtime.ledger.get(str(told["operation_id"]))
    assert policy["refund_deposit"].confirmation.expires_after_secs == 1800
    assert "expired before this approval" in flash
    assert after.status is S.EXPIRED
    assert agent.sor.refunds("dep_bk_0001") == []


PHARMACY = """
version: 1
tools:
  transfer_prescription:
    description: >-
      Moves a prescription to another pharmacy of the chain, where the patient collects it.
    kind: mutation
    risk: high
    arguments: [rx_id, to_pharmacy]
    before_state_fields: [patient_name, pharmacy, drug]
    mode: background
    confirmation:
      mode: approval
      approver_roles: [pharmacist]
      expires_after_secs: 1800
      summary: >-
        Transfer {rx_id} ({before.drug}) for {before.patient_name}
        from {before.pharmacy} to {to_pharmacy}
  order_refill:
    kind: mutation
    mode: background
    on_interruption: request_cancel
  update_phone:
    kind: mutation
"""


def pharmacy_actions(stop: asyncio.Event) -> list[Any]:
    """A pharmacy chain's tools: a transfer a pharmacist approves, a refill, a phone change."""
    from pipecat_actions.actions import ActionContext, CancelOutcome, action

    async def prescription(ctx: ActionContext) -> dict[str, Any]:
        return {"patient_name": "Jane Doe", "pharmacy": "Main St", "drug": "amoxicillin 500 mg"}

    @action(snapshot=prescription)
    async def transfer_prescription(ctx: ActionContext, rx_id: str, to_pharmacy: str) -> dict:
        """Transfer a prescription."""
        return {"rx_id": rx_id, "at": to_pharmacy}

    async def stop_refill(ctx: ActionContext) -> CancelOutcome:
        stop.set()
        return CancelOutcome.CANCELLED

    @action(cancel=stop_refill)
    async def order_refill(ctx: ActionContext, rx_id: str) -> dict:
        """Order a refill of a prescription from the wholesaler."""
        await stop.wait()  # the wholesaler takes its time; it is cancelled first
        return {"ordered": rx_id}

    @action
    async def update_phone(ctx: ActionContext, phone: str) -> dict:
        """Change the patient's phone number."""
        return {"phone": phone}

    return [transfer_prescription, order_refill, update_phone]


async def test_a_pharmacist_reads_the_transfer_in_words_and_opens_its_conversation(
    tmp_path: Path, browser: Any
) -> None:
    from pipecat_actions.policy import load_policy_text

    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    runtime = await ActionRuntime.create(
        load_policy_text(PHARMACY),
        authorizer=AllowAll(),
        actions=pharmacy_actions(asyncio.Event()),
        ledger_url=url,
    )
    jane = SessionState("call-jane", principal="jane", tenant="main-st")
    ledger = runtime.ledger

    async def told(operation_id: str, status: ActionStatus) -> None:
        # As the delivery service records what the conversation was told, then heard.
        await ledger.annotate(
            operation_id,
            actor="gate:call-jane",
            detail={"delivered": status.value, "agent": None, "late": False},
            changes={"delivered_at": time.time(), "delivered_status": status.value},
        )
        await ledger.annotate(
            operation_id,
            actor="gate:call-jane",
            detail={"acknowledged": True},
            changes={"acknowledged_at": time.time()},
        )

    credentials = Credentials(tmp_path / "users")
    credentials.add("priya", "priya-secret", frozenset({"pharmacist"}), ["main-st"])
    credentials.add("omar", "omar-secret", frozenset({"pharmacist"}), ["elm-st"])
    console_ledger = await SqlLedger.create(url, must_exist=True)
    console = await start_console(
        ConsoleSettings(users=credentials, poll_secs=0.2),
        console_ledger,
        ledger_name=console_ledger.url,
        port=0,
    )
    try:
        # Turn 1: a refill is ordered, and the caller cuts in: it is cancelled at the
        # wholesaler (on_interruption: request_cancel), and the caller is told so.
        jane.start_user_turn()
        refill = await runtime.propose("order_refill", {"rx_id": "RX-1234"}, jane, wait=False)
        refill_id = str(refill["operation_id"])
        await eventually(
            lambda: _status_is(ledger, refill_id, S.RUNNING), what="the refill to be sent"
        )
        await runtime.interrupted(refill_id)
        await eventually(
            lambda: _status_is(ledger, refill_id, S.CANCELLED), what="the refill to be cancelled"
        )
        await told(refill_id, S.CANCELLED)
        # Turn 2: the phone number is changed, but the caller is told it was cancelled: what
        # the conversation said and what the ledger holds differ.
        jane.start_user_turn()
        phone = await runtime.propose("update_phone", {"phone": "+1 555 0100"}, jane)
        assert phone["status"] == "committed", phone
        await told(str(phone["operation_id"]), S.CANCELLED)
        # Turn 3: the transfer waits for a pharmacist of the caller's pharmacy.
        jane.start_user_turn()
        asked = await runtime.propose(
            "transfer_prescription", {"rx_id": "RX-1234", "to_pharmacy": "Elm St"}, jane
        )
        assert asked["status"] == "awaiting_approval", asked

        page = await browser.new_page(viewport={"width": 1400, "height": 900})
        page.set_default_timeout(GUARD_MS)
        base = console.url
        # A pharmacist of another pharmacy is not shown it.
        await _sign_in_as(page, base, "omar", "omar-secret")
        assert await page.is_visible("[data-testid=no-approvals]")
        await page.click("text=Sign out")
        await _sign_in_as(page, base, "priya", "priya-secret")
        card = page.locator("[data-testid=approval]")
        await card.wait_for()
        summary = card.locator("[data-testid=summary]")
        assert await summary.inner_text() == (
            "Transfer RX-1234 (amoxicillin 500 mg) for Jane Doe from Main St to Elm St"
        )
        assert await card.locator("[data-testid=description]").inner_text() == (
            "Moves a prescription to another pharmacy of the chain, where the patient collects it."
        )
        box = await summary.bounding_box()
        assert box is not None and box["height"] > 0 and box["width"] > 0
        await _shoot(page, tmp_path, "approval-summary.png")
        summary_png = await summary.screenshot()

        await card.locator("[data-testid=conversation]").click()
        await page.wait_for_url(f"{base}/sessions/call-jane")
        lanes = page.locator("[data-testid=lane]")
        assert await lanes.count() == 3
        refill_lane, phone_lane, transfer_lane = (lanes.nth(i) for i in range(3))
        assert await _kinds(refill_lane) == [
            "proposed", "admitted", "running", "barge_in", "cancelling", "cancelled",
            "told", "heard",
        ]  # fmt: skip
        assert await _kinds(phone_lane) == [
            "proposed", "admitted", "running", "committed", "told", "heard",
        ]  # fmt: skip
        assert await _kinds(transfer_lane) == ["proposed", "waiting"]
        # The telling that differs from the ledger stands out, in words and in red.
        assert await page.locator("[data-testid=mismatch]").count() == 1
        said = phone_lane.locator("[data-testid=mismatch-text] tspan")
        assert await said.all_text_contents() == [
            "told CANCELLED;",
            "the ledger holds COMMITTED",
        ]
        assert await phone_lane.locator("[data-mismatch=true]").count() == 1
        assert await page.locator("[data-testid=turn]").count() == 3
        await _shoot(page, tmp_path, "session-timeline.png")
        red_lane = _tinted(await phone_lane.screenshot(), ALARM)
        plain_lane = _tinted(await refill_lane.locator(".lane-bg").screenshot(), ALARM)
    finally:
        await console.stop()
        await console_ledger.close()
        await runtime.close(grace_secs=0)
    assert _tinted(summary_png, MISSING) == 0  # no field of the summary is missing
    # A lane that agrees has at most a few such pixels, at the edges of its red marks.
    assert red_lane > 1000 and plain_lane < 100


async def _status_is(ledger: Any, operation_id: str, status: ActionStatus) -> bool:
    return (await ledger.get(operation_id)).status is status


async def _sign_in_as(page: Any, base: str, name: str, password: str) -> None:
    await page.goto(f"{base}/")
    await page.wait_for_url(f"{base}/login")
    await page.fill("input[name=name]", name)
    await page.fill("input[name=password]", password)
    await page.click("button[type=submit]")
    await page.wait_for_url(f"{base}/")


ALARM = (0xFD, 0xE2, 0xE2)
"""The console's light red: the background of a lane whose telling differs from the ledger."""
MISSING = (0xFF, 0xF1, 0xD6)
"""The console's light amber: the mark of a summary field the request does not hold."""


def _tinted(png: bytes, color: tuple[int, int, int]) -> int:
    """How many pixels of a screenshot are ``color`` (or within a few steps of it)."""
    import io

    from PIL import Image

    data = Image.open(io.BytesIO(png)).convert("RGB").tobytes()
    pixels = (data[i : i + 3] for i in range(0, len(data), 3))
    return sum(
        1 for pixel in pixels if all(abs(a - b) <= 6 for a, b in zip(pixel, color, strict=True))
    )
