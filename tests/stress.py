"""Run pytest N times while CPU burners keep every core busy: how a test proves it is not flaky.

Usage::

    python -m tests.stress [--rounds N] [--burners N] [--] [PYTEST ARGS...]

    python -m tests.stress [--rounds N] [--burners N] --command "make test"

``make test-stress`` runs the whole suite 3 times; ``make test-stress STRESS_ARGS="--rounds 20
-- tests/runtime/test_cancel.py"`` runs one module 20 times, and ``--command "make test"``
repeats the whole of ``make test`` (lint and type checks included). The burners are child
processes that spin on the CPU; they are started before the first round and killed by PID when
the last one ends, however it ends (a failure, Ctrl-C). The run stops at the first failing round
and exits with its code; otherwise it prints one line per round and a summary, and exits 0.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress

_BURN = """
import os
parent = os.getppid()
while os.getppid() == parent:  # an orphaned burner stops by itself
    for _ in range(1_000_000):
        pass
"""


@contextmanager
def burners(count: int) -> Iterator[list[int]]:
    """Start ``count`` processes that spin on the CPU; kill them (by PID) on the way out."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _BURN],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for _ in range(count)
    ]
    try:
        yield [p.pid for p in procs]
    finally:
        for proc in procs:
            with suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait()


def main(argv: Sequence[str] | None = None) -> int:
    """Run the rounds; return the exit code (0, or the first failing round's pytest code)."""
    parser = argparse.ArgumentParser(
        prog="python -m tests.stress",
        description="Run pytest N times in a row while CPU burners keep the cores busy.",
    )
    parser.add_argument("--rounds", type=int, default=3, help="how many runs (default 3)")
    parser.add_argument(
        "--burners",
        type=int,
        default=os.cpu_count() or 2,
        help="how many CPU burners (default: one per core)",
    )
    parser.add_argument(
        "--command",
        help='a shell command to run each round instead of pytest (e.g. "make test")',
    )
    args, pytest_args = parser.parse_known_args(argv)
    if pytest_args[:1] == ["--"]:
        pytest_args = pytest_args[1:]
    if args.rounds < 1 or args.burners < 0:
        parser.error("--rounds must be at least 1 and --burners at least 0")

    # A SIGTERM ends the run like Ctrl-C does: through the finally that kills the burners.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    walls: list[float] = []
    with burners(args.burners) as pids:
        print(f"stress: {args.burners} CPU burners (PIDs {pids}), {args.rounds} rounds", flush=True)
        for round_ in range(1, args.rounds + 1):
            started = time.monotonic()
            if args.command:
                code = subprocess.call(args.command, shell=True)
            else:
                code = subprocess.call([sys.executable, "-m", "pytest", *pytest_args])
            walls.append(time.monotonic() - started)
            print(
                f"stress: round {round_}/{args.rounds} exited {code} in {walls[-1]:.0f} s",
                flush=True,
            )
            if code != 0:
                print(f"stress: FAILED in round {round_}; burners stopped", flush=True)
                return code
    print(
        f"stress: {args.rounds} of {args.rounds} rounds passed with {args.burners} burners; "
        f"wall {', '.join(f'{w:.0f}' for w in walls)} s",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
