"""Planted secrets never reach the logs of a real conversation, whoever logs them.

A real pipeline (ScriptedLLM through Pipecat's tool path, the real aggregators, the tracker,
the gate, FakeTTS and the offline output transport) runs with loguru capturing everything at
DEBUG. Pipecat itself logs the arguments of every tool call (``Calling function [...] with
arguments``), the whole context before each inference and the text it sends to TTS; the effect
logs its own arguments too. Secrets are planted at policy redact paths and as free text.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from loguru import logger
from pipecat.processors.aggregators.llm_context import LLMContext

from pipecat_actions import (
    ActionContext,
    ActionRuntime,
    AllowAll,
    SessionState,
    action,
    attach,
    tools_schema,
)
from pipecat_actions.adapters import ActionResultGate, ActionTurnTracker
from pipecat_actions.observability.redaction import (
    install_log_redaction,
    uninstall_log_redaction,
)
from pipecat_actions.policy import load_policy_text
from pipecat_actions.status import ActionStatus
from pipecat_actions.testing import (
    FakeTTS,
    Say,
    ScriptedLLM,
    ToolCalls,
    UserSays,
    Wait,
    capture_logs,
    find_secrets,
    run_conversation,
)

pytestmark = pytest.mark.timeout(60)

POLICY = """
version: 1
tools:
  book_table:
    kind: mutation
    redact: ["guests[*].phone"]
  pay_deposit:
    kind: mutation
    redact: [card.number, card.expiry]
"""

CARD = "4242 4242 4242 4242"  # at the redact path card.number
EXPIRY = "12/2031"  # at the redact path card.expiry
PHONE = "+44 20 7946 0958"  # at guests[*].phone, and read back by the model
FREE_CARD = "5555555555554444"  # a Luhn-valid card number in free text
JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJlc2VjcmV0"
API_KEY = "sk-proj-Q2xhdWRlU2VjcmV0S2V5MTIzNDU2"
AWS_KEY = "AKIAIOSFODNN7EXAMPLE"
PASSWORD = "Tr0ub4dor-horse-9"
PLANTED = [CARD, EXPIRY, PHONE, FREE_CARD, JWT, API_KEY, AWS_KEY, PASSWORD]

BOOKING = {
    "restaurant_id": "r1",
    "guests": [{"name": "Ada", "phone": PHONE}, {"name": "Grace", "phone": "+1 555 0100 77"}],
}
PAYMENT = {
    "card": {"number": CARD, "expiry": EXPIRY},
    "amount_cents": 2000,
    "notes": (
        f"backup card {FREE_CARD}; auth Bearer {JWT}; key {API_KEY}; aws {AWS_KEY}; "
        f"password={PASSWORD}"
    ),
}


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[ActionRuntime]:
    @action
    async def book_table(
        ctx: ActionContext, restaurant_id: str, guests: list[dict[str, str]]
    ) -> dict[str, Any]:
        """Book a table for the guests."""
        logger.info("booking for {}", guests)  # an application that logs its arguments
        return {"booking_id": "bk_1"}

    @action
    async def pay_deposit(
        ctx: ActionContext, card: dict[str, str], amount_cents: int, notes: str
    ) -> dict[str, Any]:
        """Take a deposit."""
        logger.info("charging {} to card={} ({})", amount_cents, card, notes)
        return {"payment_id": "pay_1"}

    opened = await ActionRuntime.create(
        load_policy_text(POLICY),
        authorizer=AllowAll(),
        actions=[book_table, pay_deposit],
        ledger_url=f"sqlite:///{tmp_path}/ledger.db",
    )
    yield opened
    await opened.close(grace_secs=0)


async def _converse(runtime: ActionRuntime) -> list[str]:
    session = SessionState(session_id="call-secret", principal="alice")
    llm = ScriptedLLM(
        [
            ToolCalls([("book_table", BOOKING), ("pay_deposit", PAYMENT)]),
            Say(f"Booked, and I will text the confirmation to {PHONE}."),
        ]
    )
    attach(runtime, llm, session)
    with capture_logs("DEBUG") as lines:
        await run_conversation(
            [UserSays("Book for Ada and Grace and take the deposit"), Wait(0.3)],
            llm=llm,
            tts=FakeTTS(secs_per_char=0.002),
            context=LLMContext(messages=[], tools=tools_schema(runtime)),
            after_user_aggregator=[ActionTurnTracker(session)],
            before_assistant_aggregator=[ActionResultGate(runtime, session)],
        )
    return lines


async def test_secrets_planted_in_tool_arguments_never_appear_in_the_logs(
    runtime: ActionRuntime,
) -> None:
    lines = await _converse(runtime)
    text = "".join(lines)

    # The places that would leak were logged (the scan is not vacuous) ...
    assert "Calling function [pay_deposit" in text
    assert "Generating LLM response" in text
    assert "Generating TTS" in text
    assert "charging 2000 to card=" in text
    # ... and none of the planted secrets is in them.
    assert find_secrets(text, PLANTED) == {}
    assert "[REDACTED]" in text


async def test_the_ledger_keeps_the_exact_arguments_for_audit(runtime: ActionRuntime) -> None:
    await _converse(runtime)

    payments = [op for op in await runtime.ledger.list() if op.tool == "pay_deposit"]
    assert [op.status for op in payments] == [ActionStatus.COMMITTED]
    assert payments[0].args == PAYMENT


async def test_without_the_redaction_the_same_conversation_leaks_every_secret(
    runtime: ActionRuntime,
) -> None:
    # The control: proves Pipecat and the effect really log these values, and that the scan
    # finds them when nothing masks them.
    uninstall_log_redaction()
    try:
        lines = await _converse(runtime)
    finally:
        install_log_redaction()

    assert set(find_secrets("".join(lines), PLANTED)) == set(PLANTED)
