"""A scenario's result: the checks, what was heard, the ledger, the timeline; text or JSON."""

from __future__ import annotations

__all__ = ["ScenarioReport", "render_reports", "run_scenario"]

import os
import time
from dataclasses import dataclass, field
from typing import Any, TextIO

from pipecat_actions._printable import printable
from pipecat_actions.scenarios.checks import Check, check_run
from pipecat_actions.scenarios.loader import LoadedScenario, load_scenario
from pipecat_actions.scenarios.runner import Run, run_loaded


@dataclass
class ScenarioReport:
    """The outcome of one scenario.

    Attributes:
        name: The scenario's name.
        source: Its file.
        checks: Every expectation, checked.
        run: What happened.
        secs: Wall-clock seconds the run took.
    """

    name: str
    source: str
    checks: list[Check]
    run: Run = field(repr=False)
    secs: float = 0.0

    @property
    def passed(self) -> bool:
        """True when every expectation holds."""
        return all(check.passed for check in self.checks)

    @property
    def failures(self) -> list[Check]:
        """The expectations that do not hold."""
        return [check for check in self.checks if not check.passed]

    def to_json(self) -> dict[str, Any]:
        """The report as plain data."""
        return {
            "name": self.name,
            "source": self.source,
            "passed": self.passed,
            "secs": round(self.secs, 3),
            "checks": [{"what": c.what, "passed": c.passed, "found": c.found} for c in self.checks],
            "heard": [{"text": u.text, "interrupted": u.interrupted} for u in self.run.heard],
            "operations": [
                {
                    "operation_id": op.operation_id,
                    "label": next(
                        (k for k, v in self.run.labels.items() if v == op.operation_id), None
                    ),
                    "tool": op.tool,
                    "status": op.status.value,
                    "attempt": op.attempt,
                    "escalated": op.escalated_at is not None,
                    "delivered": op.delivered_at is not None,
                    "compensates": op.compensates,
                    "path": [
                        e.to_status.value
                        for e in self.run.events.get(op.operation_id, [])
                        if e.to_status != e.from_status
                    ],
                }
                for op in self.run.operations
            ],
            "side_effects": self.run.side_effects,
            "timeline": [entry.what for entry in self.run.timeline],
            "error": self.run.error,
        }


async def run_scenario(
    scenario: str | os.PathLike[str] | LoadedScenario,
    *,
    ledger_url: str | None = None,
    fresh_database: bool = False,
) -> ScenarioReport:
    """Load (if given a path), play and check one scenario.

    ``ledger_url`` and ``fresh_database`` are as for `run_loaded` (a scenario with durable
    tools needs PostgreSQL).

    Raises:
        ScenarioError: The file is not a valid scenario, or a durable one was given no
            PostgreSQL URL (nothing was run).
    """
    loaded = scenario if isinstance(scenario, LoadedScenario) else load_scenario(scenario)
    started = time.monotonic()
    run = await run_loaded(loaded, ledger_url=ledger_url, fresh_database=fresh_database)
    return ScenarioReport(
        loaded.spec.name, loaded.source, check_run(loaded, run), run, time.monotonic() - started
    )


def render_reports(reports: list[ScenarioReport], out: TextIO, *, verbose: bool = False) -> None:
    """Print each report: a verdict line, failed checks, and the story of failed runs."""
    for report in reports:
        verdict = "PASS" if report.passed else "FAIL"
        print(
            printable(f"{verdict} {report.name}  ({report.source}, {report.secs:.1f} s)"), file=out
        )
        for check in report.checks:
            if verbose or not check.passed:
                mark = "ok  " if check.passed else "FAIL"
                found = f"  [found: {check.found}]" if check.found and not check.passed else ""
                print(printable(f"    {mark} {check.what}{found}"), file=out)
        if verbose or not report.passed:
            _story(report, out)
    passed = sum(1 for r in reports if r.passed)
    print(printable(f"{passed} of {len(reports)} scenario(s) passed"), file=out)


def _story(report: ScenarioReport, out: TextIO) -> None:
    run = report.run
    print("    heard:", file=out)
    for u in run.heard:
        print(printable(f"      {u.text}{' [cut]' if u.interrupted else ''}"), file=out)
    print("    operations:", file=out)
    labels = {v: k for k, v in run.labels.items()}
    for op in run.operations:
        path = " -> ".join(
            e.to_status.value
            for e in run.events.get(op.operation_id, [])
            if e.to_status != e.from_status
        )
        label = f" [{labels[op.operation_id]}]" if op.operation_id in labels else ""
        print(printable(f"      {op.operation_id}{label} {op.tool}: {path}"), file=out)
    print(printable(f"    side effects: {dict(run.side_effects) or 'none'}"), file=out)
    print("    timeline:", file=out)
    start = run.timeline[0].at if run.timeline else 0.0
    for entry in run.timeline:
        print(printable(f"      {entry.at - start:7.3f}s {entry.what}"), file=out)
