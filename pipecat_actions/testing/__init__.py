"""Offline testing kit: a scripted LLM and a fake system of record with fault switches.

Shipped so applications can test their own agents without keys or network.
"""

from pipecat_actions.testing.conversation import (
    BargeIn,
    Call,
    ConversationResult,
    ObservedFrame,
    Push,
    Step,
    UserSays,
    Wait,
    WaitUntilIdle,
    run_conversation,
)
from pipecat_actions.testing.llm import Say, ScriptedLLM, ToolCalls
from pipecat_actions.testing.logs import CAPTURE_FORMAT, capture_logs, find_secrets
from pipecat_actions.testing.system_of_record import (
    Booking,
    FakeSystemOfRecord,
    Faults,
    Payment,
    ProviderCancelled,
    ProviderError,
    ProviderRejected,
    ProviderTimeout,
    ProviderUnavailable,
    Refund,
)
from pipecat_actions.testing.transport import (
    FakeInputTransport,
    FakeOutputTransport,
    FakeTransport,
    HeardTexts,
    HeardUtterance,
    PlaybackEvent,
    PlaybackKind,
    default_transport_params,
    offline_user_params,
    user_says,
    user_starts_speaking,
    user_stops_speaking,
)
from pipecat_actions.testing.tts import FakeTTS

__all__ = [
    "CAPTURE_FORMAT",
    "BargeIn",
    "Booking",
    "Call",
    "ConversationResult",
    "FakeInputTransport",
    "FakeOutputTransport",
    "FakeSystemOfRecord",
    "FakeTTS",
    "FakeTransport",
    "Faults",
    "HeardTexts",
    "HeardUtterance",
    "ObservedFrame",
    "Payment",
    "PlaybackEvent",
    "PlaybackKind",
    "ProviderCancelled",
    "ProviderError",
    "ProviderRejected",
    "ProviderTimeout",
    "ProviderUnavailable",
    "Push",
    "Refund",
    "Say",
    "ScriptedLLM",
    "Step",
    "ToolCalls",
    "UserSays",
    "Wait",
    "WaitUntilIdle",
    "capture_logs",
    "default_transport_params",
    "find_secrets",
    "offline_user_params",
    "run_conversation",
    "user_says",
    "user_starts_speaking",
    "user_stops_speaking",
]
