"""The one place that names what of Pipecat's private parts the adapters touch.

Pipecat offers no public seam where some of the adapters must work: the LLM service's
function registry (which handler serves a tool, the built-in ``cancel_<tool>`` handlers,
direct functions it registers lazily on each inference), a speech-to-speech service's
handlers of its provider's events and its connection state, and a Flows manager's pending
transition. Everything else goes through Pipecat's public API (``register_function``,
``has_function``, ``FunctionCallParams``, frames, ``tool_options``).

An adapter reaches a private part only through a view made here (`llm_service`,
`openai_realtime`, `gemini_live`, `flow_manager`): the view passes public names through and
refuses a private name that is not listed below. ``tests/adapters/test_pipecat_private.py``
checks every listed name against the installed Pipecat (pinned at 1.14.0), so a release that
renames or drops one fails that test instead of breaking a conversation silently.
"""

from __future__ import annotations

__all__ = [
    "FLOW_MANAGER",
    "GEMINI_LIVE",
    "LLM_SERVICE",
    "OPENAI_REALTIME",
    "PRIVATE_PARTS",
    "flow_manager",
    "gemini_live",
    "llm_service",
    "openai_realtime",
]

from typing import Any

LLM_SERVICE = frozenset(
    {
        "_functions",  # the registry: name -> FunctionCallRegistryItem
        "_register_direct_function",  # how direct functions of LLMContext(tools=...) arrive
        "_cancel_tool_names",  # Pipecat's own cancel_<tool> handlers
        "_adapter",  # its builtin_tools advertise those
        "_function_call_tasks",  # the calls whose wait Pipecat runs now
        "_cancel_function_calls_by_tool_call_id",  # cancel one such wait
    }
)
"""``pipecat.services.llm_service.LLMService``."""

OPENAI_REALTIME = frozenset(
    {
        "_handle_evt_response_created",
        "_handle_evt_response_done",
        "_handle_evt_session_updated",
        "_handle_evt_speech_started",
        "_receive_task_handler",
        "_disconnect",
        "_create_response",
        "_truncate_current_audio_response",
        "_websocket",
        "_api_session_ready",
        "_disconnecting",
        "_llm_needs_conversation_setup",
        "_context",
        "_response_active",
    }
)
"""``pipecat.services.openai.realtime.llm.OpenAIRealtimeLLMService``."""

GEMINI_LIVE = LLM_SERVICE | frozenset(
    {
        "_handle_function_call_result",
        "_tag_tool_behaviors",
        "_handle_server_message",
        "_handle_session_ready",
        "_handle_context",
        "_handle_send_error",
        "_connection_task_handler",
        "_connection_task",
        "_disconnect",
        "_disconnecting",
        "_complete_turn",
        "_context",
        "_session",
        "_settings",
        "_completed_tool_calls",
        "_tool_call_id_to_name",
        "_supports_non_blocking_tools",
        "_supports_blocking_tools",
        "_tools_default_to_non_blocking",
    }
)
"""``pipecat.services.google.gemini_live.llm.GeminiLiveLLMService``."""

FLOW_MANAGER = frozenset(
    {
        "_create_function_schema",  # where a node's functions become FunctionSchemas
        "_pending_transition",  # a transition waiting for the calls still in progress
        "_check_and_execute_transition",  # make it once they are done
    }
)
"""``pipecat.flows.manager.FlowManager``."""

PRIVATE_PARTS: dict[str, frozenset[str]] = {
    "pipecat.services.llm_service:LLMService": LLM_SERVICE,
    "pipecat.services.openai.realtime.llm:OpenAIRealtimeLLMService": OPENAI_REALTIME,
    "pipecat.services.google.gemini_live.llm:GeminiLiveLLMService": GEMINI_LIVE,
    "pipecat.flows.manager:FlowManager": FLOW_MANAGER,
}
"""Each Pipecat class whose private parts are touched, with the names (pinned by a test)."""


class _Parts:
    """A view of one Pipecat object: public names and the listed private ones, nothing else."""

    __slots__ = ("_Parts__names", "_Parts__target")

    def __init__(self, target: Any, names: frozenset[str]) -> None:
        object.__setattr__(self, "_Parts__target", target)
        object.__setattr__(self, "_Parts__names", names)

    def _allowed(self, name: str) -> str:
        names: frozenset[str] = object.__getattribute__(self, "_Parts__names")
        if name.startswith("_") and name not in names:
            target = object.__getattribute__(self, "_Parts__target")
            raise AttributeError(
                f"{type(target).__name__}.{name} is a private part of Pipecat that "
                "pipecat_actions.adapters._pipecat_private does not name"
            )
        return name

    def __getattr__(self, name: str) -> Any:
        return getattr(object.__getattribute__(self, "_Parts__target"), self._allowed(name))

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(object.__getattribute__(self, "_Parts__target"), self._allowed(name), value)


def llm_service(llm: Any) -> Any:
    """``llm`` (an ``LLMService``) with its function registry's private parts (`LLM_SERVICE`)."""
    return _Parts(llm, LLM_SERVICE)


def openai_realtime(llm: Any) -> Any:
    """An ``OpenAIRealtimeLLMService`` with the private parts its adapter needs."""
    return _Parts(llm, OPENAI_REALTIME)


def gemini_live(llm: Any) -> Any:
    """A ``GeminiLiveLLMService`` with the private parts its adapter needs."""
    return _Parts(llm, GEMINI_LIVE)


def flow_manager(manager: Any) -> Any:
    """A Flows ``FlowManager`` with its pending transition (`FLOW_MANAGER`)."""
    return _Parts(manager, FLOW_MANAGER)
