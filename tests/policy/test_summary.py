"""``confirmation.summary``: checked when the policy loads, filled in where it is shown."""

from __future__ import annotations

import pytest

from pipecat_actions.policy import PolicyError, load_policy_text
from pipecat_actions.policy.summary import SummaryPart, render_summary, summary_text

TOOL = """
version: 1
tools:
  transfer_prescription:
    kind: mutation
    risk: high
    arguments: [rx_id, to_pharmacy]
    before_state_fields: [patient_name, pharmacy]
    confirmation:
      mode: {mode}
      approver_roles: [pharmacist]
      summary: "{summary}"
"""


def _load(summary: str, mode: str = "approval") -> str | None:
    text = TOOL.replace("{mode}", mode).replace("{summary}", summary)
    if mode != "approval":
        text = text.replace("      approver_roles: [pharmacist]\n", "")
    policy = load_policy_text(text)["transfer_prescription"]
    return policy.confirmation.summary


def test_a_summary_over_declared_arguments_and_before_state_fields_loads() -> None:
    summary = "Transfer {rx_id} for {before.patient_name} from {before.pharmacy} to {to_pharmacy}"
    assert _load(summary) == summary


@pytest.mark.parametrize(
    ("summary", "problem"),
    [
        ("Transfer {rx}", "placeholder {rx} reads 'rx', which is not one of the tool's arguments"),
        (
            "For {before.patient}",
            "placeholder {before.patient} reads 'patient', which is not one of the tool's "
            "before_state_fields (patient_name, pharmacy)",
        ),
        ("{before}", "must name a field of the before-state"),
        ("{rx_id[0]}", "must be an argument name or a field of the before-state"),
        ("{rx_id!r}", r"placeholder {rx_id!r}"),
        ("{rx_id:>9}", r"placeholder {rx_id:>9}"),
        ("{}", "must be an argument name"),
        ("Transfer {rx_id", "is not a valid template"),
        ("  ", "must not be empty"),
    ],
)
def test_a_summary_naming_what_the_tool_does_not_have_fails_at_load(
    summary: str, problem: str
) -> None:
    with pytest.raises(PolicyError, match=r"confirmation\.summary") as failed:
        _load(summary)
    assert problem in str(failed.value)


def test_a_summary_without_approval_is_a_mistake() -> None:
    with pytest.raises(PolicyError, match=r"needs confirmation\.mode: approval"):
        _load("Transfer {rx_id}", mode="verbal")


def test_the_parts_are_the_templates_text_the_values_and_what_is_missing() -> None:
    parts = render_summary(
        "Transfer {rx_id} for {before.patient_name} ({before.card.last4}) to {to}",
        {"rx_id": "RX-1", "to": {"id": 7}},
        {"patient_name": "Jane", "card": {}},
    )
    assert parts == (
        SummaryPart("Transfer ", "text"),
        SummaryPart("RX-1", "value"),
        SummaryPart(" for ", "text"),
        SummaryPart("Jane", "value"),
        SummaryPart(" (", "text"),
        SummaryPart("before.card.last4", "missing"),
        SummaryPart(") to ", "text"),
        SummaryPart('{"id": 7}', "value"),
    )
    assert (
        summary_text(parts) == 'Transfer RX-1 for Jane ([missing: before.card.last4]) to {"id": 7}'
    )


def test_without_a_snapshot_every_before_field_is_missing_and_values_are_text() -> None:
    parts = render_summary(
        "{a} {b} {c} {before.x} {{literal}}", {"a": True, "b": None, "c": "<b>x</b>"}, None
    )
    assert summary_text(parts) == "true null <b>x</b> [missing: before.x] {literal}"


def test_a_long_value_is_cut_to_one_line_of_reading() -> None:
    (part,) = render_summary("{note}", {"note": "x" * 1000}, None)
    assert len(part.text) == 200 and part.text.endswith("…")
