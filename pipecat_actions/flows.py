"""Forwards to `pipecat_actions.adapters.flows` with a DeprecationWarning, until 0.3.0."""

from pipecat_actions._moved import moved

moved(__name__, "pipecat_actions.adapters.flows")

from pipecat_actions.adapters.flows import *  # noqa: E402, F403
from pipecat_actions.adapters.flows import __all__  # noqa: E402, F401
