"""Pipecat frame processors: the turn tracker and the result gate."""

from pipecat_actions.processors.result_gate import ActionResultGate
from pipecat_actions.processors.turn_tracker import ActionTurnTracker

__all__ = ["ActionResultGate", "ActionTurnTracker"]
