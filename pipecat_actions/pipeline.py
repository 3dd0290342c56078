"""Forwards to `pipecat_actions.adapters.pipeline` with a DeprecationWarning, until 0.3.0."""

from pipecat_actions._moved import moved

moved(__name__, "pipecat_actions.adapters.pipeline")

from pipecat_actions.adapters.pipeline import *  # noqa: E402, F403
from pipecat_actions.adapters.pipeline import __all__  # noqa: E402, F401
