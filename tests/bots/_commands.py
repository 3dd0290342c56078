"""What every demo ends with: the operator commands for its own ledger, checked by running them."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path
from typing import Any


def check_operator_commands(
    cwd: Path, printed: str, database: str, ops: list[dict[str, Any]] | None
) -> None:
    """A demo ends with the commands that read its ledger, and they do read it.

    ``ops``: the demo's operations as its ``--json`` gives them (None: not given).
    """
    url = f"sqlite:///{cwd / '.pipecat_actions' / database}"
    told = printed[printed.index("READ THIS DEMO'S LEDGER") :].splitlines()[1:]
    lines = [shlex.split(line) for line in told if line.startswith("  ")]
    commands = {" ".join(words[1:3]): words for words in lines}
    assert commands["ledger list"][1:] == ["ledger", "list", "--ledger", url]
    refunds = [o["operation_id"] for o in ops or [] if o["tool"] == "refund_deposit"]
    if refunds:
        assert commands["ledger show"][1:] == ["ledger", "show", refunds[0], "--ledger", url]
    assert commands["approvals list"][1:] == ["approvals", "list", "--ledger", url]
    assert commands["stats --ledger"][1:] == ["stats", "--ledger", url]
    users = ".pipecat_actions/users"
    assert commands["users add"][1:] == [
        "users",
        "add",
        "rosa",
        "--role",
        "manager",
        "--tenant",
        "default",
        "--users",
        users,
    ]
    assert commands["console --ledger"][1:] == ["console", "--ledger", url, "--users", users]
    env = {k: v for k, v in os.environ.items() if k != "PIPECAT_ACTIONS_LEDGER_URL"}
    for name in ("ledger list", "approvals list", "stats --ledger", "ledger show"):
        if name not in commands:
            assert not refunds  # only `ledger show` of the refund may be left out
            continue
        done = subprocess.run(
            commands[name], cwd=cwd, env=env, capture_output=True, text=True, check=False
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.splitlines()[0] == f"ledger: {url}"
        if name == "ledger list" and ops is not None:
            assert all(o["operation_id"] in done.stdout for o in ops)
