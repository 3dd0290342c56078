"""What sealing sensitive values costs a tool call, and what it costs the tools without any.

    .venv/bin/python bench/sealing.py [--calls N] [--rounds R]

Three runtimes on SQLite files of their own each take N committed mutations through
``runtime.propose`` (no pipeline): a plain tool with no policy marking anything sensitive (no
sealing installed); the same plain tool in a runtime whose policy marks another tool's values
sensitive (sealing installed, not used by this tool); and a tool with four encrypted argument
values (card number, CVC, password, a guest's phone) and an encrypted result value. Prints the
median per call of wall time and process time (every thread), median of R interleaved
rounds. Figures, not pass/fail: the machine is shared.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from loguru import logger

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipecat_actions.actions import ActionContext, action
from pipecat_actions.admission.authorization import AllowAll
from pipecat_actions.ledger.keys import LedgerKeys
from pipecat_actions.policy import load_policy_text
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.session import SessionState

PLAIN = """
version: 1
tools:
  book: {kind: mutation}
  pay: {kind: mutation}
"""
SEALED = """
version: 1
tools:
  book: {kind: mutation}
  pay:
    kind: mutation
    sensitive:
      card.number: encrypt
      card.cvc: encrypt
      password: encrypt
      guests[*].phone: encrypt
      result.token: encrypt
"""


@action
async def book(ctx: ActionContext, slot: int) -> dict[str, Any]:
    """Book."""
    return {"booking_id": f"bk_{slot}"}


@action
async def pay(
    ctx: ActionContext, slot: int, card: dict[str, str], password: str, guests: list[Any]
) -> dict[str, Any]:
    """Pay."""
    return {"token": f"tok_{slot}_9f8e7d6c5b4a", "ok": True}


def _args(tool: str, slot: int) -> dict[str, Any]:
    if tool == "book":
        return {"slot": slot}
    return {
        "slot": slot,
        "card": {"number": "4242424242424242", "cvc": "737"},
        "password": "Tr0ub4dor&3-horse",
        "guests": [{"name": "Ada", "phone": "+44 20 7946 0958"}],
    }


async def one_round(policy: str, tool: str, calls: int, folder: Path) -> tuple[float, float]:
    runtime = await ActionRuntime.create(
        load_policy_text(policy),
        authorizer=AllowAll(),
        actions=[book, pay],
        ledger_url=f"sqlite:///{folder / f'{tool}-{len(policy)}-{time.monotonic_ns()}.db'}",
        ledger_keys=LedgerKeys.fresh(),
    )
    session = SessionState("bench", principal="bench")
    try:
        for slot in range(20):  # warm up
            await runtime.propose(tool, _args(tool, -slot - 1), session)
        wall, cpu = time.perf_counter(), time.process_time()
        for slot in range(calls):
            told = await runtime.propose(tool, _args(tool, slot), session)
            assert told["status"] == "committed", told
        return (
            (time.perf_counter() - wall) / calls * 1e6,
            (time.process_time() - cpu) / calls * 1e6,
        )
    finally:
        await runtime.close()


async def main(calls: int, rounds: int) -> None:
    logger.remove()
    cases = {
        "plain tool, no sealing installed": (PLAIN, "book"),
        "plain tool, sealing installed for another": (SEALED, "book"),
        "tool with 4 sealed args + 1 sealed result": (SEALED, "pay"),
    }
    seen: dict[str, list[tuple[float, float]]] = {name: [] for name in cases}
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(rounds):
            for name, (policy, tool) in cases.items():
                seen[name].append(await one_round(policy, tool, calls, Path(folder)))
    print(f"{calls} committed proposals per round, median of {rounds} rounds (per call):")
    for name, samples in seen.items():
        wall = statistics.median(s[0] for s in samples)
        cpu = statistics.median(s[1] for s in samples)
        print(f"  {name:<44} wall {wall:8.0f} us   cpu {cpu:8.0f} us")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()
    asyncio.run(main(options.calls, options.rounds))
