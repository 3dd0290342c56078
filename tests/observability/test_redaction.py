"""The redactor: redact paths by key and by armed value, common secrets, hostile input."""

from __future__ import annotations

import json
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from loguru import logger

from pipecat_actions.observability.redaction import (
    MASK,
    Redactor,
    install_log_redaction,
    log_redactor,
)
from pipecat_actions.policy import load_policy_text
from pipecat_actions.testing import capture_logs
from pipecat_actions.testing.logs import find_secrets

CARD = "4111 1111 1111 1111"
PHONE = "+44 20 7946 0958"


def redactor(*paths: str) -> Redactor:
    r = Redactor()
    r.add_paths(paths)
    return r


@pytest.mark.parametrize(
    "text",
    [
        f"{{'card': {{'number': '{CARD}', 'cvc': '123'}}}}",  # a Python repr
        json.dumps({"card": {"number": CARD, "cvc": "123"}}),  # JSON
        repr({"arguments": json.dumps({"card": {"number": CARD}})}),  # JSON inside a repr
        json.dumps({"arguments": json.dumps({"card": {"number": CARD}})}),  # JSON in JSON
        f"Card(number={CARD!r}, cvc='123')",  # keyword form
        f"number = {CARD.replace(' ', '')} and more",  # a bare word
    ],
)
def test_the_value_of_a_redact_key_is_masked_in_every_notation(text: str) -> None:
    out = redactor("card.number", "card.cvc").redact_text(text)
    assert find_secrets(out, [CARD]) == {}
    assert MASK in out


def test_a_redacted_list_or_mapping_is_masked_whole() -> None:
    r = redactor("guests")
    text = repr({"guests": [{"phone": PHONE, "tags": ["a]", "b"]}], "party": 4})
    out = r.redact_text(text)
    assert PHONE not in out
    assert out.endswith("'party': 4}")


def test_keys_of_list_items_are_masked_for_every_item() -> None:
    r = redactor("guests[*].phone")
    text = repr({"guests": [{"phone": PHONE}, {"phone": "+1 555 0100 77"}]})
    assert find_secrets(r.redact_text(text), [PHONE, "+1 555 0100 77"]) == {}


def test_an_armed_value_is_masked_wherever_it_appears_later() -> None:
    r = Redactor()
    r.arm(["guests[*].phone", "card.number"], {"guests": [{"phone": PHONE}], "card": {}})
    out = r.redact_text(f"I will text the confirmation to {PHONE}.")
    assert out == f"I will text the confirmation to {MASK}."


def test_values_shorter_than_the_minimum_are_not_armed() -> None:
    r = Redactor(min_value_chars=4)
    r.arm(["card.cvc", "party"], {"card": {"cvc": "123"}, "party": 4})
    assert r.armed_values == 0
    assert r.redact_text("table for 4, room 123") == "table for 4, room 123"


def test_only_the_most_recent_armed_values_are_kept() -> None:
    r = Redactor(max_values=3)
    for index in range(5):
        r.arm(["phone"], {"phone": f"phone-{index:04d}"})
    assert r.armed_values == 3
    assert r.redact_text("phone-0000 phone-0004") == f"phone-0000 {MASK}"


@pytest.mark.parametrize(
    "secret",
    [
        "4111111111111111",  # Visa test card
        "4111-1111-1111-1111",
        "5555 5555 5555 4444",  # Mastercard
        "378282246310005",  # Amex, 15 digits
        "6011111111111117",  # Discover
    ],
)
def test_card_numbers_that_pass_luhn_are_masked_in_free_text(secret: str) -> None:
    out = Redactor().redact_text(f"my card is {secret}, thanks")
    assert out == f"my card is {MASK}, thanks"


@pytest.mark.parametrize(
    "phone", ["+44 20 7946 0000", "+1 (415) 555-0100", "+33612345678", "+49-30-901820"]
)
def test_phone_numbers_in_international_form_are_masked_in_free_text(phone: str) -> None:
    # A caller reads it out before any tool call has armed it as a redact-path value.
    out = Redactor().redact_text(f"my number is {phone}, thanks")
    assert out == f"my number is {MASK}, thanks"


@pytest.mark.parametrize("text", ["x=+123", "a+b", "temp +5 degrees", "version 1.2+3"])
def test_plus_signs_that_are_not_phone_numbers_are_left_alone(text: str) -> None:
    assert Redactor().redact_text(text) == text


def test_a_card_number_after_another_digit_is_still_masked() -> None:
    out = Redactor().redact_text(f"table 2 {CARD} please")
    assert find_secrets(out, [CARD]) == {}


@pytest.mark.parametrize(
    "text",
    [
        "4111111111111112",  # fails Luhn
        "ts 1718000000000 ms",  # an epoch in milliseconds
        "op_01a22bb2c9377b38edbc3b9fde",  # an operation id
        "op_01a23352279260744595e90f2d",  # one whose digits hold a Luhn-valid run
        "9999999999999995",  # passes Luhn but no card starts with 9
        "key=book|00100000000000000a00000000",  # an idempotency key's 00: no dialled +
    ],
)
def test_numbers_that_are_not_card_numbers_are_left_alone(text: str) -> None:
    assert Redactor().redact_text(text) == text


@settings(max_examples=500)
@given(st.text("0123456789abcdef", min_size=26, max_size=26))
def test_identifiers_are_never_masked_whatever_digits_they_hold(hex_id: str) -> None:
    # Operation ids are 26 hex characters: their digit runs pass Luhn one time in ten.
    line = f"op=op_{hex_id} key=book|{hex_id}"
    assert Redactor().redact_text(line) == line


@pytest.mark.parametrize(
    ("text", "secret"),
    [
        ("Authorization: Bearer abcdefghijklmnop.qrstuv", "abcdefghijklmnop.qrstuv"),
        ("Authorization: Basic dXNlcjpwYXNzd29yZA==", "dXNlcjpwYXNzd29yZA=="),
        ("OPENAI_API_KEY=sk-proj-abcdefghijklmnopqrstuv", "sk-proj-abcdefghijklmnopqrstuv"),
        ("using sk-ant-api03-abcdefghijklmnopqrstuv now", "sk-ant-api03-abcdefghijklmnopqrstuv"),
        ("stripe sk_live_abcdefghijklmnopqrstuv", "sk_live_abcdefghijklmnopqrstuv"),
        ("aws AKIAIOSFODNN7EXAMPLE here", "AKIAIOSFODNN7EXAMPLE"),
        ("aws_secret_access_key=wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "wJalrXUtnFEMI"),
        ("gh ghp_abcdefghijklmnopqrstuvwxyz0123456789", "ghp_abcdefghijklmnopqrstuvwxyz0"),
        ("slack xoxb-123456789012-abcdefghijkl", "xoxb-123456789012-abcdefghijkl"),
        ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0In0.abcdefghijkl", "eyJhbGciOiJIUzI1NiJ9"),
        ("password=hunter2-but-longer user=bob", "hunter2-but-longer"),
        ('{"password": "correct horse battery"}', "correct horse battery"),
        ("{'client_secret': 'it''s-a-secret'}", "it''s-a-secret"),
        ("db postgresql://app:pa55word@db-host/actions", "pa55word"),
    ],
)
def test_common_secrets_are_masked(text: str, secret: str) -> None:
    out = Redactor().redact_text(text)
    assert secret not in out
    assert MASK in out


def test_text_without_secrets_is_unchanged() -> None:
    text = "ScriptedLLM#0: Generating LLM response [{'role': 'user', 'content': 'a table at nine'}]"
    assert redactor("card.number").redact_text(text) == text


# --- hostile input: linear time, no recursion ---------------------------------------------


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "text",
    [
        "4" * 1_000_000,
        "4 " * 500_000,
        "\\" * 1_000_000,
        "'" * 1_000_000,
        'password="' * 100_000,
        "'phone': 'x', " * 100_000,
        '\\"phone\\": \\"' * 50_000,
        "Bearer " * 100_000,
        "sk-" + "a" * 1_000_000,
        "[" * 500_000,
    ],
    ids=lambda text: f"{text[:12]!r}x{len(text)}",
)
def test_hostile_text_is_redacted_without_blowing_up(text: str) -> None:
    out = redactor("guests[*].phone").redact_text(text)
    assert isinstance(out, str)


@pytest.mark.timeout(60)
def test_a_huge_nested_value_at_a_redact_key_is_masked_to_its_end() -> None:
    nested = "[" * 200_000 + f"'{PHONE}'" + "]" * 200_000
    text = f"{{'phone': {nested}, 'after': 'visible'}}"
    out = redactor("phone").redact_text(text)
    assert PHONE not in out
    # Longer than the scan limit: masked to the end of the text rather than scanned on.
    assert out == f"{{'phone': {MASK}"


@pytest.mark.timeout(60)
def test_a_secret_after_a_huge_prefix_is_still_found() -> None:
    text = "x" * 2_000_000 + f" card {CARD}"
    assert find_secrets(Redactor().redact_text(text), [CARD]) == {}


def test_deeply_nested_extra_values_are_bounded_not_recursed() -> None:
    value: object = PHONE
    for _ in range(sys.getrecursionlimit() * 2):
        value = [value]
    out = Redactor().redact_value(value)
    assert PHONE not in repr(out)[:1000]


# --- the installed patcher -------------------------------------------------------------------


def test_bound_extra_values_and_exceptions_are_redacted_too() -> None:
    install_log_redaction().add_paths(["card.number"])

    def pay(card: dict[str, str]) -> None:
        raise ValueError(f"declined: {card}")

    with capture_logs() as lines:
        logger.bind(card={"number": CARD}, note=f"token=abcdefghijkl {CARD}").info("paying")
        sink = logger.add(lambda m: lines.append(str(m)), diagnose=True, backtrace=True)
        try:
            pay({"number": CARD})
        except ValueError:
            logger.exception("payment failed")
        finally:
            logger.remove(sink)
    text = "".join(lines)
    assert "paying" in text
    assert "Traceback" in text and "ValueError: declined" in text
    assert find_secrets(text, [CARD, "abcdefghijkl"]) == {}


def test_installing_twice_keeps_one_patcher_and_chains_the_applications() -> None:
    seen: list[str] = []

    def mine(record: object) -> None:
        seen.append("mine")

    install_log_redaction(patcher=mine)
    install_log_redaction()
    with capture_logs() as lines:
        logger.info("secret password=abcdefgh")
    assert seen == ["mine"]
    assert find_secrets("".join(lines), ["abcdefgh"]) == {}
    install_log_redaction(patcher=lambda record: None)  # leave no test patcher behind


def test_a_policy_adds_its_redact_paths() -> None:
    policy = load_policy_text(
        "version: 1\ntools:\n  pay:\n    kind: mutation\n    redact: [card.iban_number]\n"
    )
    install_log_redaction(policy=policy)
    out = log_redactor().redact_text("{'iban_number': 'GB33BUKB20201555555555'}")
    assert "GB33BUKB20201555555555" not in out


def test_find_secrets_counts_json_escaped_and_reseparated_forms() -> None:
    quoted = json.dumps({"a": 'x"y'})
    text = f"{quoted} 4111-1111-1111-1111 {CARD}"
    assert find_secrets(text, ['x"y', CARD, "absent"]) == {'x"y': 1, CARD: 2}


# --- which values are armed ------------------------------------------------------------------


@settings(max_examples=300)
@given(st.lists(st.text(st.characters(categories=["L"]), min_size=1, max_size=20), max_size=6))
def test_plain_words_are_never_armed_whatever_path_holds_them(words: list[str]) -> None:
    r = Redactor()
    r.arm(["phone", "guests[*].phone"], {"phone": words, "guests": [{"phone": w} for w in words]})
    r.arm(["phone"], {"phone": " ".join(words)})
    assert r.armed_values == 0
    line = f"operation escalated: status UNKNOWN {' '.join(words)}"
    assert r.redact_text(line) == line


@pytest.mark.parametrize(
    "value", ["020 7946 0958", "ana@example.com", "BK-4471", "12/2031", 44207946, "4471"]
)
def test_values_that_could_be_a_secret_are_armed(value: object) -> None:
    r = Redactor()
    r.arm(["contact"], {"contact": value})
    assert r.armed_values == 1
    assert MASK in r.redact_text(f"the model read back {value} to the caller")


def _in_digits(text: str, *, zero: int) -> str:
    """``text`` with its digits written in the script whose zero is ``zero``."""
    return text.translate({ord("0") + d: zero + d for d in range(10)})


# --- numbers in the notations people write them -------------------------------------------------


@pytest.mark.parametrize(
    "card",
    [
        "5105.1051.0510.5100",
        "5105/1051/0510/5100",
        "5105_1051_0510_5100",
        "5105\u00a01051\u00a00510\u00a05100",  # no-break spaces
        "5105\u202f1051\u202f0510\u202f5100",  # narrow no-break spaces
        "3782.822463.10005",  # Amex, 4-6-5
        _in_digits("5105105105105100", zero=0xFF10),  # fullwidth digits
        _in_digits("5105 1051 0510 5100", zero=0x0660),  # Arabic-Indic digits
    ],
    ids=[
        "dots",
        "slashes",
        "underscores",
        "nbsp",
        "narrow-nbsp",
        "amex-dots",
        "fullwidth",
        "arabic",
    ],
)
def test_card_numbers_in_other_notations_are_masked(card: str) -> None:
    assert Redactor().redact_text(f"card {card}, expiry soon") == f"card {MASK}, expiry soon"


@pytest.mark.parametrize(
    "phone",
    [
        "(415) 555-0199",
        "(415)555-0199",
        "415-555-0199",
        "415.555.0199",
        "07700 900123",
        "020 7946 0958",
        "0161-496-0000",
        "+44 7700 900123",
        "+1 (415) 555-0199",
        "415 555 0199",
        "1-800-555-0199",
        "07700.900.123",
        "0044 20 7946 0958",
        "0044 (0) 20 7946 0958",
        "00447700900123",
        "0033 1 23 45 67 89",
    ],
)
def test_phone_numbers_in_national_and_international_form_are_masked(phone: str) -> None:
    assert Redactor().redact_text(f"call me on {phone}, thanks") == f"call me on {MASK}, thanks"


@pytest.mark.parametrize(
    ("text", "masked"),
    [
        ("call +44 20 7946 0958 2 guests", f"call {MASK} 2 guests"),
        ("+1 415 555 0199 and 3 more", f"{MASK} and 3 more"),
        ("+33612345678 12 people", f"{MASK} 12 people"),
        ("+86 138 0013 8000 at 9", f"{MASK} at 9"),
        ("0044 20 7946 0958 2 guests", f"{MASK} 2 guests"),
        ("0044 20 7946 0958, 0044 20 7946 0959", f"{MASK}, {MASK}"),
        ("415 555 0199 415 555 0142", f"{MASK} {MASK}"),
        ("07700.900.123, 07700.900.456", f"{MASK}, {MASK}"),
    ],
)
def test_an_international_number_is_masked_to_its_own_end_not_into_the_next(
    text: str, masked: str
) -> None:
    assert Redactor().redact_text(text) == masked


@pytest.mark.parametrize(
    "text",
    [
        "Pipecat 1.14.0 on Python 3.11.7",
        "pi is 3.14159265358979 roughly",
        "host 192.168.100.200 port 8080",
        "at 2026-12-03 17:10:12.851",
        "took 0.123 s for 1234 frames",
        "order 1234.5678 of 12",
        "4111.1111.1111.1112",  # grouped but fails Luhn
        "at 00:00:00 12345678 frames",
        "2026-12-04T20:55:00 1234567",
        "ratio 1.00123456789",
    ],
)
def test_decimals_versions_addresses_and_dates_are_not_numbers_to_mask(text: str) -> None:
    assert Redactor().redact_text(text) == text


def test_find_secrets_sees_a_card_written_with_dots() -> None:
    assert find_secrets("card 5105.1051.0510.5100", ["5105 1051 0510 5100"]) != {}


def _luhn_completed(prefix: str) -> str:
    """``prefix`` with the check digit that makes it pass Luhn."""
    for check in "0123456789":
        digits = prefix + check
        total = sum(
            (d * 2 - 9 if d * 2 > 9 else d * 2) if i % 2 else d
            for i, d in enumerate(int(c) for c in reversed(digits))
        )
        if total % 10 == 0:
            return digits
    raise AssertionError("unreachable")


@settings(max_examples=300)
@given(
    prefix=st.text("0123456789", min_size=14, max_size=14).map(lambda rest: "4" + rest),
    separator=st.sampled_from([" ", "-", ".", "/", "_", "\u00a0", "\u2009", "\u202f", ""]),
    zero=st.sampled_from([0x30, 0xFF10, 0x0660, 0x06F0, 0x0966]),
)
def test_any_luhn_valid_card_in_groups_of_four_is_masked(
    prefix: str, separator: str, zero: int
) -> None:
    card = _luhn_completed(prefix)
    written = _in_digits(separator.join(card[i : i + 4] for i in range(0, 16, 4)), zero=zero)
    assert Redactor().redact_text(f"pay with {written} today") == f"pay with {MASK} today"
