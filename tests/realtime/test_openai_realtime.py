"""OpenAI Realtime keeps the cascade's guarantees: what the provider hears is the truth.

The real ``OpenAIRealtimeLLMService`` runs in the realtime layout `build_pipeline` builds, against
`FakeRealtimeServer` on 127.0.0.1. Each test asserts what the provider received (never
``CANCELLED`` for an action that goes on or committed; the late outcome arrives), what the ledger
says and what the system of record did.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from pipecat.frames.frames import BotStartedSpeakingFrame
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService

from pipecat_actions.status import ActionStatus
from pipecat_actions.testing import capture_logs
from pipecat_actions.testing.fake_openai_realtime import Event, FakeRealtimeServer
from pipecat_actions.testing.fake_openai_realtime import realtime_response as response
from tests._waiting import guarded
from tests.processors._clocked import until
from tests.realtime._support import (
    POLICY,
    Agent,
    HeldAuthorizer,
    HeldEnds,
    OutputOnly,
    SeesInterruptions,
    agent_on,
    booking,
    restaurant,
    running_pipeline,
    status_of,
)

S = ActionStatus


@asynccontextmanager
async def openai_agent(
    tmp_path: Path, **options: Any
) -> AsyncIterator[tuple[Agent, FakeRealtimeServer]]:
    async with FakeRealtimeServer() as server:
        llm = OpenAIRealtimeLLMService(api_key="x", base_url=server.url)
        async with agent_on(llm, tmp_path, **options) as agent:
            await server.wait_for(_type("response.create"))
            yield agent, server


def _type(type_: str) -> Callable[[Event], bool]:
    return lambda event: event.get("type") == type_


def _output_for(call_id: str) -> Callable[[Event], bool]:
    def matches(event: Event) -> bool:
        item: dict[str, Any] = event.get("item", {})
        return item.get("type") == "function_call_output" and item.get("call_id") == call_id

    return matches


def _message_saying(*words: str) -> Callable[[Event], bool]:
    def matches(event: Event) -> bool:
        item: dict[str, Any] = event.get("item", {})
        text = json.dumps(item.get("content", []))
        return item.get("type") == "message" and all(word in text for word in words)

    return matches


async def _talked_over(agent: Agent, server: FakeRealtimeServer, tool: str) -> str:
    """The model books with ``tool``; the user speaks over it while the booking is at the
    provider, and the call is answered (truthfully, the test checks how). Returns its id."""
    call_id = await server.call(tool, booking())
    await agent.at_the_provider()
    await server.speech_started()
    await server.wait_for(_output_for(call_id))
    return call_id


def _outputs(server: FakeRealtimeServer, call_id: str) -> list[str | None]:
    return [status_of(text) for text in server.function_outputs(call_id)]


async def test_a_barge_in_on_a_running_booking_tells_the_provider_it_goes_on_then_that_it_committed(
    tmp_path: Path,
) -> None:
    async with openai_agent(tmp_path) as (agent, server):
        call_id = await _talked_over(agent, server, "book_table")
        agent.commit()
        await agent.settled("book_table", S.COMMITTED)
        await server.speech_stopped()
        late = await server.wait_for(_message_saying("committed", "book_table"))
        # The late outcome asks for a response: the model tells the user.
        await server.wait_for(_type("response.create"), since=server.received.index(late))
        op = await agent.delivered("book_table")

    assert _outputs(server, call_id) == ["running"]
    assert "was not stopped" in server.function_outputs(call_id)[0]
    assert not any("CANCELLED" in text for text in server.function_outputs(call_id))
    assert "CANCELLED" not in agent.context_text()
    assert agent.side_effects() == 1
    assert op.status is S.COMMITTED and op.delivered_status is S.COMMITTED


async def test_a_booking_cancelled_at_the_users_barge_in_is_told_cancelled_because_it_was(
    tmp_path: Path,
) -> None:
    # on_interruption: request_cancel still applies on a realtime service: the runtime asks the
    # provider to stop the request, and the provider is told CANCELLED only once that is true.
    async with openai_agent(tmp_path) as (agent, server):
        call_id = await server.call("book_or_cancel", booking())
        await agent.at_the_provider()
        await server.speech_started()
        op = await agent.settled("book_or_cancel", S.CANCELLED)
        await server.speech_stopped()
        await server.wait_for(_output_for(call_id))
        await until(
            lambda: (
                any("cancelled" in text for text in server.messages())
                or "cancel" in (_outputs(server, call_id)[-1] or "")
            ),
            what="the provider to hear that the booking was cancelled",
        )

    assert agent.side_effects() == 0
    assert op.status is S.CANCELLED
    heard = server.function_outputs(call_id) + server.messages()
    assert all("CANCELLED" not in text for text in heard)  # the runtime's words, not Pipecat's


async def test_a_call_proposed_in_a_response_the_user_interrupted_is_refused_and_books_nothing(
    tmp_path: Path,
) -> None:
    seen = SeesInterruptions()
    async with openai_agent(tmp_path, transport=OutputOnly(seen)) as (agent, server):
        before = agent.session.generation

        async def barge_in() -> None:
            await until(
                lambda: agent.session.generation > before,
                what="the service to start the response that proposes the call",
            )
            generation = agent.session.generation
            await server.speech_started()
            await until(
                lambda: agent.session.is_interrupted(generation),
                what="the session to record the barge-in on the response",
            )
            # The service has handled the interruption too (it passes it on after): the call
            # it is about to make is not cancelled by it, and meets the stale-proposal check.
            await until(lambda: seen.interruptions, what="the interruption to pass the service")

        call_id = await server.call("book_table", booking(), meanwhile=barge_in)
        await server.wait_for(_output_for(call_id))
        statuses = [op.status for op in await agent.runtime.ledger.list()]

    (output,) = server.function_outputs(call_id)
    assert json.loads(output).get("reason") == "stale_proposal", output
    assert agent.side_effects() == 0
    assert statuses == [S.REJECTED]


async def test_a_late_outcome_waits_until_the_user_stops_speaking_then_reaches_the_provider(
    tmp_path: Path,
) -> None:
    async with openai_agent(tmp_path) as (agent, server):
        call_id = await _talked_over(agent, server, "book_table")
        agent.commit()
        await agent.settled("book_table", S.COMMITTED)
        await until(lambda: agent.gate.delivery._state.held_outcomes, what="the outcome to be held")
        assert not any("committed" in text for text in server.messages())
        stopped_at = len(server.received)
        await server.speech_stopped()
        await server.wait_for(_message_saying("committed", "book_table"), since=stopped_at)
        await agent.delivered("book_table")

    assert _outputs(server, call_id) == ["running"]
    assert agent.side_effects() == 1


async def test_a_silent_late_outcome_reaches_the_provider_and_asks_for_no_response(
    tmp_path: Path,
) -> None:
    async with openai_agent(tmp_path) as (agent, server):
        await _talked_over(agent, server, "book_silently")
        await server.speech_stopped()
        responses = server.count("response.create")
        agent.commit()
        late = await server.wait_for(_message_saying("committed", "book_silently"))
        await agent.delivered("book_silently")

    after = server.received[server.received.index(late) :]
    assert not [event for event in after if event.get("type") == "response.create"]
    assert server.count("response.create") == responses


async def test_a_background_booking_answers_its_open_call_with_the_outcome(
    tmp_path: Path,
) -> None:
    # Pipecat keeps a background call open at the provider while it runs; its outcome is
    # the call's own answer, once, and the ledger records it as told.
    async with openai_agent(tmp_path) as (agent, server):
        call_id = await server.call("book_in_background", booking())
        await agent.at_the_provider()
        assert server.function_outputs(call_id) == []
        agent.commit()
        await server.wait_for(_output_for(call_id))
        op = await agent.delivered("book_in_background")

    assert _outputs(server, call_id) == ["committed"]
    assert not [text for text in server.messages() if "committed" in text]
    assert op.status is S.COMMITTED
    assert agent.side_effects() == 1


async def test_two_identical_calls_book_once_and_both_calls_are_told_the_booking(
    tmp_path: Path,
) -> None:
    async with openai_agent(tmp_path) as (agent, server):
        first = await server.call("book_table", booking())
        await agent.at_the_provider()
        second = await server.call("book_table", booking())
        agent.commit()
        await server.wait_for(_output_for(first))
        await server.wait_for(_output_for(second))
        operations = await agent.runtime.ledger.list()

    assert _outputs(server, first) == ["committed"]
    assert _outputs(server, second) == ["committed"]
    assert agent.side_effects() == 1
    assert len(operations) == 1


async def test_a_call_past_pipecats_timeout_tells_the_provider_it_goes_on_and_later_its_outcome(
    tmp_path: Path,
) -> None:
    async with openai_agent(tmp_path) as (agent, server):
        call_id = await server.call("book_with_a_short_wait", booking())
        await agent.at_the_provider()
        output = await server.wait_for(_output_for(call_id))  # Pipecat's timeout ended the wait
        # A timeout is the one cancel after which the model should speak: it says it goes on.
        await server.wait_for(_type("response.create"), since=server.received.index(output))
        agent.commit()
        await server.wait_for(_message_saying("committed", "book_with_a_short_wait"))

    assert _outputs(server, call_id) == ["running"]
    assert "longer than the wait allows" in server.function_outputs(call_id)[0]
    assert agent.side_effects() == 1


async def test_an_outcome_owed_when_the_connection_drops_is_told_to_the_sessions_next_pipeline(
    tmp_path: Path,
) -> None:
    async with restaurant(tmp_path) as place:
        async with FakeRealtimeServer() as server:
            llm = OpenAIRealtimeLLMService(api_key="x", base_url=server.url)
            with capture_logs("WARNING") as warned:
                async with running_pipeline(place, llm) as agent:
                    await server.wait_for(_type("response.create"))
                    call_id = await server.call("book_in_background", booking())
                    await agent.at_the_provider()
                    await server.drop()  # the provider's connection is gone
                    agent.commit()
                    op = await agent.settled("book_in_background", S.COMMITTED)
                    await guarded(place.runtime.wait(op.operation_id), what="the outcome")
            # The pipeline ended with the result held for a session that never came back: the
            # wait was given up, not left behind.
            assert not [line for line in warned if "dangling" in line]
        # The first pipeline could not tell it: it is not recorded as told.
        assert (await place.runtime.ledger.get(op.operation_id)).delivered_at is None

        async with FakeRealtimeServer() as again:
            llm = OpenAIRealtimeLLMService(api_key="x", base_url=again.url)
            async with running_pipeline(place, llm) as second:
                await again.wait_for(_message_saying("committed", "book_in_background"))
                await second.delivered("book_in_background")

    assert server.function_outputs(call_id) == []
    assert not [text for text in server.messages() if "committed" in text]
    assert place.sor.side_effects["book"] == 1


async def test_a_call_that_waits_for_its_turn_to_settle_is_admitted_when_the_response_is_done(
    tmp_path: Path,
) -> None:
    async with openai_agent(tmp_path) as (agent, server):
        call_id = await server.call("book_when_settled", booking())
        await agent.at_the_provider()
        agent.commit()
        await server.wait_for(_output_for(call_id))

    assert _outputs(server, call_id) == ["committed"]
    assert agent.side_effects() == 1


async def test_an_outcome_due_while_the_conversation_is_reset_reaches_the_new_session(
    tmp_path: Path,
) -> None:
    # reset_conversation reconnects and sets the conversation up again from the local context:
    # the late outcome told meanwhile is in that context and asks for the response that does it.
    async with openai_agent(tmp_path) as (agent, server):
        await _talked_over(agent, server, "book_table")
        await server.speech_stopped()
        llm: Any = agent.llm
        await llm.reset_conversation()
        await until(lambda: server.connections == 2, what="the second connection")
        reconnected_at = len(server.received)
        agent.commit()
        await server.wait_for(_message_saying("committed", "book_table"), since=reconnected_at)
        await server.wait_for(_type("response.create"), since=reconnected_at)
        await agent.delivered("book_table")

    assert agent.side_effects() == 1


async def test_an_interrupting_late_outcome_cancels_the_providers_response_first(
    tmp_path: Path,
) -> None:
    async with openai_agent(tmp_path) as (agent, server):
        await _talked_over(agent, server, "book_urgently")
        await server.speech_stopped()
        # The bot is speaking a response of the provider's when the outcome comes.
        await server.send({"type": "response.created", "response": response("resp_talking")})
        await agent.worker.queue_frame(BotStartedSpeakingFrame())
        await until(lambda: agent.session.bot_speaking, what="the bot to be speaking")
        agent.commit()
        late = await server.wait_for(_message_saying("committed", "book_urgently"))
        cancelled = await server.wait_for(_type("response.cancel"))

    assert server.received.index(cancelled) < server.received.index(late)
    assert agent.side_effects() == 1


async def test_a_barge_in_while_the_call_is_being_admitted_tells_the_provider_what_admission_made(
    tmp_path: Path,
) -> None:
    # Admission runs on when the wait is cancelled: the booking it admits goes on, and the
    # provider is told that (never "nothing was done"), then its outcome.
    held = HeldAuthorizer()
    async with openai_agent(tmp_path, authorizer=held) as (agent, server):
        call_id = await server.call("book_table", booking())
        await guarded(held.asked.wait(), what="admission to ask the authorizer")
        await server.speech_started()
        llm: Any = agent.llm
        await until(lambda: not llm._function_call_tasks, what="Pipecat to cancel the wait")
        held.release()
        output = await server.wait_for(_output_for(call_id))
        await agent.at_the_provider()
        await server.speech_stopped()
        agent.commit()
        await server.wait_for(_message_saying("committed", "book_table"))
        op = await agent.delivered("book_table")

    assert status_of(output["item"]["output"]) == "running"
    assert op.status is S.COMMITTED
    assert agent.side_effects() == 1


async def test_a_call_from_a_response_the_user_cut_off_is_refused_when_it_waits_for_its_turn(
    tmp_path: Path,
) -> None:
    # The server VAD heard the user while the response was still going: response.done says
    # cancelled, possibly before the user aggregator's interruption is back at the tracker.
    async with openai_agent(tmp_path) as (agent, server):
        call_id = await server.call(
            "book_when_settled",
            booking(),
            before_done=server.speech_started,
            done_status="cancelled",
        )
        output = await server.wait_for(_output_for(call_id))
        statuses = [op.status for op in await agent.runtime.ledger.list()]

    # Refused as stale, or (when Pipecat's cancel of the wait came first) closed as never
    # started: either way nothing was done, and the provider is told so.
    assert status_of(output["item"]["output"]) in ("refused", "not_started")
    assert statuses == [S.REJECTED]
    assert agent.side_effects() == 0


async def test_a_call_waiting_for_its_turn_runs_only_once_the_reply_was_heard_to_its_end(
    tmp_path: Path,
) -> None:
    # The response's end frame follows its audio through the output transport: until it has
    # passed, the user has not heard the reply to its end, and a barge-in still makes the
    # call stale.
    playback = HeldEnds()
    async with FakeRealtimeServer() as server:
        llm = OpenAIRealtimeLLMService(api_key="x", base_url=server.url)
        async with agent_on(llm, tmp_path, transport=OutputOnly(playback)) as agent:
            await server.wait_for(_type("response.create"))
            await until(lambda: playback.held, what="the first reply to be playing")
            playback.release()
            await server.call("book_when_settled", booking())
            await until(lambda: playback.held, what="the reply to be playing")
            await server.speech_started()  # the user speaks over the end of the reply
            await until(lambda: agent.session.user_speaking, what="the user's turn")
            playback.release()
            op = await agent.settled("book_when_settled", S.CANCELLED, S.REJECTED, S.COMMITTED)

    assert op.status is not S.COMMITTED and op.sent_at is None
    assert agent.side_effects() == 0


async def test_a_handoff_brief_reaches_the_provider(tmp_path: Path) -> None:
    async with openai_agent(tmp_path) as (agent, server):
        await _talked_over(agent, server, "book_table")
        await agent.gate.handoff("billing")
        await server.wait_for(_message_saying("You are now handling", "book_table"))
        agent.commit()
        await agent.settled("book_table", S.COMMITTED)


CANCELLABLE = POLICY.replace(
    "        on_interruption: request_cancel\n",
    "        on_interruption: request_cancel\n        cancellable_by_llm: true\n",
)


async def test_the_models_cancel_tells_the_provider_cancel_requested_then_the_real_outcome(
    tmp_path: Path,
) -> None:
    # The model stops a booking it started (cancel_<tool>): the provider hears what the ledger
    # says (requested, then cancelled once the system of record confirmed), never Pipecat's
    # {"cancelled": <call>} answer.
    async with openai_agent(tmp_path, policy_text=CANCELLABLE) as (agent, server):
        booking_call = await server.call("book_or_cancel", booking())
        await agent.at_the_provider()
        cancel_call = await server.call("cancel_book_or_cancel", {})
        await server.wait_for(_output_for(cancel_call))
        op = await agent.settled("book_or_cancel", S.CANCELLED)
        await server.wait_for(_output_for(booking_call))
        trail = await agent.runtime.ledger.events(op.operation_id)

    (answer,) = server.function_outputs(cancel_call)
    assert json.loads(answer)["status"] == "cancel_requested"
    assert json.loads(answer)["operation_id"] == op.operation_id
    assert _outputs(server, booking_call) == ["cancelled"]  # once it was true
    heard = server.function_outputs(cancel_call) + server.function_outputs(booking_call)
    assert not any('"cancelled": "' in text or "CANCELLED" in text for text in heard)
    assert any(e.actor == "model:call-1" for e in trail)
    assert agent.side_effects() == 0
    advertised = {
        tool.get("name")
        for event in server.received
        if event.get("type") == "session.update"
        for tool in event.get("session", {}).get("tools", [])
    }
    assert "cancel_book_or_cancel" in advertised


def _telling(server: FakeRealtimeServer, word: str, *, since: int = 0) -> list[Event]:
    """The items created (from ``received[since]`` on) whose text holds ``word``."""
    return [
        event["item"]
        for event in server.received[since:]
        if event.get("type") == "conversation.item.create" and word in json.dumps(event["item"])
    ]


async def _answered_after(server: FakeRealtimeServer, word: str, since: int) -> None:
    """Wait until the first item saying ``word`` (from ``since``) has a response after it."""

    def saying(event: Event) -> bool:
        item = event.get("item", {})
        return event.get("type") == "conversation.item.create" and word in json.dumps(item)

    told = await server.wait_for(saying, since=since)
    await server.wait_for(_type("response.create"), since=server.received.index(told))


@pytest.mark.parametrize("tool", ["book_in_background", "book_table"])
async def test_an_outcome_that_commits_while_the_websocket_is_down_is_told_once_after_the_reconnect(
    tmp_path: Path, tool: str
) -> None:
    # The result waits for the session; the reconnect sets the provider's conversation up
    # from the local context. The outcome reaches the new session once: not both as an item
    # and again inside the conversation the setup replays.
    async with openai_agent(tmp_path) as (agent, server):
        await server.call(tool, booking())
        await agent.at_the_provider()
        await server.drop()
        agent.commit()
        await agent.settled(tool, S.COMMITTED)
        reconnected_at = len(server.received)
        llm: Any = agent.llm
        await llm.reset_conversation()
        await until(lambda: server.connections == 2, what="the second connection")
        await agent.delivered(tool)
        await _answered_after(server, "committed", reconnected_at)
        told = _telling(server, "committed", since=reconnected_at)

    assert len(told) == 1, told
    assert told[0].get("role") != "user"
    assert agent.side_effects() == 1


@pytest.mark.parametrize("first_run", ["at_once", "not_yet"])
async def test_an_outcome_owed_to_the_next_pipeline_is_told_once_and_not_as_the_user(
    tmp_path: Path, first_run: str
) -> None:
    async with restaurant(tmp_path) as place:
        async with FakeRealtimeServer() as server:
            llm = OpenAIRealtimeLLMService(api_key="x", base_url=server.url)
            async with running_pipeline(place, llm) as agent:
                await server.wait_for(_type("response.create"))
                await server.call("book_in_background", booking())
                await agent.at_the_provider()
                await server.drop()
                agent.commit()
                op = await agent.settled("book_in_background", S.COMMITTED)
                await guarded(place.runtime.wait(op.operation_id), what="the outcome")

        async with FakeRealtimeServer() as again:
            llm = OpenAIRealtimeLLMService(api_key="x", base_url=again.url)
            async with running_pipeline(place, llm, run_first=first_run == "at_once") as second:
                # not_yet: the bot waits for its client before the first response (the
                # telling itself asks for one).
                await second.delivered("book_in_background")
                await _answered_after(again, "committed", 0)
                told = _telling(again, "committed")

    assert len(told) == 1, told
    (item,) = told
    assert item.get("type") == "function_call_output" or item.get("role") in ("system",), item
