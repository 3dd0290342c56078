"""Sealed values: what is stored in place of a sensitive value, and each way of reading it.

An encrypted value opens only in the operation and part it was sealed for; a mapping that
only looks like a marker is stored and read back as the model sent it, never opened; hashed
values are equal when the values are; free text keeps no sensitive value longer than three
characters but keeps operation ids; the keys' errors name the variable and never a key.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from cryptography.fernet import Fernet

from pipecat_actions.errors import LedgerKeysError
from pipecat_actions.ledger.keys import (
    ENV_LEDGER_HASH_KEY,
    ENV_LEDGER_KEYS,
    LedgerKeys,
    new_keys,
)
from pipecat_actions.ledger.records import canonical_json
from pipecat_actions.ledger.sealing import (
    MASK,
    SealedFields,
    Sealer,
    masked,
    scrub,
)

KEY = Fernet.generate_key()
FIELDS = SealedFields.of(
    {"card.number": "encrypt", "guests[*].phone": "encrypt", "email": "hash", "result": "encrypt"}
)
ARGS: dict[str, Any] = {
    "card": {"number": "4242424242424242", "holder": "Ada"},
    "guests": [{"phone": "+44 20 7946 0958"}, {"phone": "+1 415 555 0199"}],
    "email": "ada@example.com",
}


def _sealer(*fernet_keys: bytes) -> Sealer:
    environ = {ENV_LEDGER_KEYS: ",".join(k.decode() for k in fernet_keys or (KEY,))}
    environ[ENV_LEDGER_HASH_KEY] = "k" * 40
    return Sealer({"pay": FIELDS}, LedgerKeys.from_environment(environ))


def _stored(sealer: Sealer, value: Any, part: str = "args", op: str = "op_1") -> str:
    return canonical_json(sealer.seal(value, FIELDS, part, op))


def test_sealed_values_open_back_to_what_was_sealed_and_nothing_else_changes() -> None:
    sealer = _sealer()
    stored = _stored(sealer, ARGS)

    assert "4242424242424242" not in stored and "7946" not in stored and "ada@" not in stored
    assert json.loads(stored)["card"]["holder"] == "Ada"
    opened = sealer.open(json.loads(stored), operation_id="op_1", part="args")
    # Encrypted values come back; a hashed one stays a marker (only equality can be told).
    assert opened == {**ARGS, "email": json.loads(stored)["email"]}
    assert set(opened["email"]) == {"$hmac"}


def test_a_token_opens_only_in_the_operation_and_part_it_was_sealed_for() -> None:
    sealer = _sealer()
    stored = json.loads(_stored(sealer, ARGS, op="op_1"))

    elsewhere = sealer.open(stored, operation_id="op_2", part="args")
    other_part = sealer.open(stored, operation_id="op_1", part="result")

    assert elsewhere["card"]["number"] == {
        "$unreadable": "args.card.number holds an encrypted value of another operation"
    }
    assert "another operation" in other_part["guests"][1]["phone"]["$unreadable"]
    assert other_part["guests"][1]["phone"]["$unreadable"].startswith("result.guests[1].phone")


def test_a_damaged_token_or_a_missing_key_is_said_in_words_never_raised() -> None:
    sealer = _sealer()
    stored = json.loads(_stored(sealer, ARGS))
    token = stored["card"]["number"]["$enc"]
    stored["card"]["number"]["$enc"] = token[:-6] + "AAAAAA"

    damaged = sealer.reveal(stored, operation_id="op_1", part="args")
    keyless = Sealer({}, LedgerKeys()).reveal(stored, operation_id="op_1", part="args")
    other_key = _sealer(Fernet.generate_key()).open(
        json.loads(_stored(sealer, ARGS)), operation_id="op_1", part="args"
    )

    assert damaged["card"]["number"].startswith(
        "[cannot be read: args.card.number cannot be decrypted: it is damaged"
    )
    assert keyless["guests"][0]["phone"] == (
        f"[cannot be read: args.guests[0].phone is encrypted and {ENV_LEDGER_KEYS} is not set]"
    )
    assert "cannot be decrypted" in other_key["card"]["number"]["$unreadable"]


@pytest.mark.parametrize(
    "sent",
    [
        {"$enc": "gAAAAA-not-ours"},
        {"$hmac": "00"},
        {"$lit": {"$enc": "x"}},
        {"$unreadable": "made up"},
        [{"$enc": {"$enc": "nested"}}],
    ],
)
def test_what_only_looks_like_a_marker_is_kept_as_sent_and_never_opened(sent: Any) -> None:
    sealer = _sealer()
    value = {**ARGS, "notes": sent}
    stored = json.loads(_stored(sealer, value))

    assert sealer.open(stored, operation_id="op_1", part="args")["notes"] == sent
    assert sealer.reveal(stored, operation_id="op_1", part="args")["notes"] == sent
    assert masked(stored)["notes"] == sent


def test_the_operators_view_masks_without_any_key_and_equal_hashes_look_equal() -> None:
    sealer = _sealer()
    one = masked(json.loads(_stored(sealer, ARGS, op="op_1")))
    two = masked(json.loads(_stored(sealer, ARGS, op="op_2")))

    assert one["card"] == {"number": MASK, "holder": "Ada"}
    assert one["guests"] == [{"phone": MASK}, {"phone": MASK}]
    assert one["email"] == two["email"] and one["email"].startswith(f"{MASK} #")
    other = masked(json.loads(_stored(sealer, {**ARGS, "email": "grace@example.com"})))
    assert other["email"] != one["email"]


def test_a_whole_part_is_sealed_as_one_value() -> None:
    sealer = _sealer()
    result = {"token": "tok_abc", "ok": True}
    stored = json.loads(_stored(sealer, result, part="result"))

    assert set(stored) == {"$enc"}
    assert masked(stored) == MASK
    assert sealer.open(stored, operation_id="op_1", part="result") == result


def test_rotation_reencrypts_with_the_first_key_and_keeps_what_the_tokens_hold() -> None:
    old, new = KEY, Fernet.generate_key()
    text = _stored(_sealer(old), ARGS)
    rotating = _sealer(new, old)

    rotated, count, unreadable = rotating.rotate_text(text, part="args")
    again, count_again, _ = rotating.rotate_text(rotated, part="args")

    assert (count, unreadable, count_again, again) == (3, [], 0, rotated)
    opened = _sealer(new).open(json.loads(rotated), operation_id="op_1", part="args")
    assert opened["card"]["number"] == "4242424242424242"
    assert json.loads(rotated)["email"] == json.loads(text)["email"]  # hashes stay


def test_free_text_loses_the_sensitive_values_but_keeps_operation_ids() -> None:
    op_id = "op_01a24e6f63b3202b38c042ae57"
    detail = {
        "error": 'declined 4242424242424242 for "+44 20 7946 0958"',
        "duplicate_of": op_id,
        "nested": ["cvc 737", {"4242424242424242": 1}],
        "fence": 4242,
    }

    scrubbed = scrub(detail, ["4242424242424242", "+44 20 7946 0958", "737", "02a24"])

    assert scrubbed == {
        "error": f'declined {MASK} for "{MASK}"',
        "duplicate_of": op_id,
        "nested": ["cvc 737", {MASK: 1}],  # three characters: too short to mask in text
        "fence": 4242,
    }


@pytest.mark.parametrize(
    ("environ", "said"),
    [
        (
            {ENV_LEDGER_KEYS: f"{KEY.decode()},not-a-key-at-all"},
            f"{ENV_LEDGER_KEYS}: key 2 of 2 is not a Fernet key",
        ),
        ({ENV_LEDGER_HASH_KEY: "short"}, f"{ENV_LEDGER_HASH_KEY} is too short"),
    ],
)
def test_a_malformed_key_is_refused_naming_the_variable_never_the_key(
    environ: dict[str, str], said: str
) -> None:
    with pytest.raises(LedgerKeysError) as refused:
        LedgerKeys.from_environment(environ)

    assert said in str(refused.value)
    assert "not-a-key-at-all" not in str(refused.value)
    assert "short" not in str(refused.value).replace("too short", "")


def test_new_keys_are_accepted_as_they_are_printed() -> None:
    keys = LedgerKeys.from_environment(new_keys())

    assert keys.can_encrypt and keys.hash_key is not None
    assert keys.decrypt(keys.encrypt(b"x")) == b"x"
