"""Four processes, 250 concurrent calls each, one intent: one side effect, one outcome for all."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHILD = Path(__file__).with_name("_dedup_child.py")
PROCESSES, CALLS = 4, 250

ROUNDS = 5 if os.environ.get("PIPECAT_ACTIONS_LONG") == "1" else 1
"""The long variant (see the README) runs the race several times per backend."""

pytestmark = pytest.mark.timeout(180)


@pytest.mark.parametrize("round_", range(ROUNDS))
def test_four_processes_of_concurrent_duplicates_make_one_side_effect_and_share_its_outcome(
    ledger_url: str, tmp_path: Path, round_: int
) -> None:
    effects = tmp_path / "effects.txt"
    children = [
        subprocess.Popen(
            [sys.executable, str(CHILD), ledger_url, str(effects), str(CALLS)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(PROCESSES)
    ]
    try:
        for child in children:
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "ready", child.stderr
        for child in children:  # all start together
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        outputs = [child.communicate(timeout=150) for child in children]
    finally:
        for child in children:
            child.kill()
            child.wait()
    results = [row for out, _ in outputs for row in json.loads(out.strip().splitlines()[-1])]
    assert len(results) == PROCESSES * CALLS  # nobody lost
    assert {row[0] for row in results} != {"error"}, results[:3]
    assert len({row[0] for row in results}) == 1  # one operation for every caller
    assert {row[1] for row in results} == {"committed"}
    assert {json.dumps(row[2], sort_keys=True) for row in results} == {
        json.dumps({"booking_id": "bk_1", "time": "21:00"}, sort_keys=True)
    }
    assert len(effects.read_text().splitlines()) == 1  # one real booking
