"""How long an operator's ``pipecat-actions`` command takes to start and answer.

    .venv/bin/python bench/cli_startup.py [--runs N] [--checkout DIR]

Times, as whole processes (``python -c "from pipecat_actions.cli import run; run()" ...``, what
the installed console script runs), the bare interpreter (``python -c pass``), the import of
SQLAlchemy's asyncio engine and SQLite driver alone (the floor of a command that opens a
ledger), ``pipecat-actions --help``, ``worker --help``, ``policy check``
of a shipped file and three operator commands on a small SQLite ledger made here (``ledger
list``, ``stats``, ``approvals list``). Runs are interleaved (each round runs every command once,
so a busy moment of the shared machine hits all of them) and each figure is the median of N
rounds, with its ratio to the bare interpreter: the wall-clock time, and the CPU time the
process used (user and system), which a machine busy with other work inflates less. The
package is timed compiled, as an installed one is: pip writes its ``.pyc`` files, and this
machine sets ``PYTHONDONTWRITEBYTECODE``, which would have every run compile it again, so the
bench compiles it first (``compileall``, into the checkout's ``__pycache__`` folders, which
git ignores). Then the
libraries each command imported (``-X importtime``: the heavy ones only). Figures, not
pass/fail.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HEAVY = ("pipecat", "sqlalchemy", "alembic", "asyncpg", "aiosqlite", "pydantic", "loguru", "yaml")
"""The libraries whose import is worth a line."""


def _commands(ledger: str) -> dict[str, list[str]]:
    script = [sys.executable, "-c", "from pipecat_actions.cli import run; run()"]
    floor = "import sqlalchemy.ext.asyncio, sqlalchemy.dialects.sqlite.aiosqlite"
    policy = str(ROOT / "configs" / "restaurant.yaml")
    return {
        "python -c pass": [sys.executable, "-c", "pass"],
        "import sqlalchemy": [sys.executable, "-c", floor],
        "--help": [*script, "--help"],
        "worker --help": [*script, "worker", "--help"],
        "policy check": [*script, "policy", "check", policy],
        "ledger list": [*script, "ledger", "list", "--ledger", ledger],
        "stats": [*script, "stats", "--ledger", ledger],
        "approvals list": [*script, "approvals", "list", "--ledger", ledger],
    }


async def _fill(url: str) -> None:
    from pipecat_actions.ledger import NewOperation, SqlLedger

    async with await SqlLedger.create(url) as ledger:
        for i in range(100):
            await ledger.admit(
                NewOperation(
                    tool="book_table",
                    kind="mutation",
                    args={"time": f"{i}"},
                    idempotency_key=f"k{i}",
                    session_id="call-1",
                    principal="alice",
                )
            )


def _time(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """The wall-clock time of ``command`` and the CPU time it used (user and system)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True, cwd=env["PYTHONPATH"], env=env)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def _imported(command: list[str], env: dict[str, str]) -> list[str]:
    """The heavy libraries ``command`` imports (run under ``-X importtime``)."""
    env = {**env, "PYTHONPROFILEIMPORTTIME": "1"}
    done = subprocess.run(
        command, capture_output=True, text=True, cwd=env["PYTHONPATH"], env=env, check=True
    )
    names = {
        line.rpartition("|")[2].strip().partition(".")[0]
        for line in done.stderr.splitlines()
        if line.startswith("import time:")
    }
    return [name for name in HEAVY if name in names]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15, help="rounds (default 15)")
    parser.add_argument(
        "--checkout",
        default=str(ROOT),
        help="the pipecat_actions to time (a folder holding it; default this one), e.g. an "
        "older version from `git archive`, to compare",
    )
    options = parser.parse_args()
    checkout = Path(options.checkout).resolve()
    # The checkout is the working directory too: `python -c` looks there first.
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    compiling = [sys.executable, "-m", "compileall", "-q", str(checkout / "pipecat_actions")]
    subprocess.run(compiling, check=True, stdout=subprocess.DEVNULL)
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:///{Path(folder) / 'ledger.db'}"
        asyncio.run(_fill(url))
        commands = _commands(url)
        for command in commands.values():
            _time(command, env)  # warm the file cache
        walls: dict[str, list[float]] = {name: [] for name in commands}
        cpus: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(options.runs):
            for name, command in commands.items():
                wall, cpu = _time(command, env)
                walls[name].append(wall)
                cpus[name].append(cpu)
        floor = statistics.median(walls["python -c pass"])
        cpu_floor = statistics.median(cpus["python -c pass"])
        print(f"pipecat_actions from {options.checkout}")
        print(f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}; median of {options.runs}")
        print(f"{'command':<16} {'wall':>7} {'x python':>8} {'cpu':>7} {'x python':>8}  imports")
        for name, command in commands.items():
            wall, cpu = statistics.median(walls[name]), statistics.median(cpus[name])
            heavy = " ".join(_imported(command, env)) if name != "python -c pass" else ""
            print(
                f"{name:<16} {wall * 1000:>5.0f}ms {wall / floor:>8.1f} {cpu * 1000:>5.0f}ms "
                f"{cpu / cpu_floor:>8.1f}  {heavy or '-'}"
            )


if __name__ == "__main__":
    main()
