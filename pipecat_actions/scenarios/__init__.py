"""Scenario files: race, crash and concurrency stories replayed against a real pipeline.

    pipecat-actions scenario run tests/scenarios/*.yaml [--json] [--verbose]

See `pipecat_actions.scenarios.model` for the file format and docs/scenarios.md for a guide.
"""

from pipecat_actions.scenarios.checks import Check
from pipecat_actions.scenarios.loader import (
    LoadedScenario,
    ScenarioError,
    load_scenario,
    load_scenario_text,
)
from pipecat_actions.scenarios.report import ScenarioReport, render_reports, run_scenario
from pipecat_actions.scenarios.runner import ScenarioApp, ScenarioWorld, check_app

__all__ = [
    "Check",
    "LoadedScenario",
    "ScenarioApp",
    "ScenarioError",
    "ScenarioReport",
    "ScenarioWorld",
    "check_app",
    "load_scenario",
    "load_scenario_text",
    "render_reports",
    "run_scenario",
]
