"""Every scenario file in this directory, replayed on SQLite and PostgreSQL, must pass.

A failure prints the scenario's report: the failed checks, what the user heard, each
operation's path and the timeline of steps, ledger writes and utterances.
"""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from pipecat_actions.scenarios import render_reports, run_scenario

HERE = Path(__file__).parent
SCENARIOS = sorted(HERE.glob("*.yaml"))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
async def test_scenario_passes(path: Path, ledger_url: str) -> None:
    report = await run_scenario(path, ledger_url=ledger_url)
    text = io.StringIO()
    render_reports([report], text, verbose=True)
    assert report.passed, text.getvalue()
