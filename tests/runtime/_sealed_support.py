"""A payment agent whose policy marks card numbers, CVCs, passwords and phones sensitive.

Shared by the sealed-values tests: the policy, the planted secrets, the actions (which record
what they were handed, to prove they get the real values), keys made for the test, and ways
to read what a database really holds (every byte of a SQLite file and its WAL; every row of a
PostgreSQL ledger read directly) and to search it for the planted secrets.
"""

from __future__ import annotations

import asyncio
import json
import re
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import asyncpg

from pipecat_actions.actions import ActionContext, ActionDefinition, action
from pipecat_actions.admission.authorization import AllowAll
from pipecat_actions.clock import ManualClock
from pipecat_actions.ledger.keys import ENV_LEDGER_HASH_KEY, ENV_LEDGER_KEYS, LedgerKeys
from pipecat_actions.ledger.records import canonical_json
from pipecat_actions.policy import load_policy_text
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.testing.logs import find_secrets

POLICY = """
version: 1
tools:
  pay_deposit:
    kind: mutation
    arguments: [booking_id, card, account_password, guests, amount_cents]
    sensitive:
      card.number: encrypt
      card.cvc: encrypt
      account_password: encrypt
      guests[*].phone: encrypt
      result.card_token: encrypt
      result.receipt.password_hint: hash
      before_state.guest_phone: encrypt
  refund_to_card:
    kind: mutation
    risk: high
    confirmation: {mode: approval, approvers: [rosa]}
    sensitive:
      card.number: encrypt
      card.cvc: encrypt
  lookup_guest:
    kind: read
    sensitive:
      phone: hash
      result.phone: hash
  book_table:
    kind: mutation
"""

CARD = "4242424242424242"
CARD_2 = "5555555555554444"
CVC = "737"
CVC_2 = "9021"
PASSWORD = "Tr0ub4dor&3-horse"
PASSWORD_2 = "correct-battery-staple-42"
PHONE = "+44 20 7946 0958"
PHONE_2 = "+1 415 555 0199"
PHONE_3 = "+33 1 70 36 39 50"
TOKEN = "tok_9f8e7d6c5b4a39281706"
HINT = "blue-whale-of-1987"
PLANTED = [
    CARD, CARD_2, CVC, CVC_2, PASSWORD, PASSWORD_2, PHONE, PHONE_2, PHONE_3, TOKEN, HINT
]  # fmt: skip

FAIL_AMOUNT = 13
"""An amount the payment effect declines, quoting the card and the password in its error."""


def payment(
    *,
    card: str = CARD,
    cvc: str = CVC,
    password: str = PASSWORD,
    phone: str = PHONE,
    amount: int = 2000,
    booking_id: str = "bk_0001",
) -> dict[str, Any]:
    """The arguments of ``pay_deposit``."""
    return {
        "booking_id": booking_id,
        "card": {"number": card, "cvc": cvc, "holder": "Ada Lovelace"},
        "account_password": password,
        "guests": [{"name": "Ada", "phone": phone}, {"name": "Grace", "phone": PHONE_2}],
        "amount_cents": amount,
    }


HASH_KEY = "a-test-hash-key-of-more-than-32-characters"


def keys_of(*fernet_keys: bytes) -> LedgerKeys:
    """The keys a process with these Fernet keys (the first encrypts) and `HASH_KEY` has."""
    return LedgerKeys.from_environment(environment(*fernet_keys))


def environment(*fernet_keys: bytes) -> dict[str, str]:
    """The environment variables of `keys_of`."""
    return {
        ENV_LEDGER_KEYS: ",".join(k.decode() for k in fernet_keys),
        ENV_LEDGER_HASH_KEY: HASH_KEY,
    }


class Payments:
    """The agent's effects; every set of arguments an effect was handed is kept."""

    def __init__(self) -> None:
        self.received: list[tuple[str, dict[str, Any]]] = []

    def actions(self) -> list[ActionDefinition]:
        received = self.received

        async def snapshot(ctx: ActionContext) -> dict[str, Any]:
            return {"guest_phone": ctx.args["guests"][0]["phone"], "balance_cents": 0}

        async def refund(ctx: ActionContext) -> dict[str, Any]:
            received.append(("refund", dict(ctx.args)))
            return {"card_token": TOKEN, "refunded_cents": ctx.args["amount_cents"]}

        @action(snapshot=snapshot, compensate=refund)
        async def pay_deposit(
            ctx: ActionContext,
            booking_id: str,
            card: dict[str, str],
            account_password: str,
            guests: list[dict[str, str]],
            amount_cents: int,
        ) -> dict[str, Any]:
            """Take a deposit for a booking."""
            received.append(("pay_deposit", dict(ctx.args)))
            await ctx.report(f"charging card {card['number']}", card=card["number"])
            if amount_cents == FAIL_AMOUNT:
                raise ValueError(f"card {card['number']} declined; password {account_password}")
            return {"card_token": TOKEN, "receipt": {"password_hint": HINT}, "status": "paid"}

        @action
        async def refund_to_card(
            ctx: ActionContext, card: dict[str, str], amount_cents: int
        ) -> dict[str, Any]:
            """Refund an amount to a card."""
            received.append(("refund_to_card", dict(ctx.args)))
            return {"refund_id": "rf_1"}

        @action
        async def lookup_guest(ctx: ActionContext, phone: str) -> dict[str, Any]:
            """Find a guest by phone."""
            received.append(("lookup_guest", dict(ctx.args)))
            return {"name": "Ada", "phone": phone}

        @action
        async def book_table(ctx: ActionContext, restaurant_id: str, time: str) -> dict[str, Any]:
            """Book a table."""
            received.append(("book_table", dict(ctx.args)))
            return {"booking_id": "bk_9"}

        return [pay_deposit, refund_to_card, lookup_guest, book_table]


@asynccontextmanager
async def payments_runtime(
    ledger_url: str,
    payments: Payments,
    keys: LedgerKeys,
    *,
    clock: ManualClock | None = None,
    recover: bool = True,
    policy: str = POLICY,
) -> AsyncIterator[ActionRuntime]:
    """A runtime of the payment agent on ``ledger_url``, sealing with ``keys``."""
    runtime = await ActionRuntime.create(
        load_policy_text(policy),
        authorizer=AllowAll(),
        actions=payments.actions(),
        ledger_url=ledger_url,
        clock=clock,
        recover=recover,
        lease_secs=30.0,
        ledger_keys=keys,
    )
    try:
        yield runtime
    finally:
        await runtime.close(grace_secs=0)


async def stored_text(ledger_url: str) -> str:
    """Everything the database holds, as text: the raw bytes of a SQLite ledger's files
    (the database, its WAL and shared memory), or every row of a PostgreSQL ledger."""
    if ledger_url.startswith("sqlite"):
        path = Path(ledger_url.removeprefix("sqlite:///"))
        files = sorted(f for f in path.parent.glob(f"{path.name}*") if f.is_file())
        assert files, f"no ledger file at {path}"
        return "".join(f.read_bytes().decode("latin-1") for f in files)
    conn = await asyncpg.connect(ledger_url)
    try:
        rows = await conn.fetch(
            "SELECT row_to_json(o)::text AS t FROM pa_operations o "
            "UNION ALL SELECT row_to_json(e)::text FROM pa_operation_events e"
        )
    finally:
        await conn.close()
    return "\n".join(r["t"] for r in rows)


async def execute(ledger_url: str, sql: str, *params: Any) -> None:
    """Run one statement on the database directly (a damaged or tampered row).

    Parameters are written ``$1``, ``$2`` (PostgreSQL's way; SQLite gets ``?``).
    """
    if ledger_url.startswith("sqlite"):
        path = ledger_url.removeprefix("sqlite:///")

        def run() -> None:
            with sqlite3.connect(path) as conn:
                conn.execute(re.sub(r"\$\d+", "?", sql), params)

        await asyncio.to_thread(run)
        return
    conn = await asyncpg.connect(ledger_url)
    try:
        await conn.execute(sql, *params)
    finally:
        await conn.close()


def leaks(text: str, secrets: list[str] = PLANTED) -> dict[str, int]:
    """The planted secrets found in ``text``: as written, JSON-escaped or (a card) re-spaced,
    and a short one (a CVC) as its JSON text, ``"737"``, so that hex and base64 that happen to
    hold its digits do not count."""
    long = [s for s in secrets if len(s) >= 6]
    found = find_secrets(text, long)
    for secret in secrets:
        if len(secret) < 6 and canonical_json(secret) in text:
            found[secret] = text.count(canonical_json(secret))
    return found


def json_lines(text: str) -> Any:
    """The JSON a command printed."""
    return json.loads(text)
