"""Sensitive values never rest in the ledger in plain text, and everything still works.

A payment agent's policy marks card numbers, CVCs, passwords and phones ``sensitive`` (as
arguments, in results, in the before-state). Real runtimes on SQLite and PostgreSQL take
payments, refuse one, fail one whose error quotes the card, report progress quoting it,
compensate one and look guests up by phone; then every byte of the database (the SQLite file
and its WAL; every PostgreSQL row, read directly) and every operator command's text and
``--json`` is searched for each planted secret: none is there. Meanwhile the effects got the
real values, duplicates joined, approvals matched, a restarted runtime ran what was admitted,
keys rotated, and a damaged row was told to the operator in one line and never sent.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet

from pipecat_actions.admission.authorization import AllowAll
from pipecat_actions.approvals import Approver, approve_operation
from pipecat_actions.cli import main
from pipecat_actions.clock import ManualClock
from pipecat_actions.errors import LedgerKeysError
from pipecat_actions.ledger import NewOperation, SqlLedger, hash_arguments
from pipecat_actions.ledger.keys import ENV_LEDGER_HASH_KEY, ENV_LEDGER_KEYS, LedgerKeys
from pipecat_actions.ledger.sealed import SealedLedger, sealer_for
from pipecat_actions.policy import load_policy_text
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.session import SessionState
from pipecat_actions.status import ActionStatus
from pipecat_actions.testing import capture_logs
from tests._waiting import eventually, guarded
from tests.runtime._sealed_support import (
    CARD,
    CARD_2,
    CVC,
    CVC_2,
    FAIL_AMOUNT,
    HINT,
    PASSWORD_2,
    PHONE,
    PHONE_3,
    POLICY,
    TOKEN,
    Payments,
    environment,
    execute,
    keys_of,
    leaks,
    payment,
    payments_runtime,
    stored_text,
)

S = ActionStatus
SESSION = SessionState("call-1", principal="alice")


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _env(monkeypatch: pytest.MonkeyPatch, *fernet_keys: bytes) -> None:
    for name, value in environment(*fernet_keys).items():
        monkeypatch.setenv(name, value)


@dataclass
class _Story:
    """What one run of the payment agent made."""

    paid: str = ""
    joined: str = ""
    failed: str = ""
    refused: str = ""
    looked_up: list[str] = field(default_factory=list)
    compensation: str = ""
    booked: str = ""
    waiting: str = ""
    logs: str = ""
    seen_by_runtime: dict[str, Any] = field(default_factory=dict)


async def _take_payments(ledger_url: str, payments: Payments, keys: LedgerKeys) -> _Story:
    story = _Story()
    with capture_logs("DEBUG") as lines:
        async with payments_runtime(ledger_url, payments, keys) as rt:
            paid = await rt.propose("pay_deposit", payment(), SESSION)
            assert paid["status"] == "committed", paid
            assert paid["result"]["card_token"] == TOKEN  # the conversation hears the real one
            story.paid = str(paid["operation_id"])
            again = await rt.propose("pay_deposit", payment(), SESSION)
            story.joined = str(again["operation_id"])
            failed_args = payment(
                card=CARD_2,
                cvc=CVC_2,
                password=PASSWORD_2,
                phone=PHONE_3,
                amount=FAIL_AMOUNT,
                booking_id="bk_0002",
            )
            failed = await rt.propose("pay_deposit", failed_args, SESSION)
            story.failed = str(failed["operation_id"])
            refused = await rt.propose(
                "pay_deposit", {**payment(booking_id="bk_0003"), "amount_cents": "12"}, SESSION
            )
            assert refused["status"] == "refused", refused
            story.refused = str(refused["operation_id"])
            for _ in range(2):
                read = await rt.propose("lookup_guest", {"phone": PHONE}, SESSION)
                assert read["status"] == "committed", read
                story.looked_up.append(str(read["operation_id"]))
            undone = await rt.compensate(story.paid, actor="test", reason="the guest cancelled")
            story.compensation = undone.operation_id
            booked = await rt.propose(
                "book_table", {"restaurant_id": "r1", "time": "20:00"}, SESSION
            )
            story.booked = str(booked["operation_id"])
            waiting = await rt.propose(
                "refund_to_card",
                {"card": {"number": CARD, "cvc": CVC}, "amount_cents": 500},
                SESSION,
            )
            assert waiting["status"] == "awaiting_approval", waiting
            story.waiting = str(waiting["operation_id"])
            for op_id in (story.paid, story.failed, story.compensation, story.waiting):
                op = await rt.ledger.get(op_id)
                story.seen_by_runtime[op_id] = {
                    "args": op.args,
                    "result": op.result,
                    "before_state": op.before_state,
                }
            # Read while the runtime is open: what the WAL holds counts too.
            assert leaks(await stored_text(ledger_url)) == {}
    story.logs = "".join(lines)
    return story


def test_planted_secrets_are_nowhere_on_disk_nor_in_what_operators_see(
    ledger_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    key = Fernet.generate_key()
    payments = Payments()
    story = asyncio.run(_take_payments(ledger_url, payments, keys_of(key)))

    # The effects and hooks worked with the real values ...
    assert payments.received[0] == ("pay_deposit", payment())
    assert dict(payments.received)["refund"] == payment()
    assert [name for name, _ in payments.received].count("pay_deposit") == 2  # paid, failed
    assert story.joined == story.paid  # the repeat joined the payment
    # ... and so did the runtime's own view of the ledger.
    seen = story.seen_by_runtime
    assert seen[story.paid]["args"] == payment()
    assert seen[story.paid]["result"]["card_token"] == TOKEN
    assert seen[story.paid]["result"]["receipt"]["password_hint"] == HINT  # known in this process
    assert seen[story.paid]["before_state"]["guest_phone"] == PHONE
    assert seen[story.compensation]["args"] == payment()
    assert seen[story.compensation]["result"]["card_token"] == TOKEN
    assert seen[story.waiting]["args"]["card"] == {"number": CARD, "cvc": CVC}

    # Not one planted secret is in the database's bytes, nor in the logs ...
    stored = asyncio.run(stored_text(ledger_url))
    assert leaks(stored) == {}
    assert leaks(story.logs) == {}
    assert "$enc" in stored and "$hmac" in stored  # sealed, not dropped

    # ... nor in anything an operator's command prints, as text or JSON.
    outputs = []
    for argv in (
        ("ledger", "list"),
        ("ledger", "list", "--json"),
        ("undelivered",),
        ("undelivered", "--json"),
        ("approvals", "list"),
        ("approvals", "list", "--json"),
        ("approvals", "show", story.waiting),
        ("approvals", "show", story.waiting, "--json"),
        *(
            ("ledger", "show", op_id, *extra)
            for op_id in (
                story.paid, story.failed, story.refused, story.compensation, *story.looked_up
            )
            for extra in ((), ("--json",))
        ),
    ):  # fmt: skip
        code, out, err = _cli(capsys, *argv, "--ledger", ledger_url)
        assert code == 0, (argv, err)
        outputs.append(out + err)
    assert leaks("\n".join(outputs)) == {}

    rows = {
        r["operation_id"]: r
        for r in json.loads(_cli(capsys, "ledger", "list", "--ledger", ledger_url, "--json")[1])
    }
    assert rows[story.paid]["args"]["card"] == {
        "number": "••••",
        "cvc": "••••",
        "holder": "Ada Lovelace",
    }
    assert rows[story.paid]["args"]["booking_id"] == "bk_0001"  # what is not sensitive stays
    assert rows[story.refused]["args"] == "••••"  # a refusal's arguments are sealed whole
    assert "••••" in rows[story.failed]["error"]  # the error quoted the card: masked
    # A hashed value shows the start of its keyed hash: equal phones look equal.
    first, second = (rows[op_id]["args"]["phone"] for op_id in story.looked_up)
    assert first == second and first.startswith("•••• #")
    # Tools with no sensitive path are stored and shown as they were.
    assert rows[story.booked]["args"] == {"restaurant_id": "r1", "time": "20:00"}
    assert rows[story.booked]["args_hash"] == hash_arguments(
        {"restaurant_id": "r1", "time": "20:00"}
    )

    # An operator with the key sees the values, and that is recorded on the operation.
    _env(monkeypatch, key)
    code, out, _ = _cli(
        capsys, "ledger", "show", story.paid, "--reveal", "--json", "--ledger", ledger_url
    )
    assert code == 0
    shown = json.loads(out)
    assert shown["operation"]["args"] == payment()
    assert shown["operation"]["result"]["card_token"] == TOKEN
    assert shown["operation"]["result"]["receipt"]["password_hint"].startswith("•••• #")
    revealed = [e for e in shown["events"] if (e["detail"] or {}).get("revealed_by")]
    assert [e["actor"] for e in revealed] == [revealed[0]["detail"]["revealed_by"]]
    assert revealed[0]["actor"].startswith("operator:")


async def _ask_refund_then_stop(
    ledger_url: str, payments: Payments, keys: LedgerKeys, clock: ManualClock
) -> str:
    async with payments_runtime(ledger_url, payments, keys, clock=clock) as first:
        asked = await first.propose(
            "refund_to_card", {"card": {"number": CARD, "cvc": CVC}, "amount_cents": 500}, SESSION
        )
        assert asked["status"] == "awaiting_approval", asked
        return str(asked["operation_id"])


async def _approve_and_restart(
    ledger_url: str,
    payments: Payments,
    keys: LedgerKeys,
    clock: ManualClock,
    op_id: str,
    seen_hash: str,
) -> Any:
    ledger = await SqlLedger.create(ledger_url, clock=clock)
    try:
        await approve_operation(
            ledger,
            op_id,
            approver=Approver("rosa", frozenset(), frozenset({"default"})),
            reason="the guest called",
            now=clock.now(),
            args_hash=seen_hash,
        )
    finally:
        await ledger.close()
    clock.advance(120)  # past the stopped runtime's lease
    async with payments_runtime(ledger_url, payments, keys, clock=clock) as second:
        return await guarded(second.wait(op_id), what="the approved refund")


def test_an_approval_of_what_the_operator_saw_runs_with_the_real_card_after_a_restart(
    ledger_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    keys, clock, payments = keys_of(Fernet.generate_key()), ManualClock(), Payments()
    op_id = asyncio.run(_ask_refund_then_stop(ledger_url, payments, keys, clock))

    code, out, _ = _cli(capsys, "approvals", "show", op_id, "--json", "--ledger", ledger_url)
    assert code == 0
    shown = json.loads(out)
    assert shown["args"]["card"] == {"number": "••••", "cvc": "••••"}
    final = asyncio.run(
        _approve_and_restart(ledger_url, payments, keys, clock, op_id, shown["args_hash"])
    )

    assert final.status is S.COMMITTED
    assert payments.received == [
        ("refund_to_card", {"card": {"number": CARD, "cvc": CVC}, "amount_cents": 500})
    ]


async def _admitted_and_damaged(
    ledger_url: str, keys: LedgerKeys, clock: ManualClock
) -> dict[str, str]:
    """Three refunds admitted by a runtime that died before sending them; two rows then
    damaged: one token's bytes, one token copied from another operation."""
    sealer = sealer_for({"refund_to_card": {"card.number": "encrypt"}}, keys)
    assert sealer is not None
    ledger = SealedLedger(await SqlLedger.create(ledger_url, clock=clock), sealer)
    made: dict[str, str] = {}
    try:
        for name, card in (("sound", CARD), ("damaged", CARD_2), ("moved", CARD)):
            admitted = await ledger.admit(
                NewOperation(
                    tool="refund_to_card",
                    kind="mutation",
                    args={"card": {"number": card, "cvc": CVC}, "amount_cents": 100},
                    idempotency_key=f"refund|{name}",
                    session_id="call-9",
                    principal="alice",
                    status=S.ADMITTED,
                    lease_owner="a runtime that died",
                    lease_secs=1.0,
                    deadline_at=clock.now() + 600,
                )
            )
            made[name] = admitted.operation.operation_id
    finally:
        await ledger.close()
    token = await _token(ledger_url, made["damaged"])
    damaged = token[:40] + ("A" if token[40] != "A" else "B") + token[41:]
    replace = (
        "UPDATE pa_operations SET args_json = replace(args_json, $1, $2) WHERE operation_id = $3"
    )
    await execute(ledger_url, replace, token, damaged, made["damaged"])
    moved_from = await _token(ledger_url, made["sound"])
    await execute(
        ledger_url, replace, await _token(ledger_url, made["moved"]), moved_from, made["moved"]
    )
    return made


async def _token(ledger_url: str, op_id: str) -> str:
    ledger = await SqlLedger.create(ledger_url)
    try:
        stored = json.loads((await ledger.get(op_id)).args_json)
    finally:
        await ledger.close()
    return str(stored["card"]["number"]["$enc"])


async def _recover(
    ledger_url: str, payments: Payments, keys: LedgerKeys, clock: ManualClock, ids: list[str]
) -> dict[str, Any]:
    clock.advance(60)
    async with payments_runtime(ledger_url, payments, keys, clock=clock) as rt:
        return {op_id: await guarded(rt.wait(op_id), what=f"{op_id} to settle") for op_id in ids}


def test_a_damaged_or_moved_token_is_told_in_one_line_and_never_sent(
    ledger_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    key = Fernet.generate_key()
    keys, clock, payments = keys_of(key), ManualClock(), Payments()
    made = asyncio.run(_admitted_and_damaged(ledger_url, keys, clock))

    # The operator is told, in words, which value cannot be read, and why; nothing crashes.
    _env(monkeypatch, key)
    said = {}
    for name in ("damaged", "moved"):
        code, out, err = _cli(
            capsys, "ledger", "show", made[name], "--reveal", "--ledger", ledger_url
        )
        assert code == 0, err
        assert "Traceback" not in out + err
        said[name] = out
    assert "[cannot be read: args.card.number cannot be decrypted: it is damaged" in said["damaged"]
    assert "args.card.number holds an encrypted value of another operation" in said["moved"]
    code, out, _ = _cli(capsys, "ledger", "show", made["damaged"], "--ledger", ledger_url)
    assert code == 0 and "••••" in out  # without --reveal: masked, as any other

    # A new runtime recovers all three: the sound one runs with the real card; the other
    # two are failed before sending, saying why, and the runtime goes on.
    finals = asyncio.run(_recover(ledger_url, payments, keys, clock, list(made.values())))
    assert finals[made["sound"]].status is S.COMMITTED
    assert payments.received == [
        ("refund_to_card", {"card": {"number": CARD, "cvc": CVC}, "amount_cents": 100})
    ]
    for name in ("damaged", "moved"):
        final = finals[made[name]]
        assert final.status is S.FAILED_FINAL
        assert final.attempt == 0 and final.sent_at is None
        assert (final.error or "").startswith("not sent: args.card.number ")

    # Rotation reports the damaged tokens in one line each and leaves them as they are.
    _env(monkeypatch, Fernet.generate_key(), key)
    code, out, err = _cli(capsys, "ledger", "rotate-keys", "--ledger", ledger_url)
    assert code == 1
    assert f"cannot be decrypted with any key: {made['damaged']} args.card.number" in out
    assert "Traceback" not in out + err


def test_rotation_reencrypts_every_sealed_value_so_the_old_key_can_go(
    ledger_url: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    old, new = Fernet.generate_key(), Fernet.generate_key()
    payments = Payments()
    story = asyncio.run(_take_payments(ledger_url, payments, keys_of(old)))

    _env(monkeypatch, new, old)
    code, out, err = _cli(capsys, "ledger", "rotate-keys", "--ledger", ledger_url, "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["values"] > 0 and report["unreadable"] == [] and report["busy"] == []
    code, out, _ = _cli(capsys, "ledger", "rotate-keys", "--ledger", ledger_url, "--json")
    assert json.loads(out)["values"] == 0  # everything is under the new key already

    _env(monkeypatch, new)  # the old key is gone
    code, out, _ = _cli(
        capsys, "ledger", "show", story.paid, "--reveal", "--json", "--ledger", ledger_url
    )
    assert json.loads(out)["operation"]["args"] == payment()
    _env(monkeypatch, old)  # the old key alone opens nothing any more
    code, out, _ = _cli(
        capsys, "ledger", "show", story.paid, "--reveal", "--json", "--ledger", ledger_url
    )
    assert json.loads(out)["operation"]["args"]["card"]["number"].startswith("[cannot be read:")
    assert leaks(asyncio.run(stored_text(ledger_url))) == {}

    async def read_with_the_new_key() -> Any:
        async with payments_runtime(ledger_url, Payments(), keys_of(new), recover=False) as rt:
            return (await rt.ledger.get(story.paid)).args

    assert asyncio.run(read_with_the_new_key()) == payment()


@pytest.mark.parametrize(
    ("environ", "missing"),
    [
        ({}, f"{ENV_LEDGER_KEYS} and {ENV_LEDGER_HASH_KEY} are not set"),
        ({ENV_LEDGER_HASH_KEY: "h" * 40}, f"{ENV_LEDGER_KEYS} is not set"),
        ({ENV_LEDGER_KEYS: Fernet.generate_key().decode()}, f"{ENV_LEDGER_HASH_KEY} is not set"),
    ],
)
async def test_a_policy_with_sensitive_values_and_no_key_refuses_to_start_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, environ: dict[str, str], missing: str
) -> None:
    for name in (ENV_LEDGER_KEYS, ENV_LEDGER_HASH_KEY):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    ledger = tmp_path / "ledger.db"

    with pytest.raises(LedgerKeysError) as refused:
        await ActionRuntime.create(
            load_policy_text(POLICY),
            authorizer=AllowAll(),
            actions=Payments().actions(),
            ledger_url=f"sqlite:///{ledger}",
        )

    said = str(refused.value)
    assert "\n" not in said
    assert missing in said and "nothing is stored in plain text" in said
    assert not ledger.exists()  # refused before the ledger was even opened


@dataclass(frozen=True)
class _CountingKeys(LedgerKeys):
    """Keys that count every encryption, decryption and keyed hash."""

    calls: Counter[str] = field(default_factory=Counter, compare=False)

    def encrypt(self, data: bytes) -> str:
        self.calls["encrypt"] += 1
        return super().encrypt(data)

    def decrypt(self, token: str) -> bytes:
        self.calls["decrypt"] += 1
        return super().decrypt(token)

    def digest(self, data: bytes) -> str:
        self.calls["digest"] += 1
        return super().digest(data)


async def test_a_tool_without_sensitive_paths_costs_no_cryptography_and_is_stored_as_before(
    ledger_url: str,
) -> None:
    plain = keys_of(Fernet.generate_key())
    keys = _CountingKeys(encryption=plain.encryption, hash_key=plain.hash_key)
    args = {"restaurant_id": "r1", "time": "20:00"}
    async with payments_runtime(ledger_url, Payments(), keys) as rt:
        booked = await rt.propose("book_table", args, SESSION)
        again = await rt.propose("book_table", args, SESSION)
        op = await rt.ledger.get(str(booked["operation_id"]))
        listed = await rt.ledger.list()
        untouched = dict(keys.calls)
        await rt.propose("pay_deposit", payment(), SESSION)

    assert again["operation_id"] == booked["operation_id"]
    assert untouched == {}
    assert keys.calls["encrypt"] > 0 and keys.calls["digest"] > 0  # the counting works
    assert op.args_json == '{"restaurant_id":"r1","time":"20:00"}'
    assert op.args_hash == hash_arguments(args)
    assert op.idempotency_key.endswith(hash_arguments(args)[:32])
    assert [o.operation_id for o in listed] == [op.operation_id]


async def test_without_sensitive_paths_or_keys_the_ledger_is_not_wrapped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in (ENV_LEDGER_KEYS, ENV_LEDGER_HASH_KEY):
        monkeypatch.delenv(name, raising=False)
    plain_policy = """
version: 1
tools:
  pay_deposit: {kind: mutation}
  refund_to_card: {kind: mutation}
  lookup_guest: {kind: read}
  book_table: {kind: mutation}
"""
    async with payments_runtime(
        f"sqlite:///{tmp_path / 'ledger.db'}", Payments(), LedgerKeys(), policy=plain_policy
    ) as rt:
        chain = []
        ledger: Any = rt.ledger
        while hasattr(ledger, "inner"):
            chain.append(type(ledger).__name__)
            ledger = ledger.inner
    assert "SealedLedger" not in chain


async def test_a_repeat_joins_across_runtimes_that_share_the_keys(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    keys, payments = keys_of(Fernet.generate_key()), Payments()
    async with (
        payments_runtime(url, payments, keys) as one,
        payments_runtime(url, payments, keys, recover=False) as other,
    ):
        first = await one.propose("pay_deposit", payment(), SESSION)
        repeat = await other.propose(
            "pay_deposit", payment(), SessionState("call-2", principal="alice")
        )
        op = await other.ledger.get(str(first["operation_id"]))

    assert repeat["operation_id"] == first["operation_id"]
    assert [name for name, _ in payments.received] == ["pay_deposit"]
    # Stored keyed: neither the key nor the hash is the plain SHA-256 of what it holds.
    assert op.args_hash != hash_arguments(payment())
    intent = hash_arguments(payment())[:32]
    assert not op.idempotency_key.endswith(intent)


async def test_a_restarted_runtime_decrypts_and_runs_what_a_dead_one_admitted(
    ledger_url: str,
) -> None:
    # Admitted by a runtime that died before sending it: recovered from the ledger alone.
    keys, payments, clock = keys_of(Fernet.generate_key()), Payments(), ManualClock()
    sealer = sealer_for({"pay_deposit": {"card.number": "encrypt", "card.cvc": "encrypt"}}, keys)
    assert sealer is not None
    ledger = SealedLedger(await SqlLedger.create(ledger_url, clock=clock), sealer)
    try:
        admitted = await ledger.admit(
            NewOperation(
                tool="pay_deposit",
                kind="mutation",
                args=payment(),
                idempotency_key="pay|1",
                session_id="call-9",
                principal="alice",
                status=S.ADMITTED,
                lease_owner="gone",
                lease_secs=1.0,
                deadline_at=clock.now() + 600,
            )
        )
    finally:
        await ledger.close()
    clock.advance(60)
    async with payments_runtime(ledger_url, payments, keys, clock=clock) as rt:
        op_id = admitted.operation.operation_id
        await eventually(lambda: bool(payments.received), what="the recovered payment to run")
        final = await guarded(rt.wait(op_id), what="the recovered payment")

    assert final.status is S.COMMITTED
    assert payments.received[0] == ("pay_deposit", payment())
