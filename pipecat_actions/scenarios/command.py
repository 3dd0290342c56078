"""``pipecat-actions scenario run FILE...``: replay scenario files and report."""

from __future__ import annotations

__all__ = ["TEMPLATE", "new_scenario_file", "run_scenario_files"]

import json
import os
import sys
from collections.abc import Sequence
from typing import TextIO

from loguru import logger

from pipecat_actions._printable import printable
from pipecat_actions.scenarios.durable import refuse_on_sqlite
from pipecat_actions.scenarios.loader import LoadedScenario, ScenarioError, load_scenario
from pipecat_actions.scenarios.report import ScenarioReport, render_reports, run_scenario
from pipecat_actions.scenarios.runner import check_app


async def run_scenario_files(
    files: Sequence[str],
    *,
    out: TextIO,
    err: TextIO,
    as_json: bool = False,
    verbose: bool = False,
    ledger_url: str | None = None,
    fresh_database: bool = False,
) -> int:
    """Check every file and its app first (a malformed one stops the run), then run them.

    A file whose policy has durable tools is refused here, with the others, when
    ``ledger_url`` is not PostgreSQL (see `pipecat_actions.scenarios.durable`).

    Returns:
        0 when every expectation of every scenario holds, 1 otherwise, 2 when a file is
        not a valid scenario.
    """
    loaded: list[LoadedScenario] = []
    broken = False
    for path in files:
        try:
            scenario = load_scenario(path)
            check_app(scenario)
            refuse_on_sqlite(scenario, ledger_url, fresh_database=fresh_database)
            loaded.append(scenario)
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
        try:
            reports.append(
                await run_scenario(scenario, ledger_url=ledger_url, fresh_database=fresh_database)
            )
        except ScenarioError as exc:  # a factory that built once and then would not
            for problem in exc.problems:
                print(printable(f"pipecat-actions: {problem}"), file=err)
            return 2
    if as_json:
        json.dump([r.to_json() for r in reports], out, indent=2)
        out.write("\n")
    else:
        render_reports(reports, out, verbose=verbose)
    return 0 if all(r.passed for r in reports) else 1


TEMPLATE = """\
# A scenario: a story your agent must get right, replayed on a real Pipecat pipeline.
#   pipecat-actions scenario run {name}
# The format is in docs/scenarios.md. To test your own agent, point app at your
# actions' factory (found relative to this file) and policy at your policy file:
#   app: my_agent/scenario_app.py:build     # build(world) -> actions or a ScenarioApp
#   policy: ../configs/my_policy.yaml
version: 2
name: a lost answer is reconciled and told once
description: >
  The provider commits the booking but its answer is lost. The runtime records UNKNOWN,
  asks the provider (the reconcile hook), finds the booking and tells the caller once.
app: restaurant
policy:
  version: 1
  tools:
    book_table:
      kind: mutation
      idempotency: {{key_fields: [restaurant_id, date, time, party_size], provider_dedupes: true}}
steps:
  - user: A table for two tomorrow at nine, please.
  # The next request to book_table commits, then its answer never arrives.
  - fault: {{target: book_table, fault: lose_response_after_commit}}
  - llm:
      calls:
        - tool: book_table
          as: booking
          args: {{restaurant_id: trattoria, date: "2030-05-01", time: "21:00", party_size: 2}}
  - until: {{op: booking, status: [COMMITTED], delivered: true}}
  - llm: You are booked for two at nine.
  - idle: {{quiet_secs: 0.5, calls: true}}
expect:
  operations:
    - op: booking
      status: COMMITTED
      path: [ADMITTED, RUNNING, UNKNOWN, COMMITTED]
      told: 1
  requests: {{book_table: 1, book_table.reconcile: 1}}
  side_effects: {{book: 1}}
  heard:
    includes: [booked for two at nine]
    excludes: [cancelled, not yet known]
"""
"""What ``pipecat-actions scenario new`` writes: a scenario that runs as it is."""


def new_scenario_file(path: str, *, out: TextIO) -> int:
    """Write `TEMPLATE` to ``path`` (never over an existing file); 0, or 2 with one line."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        print(printable(f"pipecat-actions: {path} exists; nothing was written"), file=sys.stderr)
        return 2
    except OSError as exc:
        print(
            printable(f"pipecat-actions: cannot write {path}: {exc.strerror or exc}"),
            file=sys.stderr,
        )
        return 2
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(TEMPLATE.format(name=os.path.basename(path)))
    print(
        printable(f"{path}: a new scenario; run it with: pipecat-actions scenario run {path}"),
        file=out,
    )
    return 0
