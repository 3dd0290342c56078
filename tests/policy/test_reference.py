"""The policy reference in docs/policies.md is the one generated from the model."""

from __future__ import annotations

from pathlib import Path

from pipecat_actions.policy.model import ToolPolicy
from pipecat_actions.policy.reference import policy_reference

POLICIES = Path(__file__).resolve().parents[2] / "docs" / "policies.md"


def test_the_documented_policy_reference_matches_the_model() -> None:
    text = POLICIES.read_text()
    start = text.index("<!-- policy-reference:start -->\n") + len(
        "<!-- policy-reference:start -->\n"
    )
    end = text.index("<!-- policy-reference:end -->")
    assert text[start:end] == policy_reference(), (
        "docs/policies.md: the policy reference is stale: run "
        "`python -m pipecat_actions.policy.reference` "
        "and paste its output between the markers"
    )


def test_every_tool_policy_key_is_in_the_reference() -> None:
    reference = policy_reference()
    for name in ToolPolicy.model_fields:
        assert f"| `{name}` |" in reference
