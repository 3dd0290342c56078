"""Forwards to `pipecat_actions.adapters.realtime` with a DeprecationWarning, until 0.3.0."""

from pipecat_actions._moved import moved

moved(__name__, "pipecat_actions.adapters.realtime")

from pipecat_actions.adapters.realtime import *  # noqa: E402, F403
from pipecat_actions.adapters.realtime import __all__  # noqa: E402, F401
