"""Gemini Live keeps the cascade's guarantees, with ``behavior`` and ``scheduling`` from policy.

The real ``GeminiLiveLLMService`` runs in the realtime layout `build_pipeline` builds, against
`FakeGeminiServer` (the Live API's websocket protocol, on 127.0.0.1). Each test asserts what the
provider received, what the ledger says and what the system of record did.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from pipecat.services.google.gemini_live.llm import GeminiLiveLLMService

from pipecat_actions.status import ActionStatus
from pipecat_actions.testing.fake_gemini_live import FakeGeminiServer, Message, field
from tests._waiting import HANG_GUARD_SECS, guarded
from tests.processors._clocked import until
from tests.realtime._support import (
    POLICY,
    Agent,
    agent_on,
    booking,
    restaurant,
    running_pipeline,
)

S = ActionStatus
GEMINI_25 = "models/gemini-2.5-flash-native-audio-preview-09-2025"
"""Takes NON_BLOCKING tools and scheduling; blocks unless told otherwise."""
GEMINI_38 = "models/gemini-3.8-flash-live"
"""Takes NON_BLOCKING tools and scheduling; runs calls NON_BLOCKING unless told BLOCKING."""
GEMINI_35 = "models/gemini-3.5-flash-live"
"""Takes neither NON_BLOCKING nor scheduling (Pipecat's gate for 3.0 to 3.7)."""


def gemini(fake: FakeGeminiServer, model: str = GEMINI_25) -> GeminiLiveLLMService:
    return GeminiLiveLLMService(
        api_key="fake-key",
        http_options=fake.http_options,
        settings=GeminiLiveLLMService.Settings(model=model),
    )


@asynccontextmanager
async def gemini_agent(
    tmp_path: Path, model: str = GEMINI_25
) -> AsyncIterator[tuple[Agent, FakeGeminiServer]]:
    async with FakeGeminiServer() as fake, agent_on(gemini(fake, model), tmp_path) as agent:
        # It connects at setup, and again when the context brings the tools.
        await fake.wait_for_tools(HANG_GUARD_SECS)
        yield agent, fake


def _response_for(call_id: str) -> Any:
    return lambda message: any(
        r.get("id") == call_id
        for r in field(field(message, "tool_response") or {}, "function_responses") or []
    )


def _text_saying(*words: str) -> Any:
    def matches(message: Message) -> bool:
        content = field(message, "client_content")
        return content is not None and all(word in json.dumps(content) for word in words)

    return matches


def _declared(fake: FakeGeminiServer) -> dict[str, str | None]:
    return {decl["name"]: decl.get("behavior") for decl in fake.declared_functions()}


def _status(response: Message) -> str | None:
    value = response.get("response", {})
    return value.get("status") if isinstance(value, dict) else None


@pytest.mark.parametrize(
    ("model", "blocking"),
    [(GEMINI_25, None), (GEMINI_38, "BLOCKING")],
)
async def test_each_action_is_declared_blocking_or_not_by_its_mode(
    tmp_path: Path, model: str, blocking: str | None
) -> None:
    async with gemini_agent(tmp_path, model) as (_, fake):
        declared = _declared(fake)

    assert declared["book_in_background"] == "NON_BLOCKING"
    assert declared["book_in_background_silently"] == "NON_BLOCKING"
    # A blocking action is declared BLOCKING where the model would not block by itself.
    assert declared["book_table"] == blocking
    assert declared["book_or_cancel"] == blocking


async def test_a_model_without_non_blocking_tools_gets_no_behavior_and_no_scheduling(
    tmp_path: Path,
) -> None:
    async with gemini_agent(tmp_path, GEMINI_35) as (agent, fake):
        call_id = await fake.call("book_in_background", booking())
        await agent.at_the_provider()
        agent.commit()
        await fake.wait_for(_response_for(call_id), HANG_GUARD_SECS)
        await agent.delivered("book_in_background")

    assert set(_declared(fake).values()) == {None}
    (response,) = fake.tool_responses(call_id)
    assert "scheduling" not in response and "scheduling" not in response["response"]
    assert _status(response) == "committed"


@pytest.mark.parametrize(
    ("tool", "scheduling"),
    [
        ("book_in_background", "WHEN_IDLE"),
        ("book_in_background_silently", "SILENT"),
        ("book_in_background_urgently", "INTERRUPT"),
    ],
)
async def test_a_background_outcome_is_scheduled_as_the_tools_delivery_policy_says(
    tmp_path: Path, tool: str, scheduling: str
) -> None:
    async with gemini_agent(tmp_path) as (agent, fake):
        call_id = await fake.call(tool, booking())
        await agent.at_the_provider()
        assert fake.tool_responses(call_id) == []  # the call stays open while it runs
        agent.commit()
        await fake.wait_for(_response_for(call_id), HANG_GUARD_SECS)
        op = await agent.delivered(tool)

    (response,) = fake.tool_responses(call_id)
    assert response["scheduling"] == scheduling
    assert response["response"]["scheduling"] == scheduling
    assert response.get("will_continue", response.get("willContinue")) is False
    assert _status(response) == "committed"
    assert op.status is S.COMMITTED
    assert agent.side_effects() == 1


async def test_the_providers_cancellation_of_a_running_booking_is_a_barge_in_told_truthfully(
    tmp_path: Path,
) -> None:
    async with gemini_agent(tmp_path) as (agent, fake):
        call_id = await fake.call("book_table", booking())
        await agent.at_the_provider()
        await fake.cancel_calls(call_id)  # the user spoke over the call
        await fake.wait_for(_text_saying("was not stopped", call_id), HANG_GUARD_SECS)
        agent.commit()
        await fake.wait_for(_text_saying("committed", "book_table"), HANG_GUARD_SECS)
        op = await agent.delivered("book_table")

    # The provider forgot the call: nothing answers the cancelled id, the truth comes as text.
    assert fake.tool_responses(call_id) == []
    assert not any("CANCELLED" in text for text in fake.client_texts())
    assert op.status is S.COMMITTED
    assert agent.side_effects() == 1


async def test_the_providers_cancellation_applies_the_tools_on_interruption_policy(
    tmp_path: Path,
) -> None:
    async with gemini_agent(tmp_path) as (agent, fake):
        call_id = await fake.call("book_or_cancel", booking())
        await agent.at_the_provider()
        await fake.cancel_calls(call_id)
        op = await agent.settled("book_or_cancel", S.CANCELLED)
        await fake.wait_for(_text_saying("cancelled", "book_or_cancel"), HANG_GUARD_SECS)

    assert op.status is S.CANCELLED
    assert agent.side_effects() == 0
    assert fake.tool_responses(call_id) == []


async def test_a_repeated_call_while_the_first_is_pending_is_joined_and_books_once(
    tmp_path: Path,
) -> None:
    # Google: duplicate calls are only "minimized"; filter them on the client side.
    async with gemini_agent(tmp_path) as (agent, fake):
        first = await fake.call("book_in_background", booking())
        await agent.at_the_provider()
        second = await fake.call("book_in_background", booking())
        await until(
            lambda: agent.runtime.operation_for_call(second) is not None,
            what="the repeat to be admitted",
        )
        agent.commit()
        await fake.wait_for(_response_for(first), HANG_GUARD_SECS)
        await fake.wait_for(_response_for(second), HANG_GUARD_SECS)
        operations = await agent.runtime.ledger.list()

    assert [_status(r) for r in fake.tool_responses(first)] == ["committed"]
    assert [_status(r) for r in fake.tool_responses(second)] == ["committed"]
    assert agent.side_effects() == 1
    assert len(operations) == 1


async def test_an_outcome_due_during_a_reconnect_is_told_once_the_session_is_back(
    tmp_path: Path,
) -> None:
    # pipecat #5465: the service drops a tool result sent while it reconnects, and forgets
    # the call's id; the model then waits forever for a call nobody answers.
    async with gemini_agent(tmp_path) as (agent, fake):
        call_id = await fake.call("book_in_background", booking())
        await agent.at_the_provider()
        fake.hold_connections()
        await fake.drop()  # the service reconnects by itself; its new session waits
        await until(lambda: fake.connections == 2 and agent.llm._session is None, what="the gap")
        agent.commit()
        op = await agent.settled("book_in_background", S.COMMITTED)
        await guarded(agent.runtime.wait(op.operation_id), what="the outcome")
        assert (await agent.runtime.ledger.get(op.operation_id)).delivered_at is None
        fake.admit_connections()
        await fake.wait_for(_text_saying("committed", call_id), HANG_GUARD_SECS, connection=3)
        await agent.delivered("book_in_background")

    assert fake.tool_responses(call_id) == []
    assert agent.side_effects() == 1


async def test_an_outcome_owed_to_a_session_is_told_by_its_next_pipeline(
    tmp_path: Path,
) -> None:
    async with restaurant(tmp_path) as place:
        async with FakeGeminiServer() as fake, running_pipeline(place, gemini(fake)) as agent:
            await fake.wait_for_tools(HANG_GUARD_SECS)
            await fake.call("book_table", booking())
            await agent.at_the_provider()
        # The pipeline ended (the user hung up) with the booking at the provider.
        agent.commit()
        op = await agent.settled("book_table", S.COMMITTED)
        async with FakeGeminiServer() as fake, running_pipeline(place, gemini(fake)) as second:
            await fake.wait_for(_text_saying("committed", "book_table"), HANG_GUARD_SECS)
            told = await second.delivered("book_table")

    assert told.operation_id == op.operation_id
    assert place.sor.side_effects["book"] == 1


async def test_a_call_that_waits_for_its_turn_to_settle_is_admitted_once_the_model_proposed_it(
    tmp_path: Path,
) -> None:
    # A blocking call stops the model's turn until it is answered: no turn_complete comes
    # before it, so the proposal itself settles the generation.
    async with gemini_agent(tmp_path) as (agent, fake):
        await fake.say("Let me book that.")
        call_id = await fake.call("book_when_settled", booking())
        await agent.at_the_provider()
        agent.commit()
        await fake.wait_for(_response_for(call_id), HANG_GUARD_SECS)

    assert [_status(r) for r in fake.tool_responses(call_id)] == ["committed"]
    assert agent.side_effects() == 1


async def test_a_call_bundled_with_the_interruption_of_its_generation_is_refused_as_stale(
    tmp_path: Path,
) -> None:
    async with gemini_agent(tmp_path) as (agent, fake):
        await fake.send({"serverContent": {"modelTurn": {"parts": [{"text": "I will book"}]}}})
        call_id = "call-stale"
        await fake.send(
            {
                "serverContent": {"interrupted": True},
                "toolCall": {
                    "functionCalls": [{"id": call_id, "name": "book_table", "args": booking()}]
                },
            }
        )
        await fake.wait_for(_response_for(call_id), HANG_GUARD_SECS)
        statuses = [op.status for op in await agent.runtime.ledger.list()]

    (answer,) = fake.tool_responses(call_id)
    assert answer["response"]["reason"] == "stale_proposal"
    assert statuses == [S.REJECTED]
    assert agent.side_effects() == 0


async def test_background_calls_proposed_together_are_answered_silently_but_the_last(
    tmp_path: Path,
) -> None:
    async with gemini_agent(tmp_path) as (agent, fake):
        await fake.send(
            {
                "toolCall": {
                    "functionCalls": [
                        {"id": "call-a", "name": "book_in_background", "args": booking("20:00")},
                        {"id": "call-b", "name": "book_in_background", "args": booking("22:00")},
                    ]
                }
            }
        )
        await agent.at_the_provider(times=2)
        agent.commit()
        await fake.wait_for(_response_for("call-a"), HANG_GUARD_SECS)
        await fake.wait_for(_response_for("call-b"), HANG_GUARD_SECS)

    answers = [r for r in fake.tool_responses() if r.get("id") in ("call-a", "call-b")]
    assert [r["scheduling"] for r in answers] == ["SILENT", "WHEN_IDLE"]
    assert [_status(r) for r in answers] == ["committed", "committed"]
    assert agent.side_effects() == 2


async def test_a_background_call_that_needs_a_yes_is_asked_aloud_and_its_call_closed(
    tmp_path: Path,
) -> None:
    async with gemini_agent(tmp_path) as (_, fake):
        call_id = await fake.call("book_after_a_yes", booking())
        await fake.wait_for(_response_for(call_id), HANG_GUARD_SECS)

    (answer,) = fake.tool_responses(call_id)
    assert _status(answer) == "awaiting_confirmation"
    assert answer["scheduling"] == "WHEN_IDLE"  # the model must ask the user now
    assert answer.get("will_continue", answer.get("willContinue")) is False


async def test_after_a_reconnect_no_earlier_result_is_sent_again(tmp_path: Path) -> None:
    async with gemini_agent(tmp_path) as (agent, fake):
        first = await fake.call("book_in_background", booking("20:00"))
        await agent.at_the_provider()
        agent.commit()
        await fake.wait_for(_response_for(first), HANG_GUARD_SECS)
        await agent.delivered("book_in_background")
        before = fake.connections
        await fake.drop()  # the service reconnects by itself
        await fake.wait_for_connections(before + 1, HANG_GUARD_SECS)
        # Pipecat's catch-up path sends every tool result of the context it has not marked
        # sent; a reconnect must not unmark the ones sent before it.
        llm: Any = agent.llm
        assert first in llm._completed_tool_calls
        second = await fake.call("book_table", booking("22:00"))
        await agent.at_the_provider(times=2)
        agent.commit()
        await fake.wait_for(_response_for(second), HANG_GUARD_SECS, connection=3)
        await until(
            lambda: agent.context_text().count(second) >= 2, what="the result in the context"
        )
        on_the_new_session = [
            r
            for message in fake.received_from(3)
            for r in field(field(message, "tool_response") or {}, "function_responses") or []
        ]

    assert [r["id"] for r in on_the_new_session] == [second]


async def test_the_models_cancel_answers_what_the_ledger_says_never_pipecats_cancelled(
    tmp_path: Path,
) -> None:
    cancellable = POLICY.replace(
        "        on_interruption: request_cancel\n",
        "        on_interruption: request_cancel\n        cancellable_by_llm: true\n",
    )
    async with (
        FakeGeminiServer() as fake,
        agent_on(gemini(fake), tmp_path, policy_text=cancellable) as agent,
    ):
        await fake.wait_for_tools(HANG_GUARD_SECS)
        booking_call = await fake.call("book_or_cancel", booking())
        await agent.at_the_provider()
        cancel_call = await fake.call("cancel_book_or_cancel", {})
        await fake.wait_for(_response_for(cancel_call), HANG_GUARD_SECS)
        op = await agent.settled("book_or_cancel", S.CANCELLED)
        await fake.wait_for(_response_for(booking_call), HANG_GUARD_SECS)

    (answer,) = fake.tool_responses(cancel_call)
    assert _status(answer) == "cancel_requested"
    assert answer["response"]["operation_id"] == op.operation_id
    assert [_status(r) for r in fake.tool_responses(booking_call)] == ["cancelled"]
    sent = json.dumps(fake.tool_responses())
    assert "CANCELLED" not in sent
    assert '"cancelled": "' not in sent
    assert "cancel_book_or_cancel" in _declared(fake)
    assert agent.side_effects() == 0


async def test_an_owed_outcome_goes_once_into_the_session_that_lives_not_the_start_up_one(
    tmp_path: Path,
) -> None:
    # The service connects at start-up and again when the first context brings the tools
    # (Pipecat closes the start-up session then): the owed outcome is told once, into the
    # session the conversation goes on in.
    async with restaurant(tmp_path) as place:
        async with FakeGeminiServer() as fake, running_pipeline(place, gemini(fake)) as agent:
            await fake.wait_for_connections(2, HANG_GUARD_SECS)
            await fake.call("book_table", booking())
            await agent.at_the_provider()
        agent.commit()
        await agent.settled("book_table", S.COMMITTED)
        # The bot waits for its client before the first response: the telling comes first.
        async with (
            FakeGeminiServer() as fake,
            running_pipeline(place, gemini(fake), run_first=False) as second,
        ):
            await fake.wait_for_connections(2, HANG_GUARD_SECS)
            await fake.wait_for(_text_saying("committed", "book_table"), HANG_GUARD_SECS)
            await second.delivered("book_table")
            saying = _text_saying("committed", "book_table")
            told_on = [
                number
                for message, number in zip(fake.received, fake.received_on, strict=True)
                if saying(message)
            ]
            last = fake.connections

    assert told_on == [last]
