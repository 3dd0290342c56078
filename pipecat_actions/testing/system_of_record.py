"""An in-memory restaurant booking and payments provider with fault injection.

`FakeSystemOfRecord` stands in for the real API a tool's effect calls, so agents can be tested
offline. It is deterministic (ids are sequential, time comes from an injectable clock), counts
every real side effect, and can be told to misbehave in the ways that matter for safety: a
request that never leaves, one that commits but loses its answer, one that is refused, one that
hangs, a provider that ignores idempotency keys or has no cancel API.

    sor = FakeSystemOfRecord()
    sor.add_restaurant("trattoria", tables=2)
    sor.faults.lose_response_after_commit("book")
    try:
        await sor.book("trattoria", "2030-05-01", "21:00", 2, "Ada", idempotency_key="op_1")
    except TimeoutError:
        assert sor.find_by_idempotency_key("op_1") is not None  # it did happen
    assert sor.effects_for_key("op_1") == 1

Calls overlap: the latency wait happens outside the fake's lock, which guards only the
decision and the state change. Cancelling the task that awaits a call before it commits
abandons the call and nothing commits (many real providers would still commit it; use
``faults.hang(..., ignore_cancellation=True)`` to model that).
"""

from __future__ import annotations

__all__ = [
    "DEFAULT_SLOTS",
    "Booking",
    "CallOutcome",
    "FakeSystemOfRecord",
    "Faults",
    "OperationKind",
    "Payment",
    "ProviderCall",
    "ProviderCancelled",
    "ProviderError",
    "ProviderRejected",
    "ProviderTimeout",
    "ProviderUnavailable",
    "Refund",
]

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Literal

from pipecat_actions.clock import Clock
from pipecat_actions.testing._faults import (
    CallOutcome,
    Faults,
    OperationKind,
    ProviderCall,
    ProviderCancelled,
    ProviderError,
    ProviderRejected,
    ProviderTimeout,
    ProviderUnavailable,
    _FakeProvider,
)

DEFAULT_SLOTS: tuple[str, ...] = tuple(f"{h:02d}:{m:02d}" for h in range(12, 23) for m in (0, 30))
"""Bookable times of a restaurant unless `add_restaurant` is given others (12:00 to 22:30)."""


@dataclass(frozen=True)
class Booking:
    """A table booking as the provider stores it.

    Attributes:
        booking_id: The provider's id (``bk_0001``...).
        restaurant_id: Where.
        date: The day, as given (``2030-05-01``).
        time: The slot, ``HH:MM``.
        party_size: How many guests.
        guest: The name the booking is under.
        status: ``confirmed`` or ``cancelled``.
        idempotency_key: The key sent with the `book` call that created it, if any.
        created_at: Clock time of the commit that created it.
    """

    booking_id: str
    restaurant_id: str
    date: str
    time: str
    party_size: int
    guest: str
    status: Literal["confirmed", "cancelled"]
    idempotency_key: str | None
    created_at: float


@dataclass(frozen=True)
class Payment:
    """A captured payment that refunds draw on.

    Attributes:
        payment_id: The provider's id.
        amount_cents: The amount captured.
        principal: Who paid (the fake does not check it; authorization is the caller's job).
        refunded_cents: The total refunded so far.
    """

    payment_id: str
    amount_cents: int
    principal: str
    refunded_cents: int = 0


@dataclass(frozen=True)
class Refund:
    """A refund of part or all of a payment.

    Attributes:
        refund_id: The provider's id (``rf_0001``...).
        payment_id: The payment refunded.
        amount_cents: The amount returned.
        status: Always ``succeeded``: the fake refunds at once.
        idempotency_key: The key sent with the `refund` call, if any.
        created_at: Clock time of the commit.
    """

    refund_id: str
    payment_id: str
    amount_cents: int
    status: Literal["succeeded"]
    idempotency_key: str | None
    created_at: float


class FakeSystemOfRecord(_FakeProvider):
    """A deterministic, in-memory booking and payments provider with fault switches.

    Side effects are counted only when a mutation commits: `side_effects` by kind and
    `effects_for_key` by idempotency key, while `calls` counts every call received (deduped,
    failed and read calls too) and `log` holds one `ProviderCall` per mutation.

    Args:
        clock: Where time comes from: any object with ``now()`` and ``async sleep(secs)``.
            Defaults to real time.
        honours_idempotency_keys: Whether a repeated key is answered with the original result
            and no new side effect (Stripe semantics). Only committed results are remembered,
            so a key whose call failed may be used again.
        supports_cancel: Whether `cancel_pending` exists; when False it raises
            `ProviderUnavailable`.
        slow_cancel_secs: How long `cancel_pending` takes before it acts.
        faults: The fault switches; a fresh `Faults` when omitted.

    Attributes:
        faults: The fault switches (`Faults`), armed by tests at any time.
        side_effects: Committed mutations by kind (``book``, ``move``, ``cancel``, ``refund``).
        calls: Every provider API call received, by method name: the mutations,
            ``cancel_pending``, ``search_availability``, ``get_booking`` and
            ``find_by_idempotency_key``. Test helpers (``bookings``, ``refunds``,
            ``get_payment``, ``effects_for_key``) are not counted.
        log: One `ProviderCall` per mutation received, in the order they ended.
    """

    def __init__(
        self,
        *,
        clock: Clock | None = None,
        honours_idempotency_keys: bool = True,
        supports_cancel: bool = True,
        slow_cancel_secs: float = 0.0,
        faults: Faults | None = None,
    ) -> None:
        super().__init__(
            clock=clock,
            honours_idempotency_keys=honours_idempotency_keys,
            supports_cancel=supports_cancel,
            slow_cancel_secs=slow_cancel_secs,
            faults=faults,
        )
        self._tables: dict[str, int] = {}
        self._slots: dict[str, tuple[str, ...]] = {}
        self._max_party: dict[str, int] = {}
        self._bookings: dict[str, Booking] = {}
        self._payments: dict[str, Payment] = {}
        self._refunds: dict[str, Refund] = {}

    # -- setup -----------------------------------------------------------------------------

    def add_restaurant(
        self,
        restaurant_id: str,
        *,
        tables: int,
        slots: Sequence[str] = DEFAULT_SLOTS,
        max_party_size: int = 8,
    ) -> None:
        """Open a restaurant with ``tables`` tables per slot; each booking takes one table."""
        if tables < 0 or max_party_size < 1:
            raise ValueError("tables must be >= 0 and max_party_size >= 1")
        self._tables[restaurant_id] = tables
        self._slots[restaurant_id] = tuple(slots)
        self._max_party[restaurant_id] = max_party_size

    def add_payment(self, payment_id: str, amount_cents: int, principal: str) -> Payment:
        """Record a captured payment that `refund` can draw on, and return it."""
        payment = Payment(payment_id, amount_cents, principal)
        self._payments[payment_id] = payment
        return payment

    # -- reads -----------------------------------------------------------------------------

    def search_availability(
        self, restaurant_id: str, date: str, time: str, party_size: int
    ) -> list[str]:
        """Return the free times on ``date``, nearest to ``time`` first (a read, no faults)."""
        self.calls["search_availability"] += 1
        self._restaurant(restaurant_id)
        wanted = _minutes(time)
        if not 1 <= party_size <= self._max_party[restaurant_id]:
            return []
        free = [
            slot
            for slot in self._slots[restaurant_id]
            if self._taken(restaurant_id, date, slot) < self._tables[restaurant_id]
        ]
        return sorted(free, key=lambda slot: (abs(_minutes(slot) - wanted), slot))

    def get_booking(self, booking_id: str) -> Booking | None:
        """Return the booking's current state, or None when there is no such booking."""
        self.calls["get_booking"] += 1
        return self._bookings.get(booking_id)

    def get_payment(self, payment_id: str) -> Payment | None:
        """Return the payment's current state, or None when there is no such payment."""
        return self._payments.get(payment_id)

    def bookings(
        self,
        restaurant_id: str | None = None,
        status: Literal["confirmed", "cancelled"] | None = None,
    ) -> list[Booking]:
        """Return the bookings, oldest first, optionally of one restaurant or status."""
        return [
            booking
            for booking in self._bookings.values()
            if restaurant_id in (None, booking.restaurant_id) and status in (None, booking.status)
        ]

    def refunds(self, payment_id: str | None = None) -> list[Refund]:
        """Return the refunds, oldest first, optionally of one payment."""
        return [r for r in self._refunds.values() if payment_id in (None, r.payment_id)]

    def find_by_idempotency_key(self, key: str) -> Booking | Refund | None:
        """Return the current state of what the last committed call with ``key`` touched.

        Works whether or not keys are honoured: the provider records the key it was sent.
        None means no call with that key has committed (yet).
        """
        self.calls["find_by_idempotency_key"] += 1
        found = self._latest_by_key.get(key)
        if isinstance(found, Booking):
            return self._bookings[found.booking_id]
        if isinstance(found, Refund):
            return self._refunds[found.refund_id]
        return None

    # -- mutations -------------------------------------------------------------------------

    async def book(
        self,
        restaurant_id: str,
        date: str,
        time: str,
        party_size: int,
        guest: str,
        *,
        idempotency_key: str | None = None,
    ) -> Booking:
        """Book a table; `ProviderRejected` when no table is free or the request is invalid."""
        params: dict[str, object] = {
            "restaurant_id": restaurant_id,
            "date": date,
            "time": time,
            "party_size": party_size,
            "guest": guest,
        }

        def commit(now: float) -> Booking:
            self._check_slot(restaurant_id, date, time, party_size)
            booking_id = f"bk_{len(self._bookings) + 1:04d}"
            booking = Booking(
                booking_id,
                restaurant_id,
                date,
                time,
                party_size,
                guest,
                "confirmed",
                idempotency_key,
                now,
            )
            self._bookings[booking_id] = booking
            return booking

        return await self._mutate("book", params, idempotency_key, commit)

    async def move(
        self, booking_id: str, *, date: str, time: str, idempotency_key: str | None = None
    ) -> Booking:
        """Move a confirmed booking to another slot of the same restaurant."""
        params: dict[str, object] = {"booking_id": booking_id, "date": date, "time": time}

        def commit(now: float) -> Booking:
            booking = self._confirmed(booking_id)
            self._check_slot(booking.restaurant_id, date, time, booking.party_size, booking_id)
            moved = replace(booking, date=date, time=time)
            self._bookings[booking_id] = moved
            return moved

        return await self._mutate("move", params, idempotency_key, commit)

    async def cancel(self, booking_id: str, *, idempotency_key: str | None = None) -> Booking:
        """Cancel a confirmed booking; cancelling it again is rejected."""
        params: dict[str, object] = {"booking_id": booking_id}

        def commit(now: float) -> Booking:
            cancelled = replace(self._confirmed(booking_id), status="cancelled")
            self._bookings[booking_id] = cancelled
            return cancelled

        return await self._mutate("cancel", params, idempotency_key, commit)

    async def refund(
        self, payment_id: str, amount_cents: int, *, idempotency_key: str | None = None
    ) -> Refund:
        """Refund part of a payment; more than what is left is rejected."""
        params: dict[str, object] = {"payment_id": payment_id, "amount_cents": amount_cents}

        def commit(now: float) -> Refund:
            payment = self._payments.get(payment_id)
            if payment is None:
                raise ProviderRejected(f"no payment {payment_id!r}", kind="refund")
            left = payment.amount_cents - payment.refunded_cents
            if not 0 < amount_cents <= left:
                raise ProviderRejected(
                    f"cannot refund {amount_cents} cents of {payment_id!r}: {left} left",
                    kind="refund",
                )
            refund_id = f"rf_{len(self._refunds) + 1:04d}"
            made = Refund(refund_id, payment_id, amount_cents, "succeeded", idempotency_key, now)
            self._refunds[refund_id] = made
            self._payments[payment_id] = replace(
                payment, refunded_cents=payment.refunded_cents + amount_cents
            )
            return made

        return await self._mutate("refund", params, idempotency_key, commit)

    # -- internals -------------------------------------------------------------------------

    def _restaurant(self, restaurant_id: str) -> None:
        if restaurant_id not in self._tables:
            raise ProviderRejected(f"no restaurant {restaurant_id!r}")

    def _taken(self, restaurant_id: str, date: str, time: str, ignore: str | None = None) -> int:
        slot = (restaurant_id, date, time)
        return sum(
            1
            for b in self._bookings.values()
            if b.status == "confirmed"
            and b.booking_id != ignore
            and (b.restaurant_id, b.date, b.time) == slot
        )

    def _check_slot(
        self, restaurant_id: str, date: str, time: str, party_size: int, ignore: str | None = None
    ) -> None:
        self._restaurant(restaurant_id)
        if time not in self._slots[restaurant_id]:
            raise ProviderRejected(f"{time!r} is not a bookable time at {restaurant_id!r}")
        if not 1 <= party_size <= self._max_party[restaurant_id]:
            raise ProviderRejected(f"{restaurant_id!r} cannot seat a party of {party_size}")
        if self._taken(restaurant_id, date, time, ignore) >= self._tables[restaurant_id]:
            raise ProviderRejected(f"no table free at {restaurant_id!r} on {date} at {time}")

    def _confirmed(self, booking_id: str) -> Booking:
        booking = self._bookings.get(booking_id)
        if booking is None:
            raise ProviderRejected(f"no booking {booking_id!r}")
        if booking.status != "confirmed":
            raise ProviderRejected(f"booking {booking_id!r} is already {booking.status}")
        return booking


def _minutes(hhmm: str) -> int:
    hours, _, minutes = hhmm.partition(":")
    try:
        return int(hours) * 60 + int(minutes)
    except ValueError:
        raise ProviderRejected(f"{hhmm!r} is not a time (HH:MM)") from None
