"""Offline testing kit: a scripted LLM and a fake system of record with fault switches.

Shipped so applications can test their own agents without keys or network.
"""

from pipecat_actions.testing.llm import Say, ScriptedLLM, ToolCalls
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

__all__ = [
    "Booking",
    "FakeSystemOfRecord",
    "Faults",
    "Payment",
    "ProviderCancelled",
    "ProviderError",
    "ProviderRejected",
    "ProviderTimeout",
    "ProviderUnavailable",
    "Refund",
    "Say",
    "ScriptedLLM",
    "ToolCalls",
]
