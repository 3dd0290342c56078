"""The shipped example policies load cleanly and say what their comments promise."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from pipecat_actions.policy import (
    AdmitWhen,
    ConfirmationMode,
    DeliveryMode,
    ExecutionMode,
    IdempotencyScope,
    OnDuplicate,
    OnInterruption,
    Overflow,
    Risk,
    ToolKind,
    check_policy_files,
    load_policy,
)

CONFIGS = Path(__file__).parents[2] / "configs"
CONFIG_FILES = sorted(CONFIGS.glob("*.yaml"))


def test_there_are_example_policies_for_two_domains() -> None:
    assert {p.name for p in CONFIG_FILES} >= {"restaurant.yaml", "ecommerce_support.yaml"}


def test_policy_check_accepts_every_shipped_config() -> None:
    out, err = io.StringIO(), io.StringIO()

    status = check_policy_files([str(p) for p in CONFIG_FILES], out=out, err=err)

    assert (status, err.getvalue()) == (0, "")
    assert out.getvalue().splitlines() == [
        f"OK {p} ({len(load_policy(p))} tools)" for p in CONFIG_FILES
    ]


@pytest.mark.parametrize("config", CONFIG_FILES, ids=lambda p: p.name)
def test_every_shipped_tool_is_described_and_every_risky_one_confirmed(config: Path) -> None:
    for name, policy in load_policy(config).items():
        assert policy.description, name
        assert policy.arguments is not None, name
        if policy.risk is Risk.HIGH:
            assert policy.confirmation.mode is not ConfirmationMode.NONE, name


def test_restaurant_booking_runs_in_the_background_and_is_deduplicated() -> None:
    policies = load_policy(CONFIGS / "restaurant.yaml")
    book = policies["book_table"]

    assert policies.source == str(CONFIGS / "restaurant.yaml")
    assert book.kind is ToolKind.MUTATION
    assert book.mode is ExecutionMode.BACKGROUND
    assert book.cancel_on_interruption is False
    assert book.admit_when is AdmitWhen.TURN_CONFIRMED
    assert book.announce == "Let me book that for you, one moment."
    assert book.idempotency.key_fields == ("restaurant_id", "date", "time", "party_size")
    assert book.idempotency.scope is IdempotencyScope.PRINCIPAL
    assert book.idempotency.provider_dedupes is True
    assert book.retry.max_attempts == 3
    assert book.on_interruption is OnInterruption.CONTINUE
    assert book.on_duplicate is OnDuplicate.JOIN
    assert book.delivery.late is DeliveryMode.WHEN_IDLE
    assert book.delivery.superseded is DeliveryMode.WHEN_IDLE
    assert book.compensation is not None
    assert book.compensation.tool == "cancel_booking"
    assert policies[book.compensation.tool].kind is ToolKind.MUTATION
    assert book.resource_key({"restaurant_id": "r7", "date": "2025-06-01"}) == "table:r7:2025-06-01"
    # The defaults' session budget survives the tool's own limits.
    assert (book.limits.per_principal, book.limits.session_budget) == (1, 20)


def test_restaurant_search_is_a_retried_coalescing_read() -> None:
    search = load_policy(CONFIGS / "restaurant.yaml")["search_availability"]

    assert search.kind is ToolKind.READ
    assert search.retry.max_attempts == 3
    assert search.limits.overflow is Overflow.COALESCE
    assert search.cancel_on_interruption is True


def test_restaurant_refund_needs_approval_and_hides_card_details() -> None:
    refund = load_policy(CONFIGS / "restaurant.yaml")["refund_deposit"]

    assert refund.risk is Risk.HIGH
    assert refund.confirmation.mode is ConfirmationMode.APPROVAL
    assert refund.confirmation.expires_after_secs == 1800
    assert refund.redact == ("card.number", "card.expiry", "card.cvc")
    assert refund.visible_to == ("billing", "host")
    assert refund.on_duplicate is OnDuplicate.REJECT


def test_ecommerce_policies_confirm_changes_and_budget_them_per_session() -> None:
    policies = load_policy(CONFIGS / "ecommerce_support.yaml")

    assert policies["cancel_order"].confirmation.mode is ConfirmationMode.VERBAL
    assert policies["cancel_order"].confirmation.expires_after_secs == 120
    assert policies["issue_refund"].confirmation.mode is ConfirmationMode.APPROVAL
    assert policies["issue_refund"].confirmation.expires_after_secs == 900
    assert policies["update_shipping_address"].redact[0] == "address.street"
    assert policies["update_shipping_address"].limits.session_budget == 2
    assert policies["send_replacement"].on_interruption is OnInterruption.REQUEST_CANCEL
    assert policies["track_shipment"].limits.degrade_result == {
        "status": "unknown",
        "note": "The carrier is busy; tracking will be available again in a minute.",
    }
    assert policies["lookup_order"].max_payload_bytes == 16384
