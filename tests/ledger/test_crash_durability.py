"""A write the ledger acknowledged survives the writer being killed.

A child process admits and transitions operations as fast as it can and prints each operation
id and event number only after the ledger call returned. The parent SIGKILLs it in the middle
of its writes, then a fresh ledger must hold everything the child reported, and no operation
may be half written (a row change without its audit event, or the reverse).
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from pipecat_actions.ledger import SqlLedger
from pipecat_actions.status import ActionStatus

from ._support import assert_trail_is_contiguous, new_op, spawn_children

REPORTED_OPERATIONS_BEFORE_KILL = 30


async def test_every_acknowledged_write_survives_a_sigkill_of_the_writer(
    ledger_url: str, tmp_path: Path
) -> None:
    async with await SqlLedger.create(ledger_url):
        pass  # schema first, so the child only writes operations
    reported: dict[str, tuple[int, str]] = {}

    async with spawn_children([["write-forever", ledger_url, "4"]], tmp_path) as [child]:
        await child.expect("ready")
        while len(reported) < REPORTED_OPERATIONS_BEFORE_KILL:
            line = await child.read_line()
            assert line is not None, f"child stopped early; stderr:\n{child.stderr()}"
            reported[line["op"]] = (line["seq"], line["status"])
        os.kill(child.process.pid, signal.SIGKILL)
        # Lines already in the pipe were also printed after their call returned: count them.
        while (line := await child.read_line()) is not None:
            reported[line["op"]] = (line["seq"], line["status"])
        assert await child.process.wait() == -signal.SIGKILL

    async with await SqlLedger.create(ledger_url) as ledger:
        for op_id, (seq, status) in reported.items():
            op = await ledger.get(op_id)
            trail = await ledger.events(op_id)
            assert op.event_seq >= seq, (op_id, seq, op)
            assert trail[seq - 1].to_status == ActionStatus(status), (op_id, seq, trail)
        # Nothing is half written, including the operations whose writes were cut short.
        stored = await ledger.list()
        assert {op.operation_id for op in stored} >= set(reported)
        for op in stored:
            assert_trail_is_contiguous(op, await ledger.events(op.operation_id))
        # The killed writer left the database writable.
        assert (await ledger.admit(new_op("after-crash"))).created is True
