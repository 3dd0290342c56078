"""Pipecat frame processors: the turn tracker, the result gate and the RTVI status reporter."""

from pipecat_actions.processors.result_gate import ActionResultGate
from pipecat_actions.processors.status_reporter import ActionStatusReporter, rtvi_observer_params
from pipecat_actions.processors.turn_tracker import ActionTurnTracker

__all__ = ["ActionResultGate", "ActionStatusReporter", "ActionTurnTracker", "rtvi_observer_params"]
