"""An approval or rejection a scenario step attempts is checked at that step.

A refused approval used to be a note in the timeline, and the scenario failed much later, at
an ``until`` that gave up waiting. Now the step itself fails, naming the file and line it is
written on; ``refused: true`` says a refusal is the story (and then an acceptance fails it).
"""

from __future__ import annotations

import textwrap
from pathlib import Path
from typing import Any

from pipecat_actions.scenarios import load_scenario_text, run_scenario

ROOT = Path(__file__).resolve().parents[2]
ASK = """\
name: refusals
policy: ../../configs/restaurant.yaml
steps:
  - user: Can I get my deposit back for booking bk_0001?
  - llm:
      say: I will ask a manager.
      calls: [{tool: refund_deposit, as: refund, args: {booking_id: bk_0001, amount: 2000}}]
  - until: {op: refund, status: [AWAITING_APPROVAL]}
  - llm: A manager has to approve it.
  - idle: {quiet_secs: 0.3}
"""
ASK_LINES = ASK.count("\n")


async def play(steps: str) -> Any:
    text = ASK + textwrap.indent(textwrap.dedent(steps), "  ")
    loaded = load_scenario_text(text, source="refusals.yaml", base=ROOT / "tests" / "scenarios")
    return await run_scenario(loaded)


def step_notes(report: Any) -> list[str]:
    return [e.what for e in report.run.timeline if e.what.startswith("step ")]


async def test_an_approval_refused_for_a_missing_role_fails_its_step_at_its_line() -> None:
    report = await play("""\
        - approve: {op: refund, approver: tom, roles: [waiter]}
        - until: {op: refund, status: [COMMITTED]}
        """)
    assert not report.passed
    error = report.run.error
    assert error.startswith(f"refusals.yaml:{ASK_LINES + 1}: approve "), error
    assert "was refused" in error and "'tom'" in error and "['waiter']" in error
    # The run stopped at the approval: the until after it never started.
    assert step_notes(report)[-1].startswith("step 6: approve")
    assert report.run.operations[0].status.value == "AWAITING_APPROVAL"


async def test_an_approval_meant_to_be_refused_passes_when_refused() -> None:
    report = await play("""\
        - approve: {op: refund, approver: tom, roles: [waiter], refused: true}
        - until: {op: refund, status: [AWAITING_APPROVAL]}
        """)
    assert report.run.error is None
    assert "step 7: until" in " ".join(step_notes(report))


async def test_an_approval_meant_to_be_refused_fails_its_step_when_accepted() -> None:
    report = await play("""\
        - approve: {op: refund, refused: true}
        - until: {op: refund, status: [COMMITTED]}
        """)
    assert report.run.error == (
        f"refusals.yaml:{ASK_LINES + 1}: approve {{'op': 'refund', 'refused': True}}: "
        "the approval was accepted, and the step says refused: true"
    )


async def test_a_refused_rejection_fails_its_step_at_its_line() -> None:
    report = await play("""\
        - reject: {op: refund, approver: tom, roles: [waiter]}
        - until: {op: refund, status: [REJECTED]}
        """)
    error = report.run.error
    assert error.startswith(f"refusals.yaml:{ASK_LINES + 1}: reject "), error
    assert "the rejection was refused" in error


async def test_a_refused_approval_inside_together_names_its_own_line() -> None:
    report = await play("""\
        - together:
            - user: {text: "Is the terrace open tonight?", speech_secs: 0.3}
            - approve: {op: refund, approver: tom, roles: [waiter]}
        - llm: Yes, the terrace is open.
        - idle: {quiet_secs: 0.3}
        """)
    error = report.run.error
    assert error.startswith(f"refusals.yaml:{ASK_LINES + 3}: approve "), error
