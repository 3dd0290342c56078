"""Values are masked by value only from calls the runtime admitted, never from refused ones.

A call the runtime refuses (a phone given as a list of words, a call of another user's
booking) may hold anything the model made up; arming its values would let one call blank words
such as ``escalated`` or ``UNKNOWN`` out of every later log line. An admitted call's values at a
redact path are masked wherever they appear afterwards (the model reading the number back).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from loguru import logger

from pipecat_actions import ActionContext, ActionRuntime, SessionState, action
from pipecat_actions.admission.authorization import AuthorizationRequest, Decision
from pipecat_actions.observability.redaction import MASK
from pipecat_actions.policy import load_policy_text
from pipecat_actions.testing import capture_logs

POLICY = """
version: 1
tools:
  text_guest:
    kind: mutation
    redact: [phone]
"""

WORDS = ["escalated", "UNKNOWN", "operation", "Reconciled"]
LINE = "operation op_1 escalated: still UNKNOWN after Reconciled probes"


class OnlyAlice:
    async def authorize(self, request: AuthorizationRequest) -> Decision:
        return Decision.allow() if request.principal == "alice" else Decision.deny("not yours")


@pytest.fixture
async def runtime(ledger_url: str) -> AsyncIterator[ActionRuntime]:
    @action
    async def text_guest(ctx: ActionContext, phone: str, message: str) -> dict[str, Any]:
        """Text a guest."""
        return {"sent": True}

    opened = await ActionRuntime.create(
        load_policy_text(POLICY),
        authorizer=OnlyAlice(),
        actions=[text_guest],
        ledger_url=ledger_url,
    )
    yield opened
    await opened.close(grace_secs=0)


def _logged(text: str) -> str:
    with capture_logs("INFO") as lines:
        logger.info("{}", text)
    return "".join(lines)


async def test_a_refused_calls_values_never_mask_later_log_lines(runtime: ActionRuntime) -> None:
    alice, mallory = SessionState("a", principal="alice"), SessionState("m", principal="mallory")
    refused = [
        await runtime.propose("text_guest", {"phone": WORDS, "message": "hi"}, alice),
        await runtime.propose("text_guest", {"phone": " ".join(WORDS), "message": 1}, alice),
        await runtime.propose(
            "text_guest", {"phone": "BK-4471 escalated", "message": "x"}, mallory
        ),
    ]

    assert [r["status"] for r in refused] == ["refused"] * 3
    assert LINE in _logged(LINE)
    assert "BK-4471 escalated" in _logged("ref BK-4471 escalated")


async def test_an_admitted_calls_plain_words_are_not_armed_but_its_number_is(
    runtime: ActionRuntime,
) -> None:
    alice = SessionState("a", principal="alice")
    for phone in ["escalated", "ext. 4471 at the desk"]:
        result = await runtime.propose("text_guest", {"phone": phone, "message": "hi"}, alice)
        assert result["status"] == "committed", result

    assert LINE in _logged(LINE)
    assert _logged("I will text ext. 4471 at the desk now").count(MASK) == 1
