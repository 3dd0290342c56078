"""The console in a real browser: Debian's headless Chromium, driven by Playwright.

A manager signs in, sees the refund the agent is waiting on appear without a reload, approves
it with a reason, and the conversation (a real offline Pipecat pipeline on the same ledger)
hears the outcome. The requester cannot approve their own request, and an expired request
cannot be approved. Playwright never downloads a browser here: it drives /usr/bin/chromium
(``apt-get install chromium``; `make test` installs it where it can). Set
``PIPECAT_ACTIONS_SCREENSHOT=PATH`` to keep the screenshot of the approval the README shows.
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

from ._support import PASSWORDS, ROLES

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
        credentials.add(name, password, ROLES[name] | ({"manager"} if name == "rosa" else set()))
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

    from pipecat_actions.processors import ActionResultGate, ActionTurnTracker
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
        agent.runtime.attach(llm, session)
        context = LLMContext(
            messages=[{"role": "system", "content": "You take restaurant bookings."}],
            tools=agent.runtime.tools_schema(),
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
