"""A team runs its scenario files inside its own pytest: one test per file."""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLINIC = ROOT / "configs" / "scenarios" / "clinic"


def _plugin_args() -> list[str]:
    installed = any(
        entry.value == "pipecat_actions.scenarios.pytest_plugin"
        for entry in importlib.metadata.entry_points(group="pytest11")
    )
    return [] if installed else ["-p", "pipecat_actions.scenarios.pytest_plugin"]


def test_a_projects_scenario_files_run_as_its_own_tests(tmp_path: Path) -> None:
    project = tmp_path / "clinic_project"
    shutil.copytree(CLINIC, project / "clinic")
    scenarios = project / "clinic" / "scenarios"
    wrong = (scenarios / "lost_answer_reconciles.yaml").read_text()
    (scenarios / "told_twice.yaml").write_text(wrong.replace("      told: 1\n", "      told: 2\n"))
    (scenarios / "broken.yaml").write_text("name: broken\nsteps: []\n")
    (project / "clinic" / "down_app.py").write_text(
        "def build(world):\n    raise RuntimeError('the appointment book is down')\n"
    )
    (scenarios / "book_down.yaml").write_text(
        wrong.replace("app: ../clinic_app.py:build", "app: ../down_app.py:build")
    )
    (project / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\nscenario_files = ["clinic/scenarios/*.yaml"]\n'
    )
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *_plugin_args()],
        cwd=project,
        # This checkout's pipecat_actions, not whichever one the environment installed.
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = done.stdout
    assert done.returncode == 1, out + done.stderr
    assert "3 failed, 2 passed" in out, out
    assert "FAIL booking: told 2 time(s)  [found: 1]" in out
    assert "broken.yaml: policy: required key is missing" in out
    assert (
        "book_down.yaml: app: '../down_app.py:build' cannot be built: "
        "RuntimeError: the appointment book is down"
    ) in out
    assert "Traceback" not in out
