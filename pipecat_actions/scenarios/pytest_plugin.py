"""Run a team's scenario files inside its own ``pytest``: each file is one test.

Installed with pipecat_actions (a ``pytest11`` entry point), it does nothing until the
project names its scenario files, by glob relative to pytest's rootdir::

    # pyproject.toml
    [tool.pytest.ini_options]
    scenario_files = ["scenarios/*.yaml"]

Then ``pytest`` collects each matching file as a test that loads it (a file that cannot be
loaded fails with its problems, one line each), plays it on a real pipeline and fails with
every expectation that did not hold. ``pytest --scenario-ledger URL`` runs them on another
ledger (a PostgreSQL database, say); with ``--scenario-fresh-database`` the URL names a
PostgreSQL server and each file runs on a database of its own, made there and dropped after
(what a file with durable tools needs). Nothing heavy is imported until a scenario runs.
"""

from __future__ import annotations

import asyncio
import fnmatch
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    """Add the ``scenario_files`` setting and ``--scenario-ledger``."""
    parser.addini(
        "scenario_files",
        "globs (relative to the rootdir) of pipecat_actions scenario files to run as tests",
        type="linelist",
        default=[],
    )
    parser.addoption(
        "--scenario-ledger",
        default=None,
        metavar="URL",
        help="run scenario files on this ledger (default: a new SQLite file per scenario)",
    )
    parser.addoption(
        "--scenario-fresh-database",
        action="store_true",
        default=False,
        help="--scenario-ledger names a PostgreSQL server: a database of its own per file",
    )


def pytest_collect_file(parent: pytest.Collector, file_path: Path) -> pytest.Collector | None:
    """Collect a file the ``scenario_files`` globs name."""
    patterns = parent.config.getini("scenario_files")
    if not patterns or file_path.suffix not in (".yaml", ".yml"):
        return None
    try:
        relative = file_path.relative_to(parent.config.rootpath).as_posix()
    except ValueError:
        return None
    if any(fnmatch.fnmatch(relative, pattern) for pattern in patterns):
        return ScenarioFile.from_parent(parent, path=file_path)
    return None


class ScenarioFile(pytest.File):
    """A scenario file: one test, named after the file."""

    def collect(self) -> Iterator[pytest.Item]:
        """The file's one test."""
        yield ScenarioItem.from_parent(self, name=self.path.stem)


class ScenarioFailed(Exception):
    """The scenario could not be loaded, or some of its expectations did not hold."""


class ScenarioItem(pytest.Item):
    """Load and play one scenario file; fail with what did not hold."""

    def runtest(self) -> None:
        """Load and play the file; raise `ScenarioFailed` with what did not hold."""
        from pipecat_actions.scenarios import ScenarioError, load_scenario, run_scenario

        ledger_url = self.config.getoption("--scenario-ledger")
        fresh = bool(self.config.getoption("--scenario-fresh-database"))
        try:
            loaded = load_scenario(self.path)
            report = asyncio.run(run_scenario(loaded, ledger_url=ledger_url, fresh_database=fresh))
        except ScenarioError as exc:  # the file or its app cannot be loaded: nothing ran
            raise ScenarioFailed("\n".join(str(p) for p in exc.problems)) from None
        if not report.passed:
            lines = [f"{report.name}: {sum(not c.passed for c in report.checks)} failed"]
            lines += [
                f"  FAIL {c.what}" + (f"  [found: {c.found}]" if c.found else "")
                for c in report.checks
                if not c.passed
            ]
            raise ScenarioFailed("\n".join(lines))

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        """The failed expectations (or the file's problems), not a traceback."""
        if isinstance(excinfo.value, ScenarioFailed):
            return str(excinfo.value)
        return str(super().repr_failure(excinfo, style=style))

    def reportinfo(self) -> tuple[Path, int | None, str]:
        """Where the test is: the file."""
        return self.path, None, f"scenario {self.path.name}"
