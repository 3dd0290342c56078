"""Loading policies from text and data: only `PolicyError` ever escapes, with every problem."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipecat_actions.errors import PipecatActionsError
from pipecat_actions.policy import (
    PolicyError,
    PolicyProblem,
    ToolKind,
    load_policy_data,
    load_policy_text,
)

VALID = """\
version: 1
tools:
  search_availability:
    kind: read
"""


def test_text_policy_is_named_by_its_source() -> None:
    policies = load_policy_text(VALID, source="inline policy")

    assert policies.source == "inline policy"
    assert policies["search_availability"].kind is ToolKind.READ


def test_text_policy_problems_default_to_the_string_source() -> None:
    with pytest.raises(PolicyError) as caught:
        load_policy_text("version: 1\ntools: {a: {kind: maybe}}\n")

    assert caught.value.problems == [
        PolicyProblem("<string>", "tools.a.kind", "must be one of read, mutation (got 'maybe')")
    ]


def test_policy_error_message_lists_one_problem_per_line() -> None:
    with pytest.raises(PolicyError) as caught:
        load_policy_text("version: 3\ntools: {a: {kind: read, mode: now}}\n", source="p.yaml")

    assert isinstance(caught.value, PipecatActionsError)
    assert caught.value.retryable is False
    assert str(caught.value).splitlines() == [
        "p.yaml: version: unsupported policy version 3: this pipecat_actions reads versions 1 "
        "and 2 (the current one is 2)",
        "p.yaml: tools.a.mode: must be one of blocking, background (got 'now')",
    ]


def test_parsed_data_loads_like_the_same_yaml() -> None:
    from_data = load_policy_data(yaml.safe_load(VALID), source="scenario.yaml")

    assert from_data == load_policy_text(VALID)
    assert from_data.source == "scenario.yaml"


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (None, "got null"),
        ([1, 2], "got a list"),
        ("version: 1", "got 'version: 1'"),
    ],
)
def test_data_that_is_not_a_mapping_is_refused(data: object, reason: str) -> None:
    with pytest.raises(PolicyError) as caught:
        load_policy_data(data)

    (problem,) = caught.value.problems
    assert problem.key_path == ""
    assert "the top level must be a mapping" in problem.reason
    assert reason in problem.reason


def test_data_with_non_text_keys_is_refused_naming_the_key() -> None:
    with pytest.raises(PolicyError) as caught:
        load_policy_data({"version": 1, "tools": {7: {"kind": "read"}}})

    assert [(p.key_path, p.reason) for p in caught.value.problems] == [
        ("tools", "key 7 is not text")
    ]


def test_deeply_nested_data_is_refused_without_a_recursion_error() -> None:
    deep: Any = "leaf"
    for _ in range(5000):
        deep = [deep]

    with pytest.raises(PolicyError):
        load_policy_data(
            {
                "version": 1,
                "tools": {
                    "a": {
                        "kind": "read",
                        "limits": {"overflow": "degrade", "degrade_result": {"x": deep}},
                    }
                },
            }
        )


def test_yaml_one_point_one_booleans_are_fine_where_booleans_are_expected() -> None:
    policies = load_policy_text(
        "version: 1\ntools:\n  b:\n    kind: mutation\n    allow_stale_proposal: yes\n"
    )

    assert policies["b"].allow_stale_proposal is True


def test_quoted_yaml_boolean_words_stay_text() -> None:
    policies = load_policy_text("version: 1\ntools:\n  a: {kind: read, visible_to: ['no', 'on']}\n")

    assert policies["a"].visible_to == ("no", "on")


def test_anchors_without_aliases_are_harmless_and_accepted() -> None:
    policies = load_policy_text("version: 1\ntools:\n  a: &shared {kind: read}\n")

    assert policies.names() == ("a",)


def _assert_only_policy_error_escapes(text: str) -> None:
    problems: list[PolicyProblem] = []
    try:
        load_policy_text(text, source="fuzz.yaml")
    except PolicyError as exc:
        problems = exc.problems
        if not problems:
            pytest.fail("a PolicyError must list at least one problem")
    assert all(p.file == "fuzz.yaml" and p.reason for p in problems)
    assert not any("errors.pydantic.dev" in p.reason for p in problems)


# No wall-clock checks: no per-example deadline, no too-slow health check (a busy machine).
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=200))
def test_arbitrary_text_only_ever_raises_policy_error(text: str) -> None:
    _assert_only_policy_error_escapes(text)


_SETTING_NAMES = [
    "kind",
    "mode",
    "retry",
    "limits",
    "max_attempts",
    "overflow",
    "redact",
    "resource",
    "announce",
    "confirmation",
    "compensation",
    "tool",
    "deadline_secs",
    "timeout_secs",
    "bogus",
]
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-5, max_value=5)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from(["read", "mutation", "queue", "degrade", "{x}", "done", "a.b[*]", ""])
)
_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(_SETTING_NAMES), inner, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.fixed_dictionaries(
        {
            "version": st.sampled_from([1, 1, 2, "1", True]),
            "tools": st.dictionaries(
                st.sampled_from(["a", "b", "book-table", "cancel_booking"]),
                st.dictionaries(st.sampled_from(_SETTING_NAMES), _values, max_size=5),
                max_size=3,
            ),
        },
        optional={"defaults": st.dictionaries(st.sampled_from(_SETTING_NAMES), _values)},
    )
)
def test_policy_shaped_junk_only_ever_raises_policy_error(document: dict[str, Any]) -> None:
    _assert_only_policy_error_escapes(yaml.safe_dump(document))
