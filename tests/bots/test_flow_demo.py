"""The reservation flow: `make demo FLOW=1` end to end, and the Daily bot's flow graph offline.

The demo's outcomes are checked in what it reports (its JSON line: nodes, ledger, bookings),
not only in its exit code. The Daily bot's flow graph is built with fake keys and a
`DailyTransport` on a room that is never joined, with Python's network refused.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from pipecat.flows import FlowConfig
from pipecat.processors.aggregators.llm_response_universal import (
    LLMAssistantAggregator,
    LLMUserAggregator,
)
from pipecat.runner.types import DailyRunnerArguments
from pipecat.services.openai.llm import OpenAILLMService
from pipecat.services.openai.stt import OpenAISTTService
from pipecat.services.openai.tts import OpenAITTSService
from pipecat.transports.daily.transport import DailyInputTransport, DailyOutputTransport

from bots.daily_bot import (
    FLOW_POLICY,
    RestaurantBot,
    _check_setup,
    build_bot,
    make_transport,
    missing_settings,
    policy_path,
)
from bots.restaurant import new_system_of_record
from bots.restaurant_flow import FLOW_CONFIG
from pipecat_actions.adapters import ActionResultGate, ActionStatusReporter, ActionTurnTracker
from pipecat_actions.adapters.pipeline import check_placement
from pipecat_actions.errors import ConfigurationError
from pipecat_actions.policy import load_policy
from tests.bots._commands import check_operator_commands

ROOT = Path(__file__).resolve().parents[2]
NODES = {"greet", "collect", "book", "confirm", "checking", "try_again"}

# --- the offline demo ----------------------------------------------------------------------


@pytest.mark.timeout(240)
def test_the_flow_demo_reaches_confirm_once_the_booking_commits_with_one_booking(
    tmp_path: Path,
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PIPECAT_ACTIONS_LEDGER_URL"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "bots.flow_demo", "--json"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    outcome = json.loads(done.stdout.strip().splitlines()[-1])

    # The flow went the whole way, on the truth: book was left only when the booking
    # committed (the barge-in's "running" kept it there), and confirm came last.
    assert outcome["nodes"] == ["greet", "collect", "book", "confirm"]
    assert outcome["checks"] and all(outcome["checks"].values()), outcome["checks"]
    bookings = [o for o in outcome["operations"] if o["tool"] == "book_table"]
    assert [o["status"] for o in bookings] == ["COMMITTED"]  # the duplicate joined it
    assert outcome["bookings"] == 1
    details = [o for o in outcome["operations"] if o["tool"] == "collect_details"]
    assert [o["status"] for o in details] == ["COMMITTED"]

    printed = done.stdout
    for section in ("TRANSCRIPT", "NODES VISITED", "LEDGER", "RESTAURANT"):
        assert section in printed
    assert "CHECK OK" in printed
    assert "a duplicate call joined it" in printed
    assert "Are you still there?" in printed
    assert (tmp_path / ".pipecat_actions" / "flow_demo.db").exists()
    check_operator_commands(tmp_path, printed, "flow_demo.db", outcome["operations"])


# --- the config and its policy -------------------------------------------------------------


def test_the_flow_policy_covers_every_function_of_the_flow_that_runs_code() -> None:
    config = FlowConfig.from_file(FLOW_CONFIG)
    assert set(config.nodes) == NODES
    functions = [f for node in config.nodes.values() for f in node.functions]
    managed = {f.name for f in functions if not f.transition_only}
    assert managed == {"collect_details", "book_table"}
    policy = load_policy(FLOW_POLICY)
    assert set(policy.names()) == managed
    assert policy["collect_details"].kind.value == "read"
    book = policy["book_table"]
    assert (book.kind.value, book.mode.value, book.on_interruption.value) == (
        "mutation",
        "blocking",
        "continue",
    )
    assert book.idempotency.provider_dedupes
    (branch,) = [f.transition_to for f in functions if f.name == "book_table"]
    assert isinstance(branch, FlowConfig.Branch) and branch.field == "status"
    assert branch.cases["committed"] == "confirm"
    assert branch.cases["unknown"] == "checking"
    assert {branch.cases[s] for s in ("refused", "rejected", "failed_final")} == {"try_again"}
    assert "running" not in branch.cases and branch.default is None  # running: stay in book

    done = subprocess.run(
        [str(Path(sys.executable).parent / "pipecat-actions"), "policy", "check", str(FLOW_POLICY)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


# --- the Daily bot with FLOW=1 -------------------------------------------------------------


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
async def flow_bot(tmp_path: Path, no_network: list[str]) -> AsyncIterator[RestaurantBot]:
    runner_args = DailyRunnerArguments(room_url="https://example.daily.co/room", session_id="s1")
    bot = await build_bot(
        await make_transport(runner_args),
        openai_api_key="sk-test",
        session_id=runner_args.session_id,
        flow=True,
        ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
        system_of_record=new_system_of_record(),
    )
    yield bot
    await bot.close()


def test_the_flow_bot_has_the_cascade_layout_around_the_flow_managers_aggregators(
    flow_bot: RestaurantBot,
) -> None:
    processors = flow_bot.pipeline.processors[1:-1]  # without the pipeline's source and sink
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
    check_placement(flow_bot.pipeline.processors)
    assert processors[8] is flow_bot.gate
    manager = flow_bot.flow_manager
    assert manager is not None and flow_bot.flow is not None and flow_bot.flow_actions is not None
    # The manager drives the very aggregators in the pipeline, on the bot's context.
    assert processors[2].context is flow_bot.context
    flow_bot.context.add_message({"role": "user", "content": "hello"})
    assert manager.get_current_context()[-1]["content"] == "hello"
    # Not started until the caller connects, and already routed: a second attach is refused.
    assert manager.current_node is None
    with pytest.raises(ConfigurationError, match="already attached"):
        flow_bot.flow_actions.attach(manager, flow_bot.gate)
    assert {"restaurant", "today"} <= set(manager.state)
    # The flow's functions are registered node by node, later than the worker's RTVI
    # observer is made: Pipecat's own reports (a cancel told as cancelled) are off for them.
    from pipecat.processors.frameworks.rtvi.observer import RTVIFunctionCallReportLevel

    from pipecat_actions.adapters import rtvi_observer_params

    levels = rtvi_observer_params(flow_bot.runtime).function_call_report_level
    assert levels["book_table"] is RTVIFunctionCallReportLevel.DISABLED
    assert levels["collect_details"] is RTVIFunctionCallReportLevel.DISABLED


async def test_the_flow_bot_routes_each_nodes_functions_through_the_runtime(
    flow_bot: RestaurantBot,
) -> None:
    manager, flow = flow_bot.flow_manager, flow_bot.flow
    assert manager is not None and flow is not None
    await manager.initialize(flow.initial_node)  # queued for the worker, which never runs
    assert manager.current_node == "greet"
    assert "book_table" not in flow_bot.runtime.bindings  # registered node by node
    manager.state["details"] = {
        "restaurant_id": "trattoria",
        "date": "2030-05-01",
        "time": "21:00",
        "party_size": 2,
        "guest_name": "Alice",
    }
    for node in ("collect", "book"):
        await manager.set_node_from_config(flow.node(node))
    assert manager.current_node == "book"
    assert {"collect_details", "book_table"} <= set(flow_bot.runtime.bindings)
    assert "wants_table" not in flow_bot.runtime.bindings  # transition_only: left to Flows


def test_flow_picks_the_flows_policy_and_refuses_a_realtime_service() -> None:
    assert policy_path({"FLOW": "1"}) == FLOW_POLICY
    assert policy_path({"FLOW": "1", "POLICY": "other.yaml"}) == Path("other.yaml")
    assert policy_path({"FLOW": "0"}) != FLOW_POLICY
    problem = missing_settings(["-t", "webrtc"], {"FLOW": "1", "REALTIME": "openai"})
    assert problem is not None and "FLOW=1" in problem and "\n" not in problem
    assert missing_settings(["-t", "webrtc"], {"FLOW": "1", "OPENAI_API_KEY": "sk"}) is None


async def test_the_start_up_check_names_a_flow_function_the_policy_lacks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIPECAT_ACTIONS_LEDGER_URL", f"sqlite:///{tmp_path / 'ledger.db'}")
    await _check_setup(FLOW_POLICY, flow=True)  # the shipped pair is complete
    lacking = tmp_path / "policy.yaml"
    lacking.write_text("version: 1\ntools:\n  collect_details:\n    kind: read\n", encoding="utf-8")
    with pytest.raises(ConfigurationError, match="book_table"):
        await _check_setup(lacking, flow=True)
