"""Cost of log redaction per log line, against the same line logged without it.

    .venv/bin/python bench/redaction.py [--lines N] [--rounds R]

Each line kind is logged N times through loguru to a sink that formats the line and drops it,
once without the redaction patcher and once with it (redact paths ``card.number``,
``guests[*].phone`` and 0, 16 or 256 armed values). Prints the CPU time per line (median of R
interleaved rounds; the machine is shared) and the redaction's own cost per line, then the
time of ``redact_text`` on hostile inputs of 1 MB. Figures, not pass/fail.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from loguru import logger

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipecat_actions.observability.redaction import (
    Redactor,
    install_log_redaction,
    log_redactor,
    uninstall_log_redaction,
)

ARGS = {
    "card": {"number": "4111 1111 1111 1111", "expiry": "12/31"},
    "guests": [{"name": "Ada", "phone": "+44 20 7946 0958"}],
    "notes": "window seat please",
}
CONTEXT = [
    {"role": "system", "content": "You are a helpful restaurant booking assistant. " * 10},
    *[
        {"role": "user", "content": f"turn {i}: a table for four at nine, near the window"}
        for i in range(20)
    ],
    {
        "role": "assistant",
        "tool_calls": [
            {"id": "call_1", "function": {"name": "pay", "arguments": json.dumps(ARGS)}}
        ],
    },
]
LINES = {
    "short (no secret)": "PipelineTask#0: pipeline started",
    "Pipecat tool call (args)": (
        f"ScriptedLLM#0 Calling function [pay:call_1] with arguments {ARGS}"
    ),
    f"context ({len(str(CONTEXT))} chars)": f"ScriptedLLM#0: Generating LLM response {CONTEXT}",
}


def per_line(message: str, lines: int) -> float:
    started = time.process_time()
    for _ in range(lines):
        logger.debug("{}", message)
    return (time.process_time() - started) / lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lines", type=int, default=5_000)
    parser.add_argument("--rounds", type=int, default=5)
    options = parser.parse_args()

    logger.remove()
    logger.add(lambda _: None, level="DEBUG", format="{time} {level} {message} {extra}")
    redactor = log_redactor()
    redactor.add_paths(["card.number", "card.expiry", "guests[*].phone"])
    print(f"{'line':<28} {'armed':>5} {'plain us':>9} {'redacted us':>12} {'added us':>9}")
    for armed in (0, 16, 256):
        while redactor.armed_values < armed:
            redactor.arm(["phone"], {"phone": f"+1 555 {redactor.armed_values:08d}"})
        for name, message in LINES.items():
            plain, redacted = [], []
            for _ in range(options.rounds):
                uninstall_log_redaction()
                plain.append(per_line(message, options.lines))
                install_log_redaction()
                redacted.append(per_line(message, options.lines))
            p, r = statistics.median(plain) * 1e6, statistics.median(redacted) * 1e6
            print(f"{name:<28} {redactor.armed_values:>5} {p:>9.1f} {r:>12.1f} {r - p:>9.1f}")
    uninstall_log_redaction()

    print("\nhostile input, redact_text once (1 MB):")
    hostile = {
        "digits": "4" * 1_000_000,
        "backslashes": "\\" * 1_000_000,
        "quotes": "'" * 1_000_000,
        "nested brackets at a key": "{'phone': " + "[" * 500_000 + "]" * 499_990,
        "repeated keys": "'phone': 'x', " * 70_000,
    }
    fresh = Redactor()
    fresh.add_paths(["guests[*].phone"])
    for name, text in hostile.items():
        started = time.perf_counter()
        fresh.redact_text(text)
        elapsed = time.perf_counter() - started
        print(f"  {name:<26} {elapsed * 1e3:8.1f} ms  ({elapsed / len(text) * 1e9:.0f} ns/char)")


if __name__ == "__main__":
    main()
