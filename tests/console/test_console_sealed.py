"""The console shows sealed values as ••••; an operator with the reveal role may see them.

Even given the runtime's own ledger (which opens sealed values for the effects), the console
reads what is stored. Revealing needs the role, a form of the session, and the keys in the
console's environment; each reveal is recorded on the operation before anything is shown.
"""

from __future__ import annotations

import html
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from cryptography.fernet import Fernet

from pipecat_actions.console import ConsoleSettings, create_app
from pipecat_actions.console.users import Credentials
from pipecat_actions.ledger.keys import ENV_LEDGER_HASH_KEY, ENV_LEDGER_KEYS
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.session import SessionState
from tests.runtime._sealed_support import (
    CARD,
    CVC,
    PHONE,
    Payments,
    environment,
    keys_of,
    leaks,
    payment,
    payments_runtime,
)

from ._support import field, flash

KEY = Fernet.generate_key()


@dataclass
class _Bench:
    runtime: ActionRuntime
    client: httpx.AsyncClient
    paid: str
    waiting: str

    async def sign_in(self, name: str) -> None:
        form = await self.client.get("/login")
        answer = await self.client.post(
            "/login",
            data={"name": name, "password": f"{name}-pw", "csrf": field(form.text, "csrf")},
        )
        assert answer.status_code == 303 and answer.headers["location"] == "/"

    async def reveal(self) -> httpx.Response:
        page = await self.client.get(f"/operations/{self.paid}")
        return await self.client.post(
            f"/operations/{self.paid}/reveal", data={"csrf": field(page.text, "csrf")}
        )

    async def revealed_by(self) -> list[str]:
        events = await self.runtime.ledger.events(self.paid)
        return [e.actor for e in events if (e.detail or {}).get("revealed_by")]


@asynccontextmanager
async def _bench(tmp_path: Path) -> AsyncIterator[_Bench]:
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    async with payments_runtime(url, Payments(), keys_of(KEY)) as rt:
        session = SessionState("call-1", principal="alice")
        paid = await rt.propose("pay_deposit", payment(), session)
        waiting = await rt.propose(
            "refund_to_card", {"card": {"number": CARD, "cvc": CVC}, "amount_cents": 5}, session
        )
        users = Credentials(tmp_path / "users")
        users.add("rosa", "rosa-pw", frozenset({"reveal"}), tenants=["default"])
        users.add("sam", "sam-pw", frozenset(), tenants=["default"])
        # The runtime's own ledger, as an application embedding the console might pass it.
        app = create_app(ConsoleSettings(users=users), rt.ledger, ledger_name="sqlite:///ledger")
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://console.test"
        ) as client:
            yield _Bench(rt, client, str(paid["operation_id"]), str(waiting["operation_id"]))


def _keys_in_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in environment(KEY).items():
        monkeypatch.setenv(name, value)


async def test_pages_show_sealed_values_masked_to_everyone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _keys_in_environment(monkeypatch)
    async with _bench(tmp_path) as bench:
        await bench.sign_in("rosa")
        pages = [
            html.unescape((await bench.client.get(path)).text)
            for path in ("/", f"/operations/{bench.paid}", f"/operations/{bench.waiting}")
        ]

    assert leaks("\n".join(pages)) == {}
    assert '"number": "••••"' in pages[1] and '"holder": "Ada Lovelace"' in pages[1]
    assert '"number": "••••"' in pages[0]  # the approval card too
    assert 'data-testid="reveal"' in pages[1]


async def test_an_operator_without_the_role_cannot_reveal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _keys_in_environment(monkeypatch)
    async with _bench(tmp_path) as bench:
        await bench.sign_in("sam")
        page = (await bench.client.get(f"/operations/{bench.paid}")).text
        answer = await bench.reveal()
        told = flash((await bench.client.get(f"/operations/{bench.paid}")).text)
        revealed = await bench.revealed_by()

    assert 'data-testid="reveal"' not in page and 'data-testid="sealed"' in page
    assert answer.status_code == 303
    assert told == "Not revealed: revealing sealed values needs the role reveal"
    assert revealed == []


async def test_an_operator_with_the_role_sees_the_values_and_it_is_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _keys_in_environment(monkeypatch)
    async with _bench(tmp_path) as bench:
        await bench.sign_in("rosa")
        answer = await bench.reveal()
        revealed = await bench.revealed_by()
        afterwards = html.unescape((await bench.client.get(f"/operations/{bench.paid}")).text)

    shown = html.unescape(answer.text)
    assert answer.status_code == 200
    assert CARD in shown and PHONE in shown and 'data-testid="revealed"' in shown
    assert revealed == ["console:rosa"]
    assert CARD not in afterwards  # one page, once: the next view is masked again


async def test_without_the_keys_the_console_says_so_and_records_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _keys_in_environment(monkeypatch)
    monkeypatch.delenv(ENV_LEDGER_KEYS)
    monkeypatch.delenv(ENV_LEDGER_HASH_KEY)
    async with _bench(tmp_path) as bench:
        await bench.sign_in("rosa")
        answer = await bench.reveal()
        told = flash((await bench.client.get(f"/operations/{bench.paid}")).text)
        revealed = await bench.revealed_by()

    assert answer.status_code == 303
    assert told.startswith("Not revealed: revealing sealed values decrypts them, but ")
    assert f"{ENV_LEDGER_KEYS} is not set" in told
    assert revealed == []
