"""`FakeSystemOfRecord`: bookings, refunds, provider-side idempotency, faults and cancellation.

Time is driven by `SteppedClock`, whose sleeps wake only when the test advances it, so latency
costs no wall time and every interleaving is chosen by the test.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from pipecat_actions.testing.system_of_record import (
    Booking,
    FakeSystemOfRecord,
    ProviderCancelled,
    ProviderError,
    ProviderRejected,
    ProviderTimeout,
    ProviderUnavailable,
    Refund,
)

T0 = 1_000.0
DAY = "2030-05-01"


class SteppedClock:
    """Virtual time: ``sleep`` waits until `advance` moves the clock past its deadline."""

    def __init__(self, start: float = T0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, asyncio.Future[None]]] = []

    def now(self) -> float:
        return self._now

    async def sleep(self, secs: float) -> None:
        wake = asyncio.get_running_loop().create_future()
        self._sleepers.append((self._now + secs, wake))
        await wake

    @property
    def sleeping(self) -> int:
        return sum(1 for _, wake in self._sleepers if not wake.done())

    async def advance(self, secs: float) -> None:
        self._now += secs
        for due, wake in self._sleepers:
            if due <= self._now and not wake.done():
                wake.set_result(None)
        self._sleepers = [(due, wake) for due, wake in self._sleepers if not wake.done()]
        await settle()


async def settle(rounds: int = 20) -> None:
    """Let every runnable task go as far as it can without time passing."""
    for _ in range(rounds):
        await asyncio.sleep(0)


async def until(condition: Callable[[], bool], rounds: int = 100) -> None:
    for _ in range(rounds):
        if condition():
            return
        await asyncio.sleep(0)
    raise AssertionError("condition never became true")


@pytest.fixture
def stepped() -> SteppedClock:
    return SteppedClock()


@pytest.fixture
def sor(stepped: SteppedClock) -> FakeSystemOfRecord:
    fake = FakeSystemOfRecord(clock=stepped)
    fake.add_restaurant("trattoria", tables=2)
    fake.add_payment("pay_1", 5_000, "user:ada")
    return fake


async def book(sor: FakeSystemOfRecord, key: str | None = "op_1", time: str = "21:00") -> Booking:
    return await sor.book("trattoria", DAY, time, 2, "Ada", idempotency_key=key)


# --- the domain --------------------------------------------------------------------------------


async def test_book_confirms_a_booking_and_counts_one_side_effect(
    sor: FakeSystemOfRecord,
) -> None:
    booking = await book(sor)

    assert booking == Booking(
        "bk_0001", "trattoria", DAY, "21:00", 2, "Ada", "confirmed", "op_1", T0
    )
    assert sor.get_booking("bk_0001") == booking
    assert sor.side_effects == {"book": 1}
    assert sor.effects_for_key("op_1") == 1
    assert [(c.kind, c.outcome, c.idempotency_key, c.at) for c in sor.log] == [
        ("book", "committed", "op_1", T0)
    ]


async def test_book_is_refused_when_no_table_is_free(sor: FakeSystemOfRecord) -> None:
    await book(sor, "op_1")
    await book(sor, "op_2")

    with pytest.raises(ProviderRejected, match="no table free") as refused:
        await book(sor, "op_3")

    assert (refused.value.kind, refused.value.idempotency_key) == ("book", "op_3")
    assert sor.side_effects == {"book": 2}
    assert sor.calls["book"] == 3
    assert sor.find_by_idempotency_key("op_3") is None
    assert sor.log[-1].outcome == "rejected"


async def test_search_availability_lists_free_times_nearest_first(
    sor: FakeSystemOfRecord,
) -> None:
    sor.add_restaurant("bistro", tables=1, slots=["20:00", "20:30", "21:00", "21:30"])
    await sor.book("bistro", DAY, "21:00", 2, "Ada")

    assert sor.search_availability("bistro", DAY, "21:00", 2) == ["20:30", "21:30", "20:00"]
    assert sor.search_availability("bistro", "2030-05-02", "21:00", 2)[0] == "21:00"
    assert sor.search_availability("bistro", DAY, "21:00", 40) == []
    assert sor.calls["search_availability"] == 3


async def test_move_takes_the_new_slot_and_frees_the_old_one(sor: FakeSystemOfRecord) -> None:
    sor.add_restaurant("bistro", tables=1, slots=["21:00", "21:30"])
    first = await sor.book("bistro", DAY, "21:00", 2, "Ada")

    moved = await sor.move(first.booking_id, date=DAY, time="21:30", idempotency_key="mv_1")

    assert (moved.booking_id, moved.time, moved.status) == (first.booking_id, "21:30", "confirmed")
    assert sor.search_availability("bistro", DAY, "21:00", 2) == ["21:00"]
    assert sor.find_by_idempotency_key("mv_1") == moved
    second = await sor.book("bistro", DAY, "21:00", 2, "Grace")
    with pytest.raises(ProviderRejected, match="no table free"):
        await sor.move(second.booking_id, date=DAY, time="21:30")
    assert sor.side_effects == {"book": 2, "move": 1}


async def test_cancel_frees_the_table_and_cancelling_again_is_rejected(
    sor: FakeSystemOfRecord,
) -> None:
    booking = await book(sor)

    cancelled = await sor.cancel(booking.booking_id, idempotency_key="cx_1")

    assert cancelled.status == "cancelled"
    assert sor.bookings(status="confirmed") == []
    assert sor.find_by_idempotency_key("op_1") == cancelled  # the current state, not the original
    with pytest.raises(ProviderRejected, match="already cancelled"):
        await sor.cancel(booking.booking_id)
    assert sor.side_effects == {"book": 1, "cancel": 1}


async def test_refund_is_deduplicated_and_cannot_exceed_what_is_left(
    sor: FakeSystemOfRecord,
) -> None:
    first = await sor.refund("pay_1", 3_000, idempotency_key="rf_key")
    again = await sor.refund("pay_1", 3_000, idempotency_key="rf_key")

    assert first == again == Refund("rf_0001", "pay_1", 3_000, "succeeded", "rf_key", T0)
    with pytest.raises(ProviderRejected, match="2000 left"):
        await sor.refund("pay_1", 3_000, idempotency_key="rf_other")
    payment = sor.get_payment("pay_1")
    assert payment is not None and payment.refunded_cents == 3_000
    assert sor.refunds("pay_1") == [first]
    assert sor.side_effects == {"refund": 1}


# --- provider-side idempotency -----------------------------------------------------------------


async def test_a_repeated_key_returns_the_original_booking_without_a_new_side_effect(
    sor: FakeSystemOfRecord,
) -> None:
    first = await book(sor, "op_1")
    second = await book(sor, "op_1")

    assert second == first
    assert sor.effects_for_key("op_1") == 1
    assert sor.side_effects["book"] == 1
    assert sor.calls["book"] == 2
    assert [c.outcome for c in sor.log] == ["committed", "replayed"]


async def test_a_provider_ignoring_keys_books_twice_for_a_repeated_key(
    stepped: SteppedClock,
) -> None:
    sor = FakeSystemOfRecord(clock=stepped, honours_idempotency_keys=False)
    sor.add_restaurant("trattoria", tables=5)

    first = await book(sor, "op_1")
    second = await book(sor, "op_1")

    assert first.booking_id != second.booking_id
    assert sor.side_effects["book"] == 2
    assert sor.effects_for_key("op_1") == 2
    assert sor.find_by_idempotency_key("op_1") == second  # the key is recorded all the same


async def test_the_same_key_with_other_parameters_is_rejected(sor: FakeSystemOfRecord) -> None:
    await book(sor, "op_1", time="21:00")

    with pytest.raises(ProviderRejected, match="already used with other parameters"):
        await book(sor, "op_1", time="21:30")

    assert sor.side_effects["book"] == 1
    assert sor.effects_for_key("op_1") == 1


# --- faults ------------------------------------------------------------------------------------


async def test_error_before_send_does_nothing_and_reads_as_connection_refused(
    sor: FakeSystemOfRecord,
) -> None:
    sor.faults.error_before_send("book")

    with pytest.raises(ConnectionRefusedError) as raised:
        await book(sor)

    assert isinstance(raised.value, ProviderUnavailable)
    assert sor.side_effects == {}
    assert sor.calls["book"] == 1
    assert await sor.cancel_pending("op_1") == "unknown"  # the provider never saw the key
    assert sor.log[-1].outcome == "unavailable"


async def test_lost_response_commits_then_times_out_and_the_key_finds_the_booking(
    sor: FakeSystemOfRecord,
) -> None:
    sor.faults.lose_response_after_commit("book")

    with pytest.raises(TimeoutError) as raised:
        await book(sor)

    assert isinstance(raised.value, ProviderTimeout)
    found = sor.find_by_idempotency_key("op_1")
    assert isinstance(found, Booking) and found.status == "confirmed"
    assert sor.side_effects["book"] == 1
    assert sor.log[-1].outcome == "committed_response_lost"
    assert await book(sor) == found  # a retry on the same key replays, no second booking
    assert sor.effects_for_key("op_1") == 1


async def test_fail_after_send_is_final_and_commits_nothing(sor: FakeSystemOfRecord) -> None:
    sor.faults.fail_after_send("refund")

    with pytest.raises(ProviderRejected, match="nothing was committed"):
        await sor.refund("pay_1", 1_000, idempotency_key="rf_key")

    assert sor.side_effects == {}
    assert sor.find_by_idempotency_key("rf_key") is None
    assert await sor.cancel_pending("rf_key") == "cancelled"  # seen, and it will never commit


async def test_a_fault_is_spent_by_as_many_calls_as_it_was_armed_for(
    sor: FakeSystemOfRecord,
) -> None:
    sor.faults.error_before_send("book", times=2)

    for _ in range(2):
        with pytest.raises(ProviderUnavailable):
            await book(sor)
    assert sor.faults.remaining("error_before_send", "book") == 0
    booking = await book(sor)

    assert booking.status == "confirmed"
    assert sor.calls["book"] == 3
    assert sor.side_effects["book"] == 1


async def test_a_fault_armed_for_one_kind_leaves_the_others_alone(
    sor: FakeSystemOfRecord,
) -> None:
    sor.faults.error_before_send("refund")

    booking = await book(sor)

    assert booking.status == "confirmed"
    assert sor.faults.remaining("error_before_send", "refund") == 1


async def test_a_fault_armed_for_any_kind_hits_the_next_mutation(
    sor: FakeSystemOfRecord,
) -> None:
    sor.faults.fail_after_send()

    with pytest.raises(ProviderRejected):
        await sor.refund("pay_1", 100)

    assert await book(sor) is not None
    assert sor.side_effects == {"book": 1}


def test_provider_errors_say_what_the_caller_may_assume() -> None:
    assert issubclass(ProviderUnavailable, ConnectionRefusedError)
    assert issubclass(ProviderTimeout, TimeoutError)
    assert not issubclass(ProviderRejected, OSError)
    error = ProviderUnavailable("down", kind="book", idempotency_key="op_1")
    assert isinstance(error, ProviderError)
    assert (str(error), error.kind, error.idempotency_key) == ("down", "book", "op_1")


# --- latency, hangs and cancellation -----------------------------------------------------------


async def test_latency_waits_on_the_injected_clock(
    sor: FakeSystemOfRecord, stepped: SteppedClock
) -> None:
    sor.faults.set_latency(30.0, kind="book")
    call = asyncio.create_task(book(sor))
    await until(lambda: stepped.sleeping == 1)

    await stepped.advance(29.0)
    assert not call.done()
    assert sor.side_effects == {}
    await stepped.advance(1.0)

    assert call.done()
    assert (await call).created_at == T0 + 30.0
    assert sor.log[-1].at == T0 + 30.0


async def test_the_default_clock_is_real_time() -> None:
    sor = FakeSystemOfRecord()
    sor.add_restaurant("trattoria", tables=1)
    sor.faults.set_latency(0.01)

    booking = await book(sor)

    assert booking.status == "confirmed"


async def test_concurrent_calls_overlap_their_latency(
    sor: FakeSystemOfRecord, stepped: SteppedClock
) -> None:
    sor.add_restaurant("hall", tables=10)
    sor.faults.set_latency(5.0)
    calls = [
        asyncio.create_task(
            sor.book("hall", DAY, "20:00", 2, f"guest {n}", idempotency_key=f"k{n}")
        )
        for n in range(10)
    ]
    await until(lambda: stepped.sleeping == 10)

    await stepped.advance(5.0)  # one latency period, not ten

    assert all(call.done() for call in calls)
    assert sor.side_effects["book"] == 10


async def test_a_hundred_concurrent_books_with_one_key_make_one_booking(
    sor: FakeSystemOfRecord, stepped: SteppedClock
) -> None:
    sor.faults.set_latency(1.0)
    calls = [asyncio.create_task(book(sor, "same")) for _ in range(100)]
    await until(lambda: stepped.sleeping == 100)

    await stepped.advance(1.0)
    results = await asyncio.gather(*calls)

    assert len({b.booking_id for b in results}) == 1
    assert sor.effects_for_key("same") == 1
    assert sor.side_effects["book"] == 1
    assert sor.calls["book"] == 100
    assert len(sor.bookings()) == 1


async def test_concurrent_books_past_capacity_refuse_the_late_ones(
    stepped: SteppedClock,
) -> None:
    sor = FakeSystemOfRecord(clock=stepped, honours_idempotency_keys=False)
    sor.add_restaurant("trattoria", tables=3)
    outcomes = await asyncio.gather(
        *(book(sor, f"op_{n}") for n in range(5)), return_exceptions=True
    )

    assert sum(isinstance(o, Booking) for o in outcomes) == 3
    assert sum(isinstance(o, ProviderRejected) for o in outcomes) == 2
    assert len(sor.bookings("trattoria", "confirmed")) == 3


async def test_a_hung_call_commits_only_when_released(sor: FakeSystemOfRecord) -> None:
    sor.faults.hang("book")
    call = asyncio.create_task(book(sor))
    await settle()

    assert not call.done()
    assert sor.side_effects == {}
    sor.release_hung()

    assert (await call).status == "confirmed"
    assert sor.side_effects["book"] == 1
    assert (await book(sor, "op_2")).status == "confirmed"  # the hang was spent


async def test_cancelling_a_hung_call_abandons_it_and_nothing_commits(
    sor: FakeSystemOfRecord,
) -> None:
    sor.faults.hang("book")
    call = asyncio.create_task(book(sor))
    await settle()

    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    sor.release_hung()
    await settle()

    assert sor.side_effects == {}
    assert sor.log[-1].outcome == "abandoned"


async def test_a_hung_call_ignoring_cancellation_survives_one_cancel_and_commits(
    sor: FakeSystemOfRecord,
) -> None:
    sor.faults.hang("book", ignore_cancellation=True)
    call = asyncio.create_task(book(sor))
    await settle()

    call.cancel()
    await settle()
    assert not call.done()  # the effect did not stop
    sor.release_hung()

    booking = await call
    assert booking.status == "confirmed"
    assert sor.side_effects["book"] == 1
    assert sor.find_by_idempotency_key("op_1") == booking


async def test_cancel_pending_during_latency_aborts_the_call_and_it_never_commits(
    sor: FakeSystemOfRecord, stepped: SteppedClock
) -> None:
    sor.faults.set_latency(10.0)
    call = asyncio.create_task(book(sor))
    await until(lambda: stepped.sleeping == 1)

    assert await sor.cancel_pending("op_1") == "cancelled"

    with pytest.raises(ProviderCancelled):
        await call
    await stepped.advance(60.0)
    assert sor.side_effects == {}
    assert sor.find_by_idempotency_key("op_1") is None
    assert sor.log[-1].outcome == "cancelled"


async def test_cancel_pending_of_a_hung_call_aborts_it(sor: FakeSystemOfRecord) -> None:
    sor.faults.hang("book")
    call = asyncio.create_task(book(sor))
    await settle()

    assert await sor.cancel_pending("op_1") == "cancelled"

    with pytest.raises(ProviderCancelled):
        await call
    assert sor.side_effects == {}


async def test_cancel_pending_after_the_commit_is_too_late(sor: FakeSystemOfRecord) -> None:
    await book(sor)

    assert await sor.cancel_pending("op_1") == "too_late"
    assert sor.bookings(status="confirmed") != []


async def test_cancel_pending_of_a_key_never_seen_is_unknown(sor: FakeSystemOfRecord) -> None:
    assert await sor.cancel_pending("never_sent") == "unknown"


async def test_cancel_pending_raises_unavailable_when_the_provider_cannot_cancel(
    stepped: SteppedClock,
) -> None:
    sor = FakeSystemOfRecord(clock=stepped, supports_cancel=False)

    with pytest.raises(ProviderUnavailable, match="cannot cancel"):
        await sor.cancel_pending("op_1")


async def test_a_slow_cancel_loses_the_race_to_a_commit(
    sor: FakeSystemOfRecord, stepped: SteppedClock
) -> None:
    sor.slow_cancel_secs = 5.0
    sor.faults.set_latency(2.0)
    call = asyncio.create_task(book(sor))
    await until(lambda: stepped.sleeping == 1)
    cancel = asyncio.create_task(sor.cancel_pending("op_1"))
    await until(lambda: stepped.sleeping == 2)

    await stepped.advance(2.0)  # the booking commits while the cancel is still on its way
    assert (await call).status == "confirmed"
    await stepped.advance(3.0)

    assert await cancel == "too_late"
    assert sor.side_effects["book"] == 1
