"""Speech-to-speech services (OpenAI Realtime, Gemini Live) with the cascade's guarantees.

The layout, which `pipecat_actions.adapters.pipeline.build_pipeline` builds for such a service::

    transport.input() → user_agg → ActionTurnTracker → realtime service
        → ActionStatusReporter → transport.output() → ActionResultGate → assistant_agg

and the adapter on the service, which `build_pipeline` installs (by hand: ``attach``,
then ``adapt_realtime(runtime, llm, session, gate)``). See `pipecat_actions.adapters.realtime._base`
for what it guarantees, and the per-service modules for what each service needs.
"""

from __future__ import annotations

__all__ = ["RealtimeAdapter", "adapt_realtime", "adapter_of", "is_realtime_service"]

from typing import TYPE_CHECKING, Any

from pipecat_actions.adapters.realtime._base import ADAPTER_ATTRIBUTE, RealtimeAdapter
from pipecat_actions.errors import ConfigurationError

if TYPE_CHECKING:
    from pipecat.services.llm_service import LLMService

    from pipecat_actions.adapters.result_gate import ActionResultGate
    from pipecat_actions.runtime import ActionRuntime
    from pipecat_actions.session import SessionState


def is_realtime_service(llm: Any) -> bool:
    """Whether ``llm`` is a speech-to-speech service (its metadata says so)."""
    metadata = getattr(llm, "service_metadata_frame", None)
    if metadata is None:
        return False
    try:
        return bool(metadata().is_realtime_service)
    except Exception:  # a service that cannot say is treated as a cascade one
        return False


def adapter_of(llm: Any) -> RealtimeAdapter | None:
    """The realtime adapter installed on ``llm``, if any."""
    adapter = getattr(llm, ADAPTER_ATTRIBUTE, None)
    return adapter if isinstance(adapter, RealtimeAdapter) else None


def adapt_realtime(
    runtime: ActionRuntime, llm: LLMService, session: SessionState, gate: ActionResultGate
) -> RealtimeAdapter:
    """Install the adapter for ``llm``'s kind of service; late outcomes then go through it.

    Raises:
        ConfigurationError: ``llm`` is no speech-to-speech service this package adapts, or it
            has an adapter already.
    """
    if adapter_of(llm) is not None:
        raise ConfigurationError(f"{type(llm).__name__} already has a realtime adapter")
    adapter = _adapter_class(llm)(runtime, llm, session, gate)
    adapter.install()
    return adapter


def _adapter_class(llm: Any) -> type[RealtimeAdapter]:
    names = {cls.__name__ for cls in type(llm).__mro__}
    if "OpenAIRealtimeLLMService" in names:
        from pipecat_actions.adapters.realtime.openai import OpenAIRealtimeAdapter

        return OpenAIRealtimeAdapter
    if "GeminiLiveLLMService" in names:
        from pipecat_actions.adapters.realtime.gemini import GeminiLiveAdapter

        return GeminiLiveAdapter
    kind = type(llm).__name__
    raise ConfigurationError(
        f"{kind} is not a speech-to-speech service pipecat_actions adapts (OpenAI Realtime, "
        "Azure Realtime, Gemini Live); its results would reach the provider unchecked"
        if is_realtime_service(llm)
        else f"{kind} is not a speech-to-speech service; use the cascade layout"
    )
