"""CPU time of ``pipecat-actions policy check`` on hostile policy files, by shape and size.

    .venv/bin/python bench/policy_check.py [--sizes KIB,...] [--rounds R] [--shape NAME]...

Each shape is a way to make checking a policy file expensive: thousands of tools, long keys and
texts, deep nesting, aliases, huge lists, a problem at every key, templates of many
placeholders, a ``defaults:`` merged under every tool, compensations naming tools that are not
there... Each is generated at each size (default 128, 256, 512 KiB and just under the 1 MiB cap)
and checked in this process through the command's own entry point (``main(["policy", "check",
FILE])``, its output captured), the median of R rounds kept (the machine is shared). It prints
the CPU time per size, the growth from one size to the next (linear: about 2x per doubling; a
refusal by a limit: about 1x) and what the check said: OK with the number of tools, or the
first problem and how many lines were printed.

Target: every shape under 1 s of CPU at 1 MiB. Figures, not pass/fail.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pipecat_actions.cli import main
from pipecat_actions.policy import MAX_POLICY_BYTES

Shape = Callable[[int], str]
SHAPES: dict[str, tuple[str, Shape]] = {}


def shape(description: str) -> Callable[[Shape], Shape]:
    def register(make: Shape) -> Shape:
        SHAPES[make.__name__] = (description, make)
        return make

    return register


def fill(
    head: str, unit: Callable[[int], str], size: int, tail: str = "", count: int | None = None
) -> str:
    """``head``, ``unit(0)``, ``unit(1)``... (``count`` at most) within ``size`` bytes."""
    parts = [head]
    total = len(head.encode()) + len(tail.encode())
    for i in range(size if count is None else count):
        part = unit(i)
        total += len(part.encode())
        if total > size:
            break
        parts.append(part)
    parts.append(tail)
    return "".join(parts)


def each_tool(count: int, size: int, entry: Callable[[int, int], str], head: str = "") -> str:
    """``count`` tools (fewer if they do not fit), each ``entry(i, room)`` with ``room`` bytes."""
    head = f"version: 1\n{head}tools:\n"
    room = (size - len(head.encode())) // count
    return fill(head, lambda i: entry(i, room), size, count=count)


def padding(room: int, used: int) -> str:
    """A description that brings a tool entry of ``used`` bytes to about ``room``."""
    return "x" * max(1, room - used - 20)


@shape("many small valid tools (refused past the tool limit)")
def many_tools(size: int) -> str:
    return fill("version: 1\ntools:\n", lambda i: f"  t{i}: {{kind: read}}\n", size)


@shape("rich valid tools, as many as fit up to the most allowed, each padded to the size")
def max_tools_rich(size: int) -> str:
    def entry(i: int, room: int) -> str:
        head = (
            f"  book_{i}:\n    kind: mutation\n    arguments: [restaurant_id, date, time]\n"
            "    resource: 'table:{restaurant_id}:{date}'\n    confirmation:\n"
            "      mode: verbal\n      prompt: 'Book {restaurant_id} on {date} at {time}?'\n"
            f"    compensation: {{tool: book_{(i + 1) % 1000}}}\n    description: "
        )
        return f"{head}{padding(room, len(head))}\n"

    return each_tool(1000, size, entry)


@shape("defaults at their limit (250 redact paths) under the most tools allowed")
def defaults_redact(size: int) -> str:
    paths = ", ".join(f"a.p{i}" for i in range(250))
    head = f"defaults:\n  kind: mutation\n  arguments: [a]\n  redact: [{paths}]\n"

    def entry(i: int, room: int) -> str:
        start = f"  t{i}:\n    limits: {{max_queued: 1}}\n    description: "
        return f"{start}{padding(room, len(start))}\n"

    return each_tool(1000, size, entry, head=head)


@shape("defaults at their limit (a degrade_result of 650 numbers) under the most tools allowed")
def defaults_degrade(size: int) -> str:
    numbers = ", ".join("1" for _ in range(650))
    head = f"defaults:\n  kind: read\n  limits:\n    degrade_result: {{x: [{numbers}]}}\n"

    def entry(i: int, room: int) -> str:
        start = f"  t{i}:\n    limits: {{overflow: degrade}}\n    description: "
        return f"{start}{padding(room, len(start))}\n"

    return each_tool(1000, size, entry, head=head)


@shape("defaults holding a large degrade_result (refused past the defaults limit)")
def defaults_large(size: int) -> str:
    half = size // 2
    head = fill(
        "version: 1\ndefaults:\n  limits:\n    degrade_result:\n      x: [",
        lambda i: "1, ",
        half,
        "]\ntools:\n",
    )
    return fill(head, lambda i: f"  t{i}: {{kind: read, limits: {{max_queued: 1}}}}\n", size)


@shape("a tool with an unknown key per line: a problem each (listed up to the limit)")
def unknown_keys(size: int) -> str:
    return fill("version: 1\ntools:\n  t:\n    kind: read\n", lambda i: f"    x{i}: 1\n", size)


@shape("unknown keys of 1000 characters each (each suggestion reads the whole key)")
def unknown_long_keys(size: int) -> str:
    return fill(
        "version: 1\ntools:\n  t:\n    kind: read\n", lambda i: f"    {'r' * 1000}{i}: 1\n", size
    )


@shape("the same key repeated on every line")
def duplicate_keys(size: int) -> str:
    return fill("version: 1\ntools:\n  t:\n    kind: read\n", lambda i: "    kind: read\n", size)


@shape("keys YAML reads as numbers or merge keys, one per line")
def non_text_keys(size: int) -> str:
    return fill(
        "version: 1\ntools:\n  t:\n    kind: read\n",
        lambda i: f"    {i}: 1\n" if i % 2 else "    <<: {}\n",
        size,
    )


@shape("one flow list of short numbers in degrade_result (refused past the value limit)")
def huge_flow_list(size: int) -> str:
    head = "version: 1\ntools:\n  t:\n    kind: read\n    limits:\n      overflow: degrade\n"
    return fill(f"{head}      degrade_result: {{x: [", lambda i: "1, ", size - 4, "]}\n")


@shape("one flow list of 12-character texts in degrade_result (under the value limit)")
def long_flow_list(size: int) -> str:
    head = "version: 1\ntools:\n  t:\n    kind: read\n    limits:\n      overflow: degrade\n"
    return fill(f"{head}      degrade_result: {{x: [", lambda i: f"v{i:010d}, ", size - 4, "]}\n")


@shape("deep nesting, [[[[...]]]] on one line (refused past the depth limit)")
def deep_nesting(size: int) -> str:
    count = (size - 60) // 2
    return "version: 1\ntools:\n  t:\n    kind: read\n    redact: " + "[" * count + "]" * count


@shape("degrade_result 20 levels deep under keys of 1000 characters, then many items")
def deep_long_keys(size: int) -> str:
    lines = ["version: 1", "tools:", "  t:", "    kind: read", "    limits:"]
    lines += ["      overflow: degrade", "      degrade_result:"]
    indent = 8
    for level in range(20):
        lines.append(" " * indent + "k" * 1000 + f"{level}:")
        indent += 2
    return fill("\n".join(lines) + "\n", lambda i: " " * indent + "- {a: 1}\n", size)


@shape("an anchor on every value, and one alias at the end")
def anchors_and_alias(size: int) -> str:
    head = "version: 1\ntools:\n  t:\n    kind: read\n    limits:\n      degrade_result:\n"
    return fill(head, lambda i: f"        k{i}: &a{i} v\n", size - 20, "        z: *a0\n")


@shape("a resource template of distinct placeholders the tool does not declare")
def template_placeholders(size: int) -> str:
    head = "version: 1\ntools:\n  t:\n    kind: mutation\n    arguments: [a]\n    resource: '"
    return fill(head, lambda i: f"{{p{i}}}", size - 3, "'\n")


@shape("idempotency key_fields that are not arguments, a problem each")
def unknown_key_fields(size: int) -> str:
    head = "version: 1\ntools:\n  t:\n    kind: mutation\n    arguments: [a]\n    idempotency:\n"
    return fill(f"{head}      key_fields: [", lambda i: f"k{i}, ", size - 3, "]\n")


@shape("as many tools as fit up to the most allowed, each compensated by a misspelt tool")
def compensation_typos(size: int) -> str:
    def entry(i: int, room: int) -> str:
        start = (
            f"  tool_number_{i}:\n    kind: mutation\n"
            f"    compensation: {{tool: tool_nmber_{i}}}\n    description: "
        )
        return f"{start}{padding(room, len(start))}\n"

    return each_tool(1000, size, entry)


@shape("pairs of a cancellable tool and a tool named cancel_<it>")
def cancel_clashes(size: int) -> str:
    def pair(i: int) -> str:
        return (
            f"  t{i}: {{kind: mutation, cancellable_by_llm: true}}\n  cancel_t{i}: {{kind: read}}\n"
        )

    return fill("version: 1\ntools:\n", pair, size)


@shape("tools that each break several rules")
def rule_problems(size: int) -> str:
    def tool(i: int) -> str:
        return (
            f"  t{i}: {{kind: read, on_interruption: request_cancel, cancellable_by_llm: true}}\n"
        )

    return fill("version: 1\ntools:\n", tool, size)


@shape("a 1:2:3 (base 60) number as long as the file")
def sexagesimal_number(size: int) -> str:
    head = "version: 1\ntools:\n  t:\n    kind: read\n    max_payload_bytes: "
    return head + "1:" * ((size - len(head) - 2) // 2) + "1\n"


@shape("dates that do not exist, one per line")
def impossible_dates(size: int) -> str:
    head = "version: 1\ntools:\n  t:\n    kind: read\n    limits:\n      degrade_result:\n"
    return fill(head, lambda i: f"        k{i}: 2026-13-45\n", size)


@shape("an announcement of one long line of non-ASCII words")
def unicode_announce(size: int) -> str:
    head = "version: 1\ntools:\n  t:\n    kind: mutation\n    mode: background\n    announce: "
    return fill(head, lambda i: "un instant s'il vous pla\u00eet \u4e00\u4e0b ", size - 1, "\n")


@shape("keys with bidi overrides and combining marks, unknown, one per line")
def unicode_keys(size: int) -> str:
    return fill(
        "version: 1\ntools:\n  t:\n    kind: read\n",
        lambda i: f"    \u202e\u00e9{i}\u0301: \u4e2d\u6587\n",
        size,
    )


def check(path: str) -> tuple[float, str]:
    """CPU seconds of ``policy check path``, and what it said, in short."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        started = time.process_time()
        status = main(["policy", "check", path])
        seconds = time.process_time() - started
    if status == 0:
        return seconds, out.getvalue().strip().rpartition("(")[2].rstrip(")")
    lines = err.getvalue().splitlines()
    first = lines[0].removeprefix(f"{path}: ") if lines else "(nothing printed)"
    first = first if len(first) <= 90 else first[:87] + "..."
    return seconds, f"{len(lines)} lines: {first}"


def run(sizes_kib: list[int], rounds: int, names: list[str]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        print(f"CPU seconds of `policy check` (median of {rounds}); x: growth from the size before")
        header = "".join(f"{f'{kib} KiB':>16}" for kib in sizes_kib)
        print(f"{'shape':<24}{header}  outcome at the largest size")
        worst = 0.0
        for name in names:
            _description, make = SHAPES[name]
            row, previous, said = "", None, ""
            for kib in sizes_kib:
                size = min(kib * 1024, MAX_POLICY_BYTES - 64)
                path = Path(folder) / f"{name}.yaml"
                path.write_text(make(size), encoding="utf-8")
                timings = []
                for _ in range(rounds):
                    seconds, said = check(str(path))
                    timings.append(seconds)
                seconds = statistics.median(timings)
                growth = f"{seconds / previous:4.1f}x" if previous else "     "
                row += f"{seconds:10.3f} {growth}"
                previous = max(seconds, 1e-6)
            worst = max(worst, seconds)
            print(f"{name:<24}{row}  {said}", flush=True)
        print(f"slowest at the largest size: {worst:.3f} s (target: under 1 s)")


def _main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--sizes", default="128,256,512,1024", help="file sizes in KiB (1024: just under the cap)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="runs per size, median kept")
    parser.add_argument(
        "--shape", action="append", choices=sorted(SHAPES), help="only this shape (repeatable)"
    )
    parser.add_argument("--list", action="store_true", help="describe the shapes and exit")
    args = parser.parse_args()
    if args.list:
        for name, (description, _make) in SHAPES.items():
            print(f"{name:<24}{description}")
        return
    sizes = [int(kib) for kib in args.sizes.split(",")]
    run(sizes, args.rounds, args.shape or list(SHAPES))


if __name__ == "__main__":
    _main()
