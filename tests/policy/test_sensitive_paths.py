"""A tool's ``sensitive:`` paths: what may be sealed, and how, checked when the file loads."""

from __future__ import annotations

import pytest

from pipecat_actions.errors import PolicyError
from pipecat_actions.policy import SensitiveMode, load_policy_text


def _tool(entry: str, kind: str = "mutation") -> str:
    return f"version: 1\ntools:\n  pay:\n    kind: {kind}\n{entry}"


def test_argument_result_and_before_state_paths_are_read_with_their_modes() -> None:
    policy = load_policy_text(
        _tool(
            "    sensitive:\n"
            "      card.number: encrypt\n"
            "      guests[*].phone: encrypt\n"
            "      result.payment.card: encrypt\n"
            "      result.receipt: hash\n"
            "      before_state: encrypt\n"
        )
    )["pay"]

    assert policy.sensitive == {
        "card.number": SensitiveMode.ENCRYPT,
        "guests[*].phone": SensitiveMode.ENCRYPT,
        "result.payment.card": SensitiveMode.ENCRYPT,
        "result.receipt": SensitiveMode.HASH,
        "before_state": SensitiveMode.ENCRYPT,
    }
    # Hidden from the logs as well, as redact paths are.
    assert set(policy.sensitive) <= set(policy.redacted_paths)


def test_defaults_give_sensitive_paths_to_every_tool_that_lists_none_of_its_own() -> None:
    text = (
        "version: 1\ndefaults:\n  sensitive: {card.number: encrypt}\n"
        "tools:\n  pay:\n    kind: mutation\n"
        "  change_password:\n    kind: mutation\n    sensitive: {new_password: encrypt}\n"
    )
    policies = load_policy_text(text)

    assert set(policies["pay"].sensitive) == {"card.number"}
    # A tool's own mapping replaces the defaults' whole, as a list does (redact).
    assert set(policies["change_password"].sensitive) == {"new_password"}


@pytest.mark.parametrize(
    ("entry", "kind", "said"),
    [
        (
            "    sensitive: {card.number: hash}\n",
            "mutation",
            "tools.pay.sensitive.card.number: hash keeps only a keyed hash of the value, so a "
            "mutation could not be sent with it",
        ),
        (
            "    sensitive: {card: encrypt, card.number: encrypt}\n",
            "mutation",
            "tools.pay.sensitive.card.number: is inside 'card', which is sensitive already",
        ),
        (
            "    resource: 'guest:{phone}'\n    sensitive: {phone: encrypt}\n",
            "mutation",
            "tools.pay.resource: placeholder {phone} is a sensitive argument",
        ),
        (
            "    arguments: [amount]\n    sensitive: {card.number: encrypt}\n",
            "mutation",
            "tools.pay.sensitive.card.number: starts with 'card', which is not one of the "
            "tool's arguments",
        ),
        (
            "    sensitive: {card.number: scramble}\n",
            "read",
            "tools.pay.sensitive.card.number",
        ),
        (
            "    sensitive: {'card..number': encrypt}\n",
            "read",
            "is not a redact path",
        ),
    ],
)
def test_a_sensitive_path_that_cannot_work_is_refused_at_load(
    entry: str, kind: str, said: str
) -> None:
    with pytest.raises(PolicyError) as refused:
        load_policy_text(_tool(entry, kind))

    assert said in str(refused.value)


def test_a_read_may_keep_only_a_hash_of_its_arguments_and_results() -> None:
    policy = load_policy_text(
        _tool("    sensitive: {phone: hash, result.phone: hash}\n", kind="read")
    )["pay"]

    assert set(policy.sensitive.values()) == {SensitiveMode.HASH}


def test_result_and_before_state_paths_need_no_argument_of_that_name() -> None:
    policy = load_policy_text(
        _tool(
            "    arguments: [card]\n"
            "    sensitive: {card.number: encrypt, result.token: encrypt, before_state.pin: hash}\n"
        )
    )["pay"]

    assert len(policy.sensitive) == 3
