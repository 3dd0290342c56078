"""A child process that runs an `ActionRuntime` until the test SIGKILLs it mid-execution.

Usage::

    python -m tests.runtime._runtime_child LEDGER_URL SOR_PATH [LEASE_SECS [OWNER]]

It opens the runtime on ``LEDGER_URL`` with the actions of `file_actions` on the file-backed
system of record at ``SOR_PATH``, proposes every call of `RECOVERY_PLAN` without waiting, and
prints JSON lines on stdout:

* ``{"event": "ready", "owner": ..., "pid": ...}`` once the runtime is open;
* ``{"event": "admitted", "tool": ..., "args": ..., "operation_id": ..., "status": ...}`` after
  each admission (the operation is in the ledger when the line is printed);
* ``{"event": "effect", "name": ..., "phase": "sent" | "committed", ...}`` when an effect reaches
  its hold (`RECOVERY_HOLDS`).

The effects then wait for an hour; the child exits by itself after `_MAX_RUN_SECS` so an orphan
never lingers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from loguru import logger

from pipecat_actions.admission.authorization import AllowAll
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.session import SessionState
from tests.runtime._execution_support import (
    RECOVERY_HOLDS,
    RECOVERY_PLAN,
    RECOVERY_POLICY,
    FileSystemOfRecord,
    file_actions,
    policy,
)

_MAX_RUN_SECS = 60.0
CHILD_LEASE_SECS = 2.0


def say(**message: Any) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


async def main(ledger_url: str, sor_path: str, lease: str = "", owner: str = "") -> None:
    sor = FileSystemOfRecord(Path(sor_path))
    runtime = await ActionRuntime.create(
        policy(RECOVERY_POLICY),
        authorizer=AllowAll(),
        actions=file_actions(sor, holds=RECOVERY_HOLDS, on_event=say),
        ledger_url=ledger_url,
        owner=owner or f"child-{os.getpid()}",
        lease_secs=float(lease) if lease else CHILD_LEASE_SECS,
    )
    say(event="ready", owner=runtime.owner, pid=os.getpid())
    session = SessionState(session_id="call-child", principal="alice")
    for tool, args in RECOVERY_PLAN:
        result = await runtime.propose(tool, args, session, wait=False)
        say(
            event="admitted",
            tool=tool,
            args=args,
            operation_id=result.get("operation_id"),
            status=result.get("status"),
        )
    await asyncio.sleep(_MAX_RUN_SECS)


if __name__ == "__main__":
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    with contextlib.suppress(TimeoutError):
        asyncio.run(asyncio.wait_for(main(*sys.argv[1:5]), _MAX_RUN_SECS))
    os._exit(0)
