"""``pipecat-actions scenario run FILE...``: replay scenario files and report."""

from __future__ import annotations

__all__ = ["run_scenario_files"]

import json
import sys
from collections.abc import Sequence
from typing import TextIO

from loguru import logger

from pipecat_actions._printable import printable
from pipecat_actions.scenarios.loader import LoadedScenario, ScenarioError, load_scenario
from pipecat_actions.scenarios.report import ScenarioReport, render_reports, run_scenario


async def run_scenario_files(
    files: Sequence[str],
    *,
    out: TextIO,
    err: TextIO,
    as_json: bool = False,
    verbose: bool = False,
    ledger_url: str | None = None,
) -> int:
    """Check every file first (a malformed one stops the run), then run them one by one.

    Returns:
        0 when every expectation of every scenario holds, 1 otherwise, 2 when a file is
        not a valid scenario.
    """
    loaded: list[LoadedScenario] = []
    broken = False
    for path in files:
        try:
            loaded.append(load_scenario(path))
        except ScenarioError as exc:
            broken = True
            for problem in exc.problems:
                print(printable(f"pipecat-actions: {problem}"), file=err)
    if broken:
        return 2
    # Pipecat and the runtime log at DEBUG; a report reader wants warnings and up only.
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    reports: list[ScenarioReport] = []
    for scenario in loaded:
        if not as_json:
            print(printable(f"... {scenario.spec.name}"), file=err, flush=True)
        reports.append(await run_scenario(scenario, ledger_url=ledger_url))
    if as_json:
        json.dump([r.to_json() for r in reports], out, indent=2)
        out.write("\n")
    else:
        render_reports(reports, out, verbose=verbose)
    return 0 if all(r.passed for r in reports) else 1
