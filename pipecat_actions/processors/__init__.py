"""Pipecat frame processors: the turn tracker, the result gate and the RTVI status reporter.

`check_placement` (which says whether they are where they work) is found here too, where a
user of the processors looks for it; it lives in `pipecat_actions.pipeline`, above this
package, and is resolved from there when first asked for.
"""

from typing import Any as _Any

from pipecat_actions.processors.result_gate import ActionResultGate
from pipecat_actions.processors.status_reporter import ActionStatusReporter, rtvi_observer_params
from pipecat_actions.processors.turn_tracker import ActionTurnTracker

__all__ = [
    "ActionResultGate",
    "ActionStatusReporter",
    "ActionTurnTracker",
    "check_placement",
    "rtvi_observer_params",
]


def __getattr__(name: str) -> _Any:
    if name == "check_placement":
        import importlib

        # By name, when asked: the pipeline module imports this package (no import cycle).
        return importlib.import_module("pipecat_actions.pipeline").check_placement
    raise AttributeError(f"module 'pipecat_actions.processors' has no attribute {name!r}")
