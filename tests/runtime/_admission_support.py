"""Helpers shared by the admission tests: a small restaurant agent on the fake system of record.

`Restaurant` holds the effects of the agent's tools, bound to one `FakeSystemOfRecord`, and
counts what really happened: bookings and cancellations on the fake, the other mutations in
``effects``, and every argument set an effect was handed in ``received`` (so a test can prove that
no unvalidated payload ever reached an effect). `OwnBookingsOnly` is an authorizer that lets a
principal act only on its own bookings. Policies are written inline as YAML by each test.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from pipecat_actions.actions import ActionContext, ActionDefinition, action
from pipecat_actions.admission.authorization import (
    AllowAll,
    AuthorizationRequest,
    Authorizer,
    Decision,
)
from pipecat_actions.clock import ManualClock
from pipecat_actions.execution.outcomes import EffectFailed
from pipecat_actions.ledger import Operation
from pipecat_actions.policy import PolicySet, load_policy_text
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.status import ActionStatus
from pipecat_actions.testing import FakeSystemOfRecord, ProviderRejected
from tests._waiting import eventually as eventually
from tests._waiting import guarded as guarded

S = ActionStatus
RESTAURANT = "trattoria"
DATE = "2030-05-01"


@dataclass(frozen=True)
class Received:
    """One call of an effect: the tool, the arguments it was handed, and whom it acted for."""

    tool: str
    arguments: dict[str, Any]
    principal: str
    attempt: int


class Restaurant:
    """The effects of a restaurant agent, bound to one fake system of record, with counters.

    Args:
        clock: The test's clock, shared with the fake provider.
        tables: Tables per slot, enough by default that no test runs out.
    """

    def __init__(self, clock: ManualClock, *, tables: int = 1000) -> None:
        self.sor = FakeSystemOfRecord(clock=clock)
        self.sor.add_restaurant(RESTAURANT, tables=tables)
        self.received: list[Received] = []
        self.effects: Counter[str] = Counter()
        self.reads = 0
        self.read_gate = asyncio.Event()
        self.read_gate.set()
        self._definitions = {d.name: d for d in self._build()}

    def actions(self, names: Iterable[str]) -> list[ActionDefinition]:
        """Return the actions named (the tools of a policy)."""
        return [self._definitions[name] for name in names]

    def definition(self, name: str) -> ActionDefinition:
        """Return the action of one tool."""
        return self._definitions[name]

    @property
    def bookings_made(self) -> int:
        """Bookings committed on the fake (a real side effect each)."""
        return self.sor.side_effects["book"]

    @property
    def all_effects(self) -> int:
        """Every committed side effect, on the fake and elsewhere."""
        return sum(self.sor.side_effects.values()) + sum(self.effects.values())

    def unvalidated(self) -> list[Received]:
        """Return every effect call whose arguments do not validate strictly against its tool."""
        bad = []
        for call in self.received:
            model = self._definitions[call.tool].args_model
            try:
                model.model_validate(call.arguments, strict=True)
            except ValueError:
                bad.append(call)
        return bad

    def _receive(self, ctx: ActionContext, **arguments: Any) -> None:
        self.received.append(Received(ctx.tool, arguments, ctx.principal, ctx.attempt))

    def _build(self) -> list[ActionDefinition]:
        sor = self.sor

        @action
        async def book_table(
            ctx: ActionContext,
            restaurant_id: str,
            date: str,
            time: str,
            party_size: int,
            guest: str = "guest",
        ) -> dict[str, Any]:
            """Book a table and return the booking reference."""
            self._receive(
                ctx,
                restaurant_id=restaurant_id,
                date=date,
                time=time,
                party_size=party_size,
                guest=guest,
            )
            try:
                booking = await sor.book(
                    restaurant_id,
                    date,
                    time,
                    party_size,
                    guest,
                    idempotency_key=ctx.idempotency_key,
                )
            except ProviderRejected as exc:
                raise EffectFailed(str(exc)) from exc
            return {"booking_id": booking.booking_id, "time": booking.time}

        @action
        async def cancel_booking(
            ctx: ActionContext,
            booking_id: str,
            principal: str | None = None,
            user_id: str | None = None,
        ) -> dict[str, Any]:
            """Cancel a booking (the principal and user_id arguments are only data)."""
            self._receive(ctx, booking_id=booking_id, principal=principal, user_id=user_id)
            try:
                booking = await sor.cancel(booking_id, idempotency_key=ctx.idempotency_key)
            except ProviderRejected as exc:
                raise EffectFailed(str(exc)) from exc
            return {"booking_id": booking.booking_id, "status": booking.status}

        @action
        async def search_tables(
            ctx: ActionContext, restaurant_id: str, date: str, time: str, party_size: int
        ) -> dict[str, Any]:
            """Return the free times nearest to the one asked for."""
            self._receive(
                ctx, restaurant_id=restaurant_id, date=date, time=time, party_size=party_size
            )
            self.reads += 1
            await self.read_gate.wait()
            try:
                free = sor.search_availability(restaurant_id, date, time, party_size)
            except ProviderRejected as exc:
                raise EffectFailed(str(exc)) from exc
            return {"times": free[:3]}

        @action
        async def add_tip(ctx: ActionContext, booking_id: str, percent: float) -> dict[str, Any]:
            """Add a tip to a booking's bill."""
            self._receive(ctx, booking_id=booking_id, percent=percent)
            self.effects["add_tip"] += 1
            return {"booking_id": booking_id, "percent": percent}

        @action
        async def set_preferences(
            ctx: ActionContext, booking_id: str, preferences: dict[str, Any]
        ) -> dict[str, Any]:
            """Store free-form seating and diet preferences on a booking."""
            self._receive(ctx, booking_id=booking_id, preferences=preferences)
            self.effects["set_preferences"] += 1
            return {"booking_id": booking_id, "stored": len(preferences)}

        @action
        async def invite_guests(
            ctx: ActionContext, booking_id: str, guests: list[str], note: str = ""
        ) -> dict[str, Any]:
            """Send an invitation to each guest of a booking."""
            self._receive(ctx, booking_id=booking_id, guests=guests, note=note)
            self.effects["invite_guests"] += 1
            return {"booking_id": booking_id, "invited": len(guests)}

        return [book_table, cancel_booking, search_tables, add_tip, set_preferences, invite_guests]


class OwnBookingsOnly:
    """Lets a principal act only on bookings it owns; a revoked principal may do nothing.

    Args:
        owners: Booking id to the principal that owns it.
    """

    def __init__(self, owners: Mapping[str, str]) -> None:
        self.owners = dict(owners)
        self.revoked: set[str] = set()
        self.requests: list[AuthorizationRequest] = []

    async def authorize(self, request: AuthorizationRequest) -> Decision:
        """Allow when the session principal owns the booking named in the arguments."""
        self.requests.append(request)
        if request.principal in self.revoked:
            return Decision.deny(f"{request.principal} may no longer use {request.tool}")
        booking_id = request.args.get("booking_id")
        if booking_id is None:
            return Decision.allow()
        if self.owners.get(str(booking_id)) != request.principal:
            return Decision.deny(f"booking {booking_id} does not belong to {request.principal}")
        return Decision.allow()


def policy(text: str) -> PolicySet:
    """Load an inline policy; ``text`` holds the entries under ``tools:``, indented by 2."""
    return load_policy_text("version: 1\ntools:\n" + text)


@asynccontextmanager
async def running(
    tools: str,
    restaurant: Restaurant,
    *,
    ledger_url: str,
    clock: ManualClock,
    authorizer: Authorizer | None = None,
) -> AsyncIterator[ActionRuntime]:
    """Start a runtime with the policy ``tools`` and the restaurant's actions; close it after."""
    policies = policy(tools)
    runtime = await ActionRuntime.create(
        policies,
        authorizer=authorizer or AllowAll(),  # AllowAll: these tests are not about authorization
        actions=restaurant.actions(policies.names()),
        ledger_url=ledger_url,
        clock=clock,
    )
    try:
        yield runtime
    finally:
        await runtime.close(grace_secs=0)


def booking_args(time: str = "20:00", party_size: int = 2, **overrides: Any) -> dict[str, Any]:
    """Return valid arguments of ``book_table``."""
    args: dict[str, Any] = {
        "restaurant_id": RESTAURANT,
        "date": DATE,
        "time": time,
        "party_size": party_size,
    }
    args.update(overrides)
    return args


async def status_of(runtime: ActionRuntime, operation_id: str) -> ActionStatus:
    """Return the ledger status of an operation."""
    return (await runtime.ledger.get(operation_id)).status


async def wait_for_status(
    runtime: ActionRuntime, operation_id: str, *statuses: ActionStatus
) -> Operation:
    """Poll the ledger until the operation is in one of ``statuses`` (only a hang guard limits
    the wait); return it."""
    seen: list[Operation] = []

    async def check() -> bool:
        seen[:] = [await runtime.ledger.get(operation_id)]
        return seen[0].status in statuses

    names = ", ".join(status.value for status in statuses)
    await eventually(
        check, what=lambda: f"{operation_id} to reach {names} (it is {seen[0].status.value})"
    )
    return seen[0]


async def assert_refusal_audited(
    runtime: ActionRuntime,
    result: Mapping[str, Any],
    reason: str,
    *,
    refers_to: str | None = None,
) -> Operation:
    """Assert ``result`` refused the call for ``reason`` and the ledger holds its REJECTED row.

    The result's ``operation_id`` is always the call's own REJECTED row. A refusal that names
    an earlier operation (a duplicate, an idempotency mismatch) names it apart, as
    ``existing_operation_id``, given as ``refers_to``; its own row names it in the audit.
    """
    assert result["status"] == "refused", result
    assert result["reason"] == reason, result
    assert result["message"], result
    op = await runtime.ledger.get(result["operation_id"])
    if refers_to is not None:
        assert result["existing_operation_id"] == refers_to, result
        assert result["operation_id"] != refers_to, result
        assert (await runtime.ledger.events(op.operation_id))[-1].detail.get(
            "duplicate_of"
        ) == refers_to
    assert op.status is S.REJECTED, op
    assert op.error, op
    trail = await runtime.ledger.events(op.operation_id)
    assert trail[-1].to_status is S.REJECTED
    assert trail[-1].detail.get("reason") == reason, trail[-1].detail
    return op


def sqlite_url(directory: Any) -> str:
    """Return the URL of a SQLite ledger file in ``directory`` (a test's ``tmp_path``)."""
    return f"sqlite:///{directory / 'ledger.db'}"
