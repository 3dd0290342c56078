"""examples/your_own_agent/ runs as a user runs it: the program, and its scenario files."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from pipecat_actions.scenarios import load_scenario, run_scenario

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "your_own_agent"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"your_own_agent_{name}", EXAMPLE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


async def test_the_agent_in_its_own_pipeline_orders_one_refill_for_two_requests(
    tmp_path: Path,
) -> None:
    main = _load("main")
    heard = await main.main(ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}")
    assert heard == [
        "Your refill is ordered; it is ready tomorrow.",
        "That refill was already ordered; it is ready tomorrow.",
    ]


async def test_the_repeated_refill_joins_the_first_and_the_pharmacy_acts_once(
    tmp_path: Path,
) -> None:
    agent = _load("agent")
    from pipecat_actions import ActionRuntime, SessionState

    pharmacy = agent.Pharmacy()
    runtime = await ActionRuntime.create(
        EXAMPLE / "policy.yaml",
        authorizer=agent.Patients(),
        actions=agent.build_actions(pharmacy),
        ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
    )
    try:
        session = SessionState(session_id="call-1", principal="patient-7")
        first = await runtime.propose("refill_prescription", {"prescription_id": "rx-100"}, session)
        again = await runtime.propose("refill_prescription", {"prescription_id": "rx-100"}, session)
        empty = await runtime.propose("refill_prescription", {"prescription_id": "rx-200"}, session)
        anonymous = SessionState(session_id="call-2", principal="someone")
        refused = await runtime.propose("refill_status", {"prescription_id": "rx-100"}, anonymous)
    finally:
        await runtime.close()
    assert first["status"] == again["status"] == "committed"
    assert again["operation_id"] == first["operation_id"]
    assert len(pharmacy.refills) == 1 and pharmacy.refills_left["rx-100"] == 1
    assert empty["status"] == "failed_final" and "no refills left" in empty["message"]
    assert refused["status"] == "refused" and refused["reason"] == "not_authorized"


@pytest.mark.parametrize(
    "path", sorted((EXAMPLE / "scenarios").glob("*.yaml")), ids=lambda p: p.stem
)
async def test_the_example_scenarios_pass(path: Path, tmp_path: Path) -> None:
    report = await run_scenario(load_scenario(path), ledger_url=f"sqlite:///{tmp_path / 's.db'}")
    assert report.passed, [f"{c.what}: {c.found}" for c in report.failures]


def test_the_program_runs_from_anywhere_and_prints_what_was_heard(tmp_path: Path) -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT),
           "PIPECAT_ACTIONS_LEDGER_URL": f"sqlite:///{tmp_path / 'ledger.db'}"}  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(EXAMPLE / "main.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-3:] == [
        "caller heard: Your refill is ordered; it is ready tomorrow.",
        "caller heard: That refill was already ordered; it is ready tomorrow.",
        "refills ordered: 1",
    ]
    assert "DEBUG" not in done.stderr
