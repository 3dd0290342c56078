"""Every scenario file in this directory, replayed on SQLite and PostgreSQL, must pass.

Each run is also checked for what the issue asks of the whole suite:

* its logs (everything loguru writes at DEBUG, Pipecat's lines included) carry none of the
  planted secrets, although the ledger keeps them;
* every status transition of every operation has an audit event naming who did it and why,
  on an operation that names the principal, the tool and the arguments' hash.

A failure prints the scenario's report: the failed checks, what the user heard, each
operation's path and the timeline of steps, ledger writes and utterances.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from pipecat_actions.scenarios import render_reports, run_scenario
from pipecat_actions.scenarios.runner import Run
from pipecat_actions.status import ActionStatus
from pipecat_actions.testing import capture_logs
from pipecat_actions.testing.logs import find_secrets

HERE = Path(__file__).parent
SCENARIOS = sorted(HERE.glob("*.yaml"))

PLANTED = (
    "+44 20 7946 0000",  # book_table phone: a redact path
    "4242424242424242",  # refund_deposit card.number: a redact path
    "12/30",  # card.expiry
    "4111 1111 1111 1111",  # a card number the caller reads out (free text)
    "sk-proj-Zq3x9LmN7pQr2sTv8wXy4A",  # an API key in free text
)
"""Secrets planted in the suite's tool arguments and utterances."""

REQUIRED = {
    # issue 5, item 2
    "barge_in_before_admitted",
    "barge_in_after_running",
    "timeout_after_sending_mutation",
    "duplicate_result",
    "reconnect_while_running",
    "handoff_before_async_completes",
    "crash_between_committed_and_ack",
    "late_result_after_intent_changed",
    "two_concurrent_calls_same_resource",
    "retry_with_provider_idempotency",
    "retry_without_provider_idempotency",
    "regression_pipecat_5779_cancel_overtakes_in_progress",
    "regression_pipecat_4997_call_from_interrupted_generation",
    "regression_lost_result_model_calls_again",
    "regression_runaway_tool_loop",
    "approval_approve",
    "approval_reject",
    "approval_expire",
    "approval_args_changed",
}


def test_the_suite_has_every_scenario_the_issue_lists() -> None:
    assert REQUIRED - {p.stem for p in SCENARIOS} == set()


def test_the_planted_secrets_are_in_the_suite_files() -> None:
    text = "".join(p.read_text() for p in SCENARIOS)
    assert [s for s in PLANTED if s not in text] == []


def audit_gaps(run: Run) -> list[str]:
    """Status changes without a complete audit event, as readable lines."""
    gaps = []
    for op in run.operations:
        if not (op.principal and op.tool and op.args_hash):
            gaps.append(f"{op.operation_id}: principal, tool or args hash missing")
        trail = run.events.get(op.operation_id, [])
        status = ActionStatus.REQUESTED
        for event in trail:
            if event.to_status == event.from_status:
                continue
            if event.from_status is not None and event.from_status != status:
                gaps.append(f"{op.operation_id}: no event for {status} -> {event.from_status}")
            detail = event.detail if isinstance(event.detail, dict) else {}
            if not event.actor or not detail.get("reason"):
                gaps.append(
                    f"{op.operation_id} {op.tool}: {event.from_status} -> {event.to_status} "
                    f"by {event.actor!r} without a reason: {json.dumps(detail)}"
                )
            status = event.to_status
        if status != op.status:
            gaps.append(f"{op.operation_id}: trail ends at {status}, the row says {op.status}")
    return gaps


@pytest.mark.timeout(180)
@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
async def test_scenario_passes(path: Path, ledger_url: str) -> None:
    with capture_logs("DEBUG") as lines:
        report = await run_scenario(path, ledger_url=ledger_url)
    text = io.StringIO()
    render_reports([report], text, verbose=True)
    assert report.passed, text.getvalue()

    assert audit_gaps(report.run) == [], text.getvalue()

    logged = "".join(lines)
    assert lines, "nothing was logged: the scan would prove nothing"
    assert find_secrets(logged, PLANTED) == {}, [
        line for line in lines if find_secrets(line, PLANTED)
    ][:5]
    kept = json.dumps([op.args for op in report.run.operations])
    for secret in PLANTED:
        if secret in path.read_text() and secret not in kept:
            # Planted in an utterance, not in a tool's arguments: it reached the LLM context.
            assert secret in json.dumps(report.run.context), secret
