"""The tool policy model: safe defaults, merge semantics, rules enforced on every instance."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

import pipecat_actions.policy as policy_pkg
from pipecat_actions.policy import (
    AdmitWhen,
    CompensationPolicy,
    ConfirmationMode,
    ConfirmationPolicy,
    DeliveryMode,
    DeliveryPolicy,
    ExecutionMode,
    IdempotencyPolicy,
    IdempotencyScope,
    LimitsPolicy,
    OnDuplicate,
    OnInterruption,
    Overflow,
    PolicyFile,
    PolicySet,
    RetryPolicy,
    Risk,
    ToolKind,
    ToolPolicy,
    load_policy_text,
)

ALL_MODELS: list[type[BaseModel]] = [
    CompensationPolicy,
    ConfirmationPolicy,
    DeliveryPolicy,
    IdempotencyPolicy,
    LimitsPolicy,
    PolicyFile,
    RetryPolicy,
    ToolPolicy,
]


def _policy(text: str) -> PolicySet:
    return load_policy_text(text, source="test.yaml")


def test_a_mutation_with_no_settings_gets_the_safe_defaults() -> None:
    policy = ToolPolicy(kind=ToolKind.MUTATION)

    assert policy.risk is Risk.LOW
    assert policy.mode is ExecutionMode.BLOCKING
    assert policy.admit_when is AdmitWhen.IMMEDIATELY
    assert policy.allow_stale_proposal is False
    assert policy.on_interruption is OnInterruption.CONTINUE
    assert policy.on_duplicate is OnDuplicate.JOIN
    assert policy.retry.max_attempts == 1  # never retried blindly
    assert policy.idempotency.key_fields == ()
    assert policy.idempotency.scope is IdempotencyScope.PRINCIPAL
    assert policy.idempotency.window_secs == 86400
    assert policy.idempotency.provider_dedupes is False
    assert policy.confirmation.mode is ConfirmationMode.NONE
    assert policy.confirmation.expires_after_secs is None
    assert policy.timeout_secs is None
    assert policy.deadline_secs == 30
    assert policy.limits.overflow is Overflow.REJECT
    assert policy.limits.max_queued == 0
    assert policy.delivery.late is DeliveryMode.WHEN_IDLE
    assert policy.delivery.superseded is DeliveryMode.WHEN_IDLE
    assert policy.delivery.intermediate is DeliveryMode.SILENT
    assert policy.resource is None
    assert policy.compensation is None
    assert policy.redact == ()
    assert policy.visible_to == ()
    assert policy.announce is None
    assert policy.arguments is None
    assert policy.max_payload_bytes == 65536


def test_retry_defaults_are_a_single_attempt_with_doubling_backoff() -> None:
    retry = RetryPolicy()

    assert (retry.max_attempts, retry.retries) == (1, 0)
    assert retry.initial_backoff_secs == 0.5
    assert retry.multiplier == 2.0
    assert retry.max_backoff_secs == 10.0
    assert retry.jitter == 0.2


def test_kind_is_required_when_building_a_tool_policy_in_code() -> None:
    with pytest.raises(ValidationError) as caught:
        ToolPolicy.model_validate({})

    assert caught.value.errors()[0]["loc"] == ("kind",)


def test_blocking_mode_cancels_on_interruption_and_background_does_not() -> None:
    assert ToolPolicy(kind=ToolKind.READ).cancel_on_interruption is True
    background = ToolPolicy(kind=ToolKind.MUTATION, mode=ExecutionMode.BACKGROUND)
    assert background.cancel_on_interruption is False


def test_mode_and_on_interruption_are_independent_settings() -> None:
    policy = ToolPolicy(
        kind=ToolKind.MUTATION,
        mode=ExecutionMode.BLOCKING,
        on_interruption=OnInterruption.CONTINUE,
    )

    # Pipecat stops waiting on barge-in, but the business action goes on.
    assert policy.cancel_on_interruption is True
    assert policy.on_interruption is OnInterruption.CONTINUE


def test_resource_key_fills_the_template_from_the_arguments() -> None:
    policy = ToolPolicy(kind=ToolKind.MUTATION, resource="table:{restaurant_id}:{date}")

    key = policy.resource_key({"restaurant_id": 42, "date": "2025-06-01", "time": "21:00"})

    assert key == "table:42:2025-06-01"


def test_resource_key_keeps_literal_braces_and_repeated_placeholders() -> None:
    policy = ToolPolicy(kind=ToolKind.MUTATION, resource="{{x}}:{a}:{a}")

    assert policy.resource_key({"a": "b"}) == "{x}:b:b"


def test_resource_key_is_none_without_a_template() -> None:
    assert ToolPolicy(kind=ToolKind.READ).resource_key({"a": 1}) is None


def test_resource_key_names_a_missing_argument() -> None:
    policy = ToolPolicy(kind=ToolKind.MUTATION, resource="booking:{booking_id}")

    with pytest.raises(KeyError, match="booking_id"):
        policy.resource_key({"date": "2025-06-01"})


def test_confirmation_expiry_defaults_depend_on_the_mode() -> None:
    assert ConfirmationPolicy(mode=ConfirmationMode.VERBAL).expires_after_secs == 120
    assert ConfirmationPolicy(mode=ConfirmationMode.APPROVAL).expires_after_secs == 900
    assert ConfirmationPolicy().expires_after_secs is None
    explicit = ConfirmationPolicy(mode=ConfirmationMode.VERBAL, expires_after_secs=30)
    assert explicit.expires_after_secs == 30


def test_confirmation_expiry_follows_the_merged_mode_not_the_defaults_mode() -> None:
    policies = _policy(
        """
version: 1
defaults:
  confirmation: {mode: verbal}
tools:
  cancel_booking: {kind: mutation}
  refund_deposit: {kind: mutation, confirmation: {mode: approval, approvers: [ops]}}
"""
    )

    assert policies["cancel_booking"].confirmation.expires_after_secs == 120
    assert policies["refund_deposit"].confirmation.expires_after_secs == 900


def test_nested_settings_merge_key_by_key_with_the_tool_winning() -> None:
    policies = _policy(
        """
version: 1
defaults:
  retry: {max_attempts: 3, initial_backoff_secs: 2}
  limits: {session_budget: 5, max_concurrent: 4}
tools:
  search_availability:
    kind: read
    retry: {initial_backoff_secs: 1}
    limits: {max_concurrent: 8}
"""
    )

    policy = policies["search_availability"]
    assert policy.retry.max_attempts == 3  # from defaults
    assert policy.retry.initial_backoff_secs == 1  # the tool's own value wins
    assert policy.retry.multiplier == 2.0  # the model default
    assert policy.limits.session_budget == 5
    assert policy.limits.max_concurrent == 8


def test_lists_and_degrade_results_replace_rather_than_merge() -> None:
    policies = _policy(
        """
version: 1
defaults:
  redact: [phone]
  limits: {overflow: degrade, degrade_result: {status: unknown, note: busy}}
tools:
  search_availability:
    kind: read
    redact: [email]
    limits: {degrade_result: {status: closed}}
"""
    )

    policy = policies["search_availability"]
    assert policy.redact == ("email",)
    assert policy.limits.overflow is Overflow.DEGRADE
    assert policy.limits.degrade_result == {"status": "closed"}


def test_defaults_may_supply_the_kind_and_a_tool_may_override_it() -> None:
    policies = _policy(
        """
version: 1
defaults: {kind: read}
tools:
  search_availability: {}
  book_table: {kind: mutation}
"""
    )

    assert policies["search_availability"].kind is ToolKind.READ
    assert policies["book_table"].kind is ToolKind.MUTATION


def test_a_tool_may_clear_a_default_with_null() -> None:
    policies = _policy(
        """
version: 1
defaults: {timeout_secs: 10}
tools:
  search_availability: {kind: read, timeout_secs: null}
"""
    )

    assert policies["search_availability"].timeout_secs is None


def test_a_rule_broken_only_by_the_merge_is_reported_at_the_tool() -> None:
    with pytest.raises(policy_pkg.PolicyError) as caught:
        _policy(
            """
version: 1
defaults:
  retry: {max_attempts: 3}
tools:
  search_availability: {kind: read}
  book_table: {kind: mutation}
  cancel_booking: {kind: mutation, idempotency: {provider_dedupes: true}}
"""
        )

    assert [(p.file, p.key_path) for p in caught.value.problems] == [
        ("test.yaml", "tools.book_table.retry.max_attempts")
    ]


def test_a_problem_in_defaults_is_reported_once_at_defaults() -> None:
    with pytest.raises(policy_pkg.PolicyError) as caught:
        _policy(
            """
version: 1
defaults: {retry: {max_attempt: 3}}
tools:
  a: {kind: read}
  b: {kind: read}
"""
        )

    assert [p.key_path for p in caught.value.problems] == ["defaults.retry.max_attempt"]


def test_retry_on_non_idempotent_mutation_is_refused_naming_the_key() -> None:
    with pytest.raises(ValidationError, match=r"retry\.max_attempts: .*provider_dedupes"):
        ToolPolicy(kind=ToolKind.MUTATION, retry=RetryPolicy(max_attempts=2))


def test_retry_on_a_mutation_whose_provider_dedupes_is_allowed() -> None:
    policy = ToolPolicy(
        kind=ToolKind.MUTATION,
        retry=RetryPolicy(max_attempts=5),
        idempotency=IdempotencyPolicy(provider_dedupes=True),
    )

    assert policy.retry.retries == 4


def test_reads_may_retry_without_provider_deduplication() -> None:
    assert ToolPolicy(kind=ToolKind.READ, retry=RetryPolicy(max_attempts=4)).retry.retries == 3


def test_coalescing_is_allowed_for_reads() -> None:
    policy = ToolPolicy(kind=ToolKind.READ, limits=LimitsPolicy(overflow=Overflow.COALESCE))

    assert policy.limits.overflow is Overflow.COALESCE


def test_high_risk_mutation_with_verbal_confirmation_is_accepted() -> None:
    policy = ToolPolicy(
        kind=ToolKind.MUTATION,
        risk=Risk.HIGH,
        confirmation=ConfirmationPolicy(mode=ConfirmationMode.VERBAL),
    )

    assert policy.confirmation.expires_after_secs == 120


def test_announce_on_a_background_mutation_is_accepted() -> None:
    policy = ToolPolicy(
        kind=ToolKind.MUTATION,
        mode=ExecutionMode.BACKGROUND,
        admit_when=AdmitWhen.TURN_CONFIRMED,
        announce="Let me book that for you, one moment.",
    )

    assert policy.announce == "Let me book that for you, one moment."


@pytest.mark.parametrize(
    "text",
    ["All done!", "Your table is BOOKED.", "Refunded.", "That's cancelled", "Canceled it"],
)
def test_announce_claiming_an_outcome_is_refused(text: str) -> None:
    with pytest.raises(ValidationError, match="must not claim an outcome"):
        ToolPolicy(kind=ToolKind.MUTATION, mode=ExecutionMode.BACKGROUND, announce=text)


def test_argument_cross_checks_apply_only_when_arguments_are_listed() -> None:
    unchecked = ToolPolicy(
        kind=ToolKind.MUTATION,
        resource="booking:{anything}",
        redact=("card.number",),
        idempotency=IdempotencyPolicy(key_fields=("whatever",)),
    )
    assert unchecked.arguments is None

    with pytest.raises(ValidationError) as caught:
        ToolPolicy(
            kind=ToolKind.MUTATION,
            arguments=(),
            resource="booking:{anything}",
            redact=("card.number",),
        )
    summary = str(caught.value)
    assert "placeholder {anything} is not one of the tool's arguments (it declares none)" in summary
    assert "'card.number' starts with 'card'" in summary


@pytest.mark.parametrize(
    "path", ["card", "card.number", "guests[*].phone", "items[0].price", "a_b.c_d[*][2]"]
)
def test_well_formed_redact_paths_are_accepted(path: str) -> None:
    assert ToolPolicy(kind=ToolKind.READ, redact=(path,)).redact == (path,)


@pytest.mark.parametrize("path", ["", ".card", "card.", "card[]", "card[x]", "1card", "a b"])
def test_malformed_redact_paths_are_refused(path: str) -> None:
    with pytest.raises(ValidationError, match="redact path"):
        ToolPolicy(kind=ToolKind.READ, redact=(path,))


def test_policies_are_frozen() -> None:
    policy = ToolPolicy(kind=ToolKind.READ)

    with pytest.raises(ValidationError, match="frozen"):
        policy.kind = ToolKind.MUTATION  # type: ignore[misc]


def test_policy_set_is_a_read_only_mapping_in_file_order() -> None:
    policies = _policy(
        """
version: 1
tools:
  zeta: {kind: read}
  alpha: {kind: mutation}
"""
    )

    assert policies.source == "test.yaml"
    assert list(policies) == ["zeta", "alpha"]
    assert policies.names() == ("zeta", "alpha")
    assert len(policies) == 2
    assert "alpha" in policies
    assert "beta" not in policies
    assert policies.get("beta") is None
    assert policies.get("alpha") is policies["alpha"]
    with pytest.raises(KeyError, match=r"no policy for tool 'beta' in test\.yaml"):
        policies["beta"]
    with pytest.raises(TypeError):
        policies.tools["beta"] = policies["alpha"]  # type: ignore[index]
    with pytest.raises(AttributeError):
        policies.source = "other.yaml"  # type: ignore[misc]


def test_policy_file_keeps_what_was_written_and_merges_on_request() -> None:
    document = PolicyFile.model_validate(
        {
            "version": 1,
            "defaults": {"retry": {"max_attempts": 2}},
            "tools": {"search_availability": {"kind": "read", "retry": {"jitter": 0}}},
        }
    )

    assert document.names() == ("search_availability",)
    merged = document.settings_for("search_availability")
    assert merged["retry"] == {"max_attempts": 2, "jitter": 0}
    assert ToolPolicy.model_validate(merged).retry.jitter == 0


@pytest.mark.parametrize("model", ALL_MODELS, ids=lambda m: m.__name__)
def test_every_policy_field_has_a_description_for_the_reference(model: type[BaseModel]) -> None:
    undocumented = [name for name, f in model.model_fields.items() if not f.description]

    assert undocumented == []
    assert model.__doc__


@pytest.mark.parametrize("model", ALL_MODELS, ids=lambda m: m.__name__)
def test_every_policy_model_forbids_unknown_keys_and_is_frozen(model: type[BaseModel]) -> None:
    assert model.model_config.get("extra") == "forbid"
    assert model.model_config.get("frozen") is True


def test_policy_package_all_is_sorted_and_importable() -> None:
    names = policy_pkg.__all__

    # isort-style order, as ruff's RUF022 keeps it: CONSTANTS, then Classes, then functions.
    assert names == sorted(names, key=lambda n: (not n.isupper(), not n[:1].isupper(), n))
    assert len(names) == len(set(names))
    for name in names:
        assert getattr(policy_pkg, name) is not None
