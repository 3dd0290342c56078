"""`make demo DURABLE=1` end to end: a DBOS worker process on the machine's PostgreSQL.

The story's outcomes are checked in what the demo read from the ledger and from DBOS's
tables before it dropped its database, and in the order of the transcript it printed: the
hand-off heard as "started", the worker's outcome told in the call, and a call that ended
before its outcome told once in the session's next conversation.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest

from tests.conftest import PG_ADMIN_URL, SKIP_PG

ROOT = Path(__file__).resolve().parents[2]

pytestmark = [pytest.mark.timeout(240), pytest.mark.postgres]


def _demo(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    unset = ("PIPECAT_ACTIONS_LEDGER_URL",)
    environment = {k: v for k, v in os.environ.items() if k not in unset}
    environment.update(PYTHONPATH=str(ROOT), **env)
    return subprocess.run(
        [sys.executable, "-m", "bots.durable_demo", "--json"],
        cwd=tmp_path,
        env=environment,
        capture_output=True,
        text=True,
        timeout=200,
        check=False,
    )


async def _exists(database: str) -> bool:
    conn = await asyncpg.connect(PG_ADMIN_URL)
    try:
        return bool(await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", database))
    finally:
        await conn.close()


def _said(transcript: str) -> list[str]:
    """The transcript's lines without their times."""
    return [line.split(maxsplit=1)[1] for line in transcript.splitlines()[1:] if line.strip()]


def _index(said: list[str], pattern: str) -> int:
    found = [k for k, line in enumerate(said) if re.search(pattern, line)]
    assert len(found) == 1, f"{pattern!r} in:\n" + "\n".join(said)  # all of it, untruncated
    return found[0]


def test_the_durable_demo_hands_off_runs_on_the_worker_and_tells_each_outcome_once(
    tmp_path: Path,
) -> None:
    if SKIP_PG:
        pytest.skip("PIPECAT_ACTIONS_SKIP_PG=1")
    done = _demo(tmp_path, PIPECAT_ACTIONS_PG_ADMIN_URL=PG_ADMIN_URL)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    printed = done.stdout
    outcome = json.loads(printed.strip().splitlines()[-1])
    ops = outcome["operations"]
    assert [(o["tool"], o["status"], o["workflow"], o["told"], o["lease_owner"]) for o in ops] == [
        ("book_table", "COMMITTED", "SUCCESS", 1, "dbos"),
        ("refund_deposit", "COMMITTED", "SUCCESS", 1, "dbos"),
        ("book_table", "COMMITTED", "SUCCESS", 1, "dbos"),
    ]
    assert outcome["side_effects"] == {"book": 2, "refund": 1}
    assert "WORKER (stopped with SIGTERM, exit 0)" in printed

    said = _said(printed[printed.index("TRANSCRIPT") : printed.index("WORKER (")])
    alice, refund, bob = (o["operation_id"][-8:] for o in ops)
    # Alice hears that the booking started, the worker books it, and she is told in the call.
    started = _index(said, r"^bot +Sure, I have started the booking")
    handed = _index(said, rf"^tool +book_table +{alice} REQUESTED -> ADMITTED")
    worked = _index(said, rf"^worker {alice} book_table: COMMITTED")
    booked = _index(said, r"^bot +Your table for two at nine tonight is booked")
    assert handed < started < booked and worked < booked
    # The refund waits for the manager while the call goes on; the worker runs it once approved.
    waiting = _index(said, rf"^tool +refund_deposit +{refund} REQUESTED -> AWAITING_APPROVAL")
    parking = _index(said, r"^bot +Yes, there is a car park")
    approved = _index(said, rf"^app +manager rosa approves {refund}")
    refunded = _index(said, rf"^worker {refund} refund_deposit: COMMITTED")
    told = _index(said, r"^bot +Good news: your refund")
    assert waiting < approved < refunded < told and parking < told
    # Bob's call ends before the worker is done; his next conversation is told, once.
    ended = _index(said, rf"^app +bob's booking {bob}: admitted; bob's call ends")
    finished = _index(said, rf"^worker {bob} book_table: COMMITTED")
    back = _index(said, r"^app +bob calls back")
    welcome = _index(said, r"^bot +Welcome back, Bob")
    assert ended < finished < back < welcome

    # The database the demo made is gone; so is the restaurant's file.
    (database,) = re.findall(r"a database of its own: \S+/(pa_demo_\w+)", done.stderr)
    assert not asyncio.run(_exists(database))
    assert list((tmp_path / ".pipecat_actions").iterdir()) == []


def test_the_durable_demo_refuses_in_one_line_when_postgresql_is_not_there(
    tmp_path: Path,
) -> None:
    # Port 9 (discard) on this host: nothing listens, the connection is refused at once.
    done = _demo(
        tmp_path, PIPECAT_ACTIONS_PG_ADMIN_URL="postgresql://postgres@127.0.0.1:9/postgres"
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    (line,) = done.stderr.splitlines()
    assert line.startswith("make demo DURABLE=1: PostgreSQL is not reachable at ")
    assert "127.0.0.1:9" in line
    assert done.stdout == ""
