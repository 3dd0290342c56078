"""Forwards to `pipecat_actions.adapters` with a DeprecationWarning, until 0.3.0."""

from pipecat_actions._moved import moved

moved(__name__, "pipecat_actions.adapters")

from pipecat_actions.adapters.handlers import (  # noqa: E402
    CONFIRM_TOOL,
    asks_for_confirmation,
    attach,
    attached_to,
    cancel_target,
    needs_confirm_tool,
    owns_tool,
)
from pipecat_actions.adapters.routed import instrument  # noqa: E402
from pipecat_actions.adapters.tools import tools_schema  # noqa: E402

__all__ = [
    "CONFIRM_TOOL",
    "asks_for_confirmation",
    "attach",
    "attached_to",
    "cancel_target",
    "instrument",
    "needs_confirm_tool",
    "owns_tool",
    "tools_schema",
]
