"""`pipecat-actions` imports what a command needs when it runs, and nothing else.

An operator's command starts fast when it does not import what it does not use: `--help`
and a usage error import no library at all, no command of the ledger imports Pipecat (or the
runtime, or Alembic), and only the commands that open a ledger import SQLAlchemy. Checked by
the modules a real process holds when the command ends, never by a measured time
(`bench/cli_startup.py` measures).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipecat_actions.cli import main

ROOT = Path(__file__).resolve().parents[1]
POLICY = str(ROOT / "configs" / "restaurant.yaml")

_DRIVER = """\
import json, os, sys
from pipecat_actions.cli import run
try:
    run()
finally:
    with open(os.environ["LOADED_TO"], "w") as loaded:
        json.dump(sorted(sys.modules), loaded)
"""
"""The console script's own call, then the names of every module the process holds."""

LIBRARIES = ("pipecat", "sqlalchemy", "alembic", "asyncpg", "aiosqlite", "pydantic", "loguru")


def _loaded(argv: list[str], tmp_path: Path) -> tuple[int, set[str]]:
    """Run ``pipecat-actions ARGV`` in a process; its exit status and the modules it held."""
    record = tmp_path / "loaded.json"
    done = subprocess.run(
        [sys.executable, "-c", _DRIVER, *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env={**os.environ, "LOADED_TO": str(record)},
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, set(json.loads(record.read_text()))


def _libraries(modules: set[str]) -> set[str]:
    return {name for name in LIBRARIES if name in modules}


@pytest.fixture
def ledger(tmp_path: Path) -> str:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    assert main(["db", "upgrade", "--ledger", url]) == 0
    return url


@pytest.mark.parametrize(
    "argv",
    [["--help"], ["worker", "--help"], ["ledger", "list", "--help"], ["ledger", "lisst"]],
    ids=" ".join,
)
def test_help_and_a_usage_error_import_no_library(argv: list[str], tmp_path: Path) -> None:
    code, modules = _loaded(argv, tmp_path)
    assert code in (0, 2)
    assert _libraries(modules) == set()
    assert not {
        m for m in modules if m.startswith(("pipecat_actions.runtime", "pipecat_actions.ledger."))
    }


def test_checking_a_policy_opens_no_ledger_and_imports_no_database_library(
    tmp_path: Path,
) -> None:
    code, modules = _loaded(["policy", "check", POLICY], tmp_path)
    assert code == 0
    assert _libraries(modules) == {"pydantic", "loguru"}  # the policy model, the log setup


OPERATOR_COMMANDS = [
    ["ledger", "list"],
    ["ledger", "show", "op_missing"],
    ["undelivered"],
    ["stats"],
    ["approvals", "list"],
    ["db", "status"],
]


@pytest.mark.parametrize("argv", OPERATOR_COMMANDS, ids=" ".join)
def test_an_operator_command_imports_the_ledger_but_not_pipecat_the_runtime_or_alembic(
    argv: list[str], ledger: str, tmp_path: Path
) -> None:
    code, modules = _loaded([*argv, "--ledger", ledger], tmp_path)
    assert code == (1 if "op_missing" in argv else 0)
    assert _libraries(modules) == {"sqlalchemy", "aiosqlite", "loguru"}  # a SQLite ledger's
    assert "pipecat_actions.runtime" not in modules
    assert "sqlalchemy.dialects.postgresql" not in modules


def test_a_command_that_cannot_open_its_ledger_still_imports_no_pipecat(tmp_path: Path) -> None:
    code, modules = _loaded(["stats", "--ledger", str(tmp_path / "missing.db")], tmp_path)
    assert code == 1
    assert "pipecat" not in modules and "alembic" not in modules
