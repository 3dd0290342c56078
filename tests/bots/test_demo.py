"""`make demo` end to end: the story's outcomes are checked in the ledger, not the exit code."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from tests.bots._commands import check_operator_commands

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(240)


FIRST_LINE = "user   A table for two at nine tonight, please."


def _refunds_in_ledger(tmp_path: Path) -> int:
    """How many refund operations the running demo's ledger holds now (read-only)."""
    database = tmp_path / ".pipecat_actions" / "demo.db"
    with closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as connection:
        [(count,)] = connection.execute(
            "SELECT count(*) FROM pa_operations WHERE tool = 'refund_deposit'"
        ).fetchall()
    return int(count)


def _run_demo(tmp_path: Path, policy: str | None = None) -> tuple[dict[str, Any], str]:
    """Run the demo, reading its output as it comes; check the story is printed as it happens.

    When the first line of the conversation is read, the demo must still be running and its
    ledger must not yet hold the refund the user asks for later in the call: a demo that
    collected its output and printed it at the end would show that line only after the
    refund. Order and cause, not time.
    """
    # Without PYTHONUNBUFFERED, as a user's shell piping `make demo` into tee or a CI log:
    # the demo must flush each line itself.
    unset = ("PIPECAT_ACTIONS_LEDGER_URL", "PYTHONUNBUFFERED")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    if policy:
        env["POLICY"] = str(ROOT / policy)
    env["PYTHONPATH"] = str(ROOT)
    errors = tmp_path / "stderr.txt"
    with errors.open("w") as stderr:
        demo = subprocess.Popen(
            [sys.executable, "-m", "bots.demo", "--json"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        try:
            assert demo.stdout is not None
            lines: list[str] = []
            at_first_line: tuple[bool, int] | None = None
            for line in demo.stdout:
                lines.append(line)
                if at_first_line is None and line.strip().endswith(FIRST_LINE.split(maxsplit=1)[1]):
                    at_first_line = (demo.poll() is None, _refunds_in_ledger(tmp_path))
            returncode = demo.wait(timeout=200)
        finally:
            demo.kill()
            demo.wait()
    printed_errors = errors.read_text()
    assert returncode == 0, printed_errors[-3000:]
    assert "Traceback" not in printed_errors
    assert at_first_line == (True, 0), "the story was not printed as it happened"
    printed = "".join(lines)
    outcome = json.loads(printed.strip().splitlines()[-1])
    return outcome, printed


def _check_story(ops: list[dict[str, Any]]) -> None:
    bookings = [o for o in ops if o["tool"] == "book_table"]
    at_2130 = [o for o in bookings if o["args"]["time"] == "21:30" and o["status"] == "COMMITTED"]
    at_2100 = [o for o in bookings if o["args"]["time"] == "21:00"]
    assert len(at_2130) == 1, bookings
    assert [o["status"] for o in at_2100] == ["COMPENSATED"]
    compensations = [o for o in ops if o["tool"] == "book_table.compensate"]
    assert [(o["status"], o["compensates"]) for o in compensations] == [
        ("COMMITTED", at_2100[0]["operation_id"])
    ]
    refunds = [o for o in ops if o["tool"] == "refund_deposit"]
    assert [o["status"] for o in refunds] == ["COMMITTED"]
    crashed = [o for o in bookings if o["args"]["time"] == "20:00"]
    assert [o["status"] for o in crashed] == ["COMMITTED"]  # reconciled after the SIGKILL


def _check_transcript(printed: str) -> None:
    """Each line of the model answers what came before it: nothing from a later turn."""
    transcript = printed[printed.index("TRANSCRIPT") : printed.index("LEDGER")]
    lines = [line.split(maxsplit=2)[1:] for line in transcript.splitlines()[1:] if line.strip()]
    said = [(who, text) for who, *rest in lines for text in rest if who in ("user", "bot")]
    asked = said.index(("user", "And please refund the deposit for the nine o'clock booking."))
    refund_offered = said.index(("bot", "Of course."))
    parking = said.index(("user", "Thanks. Is there parking nearby?"))
    car_park = said.index(("bot", "Yes, there is a car park right next door."))
    assert asked < refund_offered, said  # the refund only once she asked for it
    assert parking < car_park, said
    assert ("bot", "(done)") not in said  # the script did not run out early


def test_the_demo_tells_the_whole_story_with_a_manager_approving_the_refund(
    tmp_path: Path,
) -> None:
    outcome, printed = _run_demo(tmp_path)
    _check_story(outcome["operations"])
    _check_transcript(printed)
    assert "TRANSCRIPT" in printed
    assert "LEDGER" in printed
    assert "METRICS" in printed
    assert "manager rosa approves" in printed
    # The restaurant's database at the end: the 21:30 table and Bob's, booked by the bot that
    # was killed and reconciled by the one that recovered.
    assert "bookings left at the restaurant: [('bk_0002', '21:30'), ('bk_0003', '20:00')]" in (
        printed
    )
    assert "provider side effects: {'book': 3, 'cancel': 1, 'refund': 1}" in printed
    assert "Pipecat 'CANCELLED' tool results left in the context: 0" in printed
    assert (tmp_path / ".pipecat_actions" / "demo.db").exists()
    check_operator_commands(tmp_path, printed, "demo.db", outcome["operations"])


def test_the_demo_follows_another_policy_file(tmp_path: Path) -> None:
    outcome, printed = _run_demo(tmp_path, "configs/restaurant_verbal_refunds.yaml")
    _check_story(outcome["operations"])
    _check_transcript(printed)
    assert "AWAITING_CONFIRMATION" in printed
    assert "AWAITING_APPROVAL" not in printed


@pytest.mark.parametrize("service", ["openai", "gemini"])
def test_the_realtime_demo_tells_the_story_through_the_real_service_offline(
    tmp_path: Path, service: str
) -> None:
    env = {k: v for k, v in os.environ.items() if k != "PIPECAT_ACTIONS_LEDGER_URL"}
    env["PYTHONPATH"] = str(ROOT)
    done = subprocess.run(
        [sys.executable, "-m", "bots.realtime_demo", service],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    printed = done.stdout
    assert "WHAT THE PROVIDER HEARD" in printed
    assert "'CANCELLED' told to the provider: 0" in printed
    assert "bookings left at the restaurant: [('bk_0002', '21:30')]" in printed
    assert "provider side effects: {'book': 2, 'cancel': 1, 'refund': 1}" in printed
    assert "refund_deposit" in printed and "COMPENSATED" in printed
    assert (tmp_path / ".pipecat_actions" / f"demo-{service}.db").exists()
    check_operator_commands(tmp_path, printed, f"demo-{service}.db", None)


class _Writes:
    """An output that keeps each write apart (a line in two writes shows as two)."""

    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)

    def flush(self) -> None:
        return None


def test_the_story_writes_each_line_whole_from_any_thread_and_any_story_on_the_output() -> None:
    import threading

    from bots.demo import Story

    out = _Writes()
    story, call = Story(out), Story(out)  # the durable demo's story and a call's own
    story.begin()

    def worker_lines() -> None:
        for n in range(200):
            story.line(f"worker op{n} book_table: COMMITTED")

    reader = threading.Thread(target=worker_lines)
    reader.start()
    for n in range(200):
        call.line(f"tool   book_table op{n} REQUESTED -> ADMITTED")
    reader.join()

    # Each write is one line and its end: another thread's line cannot come between them
    # (print() wrote the text and its newline apart: a tool line once ran into a worker line).
    assert all(w.endswith("\n") and w.count("\n") == 1 for w in out.writes)
    lines = "".join(out.writes).splitlines()
    assert len(lines) == 1 + 400
    assert sum("worker" in line for line in lines) == sum("tool" in line for line in lines) == 200
