"""The restaurant booking agent as a voice bot in a Daily room, started by Pipecat's runner.

::

    make bot                                   # = .venv/bin/python bots/daily_bot.py -t daily
    make bot REALTIME=openai                   # OpenAI Realtime, speech to speech
    make bot REALTIME=gemini                   # Gemini Live, speech to speech
    make bot FLOW=1                            # the reservation as a Pipecat Flows conversation
    .venv/bin/python bots/daily_bot.py -t webrtc   # a local page, http://localhost:7860/client

Pipecat's development runner serves http://localhost:7860; for ``-t daily`` open
http://localhost:7860/daily (or POST ``/start``): the runner creates a Daily room and a token,
starts `bot` for that session, and sends the browser to the room. The runner needs Pipecat's
``runner`` extra (and ``webrtc`` for ``-t webrtc``); the bot names the missing one.

Pipeline (`pipecat_actions.adapters.pipeline.build_pipeline`)::

    transport.input → OpenAI STT → user aggregator (Silero VAD) → ActionTurnTracker
        → OpenAI LLM → ActionStatusReporter → OpenAI TTS → transport.output → ActionResultGate
        → assistant aggregator

With ``REALTIME=openai`` or ``REALTIME=gemini`` a speech-to-speech service replaces STT, LLM
and TTS, with its realtime adapter (`pipecat_actions.adapters.realtime`)::

    transport.input → user aggregator (Silero VAD) → ActionTurnTracker → OpenAI Realtime or
        Gemini Live → ActionStatusReporter → transport.output → ActionResultGate
        → assistant aggregator

With ``FLOW=1`` the conversation is the Pipecat Flows reservation of
``configs/flows/restaurant.yaml`` (greet → collect → book → confirm, with ``checking`` and
``try_again``), under ``configs/restaurant_flow_policy.yaml``: a `FlowManager` on the same
cascade pipeline (`build_pipeline` with the manager's aggregator pair), its functions routed
through the runtime by `pipecat_actions.adapters.flows.FlowActions`, so the flow moves on
the runtime's truthful status (``bots.restaurant_flow``; the offline version is
``make demo FLOW=1``). The flow runs on the cascade only: ``FLOW=1`` with ``REALTIME`` is refused.

An RTVI client (Pipecat's web client on ``-t webrtc``) gets ``action-status`` server messages
for the bot's tools, never ``llm-function-call-stopped {cancelled: true}`` for a booking that
goes on (`pipecat_actions.adapters.status_reporter`).

Environment (a ``.env`` file in the working directory is read too, as Pipecat's runner does):

* ``OPENAI_API_KEY``, required: the LLM, speech-to-text and text-to-speech (with
  ``REALTIME=openai``: OpenAI Realtime).
* ``REALTIME``, optional: ``openai`` (OpenAI Realtime) or ``gemini`` (Gemini Live, which needs
  ``GOOGLE_API_KEY`` instead of ``OPENAI_API_KEY``).
* ``DAILY_API_KEY``, required for ``-t daily``: Pipecat's runner creates the room and the
  bot's meeting token with it (https://dashboard.daily.co/developers).
* ``DAILY_ROOM_URL``, optional: join this room instead of creating one (the runner still
  needs ``DAILY_API_KEY`` to mint the token).
* ``FLOW``, optional: ``1`` runs the Pipecat Flows reservation (see above).
* ``POLICY``, optional: the tool policies (default ``configs/restaurant.yaml``; with ``FLOW=1``
  ``configs/restaurant_flow_policy.yaml``).
* ``PIPECAT_ACTIONS_LEDGER_URL``, optional: the action ledger (default: SQLite at
  ``./.pipecat_actions/ledger.db``; ``postgresql://...`` to share it between processes).
* ``RESTAURANT_URL``, optional: a restaurant service already running (see below); unset, the
  bot starts its own.

A missing key is reported in one line and the bot exits with status 2 before anything starts.

The operator works on the same ledger while the bot runs (``pipecat-actions`` is in
``.venv/bin``). A refund waits for a manager::

    pipecat-actions users add rosa --role manager --tenant default --users ops/users  # once
    pipecat-actions console --ledger URL --users ops/users            # in a browser, or:
    pipecat-actions approvals list --ledger URL
    pipecat-actions approvals show OPERATION_ID --ledger URL
    pipecat-actions approvals approve OPERATION_ID --approver rosa --reason ok
        --args-hash HASH --users ops/users --ledger URL    # (one command line)

``URL`` is printed at start-up; with the defaults it is the ``sqlite:///`` path of
``.pipecat_actions/ledger.db`` under the directory the bot was started from. While the call
lasts, its runtime picks an approval up within a third of its lease (10 s) and runs it; after
the call, the next session's runtime recovers it once the lease has expired.

Who the caller is: this demo has no sign-in, so every session acts for `DEMO_PRINCIPAL`, and
`SessionPrincipalAuthorizer` allows exactly that principal. A real deployment authenticates
the caller, sets ``SessionState.principal`` from that, and supplies its own `Authorizer`
(e.g. "is booking bk_0001 this caller's?"); it never takes identity from tool arguments.

The restaurant is a real server: `main` starts `bots.restaurant_service` as a child process on
127.0.0.1 (a free port), with its database at ``./.pipecat_actions/restaurant.db``, so bookings
outlive a call and the bot process the way a real booking system's do, and stops it when the
bot ends (Ctrl-C, an error, or the bot's own death: the child watches a pipe to it). Each
session reaches it through `bots.restaurant_api`, the HTTP adapter (``$RESTAURANT_URL``). The
Flows reservation (``FLOW=1``) and a bot built without ``restaurant_url`` (the offline tests)
use the in-memory `FakeSystemOfRecord` of `bots.restaurant` instead. Each session has its own
`ActionRuntime` on the shared ledger; when the caller leaves, running operations get five
seconds to finish and are otherwise left to recovery.

`build_bot` builds the whole object graph for a transport without touching the network, so a
test can check it; `bot` is what Pipecat's runner calls.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import importlib.util
import os
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipecat_actions import (
    ActionRuntime,
    AuthorizationRequest,
    Decision,
    SessionState,
)

# Pipecat is imported inside the functions that need it: importing it logs a banner, and a
# missing key must be reported in one line before anything else is printed.
if TYPE_CHECKING:
    from pipecat.audio.vad.silero import SileroVADAnalyzer
    from pipecat.flows import Flow, FlowManager
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineWorker
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
    from pipecat.runner.types import RunnerArguments
    from pipecat.services.llm_service import LLMService
    from pipecat.transports.base_transport import BaseTransport

    from bots.restaurant_api import RestaurantAPI
    from bots.restaurant_service.process import RestaurantProcess
    from pipecat_actions.adapters import ActionResultGate
    from pipecat_actions.adapters.flows import FlowActions
    from pipecat_actions.testing import FakeSystemOfRecord

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_POLICY = ROOT / "configs" / "restaurant.yaml"
FLOW_POLICY = ROOT / "configs" / "restaurant_flow_policy.yaml"
DEMO_PRINCIPAL = "demo-caller"
"""The principal every session of this demo acts for (there is no sign-in)."""

INSTRUCTIONS = """\
You are the phone voice of {restaurant}, an Italian restaurant. Everything you write is spoken \
aloud: answer in one or two short sentences, without lists, markdown or emoji.

Today is {today}. Dates are YYYY-MM-DD; tables are booked on the hour or half hour from 12:00 \
to 22:30 (HH:MM); the restaurant id for every tool is "{restaurant}".

Use the tools to look up free tables, book, move or cancel a booking, and refund a deposit. \
Say only what a tool result says happened: never claim a booking, move, cancellation or \
refund that no result confirmed. If a result says the outcome is unknown, pending, waiting \
for approval or refused, say exactly that, in plain words. When a result asks for the \
caller's confirmation, read the question to them and call confirm_action with its \
operation_id and confirmation_token only after they say yes.

Start by greeting the caller and asking how you can help."""


class SessionPrincipalAuthorizer:
    """Allows the calls made for one principal and refuses every other. For this demo only.

    The runtime asks it before admission, before every retry and before recovery runs an
    operation again. A real deployment supplies its own `Authorizer`, which checks what the
    signed-in caller may do with the ids in the arguments (their booking, their deposit).

    Args:
        principal: The principal this bot's sessions act for.
    """

    def __init__(self, principal: str) -> None:
        self.principal = principal

    async def authorize(self, request: AuthorizationRequest) -> Decision:
        """Allow `principal`; refuse anyone else."""
        if request.principal == self.principal:
            return Decision.allow()
        return Decision.deny("this line only acts for the caller it was started for")


@dataclass
class RestaurantBot:
    """The object graph of one bot session, built by `build_bot`.

    Attributes:
        transport: The transport the pipeline starts and ends with.
        worker: Runs the pipeline (``WorkerRunner.add_workers(worker)``).
        pipeline: The pipeline, in order (see the module docstring).
        runtime: The session's action runtime; `close` stops it.
        session: The session state (its principal is who the actions are for).
        gate: The result gate, for handoffs.
        llm: The OpenAI LLM service, with a handler per action.
        context: The conversation context, with the actions' tool schemas.
        vad_analyzer: The voice activity detector of the user aggregator.
        system_of_record: The in-memory restaurant (a fake), when the bot does not call the
            restaurant service; the flow's functions use it too.
        restaurant: The restaurant service's client, when the actions call it over HTTP.
        flow: With ``flow=True``: the configured reservation flow (its nodes and functions).
        flow_manager: With ``flow=True``: the `FlowManager` on ``worker``, attached to
            ``flow_actions``; it is initialized with the flow's first node when the caller
            connects.
        flow_actions: With ``flow=True``: routes the flow's functions through ``runtime``.
    """

    transport: BaseTransport
    worker: PipelineWorker
    pipeline: Pipeline
    runtime: ActionRuntime
    session: SessionState
    gate: ActionResultGate
    llm: LLMService
    context: LLMContext
    vad_analyzer: SileroVADAnalyzer
    system_of_record: FakeSystemOfRecord
    restaurant: RestaurantAPI | None = None
    flow: Flow | None = None
    flow_manager: FlowManager | None = None
    flow_actions: FlowActions | None = None

    async def close(self) -> None:
        """Stop the runtime: running operations get a grace period, then recovery."""
        try:
            await self.runtime.close()
        finally:
            if self.restaurant is not None:
                await self.restaurant.aclose()


def flow_enabled(env: Mapping[str, str] = os.environ) -> bool:
    """Whether ``$FLOW`` asks for the Pipecat Flows reservation (``1``, ``true``, ``yes``)."""
    return env.get("FLOW", "").strip().lower() in ("1", "true", "yes", "on")


def policy_path(env: Mapping[str, str] = os.environ) -> Path:
    """Return the policy file: ``$POLICY``, else the restaurant's (or the flow's) default."""
    if env.get("POLICY"):
        return Path(env["POLICY"])
    return FLOW_POLICY if flow_enabled(env) else DEFAULT_POLICY


@cache
def shared_system_of_record() -> FakeSystemOfRecord:
    """Return this process's restaurant system, created on first use."""
    from bots.restaurant import new_system_of_record

    return new_system_of_record()


async def build_bot(
    transport: BaseTransport,
    *,
    openai_api_key: str,
    session_id: str | None = None,
    principal: str = DEMO_PRINCIPAL,
    policy: str | os.PathLike[str] | None = None,
    ledger_url: str | None = None,
    system_of_record: FakeSystemOfRecord | None = None,
    restaurant_url: str | None = None,
    today: datetime.date | None = None,
    idle_timeout_secs: float | None = 300.0,
    realtime: str | None = None,
    google_api_key: str = "",
    flow: bool = False,
) -> RestaurantBot:
    """Build one session's bot on ``transport``; nothing touches the network until it runs.

    Opens the ledger (a SQLite file by default; a PostgreSQL ledger is a connection) and
    recovers operations whose owner died.

    Args:
        transport: The Pipecat transport (Daily, SmallWebRTC, ...).
        openai_api_key: The OpenAI key for the LLM, STT and TTS.
        session_id: The conversation's id (default: a new one).
        principal: Who the actions are for; see `SessionPrincipalAuthorizer`.
        policy: The policy file (default: `policy_path`).
        ledger_url: The ledger (default: ``$PIPECAT_ACTIONS_LEDGER_URL``, else SQLite).
        system_of_record: The in-memory restaurant (default: `shared_system_of_record`), used
            when ``restaurant_url`` is None, and by the flow.
        restaurant_url: The restaurant service (`bots.restaurant_service`) the actions call
            over HTTP; None: the in-memory restaurant.
        today: The date the model is told it is (default: today).
        idle_timeout_secs: End the session after this long without speech (None: never).
        realtime: ``openai`` or ``gemini`` for a speech-to-speech service (no STT, no TTS);
            None for the cascade.
        google_api_key: The Google key, for ``realtime="gemini"``.
        flow: Run the Pipecat Flows reservation (``configs/flows/restaurant.yaml``) instead of
            the free conversation; ``policy`` then defaults to the flow's policy. Cascade only.

    Returns:
        The session's graph; the caller runs ``worker`` and then calls ``close``.
    """
    from pipecat.audio.vad.silero import SileroVADAnalyzer
    from pipecat.frames.frames import LLMRunFrame
    from pipecat.pipeline.worker import PipelineParams, PipelineWorker
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.processors.aggregators.llm_response_universal import LLMUserAggregatorParams
    from pipecat.services.openai.llm import OpenAILLMService
    from pipecat.services.openai.stt import OpenAISTTService
    from pipecat.services.openai.tts import OpenAITTSService

    from bots.restaurant import RESTAURANT, build_actions
    from bots.restaurant_flow import flow_tools
    from pipecat_actions.adapters import rtvi_observer_params
    from pipecat_actions.adapters.pipeline import build_pipeline

    if flow and realtime is not None:
        raise ValueError("the flow runs on the cascade only: give flow=True or realtime, not both")
    sor = system_of_record if system_of_record is not None else shared_system_of_record()
    if policy is None:
        policy = FLOW_POLICY if flow else policy_path()
    restaurant: RestaurantAPI | None = None
    if flow:
        actions = []  # the flow's functions are registered by FlowActions, node by node
    elif restaurant_url is not None:
        from bots.restaurant_api import RestaurantAPI
        from bots.restaurant_api import build_actions as http_actions

        restaurant = RestaurantAPI(restaurant_url)  # no connection until the first call
        actions = http_actions(restaurant)
    else:
        actions = build_actions(sor)
    try:
        runtime = await ActionRuntime.create(
            policy,
            authorizer=SessionPrincipalAuthorizer(principal),
            actions=actions,
            routed=flow_tools() if flow else (),
            ledger_url=ledger_url,
        )
    except BaseException:
        if restaurant is not None:
            await restaurant.aclose()
        raise
    try:
        session = SessionState(session_id=session_id or str(uuid.uuid4()), principal=principal)
        day = today or datetime.date.today()
        instructions = INSTRUCTIONS.format(restaurant=RESTAURANT, today=day.isoformat())
        llm: LLMService
        stt: OpenAISTTService | None = None
        tts: OpenAITTSService | None = None
        if flow:
            # The flow's nodes set the system instruction (role_message) and the tools.
            llm = OpenAILLMService(api_key=openai_api_key)
            stt = OpenAISTTService(api_key=openai_api_key)
            tts = OpenAITTSService(api_key=openai_api_key)
        elif realtime is None:
            llm = OpenAILLMService(
                api_key=openai_api_key,
                settings=OpenAILLMService.Settings(system_instruction=instructions),
            )
            stt = OpenAISTTService(api_key=openai_api_key)
            tts = OpenAITTSService(api_key=openai_api_key)
        else:
            llm = realtime_service(
                realtime, instructions, openai_api_key=openai_api_key, google_api_key=google_api_key
            )
        vad = SileroVADAnalyzer()
        user_params = LLMUserAggregatorParams(vad_analyzer=vad)
        pair: LLMContextAggregatorPair | None = None
        if flow:
            # FlowManager needs the aggregator pair; build_pipeline places this one.
            from pipecat.processors.aggregators.llm_response_universal import (
                LLMContextAggregatorPair,
            )

            context = LLMContext(messages=[])  # each node sets its tools
            pair = LLMContextAggregatorPair(context, user_params=user_params)
        else:
            from pipecat_actions import tools_schema  # imports Pipecat: not before the keys

            context = LLMContext(messages=[], tools=tools_schema(runtime))
        pipeline, gate = build_pipeline(
            runtime=runtime,
            session=session,
            llm=llm,
            context=context,
            stt=stt,
            tts=tts,
            transport=transport,
            user_params=None if pair is not None else user_params,  # the pair has them
            context_aggregator=pair,
        )
        worker = PipelineWorker(
            pipeline,
            params=PipelineParams(enable_metrics=True, enable_usage_metrics=True),
            conversation_id=session.session_id,
            idle_timeout_secs=idle_timeout_secs,
            rtvi_observer_params=rtvi_observer_params(runtime),
        )
        flow_parts = _attach_flow(runtime, session, sor, worker, llm, pair, gate, transport, day)
    except BaseException:
        await runtime.close()
        if restaurant is not None:
            await restaurant.aclose()
        raise
    the_flow, flow_manager, flow_actions = flow_parts or (None, None, None)

    @transport.event_handler("on_client_connected")
    async def on_client_connected(transport: BaseTransport, client: Any) -> None:
        if flow_manager is not None and the_flow is not None:
            await flow_manager.initialize(the_flow.initial_node)  # its first node speaks
        else:
            await worker.queue_frames([LLMRunFrame()])

    @transport.event_handler("on_client_disconnected")
    async def on_client_disconnected(transport: BaseTransport, client: Any) -> None:
        await worker.cancel()

    return RestaurantBot(
        transport=transport,
        worker=worker,
        pipeline=pipeline,
        runtime=runtime,
        session=session,
        gate=gate,
        llm=llm,
        context=context,
        vad_analyzer=vad,
        system_of_record=sor,
        restaurant=restaurant,
        flow=the_flow,
        flow_manager=flow_manager,
        flow_actions=flow_actions,
    )


def _attach_flow(
    runtime: ActionRuntime,
    session: SessionState,
    sor: FakeSystemOfRecord,
    worker: PipelineWorker,
    llm: LLMService,
    pair: Any,
    gate: ActionResultGate,
    transport: BaseTransport,
    today: datetime.date,
) -> tuple[Flow, FlowManager, FlowActions] | None:
    """The flow's manager on ``worker``, its functions routed through ``runtime`` (or None)."""
    if pair is None:
        return None
    from pipecat.flows import FlowManager

    from bots.restaurant_flow import flow_state, restaurant_flow

    actions, flow = restaurant_flow(runtime, session, sor)
    manager = FlowManager(
        worker=worker,
        llm=llm,
        context_aggregator=pair,
        transport=transport,
        global_functions=flow.global_functions,
    )
    actions.attach(manager, gate)
    manager.state.update(flow_state(today))
    return flow, manager, actions


REALTIME_SERVICES = ("openai", "gemini")


def realtime_service(
    kind: str, instructions: str, *, openai_api_key: str = "", google_api_key: str = ""
) -> LLMService:
    """The speech-to-speech service ``kind`` (``openai`` or ``gemini``), told ``instructions``."""
    if kind == "openai":
        from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService

        return OpenAIRealtimeLLMService(
            api_key=openai_api_key,
            settings=OpenAIRealtimeLLMService.Settings(system_instruction=instructions),
        )
    if kind == "gemini":
        from pipecat.services.google.gemini_live.llm import GeminiLiveLLMService

        return GeminiLiveLLMService(
            api_key=google_api_key,
            settings=GeminiLiveLLMService.Settings(system_instruction=instructions),
        )
    raise ValueError(f"REALTIME must be one of {', '.join(REALTIME_SERVICES)}, not {kind!r}")


async def make_transport(runner_args: RunnerArguments) -> BaseTransport:
    """Return the transport the runner opened the session on (Daily or WebRTC), audio only."""
    from pipecat.runner.utils import create_transport
    from pipecat.transports.base_transport import TransportParams
    from pipecat.transports.daily.transport import DailyParams

    return await create_transport(
        runner_args,
        {
            "daily": lambda: DailyParams(audio_in_enabled=True, audio_out_enabled=True),
            "webrtc": lambda: TransportParams(audio_in_enabled=True, audio_out_enabled=True),
        },
    )


async def bot(runner_args: RunnerArguments) -> None:
    """Run one session; Pipecat's runner calls it for every room or connection it opens."""
    from pipecat.workers.runner import WorkerRunner

    built = await build_bot(
        await make_transport(runner_args),
        openai_api_key=os.environ.get("OPENAI_API_KEY", ""),
        google_api_key=os.environ.get("GOOGLE_API_KEY", ""),
        realtime=os.environ.get("REALTIME") or None,
        flow=flow_enabled(),
        restaurant_url=os.environ.get("RESTAURANT_URL") or None,
        session_id=runner_args.session_id,
        idle_timeout_secs=runner_args.pipeline_idle_timeout_secs,
    )
    try:
        runner = WorkerRunner(
            handle_sigint=runner_args.handle_sigint, handle_sigterm=runner_args.handle_sigterm
        )
        await runner.add_workers(built.worker)
        await runner.run()
    finally:
        await built.close()


# --- start-up ------------------------------------------------------------------------------


def missing_settings(argv: Sequence[str], env: Mapping[str, str]) -> str | None:
    """Return the one line saying which keys to set for these runner arguments, or None."""
    transport = _transport(argv)
    realtime = env.get("REALTIME") or None
    if realtime is not None and realtime not in REALTIME_SERVICES:
        return (
            f"daily_bot: REALTIME must be one of {', '.join(REALTIME_SERVICES)}, not {realtime!r}"
        )
    if realtime is not None and flow_enabled(env):
        return "daily_bot: FLOW=1 runs the cascade (OpenAI LLM, STT and TTS): leave REALTIME unset"
    wanted = {
        None: {"OPENAI_API_KEY": "the LLM, speech-to-text and text-to-speech"},
        "openai": {"OPENAI_API_KEY": "OpenAI Realtime"},
        "gemini": {"GOOGLE_API_KEY": "Gemini Live"},
    }[realtime]
    if transport == "daily":
        wanted["DAILY_API_KEY"] = (
            "Pipecat's runner creates the Daily room and the bot's token with it; "
            "https://dashboard.daily.co/developers"
        )
    missing = [f"{name} ({why})" for name, why in wanted.items() if not env.get(name)]
    if not missing:
        return None
    return f"daily_bot: set {' and '.join(missing)}, in the environment or in ./.env"


def missing_packages(argv: Sequence[str]) -> str | None:
    """Return the one line saying which Pipecat extras to install, or None."""
    transport = _transport(argv)
    extras = {"runner": ("fastapi", "uvicorn", "pipecat_ai_prebuilt")}
    if transport == "webrtc":
        extras["webrtc"] = ("aiortc",)
    absent = [
        extra
        for extra, modules in extras.items()
        if any(importlib.util.find_spec(m) is None for m in modules)
    ]
    if not absent:
        return None
    names = " and ".join(absent) + (" extras are" if len(absent) > 1 else " extra is")
    return (
        f"daily_bot: Pipecat's {names} not installed: run "
        f"{sys.executable} -m pip install 'pipecat-ai[{','.join(absent)}]==1.14.0'"
    )


def _transport(argv: Sequence[str]) -> str | None:
    # Only the runner's -t/--transport and -d/--direct matter here; it parses the rest.
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("-t", "--transport")
    parser.add_argument("-d", "--direct", action="store_true")
    known, _ = parser.parse_known_args(argv)
    return "daily" if known.direct else known.transport


async def _check_setup(policy: Path, *, flow: bool = False) -> None:
    # Open a runtime once, recovering nothing: the policy, the actions it must cover (with
    # FLOW=1: the flow's functions) and the ledger all fail here, in one line, rather than
    # when the first caller arrives.
    from bots.restaurant import build_actions, new_system_of_record
    from bots.restaurant_flow import flow_tools

    sor = new_system_of_record()
    runtime = await ActionRuntime.create(
        policy,
        authorizer=SessionPrincipalAuthorizer(DEMO_PRINCIPAL),
        actions=[] if flow else build_actions(sor),
        routed=flow_tools() if flow else (),
        recover=False,
    )
    try:
        if flow:
            from pipecat.flows import FlowError

            from bots.restaurant_flow import FLOW_CONFIG, restaurant_flow
            from pipecat_actions.errors import ConfigurationError

            session = SessionState(session_id="setup-check", principal=DEMO_PRINCIPAL)
            try:
                restaurant_flow(runtime, session, sor)
            except (FlowError, ValueError, OSError) as exc:
                problem = " ".join(str(exc).split())
                raise ConfigurationError(f"flow {FLOW_CONFIG}: {problem}") from exc
    finally:
        await runtime.close()


def main(argv: Sequence[str] | None = None) -> None:
    """Check the keys, the policy and the ledger, then hand over to Pipecat's runner."""
    from dotenv import find_dotenv, load_dotenv

    from pipecat_actions.errors import PipecatActionsError
    from pipecat_actions.ledger import default_ledger_url
    from pipecat_actions.ledger.engine import redact_url

    args = list(sys.argv[1:] if argv is None else argv)
    if not {"-h", "--help"} & set(args):
        load_dotenv(find_dotenv(usecwd=True))
        problem = missing_settings(args, os.environ) or missing_packages(args)
        if problem:
            print(problem, file=sys.stderr)
            sys.exit(2)
        try:
            asyncio.run(_check_setup(policy_path(), flow=flow_enabled()))
        except PipecatActionsError as exc:
            print(f"daily_bot: {exc}", file=sys.stderr)
            sys.exit(2)
        ledger = redact_url(default_ledger_url()).replace("sqlite+aiosqlite:", "sqlite:", 1)
        if flow_enabled():
            print("daily_bot: flow configs/flows/restaurant.yaml", file=sys.stderr)
        print(
            f"daily_bot: policy {policy_path()}\n"
            f"daily_bot: operator: pipecat-actions approvals list --ledger {ledger}",
            file=sys.stderr,
        )

    try:
        from pipecat.runner.run import main as run_main
    except ImportError as exc:
        print(
            f"daily_bot: Pipecat's runner cannot start ({exc}): run "
            f"{sys.executable} -m pip install 'pipecat-ai[runner]==1.14.0'",
            file=sys.stderr,
        )
        sys.exit(2)

    sys.argv = [sys.argv[0], *args]
    if flow_enabled() or os.environ.get("RESTAURANT_URL") or {"-h", "--help"} & set(args):
        run_main()
        return
    with start_restaurant() as restaurant:
        os.environ["RESTAURANT_URL"] = restaurant.url
        print(
            f"daily_bot: restaurant service on {restaurant.url}, its database {restaurant.db}",
            file=sys.stderr,
        )
        run_main()


def start_restaurant() -> RestaurantProcess:
    """Start the restaurant service on 127.0.0.1 (a free port), its database in the cwd."""
    from bots.restaurant_service.process import RestaurantProcess

    workdir = Path(".pipecat_actions")
    workdir.mkdir(mode=0o700, exist_ok=True)
    return RestaurantProcess.start((workdir / "restaurant.db").resolve())


if __name__ == "__main__":
    # `python bots/daily_bot.py` puts bots/ on the path, not the root holding the `bots` package.
    sys.path.insert(0, str(ROOT))
    main()
