"""A restaurant agent's actions on the fake system of record: a complete offline application.

`build_actions(sor)` returns the effects of the tools in ``configs/restaurant.yaml`` with their
hooks (reconcile by idempotency key, compensate a booking by cancelling it, snapshot the slot,
cancel a pending request). The unit tests, the scenario runner (``app: restaurant``), the
realtime and Flows demos use it, in memory and fast. The offline demo and the Daily bot call a
real restaurant server instead, through ``bots/restaurant_api.py``: the adapter to copy when
writing actions for your own provider.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RESTAURANT", "build_actions", "new_system_of_record"]

from pipecat_actions.actions import (
    ActionContext,
    ActionDefinition,
    CancelOutcome,
    Reconciliation,
    action,
)
from pipecat_actions.execution.outcomes import EffectFailed
from pipecat_actions.testing.system_of_record import FakeSystemOfRecord, ProviderRejected

RESTAURANT = "trattoria"


def new_system_of_record(**kwargs: Any) -> FakeSystemOfRecord:
    """Return the demo restaurant's (fake) booking and payment system, seeded."""
    sor = FakeSystemOfRecord(**kwargs)
    sor.add_restaurant(RESTAURANT, tables=4)
    sor.add_payment("dep_bk_0001", 2000, "alice")
    return sor


def build_actions(sor: FakeSystemOfRecord) -> list[ActionDefinition]:
    """Return the restaurant tools' actions, bound to ``sor``."""

    async def find_by_key(ctx: ActionContext) -> Reconciliation:
        found = sor.find_by_idempotency_key(ctx.idempotency_key)
        if found is None:
            return Reconciliation.not_found()
        return Reconciliation.committed(
            {"reference": getattr(found, "booking_id", None) or getattr(found, "refund_id", None)}
        )

    async def cancel_pending(ctx: ActionContext) -> CancelOutcome:
        return CancelOutcome(await sor.cancel_pending(ctx.idempotency_key))

    async def undo_booking(ctx: ActionContext) -> dict[str, Any]:
        assert ctx.operation is not None
        booking_id = str((ctx.operation.result or {}).get("booking_id"))
        try:
            cancelled = await sor.cancel(booking_id, idempotency_key=ctx.idempotency_key)
        except ProviderRejected as exc:
            raise EffectFailed(str(exc)) from exc
        return {"booking_id": cancelled.booking_id, "status": cancelled.status}

    async def snapshot_slot(ctx: ActionContext) -> dict[str, Any]:
        args = ctx.args
        return {
            "free_times": sor.search_availability(
                args["restaurant_id"], args["date"], args["time"], args["party_size"]
            )
        }

    @action
    async def search_availability(
        ctx: ActionContext, restaurant_id: str, date: str, time: str, party_size: int
    ) -> dict[str, Any]:
        """Look up free tables near a time."""
        return {"free_times": sor.search_availability(restaurant_id, date, time, party_size)[:4]}

    @action(reconcile=find_by_key, compensate=undo_booking, snapshot=snapshot_slot)
    async def book_table(
        ctx: ActionContext,
        restaurant_id: str,
        date: str,
        time: str,
        party_size: int,
        guest_name: str = "guest",
        phone: str = "",
    ) -> dict[str, Any]:
        """Book a table; returns the booking reference."""
        try:
            booking = await sor.book(
                restaurant_id,
                date,
                time,
                party_size,
                guest_name,
                idempotency_key=ctx.idempotency_key,
            )
        except ProviderRejected as exc:
            raise EffectFailed(str(exc)) from exc
        return {"booking_id": booking.booking_id, "date": booking.date, "time": booking.time}

    @action(reconcile=find_by_key)
    async def move_booking(
        ctx: ActionContext, booking_id: str, date: str, time: str, party_size: int = 2
    ) -> dict[str, Any]:
        """Move a booking to another date or time."""
        try:
            moved = await sor.move(
                booking_id, date=date, time=time, idempotency_key=ctx.idempotency_key
            )
        except ProviderRejected as exc:
            raise EffectFailed(str(exc)) from exc
        return {"booking_id": moved.booking_id, "date": moved.date, "time": moved.time}

    @action(reconcile=find_by_key, cancel=cancel_pending)
    async def cancel_booking(ctx: ActionContext, booking_id: str) -> dict[str, Any]:
        """Cancel a booking by its reference."""
        try:
            cancelled = await sor.cancel(booking_id, idempotency_key=ctx.idempotency_key)
        except ProviderRejected as exc:
            raise EffectFailed(str(exc)) from exc
        return {"booking_id": cancelled.booking_id, "status": cancelled.status}

    async def snapshot_deposit(ctx: ActionContext) -> dict[str, Any]:
        # What the approver sees before deciding: the deposit as the provider holds it now.
        payment = sor.get_payment(f"dep_{ctx.args['booking_id']}")
        if payment is None:
            return {"deposit": None}
        return {
            "deposit": payment.payment_id,
            "paid_cents": payment.amount_cents,
            "refunded_cents": payment.refunded_cents,
        }

    @action(reconcile=find_by_key, snapshot=snapshot_deposit)
    async def refund_deposit(
        ctx: ActionContext, booking_id: str, amount: int, card: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """Refund the deposit of a booking (amount in cents) to the card it was paid with."""
        try:
            refund = await sor.refund(
                f"dep_{booking_id}", amount, idempotency_key=ctx.idempotency_key
            )
        except ProviderRejected as exc:
            raise EffectFailed(str(exc)) from exc
        return {"refund_id": refund.refund_id, "amount": refund.amount_cents}

    return [search_availability, book_table, move_booking, cancel_booking, refund_deposit]
