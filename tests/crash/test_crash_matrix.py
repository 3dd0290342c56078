"""The crash-point matrix: a process SIGKILLed at each named point loses and duplicates nothing.

For every crash point of `Point`, on SQLite and PostgreSQL, over several seeds (3; 10 with
``PIPECAT_ACTIONS_LONG=1``): a child process runs a real runtime on a plan drawn from the
seed and is SIGKILLed exactly at the point; one or two fresh runtimes recover the ledger; the
checker (``_checker.py``) then asserts that nothing is left pending (an escalated UNKNOWN is
listed, not hidden), that side effects per key match the ledger (never two; exactly one for
every committed operation, deduplicating provider or not), that nothing the child had
acknowledged is lost, and that a committed result nobody was told about is listed as
undelivered. A failure names the point, the backend and the seed, and prints the plan.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.crash._harness import run_case
from tests.crash._plan import Point, make_plan, seeds

LONG = os.environ.get("PIPECAT_ACTIONS_LONG") == "1"


@pytest.mark.parametrize("seed", seeds(LONG))
@pytest.mark.parametrize("point", list(Point), ids=lambda p: p.value)
async def test_a_sigkill_at_the_point_is_recovered_without_loss_duplicates_or_pending_work(
    point: Point, seed: int, ledger_url: str, tmp_path: Path
) -> None:
    case = await run_case(make_plan(point, seed), ledger_url, tmp_path)
    assert not case.problems, case.report()
    print(f"\n{case.title()}: {case.verdict.summary()}")
