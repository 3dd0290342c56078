"""Forwards to `pipecat_actions.adapters.status_reporter` with a DeprecationWarning, until 0.3.0."""

from pipecat_actions._moved import moved

moved(__name__, "pipecat_actions.adapters.status_reporter")

from pipecat_actions.adapters.status_reporter import *  # noqa: E402, F403
from pipecat_actions.adapters.status_reporter import __all__  # noqa: E402, F401
