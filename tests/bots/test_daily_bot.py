"""The Daily bot: its whole object graph builds offline, in order; a missing key is one line.

The graph is built with fake keys and a `DailyTransport` on a room that is never joined:
nothing connects until the worker runs. A network guard (``socket`` connects and DNS lookups
refused and recorded) checks that, in this process and in a fresh one where Pipecat's
import-time code runs too. It sees Python sockets only, not the native Daily client's.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from pipecat.audio.vad.silero import SileroVADAnalyzer
from pipecat.processors.aggregators.llm_response_universal import (
    LLMAssistantAggregator,
    LLMUserAggregator,
)
from pipecat.runner.types import DailyRunnerArguments
from pipecat.services.openai.llm import OpenAILLMService
from pipecat.services.openai.stt import OpenAISTTService
from pipecat.services.openai.tts import OpenAITTSService
from pipecat.transports.daily.transport import DailyInputTransport, DailyOutputTransport

from bots.daily_bot import RestaurantBot, SessionPrincipalAuthorizer, build_bot, make_transport
from bots.restaurant import new_system_of_record
from pipecat_actions import AuthorizationRequest
from pipecat_actions.adapters import ActionResultGate, ActionStatusReporter, ActionTurnTracker
from pipecat_actions.adapters.pipeline import check_placement
from pipecat_actions.policy import load_policy

ROOT = Path(__file__).resolve().parents[2]
BOT = ROOT / "bots" / "daily_bot.py"
POLICY = ROOT / "configs" / "restaurant.yaml"
KEYS = ("OPENAI_API_KEY", "DAILY_API_KEY", "DAILY_ROOM_URL")


@pytest.fixture
def no_network(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    attempts: list[str] = []

    def refuse(*args: Any, **kwargs: Any) -> Any:
        attempts.append(repr(args))
        raise OSError("network use during an offline build")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    yield attempts
    assert attempts == []


@pytest.fixture
async def built(tmp_path: Path, no_network: list[str]) -> AsyncIterator[RestaurantBot]:
    # The transport the runner's Daily route would give `bot`, on a room that is never joined.
    runner_args = DailyRunnerArguments(room_url="https://example.daily.co/room", session_id="s1")
    bot = await build_bot(
        await make_transport(runner_args),
        openai_api_key="sk-test",
        session_id=runner_args.session_id,
        policy=POLICY,
        ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
        system_of_record=new_system_of_record(),
    )
    yield bot
    await bot.close()


def test_the_processors_are_in_place_in_order(built: RestaurantBot) -> None:
    processors = built.pipeline.processors[1:-1]  # without the pipeline's source and sink
    assert [type(p) for p in processors] == [
        DailyInputTransport,
        OpenAISTTService,
        LLMUserAggregator,
        ActionTurnTracker,
        OpenAILLMService,
        ActionStatusReporter,
        OpenAITTSService,
        DailyOutputTransport,
        ActionResultGate,
        LLMAssistantAggregator,
    ]
    assert processors[0] is built.transport.input()
    assert processors[4] is built.llm
    assert processors[7] is built.transport.output()
    assert processors[8] is built.gate
    check_placement(built.pipeline.processors)


def test_the_llm_has_a_handler_for_every_tool_of_the_restaurant_policy(
    built: RestaurantBot,
) -> None:
    tools = load_policy(POLICY).names()
    assert set(tools) == {
        "search_availability",
        "book_table",
        "move_booking",
        "cancel_booking",
        "refund_deposit",
    }
    assert not built.llm.has_function("no_such_tool")  # no catch-all handler
    assert [name for name in tools if not built.llm.has_function(name)] == []
    # Verbal confirmations (move_booking, cancel_booking) are carried out by confirm_action.
    assert built.llm.has_function("confirm_action")
    advertised = {schema.name for schema in built.context.tools.standard_tools}
    assert advertised == {*tools, "confirm_action"}


def test_the_user_aggregator_detects_speech_with_silero(built: RestaurantBot) -> None:
    assert isinstance(built.vad_analyzer, SileroVADAnalyzer)
    (user_aggregator,) = [p for p in built.pipeline.processors if isinstance(p, LLMUserAggregator)]
    # Pipecat 1.14 keeps the analyzer in the aggregator's params and has no public accessor.
    assert user_aggregator._params.vad_analyzer is built.vad_analyzer


async def test_the_demo_authorizer_allows_the_session_principal_and_no_one_else(
    built: RestaurantBot,
) -> None:
    authorizer = SessionPrincipalAuthorizer(built.session.principal)

    def asking(principal: str) -> AuthorizationRequest:
        return AuthorizationRequest(
            principal=principal,
            tenant="default",
            session_id=built.session.session_id,
            tool="cancel_booking",
            kind="mutation",
            args={"booking_id": "bk_0001"},
            resource_key="booking:bk_0001",
        )

    assert (await authorizer.authorize(asking(built.session.principal))).allowed
    refused = await authorizer.authorize(asking("someone-else"))
    assert not refused.allowed
    assert refused.reason


async def test_the_operator_cli_lists_a_refund_waiting_in_the_running_bots_ledger(
    built: RestaurantBot, tmp_path: Path
) -> None:
    waiting = await built.runtime.propose(
        "refund_deposit", {"booking_id": "bk_0001", "amount": 2000}, built.session
    )
    assert waiting["status"] == "awaiting_approval"
    cli = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).parent / "pipecat-actions"),
        *("approvals", "list", "--json", "--ledger", f"sqlite:///{tmp_path / 'ledger.db'}"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(cli.communicate(), timeout=60)
    assert cli.returncode == 0, err.decode()[-2000:]
    (listed,) = json.loads(out)
    assert listed["operation_id"] == waiting["operation_id"]
    assert (listed["tool"], listed["principal"]) == ("refund_deposit", built.session.principal)


COLD_BUILD = """
import asyncio, json, socket, sys

attempts = []

def refuse(*args, **kwargs):
    attempts.append(repr(args))
    raise OSError("network use during an offline build")

socket.socket.connect = socket.socket.connect_ex = socket.getaddrinfo = refuse
sys.path.insert(0, sys.argv[1])

from pipecat.transports.daily.transport import DailyParams, DailyTransport

from bots.daily_bot import build_bot

async def main():
    transport = DailyTransport(
        "https://example.daily.co/room", None, "demo-bot",
        params=DailyParams(audio_in_enabled=True, audio_out_enabled=True),
    )
    bot = await build_bot(transport, openai_api_key="sk-test", ledger_url=sys.argv[2],
                          policy=sys.argv[3])
    await bot.close()
    return [type(p).__name__ for p in bot.pipeline.processors]

processors = asyncio.run(main())
print(json.dumps({"attempts": attempts, "processors": processors}))
"""


def test_a_fresh_process_builds_the_bot_without_opening_a_connection(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            COLD_BUILD,
            str(ROOT),
            f"sqlite:///{tmp_path / 'ledger.db'}",
            str(POLICY),
        ],
        cwd=tmp_path,
        env=_env_without_keys(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["attempts"] == []
    assert "ActionResultGate" in report["processors"]


@pytest.mark.parametrize(
    ("args", "given", "named", "not_named"),
    [
        (["-t", "daily"], {}, ["OPENAI_API_KEY", "DAILY_API_KEY"], []),
        (["-t", "daily"], {"OPENAI_API_KEY": "sk-test"}, ["DAILY_API_KEY"], ["OPENAI_API_KEY"]),
        (["-d"], {"OPENAI_API_KEY": "sk-test"}, ["DAILY_API_KEY"], ["OPENAI_API_KEY"]),
        (["-t", "webrtc"], {}, ["OPENAI_API_KEY"], ["DAILY_API_KEY"]),
    ],
)
def test_a_missing_key_is_one_line_naming_it_and_a_non_zero_exit(
    tmp_path: Path,
    args: list[str],
    given: dict[str, str],
    named: list[str],
    not_named: list[str],
) -> None:
    done = subprocess.run(
        [sys.executable, str(BOT), *args],
        cwd=tmp_path,  # no .env here
        env={**_env_without_keys(), **given},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("daily_bot: set ")
    for key in named:
        assert key in lines[0]
    for key in not_named:
        assert key not in lines[0]


def _env_without_keys() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in KEYS}


@pytest.mark.parametrize(
    ("kind", "service"),
    [("openai", "OpenAIRealtimeLLMService"), ("gemini", "GeminiLiveLLMService")],
)
async def test_a_realtime_bot_has_the_speech_to_speech_layout_and_the_services_adapter(
    tmp_path: Path, no_network: list[str], kind: str, service: str
) -> None:
    from pipecat_actions.adapters.realtime import adapter_of

    runner_args = DailyRunnerArguments(room_url="https://example.daily.co/room", session_id="s1")
    bot = await build_bot(
        await make_transport(runner_args),
        openai_api_key="sk-test",
        google_api_key="g-test",
        realtime=kind,
        session_id=runner_args.session_id,
        policy=POLICY,
        ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
        system_of_record=new_system_of_record(),
    )
    try:
        processors = bot.pipeline.processors[1:-1]
        assert [type(p).__name__ for p in processors] == [
            "DailyInputTransport",
            "LLMUserAggregator",
            "ActionTurnTracker",
            service,
            "ActionStatusReporter",
            "DailyOutputTransport",
            "ActionResultGate",
            "LLMAssistantAggregator",
        ]
        adapter = adapter_of(bot.llm)
        assert adapter is not None and bot.gate.speaker is adapter
        check_placement(bot.pipeline.processors)
    finally:
        await bot.close()


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"REALTIME": "gemini"}, "GOOGLE_API_KEY"),
        ({"REALTIME": "openai"}, "OPENAI_API_KEY"),
        ({"REALTIME": "nova"}, "REALTIME must be one of openai, gemini"),
    ],
)
def test_a_realtime_bot_names_the_key_it_needs(env: dict[str, str], named: str) -> None:
    from bots.daily_bot import missing_settings

    problem = missing_settings(["-t", "webrtc"], env)
    assert problem is not None and named in problem
    assert "\n" not in problem
