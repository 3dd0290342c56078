"""The pipeline template: the standard cascade with the runtime and both processors in place.

::

    transport.input() → stt → user_agg → ActionTurnTracker → llm → ActionStatusReporter → tts
        → transport.output() → ActionResultGate → assistant_agg

Why each goes where it goes (and what breaks otherwise):

* `ActionTurnTracker` right **after the user aggregator**: it must see the user's turn frames
  and every interruption the aggregator broadcasts, and the context frames it sends to the
  LLM. Before the aggregator it would see raw VAD and transcripts, not turns; after the LLM it
  would see interruptions too late to mark a proposal stale.
* `ActionResultGate` right **before the assistant aggregator**: it must see exactly what the
  aggregator sees, in the same order, to replace a ``FunctionCallCancelFrame`` before the
  aggregator writes ``"CANCELLED"``. The aggregator consumes every function-call frame, so a
  gate after it sees none; a gate before ``transport.output()`` sees frames before they are
  synced with audio, so it cannot repair a cancel that overtook its in-progress frame.
* `ActionStatusReporter` right **after the LLM service**: it tells RTVI clients each call's
  real status from the service's function-call frames, before the output transport holds them
  behind audio and before the gate replaces a cancel (before the LLM it would get only their
  upstream copies, which it leaves alone). Give the worker
  ``rtvi_observer_params=rtvi_observer_params(runtime)``, so that Pipecat's own reports (a
  cancel told as ``cancelled: true``) are off for the runtime's tools.

With a speech-to-speech service (OpenAI Realtime, Gemini Live) there is no STT or TTS, and the
service itself sends results to the provider::

    transport.input() → user_agg → ActionTurnTracker → realtime service → ActionStatusReporter
        → transport.output() → ActionResultGate → assistant_agg

The tracker and the gate keep their places; the realtime adapter on the service
(`pipecat_actions.adapters.realtime`) tells the provider each call's truth and the late
outcomes, and counts the provider's responses as generations. Without it the provider would be told
``CANCELLED`` for an action that goes on, and hear no late outcome at all.

`check_placement` reports a misplacement it can detect before the pipeline starts, and what is
missing: the gate, the tracker, or the handlers of the runtime's actions on the LLM service
(``attach(runtime, llm, session)`` forgotten: Pipecat would answer every call "The function is
not currently available"). Handlers the application registers itself (``instrument``)
and Pipecat Flows functions (`FlowActions`, which registers them node by node) are not the
runtime's to attach and are not asked for. `build_pipeline` builds the template and checks it.
"""

from __future__ import annotations

__all__ = ["build_pipeline", "check_placement"]

from collections.abc import Sequence
from typing import Any

from pipecat.pipeline.pipeline import Pipeline
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import (
    LLMAssistantAggregator,
    LLMContextAggregatorPair,
    LLMUserAggregator,
    LLMUserAggregatorParams,
)
from pipecat.processors.frame_processor import FrameProcessor
from pipecat.services.llm_service import LLMService

from pipecat_actions.adapters.handlers import (
    CONFIRM_TOOL,
    asks_for_confirmation,
    attach,
    attached_to,
)
from pipecat_actions.adapters.realtime import adapt_realtime, adapter_of, is_realtime_service
from pipecat_actions.adapters.result_gate import ActionResultGate
from pipecat_actions.adapters.status_reporter import ActionStatusReporter
from pipecat_actions.adapters.turn_tracker import ActionTurnTracker
from pipecat_actions.errors import ConfigurationError
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.session import SessionState


def build_pipeline(
    *,
    runtime: ActionRuntime,
    session: SessionState,
    llm: LLMService,
    context: LLMContext,
    tts: FrameProcessor | None = None,
    stt: FrameProcessor | None = None,
    transport: Any = None,
    user_params: LLMUserAggregatorParams | None = None,
    context_aggregator: LLMContextAggregatorPair | None = None,
) -> tuple[Pipeline, ActionResultGate]:
    """Build the standard pipeline with the runtime attached and the processors in place.

    A speech-to-speech ``llm`` (OpenAI Realtime, Azure Realtime, Gemini Live) gets the
    speech-to-speech layout and its realtime adapter (see the module docstring); ``stt`` and
    ``tts`` are then usually None (a realtime service with text output may feed a TTS).

    Args:
        runtime: The action runtime; its actions are registered on ``llm`` for ``session``.
        session: The conversation's session state.
        llm: The LLM service (a cascade one or a speech-to-speech one).
        context: The conversation context; pass ``tools=tools_schema(runtime)`` to it.
        tts: The TTS service, if any.
        stt: The STT service, if any.
        transport: A Pipecat transport (its ``input()`` and ``output()`` are used), if any.
        user_params: Parameters of the user aggregator (VAD, turn strategies).
        context_aggregator: The aggregator pair to place, when the application needs it
            too (Pipecat Flows' ``FlowManager(context_aggregator=...)``); its context must
            be ``context``. Left out: a pair is made around ``context`` with ``user_params``.

    Returns:
        The pipeline and its gate (for handoffs: ``await gate.handoff("billing")``).
    """
    if context_aggregator is not None:
        if context_aggregator.user().context is not context:
            raise ConfigurationError(
                "context_aggregator holds another LLMContext than context; pass the pair's "
                "own context"
            )
        if user_params is not None:
            raise ConfigurationError(
                "user_params cannot apply to a context_aggregator already made; give them "
                "to LLMContextAggregatorPair instead"
            )
        pair = context_aggregator
    else:
        pair = LLMContextAggregatorPair(context, user_params=user_params)
    realtime = is_realtime_service(llm)
    if realtime and adapter_of(llm) is not None:
        # Refused before anything is registered: the service still serves its first session.
        raise ConfigurationError(
            f"{type(llm).__name__} already has a realtime adapter (it serves another "
            "pipeline); use one speech-to-speech service per pipeline"
        )
    gate = ActionResultGate(runtime, session)
    attach(runtime, llm, session)
    if realtime:
        adapt_realtime(runtime, llm, session, gate)
    stages: list[FrameProcessor] = []
    if transport is not None:
        stages.append(transport.input())
    if stt is not None:
        stages.append(stt)
    stages += [pair.user(), ActionTurnTracker(session), llm, ActionStatusReporter(runtime, session)]
    if tts is not None:
        stages.append(tts)
    if transport is not None:
        stages.append(transport.output())
    stages += [gate, pair.assistant()]
    check_placement(stages)
    return Pipeline(stages), gate


def check_placement(processors: Sequence[FrameProcessor]) -> None:
    """Raise `ConfigurationError` if the tracker, the gate or the reporter cannot work there.

    Also when the tracker or the gate is missing, when they serve different sessions, or when
    the LLM service lacks the handlers ``attach(runtime, llm, session)`` registers for the
    gate's runtime and session (the runtime's own actions; not the handlers it routes).

    Args:
        processors: The pipeline's processors in order (``Pipeline.processors`` or the list
            given to ``Pipeline``).
    """
    names = [type(p).__name__ for p in processors]

    def index(kind: type[Any]) -> int | None:
        found = [i for i, p in enumerate(processors) if isinstance(p, kind)]
        if len(found) > 1:
            raise ConfigurationError(f"the pipeline has {len(found)} {kind.__name__}s; use one")
        return found[0] if found else None

    gate, tracker = index(ActionResultGate), index(ActionTurnTracker)
    user, assistant = index(LLMUserAggregator), index(LLMAssistantAggregator)
    llm = next((i for i, p in enumerate(processors) if isinstance(p, LLMService)), None)
    if gate is None:
        raise ConfigurationError(
            "the pipeline has no ActionResultGate: Pipecat would write 'CANCELLED' for an "
            "action that goes on; put the gate right before the assistant aggregator"
        )
    if assistant is None or gate + 1 != assistant:
        after = names[gate + 1] if gate + 1 < len(names) else "nothing"
        raise ConfigurationError(
            "ActionResultGate must come right before the assistant aggregator (it must see "
            f"what the aggregator sees, in the same order); it is followed by {after}"
        )
    if llm is not None and gate < llm:
        raise ConfigurationError("ActionResultGate must come after the LLM service")
    if llm is not None:
        _check_realtime(processors[llm], processors[gate])
    reporter = index(ActionStatusReporter)
    if reporter is not None and (reporter > gate or (llm is not None and reporter < llm)):
        raise ConfigurationError(
            "ActionStatusReporter must come after the LLM service and before the "
            "ActionResultGate: it must see the service's function-call frames, cancels included"
        )
    if tracker is None:
        raise ConfigurationError(
            "the pipeline has no ActionTurnTracker: the session would never learn of the "
            "user's turns and interruptions, so a tool call from a reply the user interrupted "
            "would run and a verbal confirmation could never count; put "
            "ActionTurnTracker(session) right after the user aggregator"
        )
    if user is None or tracker < user:
        raise ConfigurationError(
            "ActionTurnTracker must come after the user aggregator, which broadcasts the "
            "user's turns and interruptions"
        )
    if llm is not None and tracker > llm:
        raise ConfigurationError(
            "ActionTurnTracker must come before the LLM service: after it, an interruption "
            "arrives too late to mark a proposal stale"
        )
    gate_processor = processors[gate]
    assert isinstance(gate_processor, ActionResultGate)
    tracker_processor = processors[tracker]
    assert isinstance(tracker_processor, ActionTurnTracker)
    if tracker_processor.session is not gate_processor.session:
        raise ConfigurationError(
            "ActionTurnTracker and ActionResultGate serve different SessionStates: the turns "
            "the tracker records would not be the ones the calls are checked against; give "
            "both the conversation's one session"
        )
    if llm is not None:
        _check_attached(processors[llm], gate_processor)


def _check_attached(llm: Any, gate: ActionResultGate) -> None:
    """The runtime's own actions must have the handlers `attach` registered for this session.

    Handlers the runtime routes (``instrument``, Flows: ``app_handler``) are the application's
    to register, and Flows registers its own when a node is set: they are not asked for.
    """
    runtime, session = gate.runtime, gate.session
    own = [b for b in runtime.calls.bindings.values() if not b.action.app_handler]
    wanted = [b.action.name for b in own]
    if any(asks_for_confirmation(b) for b in own):
        wanted.append(CONFIRM_TOOL)
    owners = {name: attached_to(llm, name) for name in wanted}
    missing = [name for name, owner in owners.items() if owner is None or owner[0] is not runtime]
    kind = type(llm).__name__
    if missing:
        raise ConfigurationError(
            f"{kind} has no handler of this runtime for {', '.join(missing)}: Pipecat would "
            "answer the model that the function is not currently available; call "
            "attach(runtime, llm, session) before the pipeline runs (build_pipeline does)"
        )
    elsewhere = [name for name, owner in owners.items() if owner and owner[1] is not session]
    if elsewhere:
        raise ConfigurationError(
            f"the handlers of {', '.join(elsewhere)} on {kind} were attached for another "
            "SessionState than the gate's: calls would be admitted for another conversation's "
            "principal; attach the runtime with this pipeline's session"
        )


def _check_realtime(llm: Any, gate: Any) -> None:
    """A speech-to-speech service needs its adapter, speaking through this pipeline's gate."""
    adapter = adapter_of(llm)
    kind = type(llm).__name__
    if adapter is None:
        if is_realtime_service(llm):
            raise ConfigurationError(
                f"{kind} is a speech-to-speech service with no realtime adapter: it would tell "
                "the provider CANCELLED for an action that goes on, and the provider would hear "
                "no late outcome; build the pipeline with build_pipeline, or call "
                "pipecat_actions.adapters.realtime.adapt_realtime(runtime, llm, session, gate)"
            )
        return
    if adapter.gate is not gate or gate.speaker is not adapter:
        raise ConfigurationError(
            f"the realtime adapter of {kind} speaks through another pipeline's "
            "ActionResultGate: late outcomes would reach the wrong conversation; adapt the "
            "service with this pipeline's gate"
        )
