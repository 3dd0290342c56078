"""A console on a real ledger, with a runtime whose refunds wait for a person's approval.

`ConsoleBench` holds the runtime (the agent's side), the credentials file and an httpx client
on the console's ASGI application (the operator's side). Its clock is the runtime's manual
clock, so approval windows and their expiry move only when a test says so.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from pipecat_actions.admission.authorization import AllowAll
from pipecat_actions.clock import ManualClock
from pipecat_actions.console import ConsoleSettings, create_app
from pipecat_actions.console.users import Credentials
from pipecat_actions.ledger import Operation
from pipecat_actions.policy import load_policy_text
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.session import SessionState
from pipecat_actions.status import TERMINAL_STATUSES
from pipecat_actions.testing.restaurant import build_actions, new_system_of_record
from tests._waiting import eventually

POLICY = """
version: 1
tools:
  refund_deposit:
    kind: mutation
    risk: high
    confirmation:
      mode: approval
      expires_after_secs: 600
      approvers: [rosa]
      approver_roles: [manager]
      summary: "Refund {amount} cents for booking {booking_id} (paid {before.paid_cents})"
    mode: background
    idempotency: {key_fields: [booking_id], scope: tenant, provider_dedupes: true}
    deadline_secs: 60
"""

PASSWORDS = {"rosa": "rosa-secret", "alice": "alice-secret", "sam": "sam-secret"}
ROLES = {"rosa": frozenset(), "alice": frozenset({"manager"}), "sam": frozenset({"cook"})}
"""rosa is named by the policy; alice (the caller) is a manager too; sam may not decide."""
TENANTS = {"rosa": {"default"}, "alice": {"default"}, "sam": {"default"}}
"""Everyone works for the callers' tenant (`SessionState`'s default)."""

CALLER = SessionState("call-1", principal="alice")
LEASE_SECS = 30.0


def write_users(path: Path) -> Credentials:
    """A credentials file with rosa, alice and sam, all of tenant default."""
    credentials = Credentials(path)
    for name, password in PASSWORDS.items():
        credentials.add(name, password, ROLES[name], TENANTS[name])
    return credentials


@dataclass
class ConsoleBench:
    runtime: ActionRuntime
    clock: ManualClock
    client: httpx.AsyncClient
    credentials: Credentials
    sor: Any
    app: Any
    """The console's ASGI application (for a client of a test's own)."""

    async def ask_refund(
        self, session: SessionState = CALLER, booking_id: str = "bk_0001", amount: int = 2000
    ) -> Operation:
        told = await self.runtime.propose(
            "refund_deposit", {"booking_id": booking_id, "amount": amount}, session
        )
        assert told["status"] == "awaiting_approval", told
        return await self.runtime.ledger.get(str(told["operation_id"]))

    async def settled(self, operation_id: str) -> Operation:
        """The operation once it left the statuses in flight (after a decision made here).

        A decision made through the ledger reaches the owning runtime at its lease heartbeat,
        which its clock wakes: the clock is moved a heartbeat at a time until then.
        """

        async def done() -> bool:
            op = await self.runtime.ledger.get(operation_id)
            if op.status in TERMINAL_STATUSES:
                return True
            self.clock.advance(LEASE_SECS / 3)
            return False

        await eventually(done, what=f"operation {operation_id} to settle")
        return await self.runtime.ledger.get(operation_id)

    async def sign_in(self, name: str, password: str | None = None) -> httpx.Response:
        form = await self.client.get("/login")
        csrf = field(form.text, "csrf")
        return await self.client.post(
            "/login",
            data={
                "name": name,
                "password": PASSWORDS[name] if password is None else password,
                "csrf": csrf,
            },
        )

    async def csrf(self) -> str:
        return field((await self.client.get("/")).text, "csrf")

    async def decide(
        self,
        op: Operation,
        decision: str = "approve",
        *,
        reason: str = "deposit policy",
        args_hash: str | None = None,
        csrf: str | None = None,
    ) -> str:
        """Post a decision as the page's form does; return the message the page then shows."""
        data = {
            "reason": reason,
            "args_hash": op.args_hash if args_hash is None else args_hash,
            "csrf": await self.csrf() if csrf is None else csrf,
        }
        answer = await self.client.post(f"/approvals/{op.operation_id}/{decision}", data=data)
        assert answer.status_code == 303, answer.text
        page = await self.client.get("/")
        return flash(page.text)


def field(html: str, name: str) -> str:
    """The value of the hidden input ``name`` (the first one) in ``html``."""
    found = re.search(rf'name="{name}" value="([^"]*)"', html)
    assert found, f"no {name} field"
    return found.group(1)


def flash(html: str) -> str:
    """The message at the top of a page, or ''."""
    found = re.search(r'data-testid="flash">([^<]*)<', html)
    return "" if found is None else found.group(1)


@asynccontextmanager
async def console_bench(
    tmp_path: Path, *, policy: str = POLICY, **settings: Any
) -> AsyncIterator[ConsoleBench]:
    clock = ManualClock(start=1_900_000_000.0)
    sor = new_system_of_record(clock=clock)
    runtime = await ActionRuntime.create(
        load_policy_text(policy),
        authorizer=AllowAll(),
        actions=[a for a in build_actions(sor) if a.name == "refund_deposit"],
        ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
        clock=clock,
        lease_secs=LEASE_SECS,
    )
    credentials = write_users(tmp_path / "users")
    options: dict[str, Any] = {"users": credentials, "now": clock.now, **settings}
    if "user_header" in settings:
        options.pop("users")
    app = create_app(ConsoleSettings(**options), runtime.ledger, ledger_name="sqlite:///ledger")
    transport = httpx.ASGITransport(app=app)
    try:
        async with httpx.AsyncClient(
            transport=transport, base_url="http://console.test", follow_redirects=False
        ) as client:
            yield ConsoleBench(runtime, clock, client, credentials, sor, app)
    finally:
        await runtime.close(grace_secs=0)
