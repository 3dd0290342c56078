"""Log lines about an operation carry its correlation ids, in a form a sink format can print."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from loguru import logger

from pipecat_actions import (
    ActionContext,
    ActionRuntime,
    AllowAll,
    EffectOutcomeUnknown,
    SessionState,
    action,
)
from pipecat_actions.execution.executor import ReconcileSchedule
from pipecat_actions.observability.correlation import LOG_FORMAT
from pipecat_actions.policy import load_policy_text
from pipecat_actions.testing import capture_logs

pytestmark = pytest.mark.timeout(30)

_ROOT = Path(__file__).resolve().parents[2]

POLICY = """
version: 1
tools:
  book_table:
    kind: mutation
  charge:
    kind: mutation
"""


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[ActionRuntime]:
    @action
    async def book_table(ctx: ActionContext, time: str) -> dict[str, Any]:
        """Book a table."""
        logger.info("the application books {}", time)
        return {"booking_id": "bk_1"}

    @action
    async def charge(ctx: ActionContext, amount_cents: int) -> dict[str, Any]:
        """Charge, and lose the answer (no reconcile hook: it is escalated)."""
        raise EffectOutcomeUnknown("the answer was lost")

    opened = await ActionRuntime.create(
        load_policy_text(POLICY),
        authorizer=AllowAll(),
        actions=[book_table, charge],
        ledger_url=f"sqlite:///{tmp_path}/ledger.db",
        schedule=ReconcileSchedule(initial_secs=0.01, max_probes=1),
    )
    yield opened
    await opened.close(grace_secs=0)


def _extras(lines: list[str], needle: str) -> list[str]:
    return [line for line in lines if needle in line]


async def test_the_effects_own_log_lines_carry_the_operations_ids(runtime: ActionRuntime) -> None:
    session = SessionState(session_id="call-7", principal="alice")
    session.start_user_turn()
    session.start_generation()
    with capture_logs(format="{message} || {extra[correlation]}") as lines:
        result = await runtime.propose(
            "book_table", {"time": "21:00"}, session, tool_call_id="call_abc"
        )

    op_id = result["operation_id"]
    (line,) = _extras(lines, "the application books")
    assert f"session=call-7 turn=1 gen=1 call=call_abc op={op_id} tool=book_table" in line
    (outcome,) = _extras(lines, "tool call call_abc of book_table: committed")
    assert f"op={op_id}" in outcome


async def test_an_escalation_line_names_the_operation_session_and_call(
    runtime: ActionRuntime,
) -> None:
    session = SessionState(session_id="call-8", principal="alice")
    with capture_logs(format="{message} || {extra[correlation]}") as lines:
        result = await runtime.propose("charge", {"amount_cents": 100}, session, tool_call_id="c9")

    op_id = result["operation_id"]
    (line,) = _extras(lines, "escalated")
    assert f"session=call-8 turn=0 gen=0 call=c9 op={op_id} tool=charge" in line


def test_the_suggested_format_prints_lines_with_and_without_ids() -> None:
    with capture_logs(format=LOG_FORMAT) as lines:
        logger.info("not about any operation")
        logger.bind(operation_id="op_1", session_id="s").info("about one")
    assert lines[0].rstrip().endswith("not about any operation")
    assert "session=s op=op_1" in lines[1]


def test_the_suggested_format_works_on_lines_logged_before_any_runtime() -> None:
    # A fresh process: no runtime was created, so no redaction patcher adds the correlation.
    code = """
import sys
from loguru import logger
from pipecat_actions.observability.correlation import LOG_FORMAT
logger.remove()
logger.add(sys.stdout, format=LOG_FORMAT, colorize=False, catch=False)
logger.info("starting up")
logger.bind(session_id="call-1", operation_id="op_1").info("about one")
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=_ROOT
    )
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert first.rstrip().endswith("starting up")
    assert second.rstrip().endswith("about one session=call-1 op=op_1")
