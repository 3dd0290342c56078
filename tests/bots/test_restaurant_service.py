"""The HTTP adapter (`bots.restaurant_api`) against the real restaurant service on 127.0.0.1.

Each test starts `bots.restaurant_service` as a child process on a free port with a database of
its own, arms a fault through the admin endpoint, and checks what the runtime made of it in
the ledger and what the restaurant holds in its own database. Faults are armed, never timed:
nothing here compares a duration.
"""

from __future__ import annotations

import dataclasses
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from bots.restaurant_api import RESTAURANT, RestaurantAPI, build_actions
from bots.restaurant_service.process import RestaurantProcess
from pipecat_actions import ActionRuntime, AllowAll, SessionState
from pipecat_actions.approvals import Approver
from pipecat_actions.execution.executor import ReconcileSchedule
from pipecat_actions.execution.outcomes import (
    EffectNotSent,
    EffectOutcomeUnknown,
    EffectRetryable,
    Outcome,
    classify,
)
from pipecat_actions.ledger import Operation
from pipecat_actions.policy import load_policy
from pipecat_actions.status import ActionStatus as S

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]

BOOKING = {
    "restaurant_id": RESTAURANT,
    "date": "2030-05-01",
    "time": "21:00",
    "party_size": 2,
    "guest_name": "Ada",
}

POLICY = """
version: 1
tools:
  book_table:
    description: Books a table.
    kind: mutation
    arguments: [restaurant_id, date, time, party_size, guest_name, phone]
    idempotency:
      key_fields: [restaurant_id, date, time, party_size]
      scope: principal
      provider_dedupes: {dedupes}
    on_duplicate: join
    retry:
      max_attempts: {attempts}
      initial_backoff_secs: 0.05
      max_backoff_secs: 0.1
    deadline_secs: 60
    # The restaurant applies a request while it handles it (slowed by a fault at most 3 s):
    # after that, no trace of a booking means it did not happen.
    reconciliation: {{commit_horizon_secs: 4}}
"""


@pytest.fixture
def restaurant(tmp_path: Path) -> Iterator[RestaurantProcess]:
    with RestaurantProcess.start(tmp_path / "restaurant.db") as service:
        yield service
    assert service.process.poll() is not None  # stopped, whatever the test did


class Raised(list[BaseException]):
    """What the adapter's effect raised, attempt by attempt."""


async def _runtime(
    tmp_path: Path,
    api: RestaurantAPI,
    *,
    dedupes: bool = True,
    raised: Raised | None = None,
    snapshot: bool = True,
) -> ActionRuntime:
    policy_file = tmp_path / "policy.yaml"
    # The policy refuses retries of a mutation whose provider does not dedupe.
    policy_file.write_text(
        POLICY.format(dedupes=str(dedupes).lower(), attempts=3 if dedupes else 1)
    )
    (book_table,) = [a for a in build_actions(api) if a.name == "book_table"]
    effect = book_table.effect

    async def recorded(*args: Any, **kwargs: Any) -> Any:
        try:
            return await effect(*args, **kwargs)
        except Exception as exc:
            if raised is not None:
                raised.append(exc)
            raise

    return await ActionRuntime.create(
        load_policy(policy_file),
        authorizer=AllowAll(),
        actions=[
            dataclasses.replace(
                book_table, effect=recorded, snapshot=book_table.snapshot if snapshot else None
            )
        ],
        ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
        schedule=ReconcileSchedule(initial_secs=0.05, max_secs=0.2, max_probes=300),
    )


@pytest.fixture
async def api(restaurant: RestaurantProcess) -> AsyncIterator[RestaurantAPI]:
    client = RestaurantAPI(restaurant.url)
    yield client
    await client.aclose()


async def _book(runtime: ActionRuntime, **changes: Any) -> tuple[dict[str, Any], Operation]:
    session = SessionState(session_id="call-ada", principal="ada")
    told = await runtime.propose("book_table", {**BOOKING, **changes}, session)
    return told, await runtime.wait(told["operation_id"], settled=True)


async def _trail(runtime: ActionRuntime, op: Operation) -> list[Any]:
    """The operation's status changes, in order."""
    events = await runtime.ledger.events(op.operation_id)
    return [(e.from_status, e.to_status) for e in events if e.kind.value == "transition"]


async def test_a_lost_answer_after_commit_reconciles_to_committed_with_one_booking(
    tmp_path: Path, restaurant: RestaurantProcess, api: RestaurantAPI
) -> None:
    await restaurant.admin.arm("book", "drop_after_commit")
    raised = Raised()
    runtime = await _runtime(tmp_path, api, raised=raised)
    try:
        _, op = await _book(runtime)
        trail = await _trail(runtime, op)
    finally:
        await runtime.close()
    assert op.status is S.COMMITTED
    (lost,) = raised
    assert isinstance(lost, EffectOutcomeUnknown)
    assert isinstance(lost.__cause__, httpx.RemoteProtocolError)  # no byte of an answer
    assert (S.RUNNING, S.UNKNOWN) in trail and (S.UNKNOWN, S.COMMITTED) in trail
    (booking,) = await restaurant.admin.bookings(guest_name="Ada")
    assert op.result == {"booking_id": booking["booking_id"], "date": "2030-05-01", "time": "21:00"}
    assert booking["idempotency_key"] == op.idempotency_key
    stats = await restaurant.admin.stats()
    assert stats["requests"]["book"] == 1  # asked, never sent again
    assert stats["side_effects"] == {"book": 1}


@pytest.mark.parametrize("dedupes", [True, False])
async def test_a_5xx_before_commit_is_retried_only_when_the_provider_dedupes(
    tmp_path: Path, dedupes: bool
) -> None:
    flags = [] if dedupes else ["--ignore-idempotency-keys"]
    with RestaurantProcess.start(tmp_path / "restaurant.db", *flags) as restaurant:
        await restaurant.admin.arm("book", "error_before_commit")
        api = RestaurantAPI(restaurant.url, provider_dedupes=dedupes)
        raised = Raised()
        runtime = await _runtime(tmp_path, api, dedupes=dedupes, raised=raised)
        try:
            _, op = await _book(runtime)
            trail = await _trail(runtime, op)
        finally:
            await runtime.close()
            await api.aclose()
        stats = await restaurant.admin.stats()
        bookings = await restaurant.admin.bookings(guest_name="Ada")
    if dedupes:
        # 503, then the same key again: one booking.
        assert op.status is S.COMMITTED and op.attempt == 2
        assert [type(e) for e in raised] == [EffectRetryable]
        assert (S.RUNNING, S.FAILED_RETRYABLE) in trail
        assert stats["requests"]["book"] == 2
        assert len(bookings) == 1
    else:
        # Without dedupe a 5xx may hide a commit: asked about, never sent again.
        assert stats["requests"]["book"] == 1
        assert [type(e) for e in raised] == [EffectOutcomeUnknown]
        assert (S.RUNNING, S.UNKNOWN) in trail
        assert op.status is S.FAILED_FINAL and op.attempt == 1
        assert bookings == []


async def test_the_same_key_with_other_arguments_is_refused_by_the_provider_and_by_admission(
    tmp_path: Path, restaurant: RestaurantProcess, api: RestaurantAPI
) -> None:
    runtime = await _runtime(tmp_path, api)
    try:
        _, first = await _book(runtime)
        refused, _ = await _book(runtime, guest_name="Bea")  # same key fields, other details
    finally:
        await runtime.close()
    assert first.status is S.COMMITTED
    assert refused["status"] == "refused" and refused["reason"] == "idempotency_mismatch"
    async with httpx.AsyncClient(base_url=restaurant.url) as client:
        again = await client.post(
            "/bookings",
            json={**BOOKING, "guest_name": "Bea"},
            headers={"Idempotency-Key": first.idempotency_key},
        )
        same = await client.post(
            "/bookings", json=BOOKING, headers={"Idempotency-Key": first.idempotency_key}
        )
    assert again.status_code == 422
    assert again.json()["error"] == "idempotency_key_reused"
    assert (same.status_code, same.headers["Idempotent-Replayed"]) == (201, "true")
    assert same.json()["booking_id"] == first.result["booking_id"]
    assert len(await restaurant.admin.bookings(restaurant_id=RESTAURANT)) == 1


async def test_a_key_is_honoured_until_its_time_to_live_runs_out(tmp_path: Path) -> None:
    # --key-ttl-secs 0: every key has already run out when it is sent again.
    answers = {}
    for ttl in ("86400", "0"):
        db = tmp_path / f"restaurant-{ttl}.db"
        with RestaurantProcess.start(db, "--key-ttl-secs", ttl) as restaurant:
            async with httpx.AsyncClient(base_url=restaurant.url) as client:
                for _ in range(2):
                    sent = await client.post(
                        "/bookings", json=BOOKING, headers={"Idempotency-Key": "k-ttl"}
                    )
                    assert sent.status_code == 201
            answers[ttl] = len(await restaurant.admin.bookings(guest_name="Ada"))
    assert answers == {"86400": 1, "0": 2}


async def test_connection_refused_is_classified_as_not_sent(tmp_path: Path) -> None:
    with socket.socket() as probe:  # a port nothing listens on once it is closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    api = RestaurantAPI(f"http://127.0.0.1:{port}")
    try:
        with pytest.raises(EffectNotSent) as raised:
            await api.change("/bookings", BOOKING, key="k-refused")
        assert classify(raised.value, mutation=True) is Outcome.NOT_SENT
        raised = Raised()
        # Without its snapshot (a read of the same service), which would refuse the call first.
        runtime = await _runtime(tmp_path, api, dedupes=False, raised=raised, snapshot=False)
        try:
            _, op = await _book(runtime)
            trail = await _trail(runtime, op)
        finally:
            await runtime.close()
    finally:
        await api.aclose()
    # Failed, not UNKNOWN: nothing to reconcile, since nothing can have been sent.
    assert op.status is S.FAILED_FINAL
    assert (S.RUNNING, S.FAILED_RETRYABLE) in trail and (S.RUNNING, S.UNKNOWN) not in trail
    assert [type(e) for e in raised] == [EffectNotSent]
    assert isinstance(raised[0].__cause__, httpx.ConnectError)


async def test_a_read_timeout_is_unknown_and_reconciles_once_the_restaurant_commits(
    tmp_path: Path, restaurant: RestaurantProcess
) -> None:
    # The restaurant takes longer than the client waits; its answer is never read.
    await restaurant.admin.arm("book", "slow_before_commit", secs=3.0)
    api = RestaurantAPI(restaurant.url, timeout=httpx.Timeout(5.0, read=0.2))
    raised = Raised()
    runtime = await _runtime(tmp_path, api, raised=raised)
    try:
        _, op = await _book(runtime)
        trail = await _trail(runtime, op)
    finally:
        await runtime.close()
        await api.aclose()
    (timed_out,) = raised
    assert isinstance(timed_out, EffectOutcomeUnknown)
    assert isinstance(timed_out.__cause__, httpx.ReadTimeout)
    assert (S.RUNNING, S.UNKNOWN) in trail and (S.UNKNOWN, S.COMMITTED) in trail
    assert op.status is S.COMMITTED
    (booking,) = await restaurant.admin.bookings(guest_name="Ada")
    assert op.result is not None and op.result["booking_id"] == booking["booking_id"]
    assert (await restaurant.admin.stats())["requests"]["book"] == 1


async def test_a_refund_snapshots_the_deposit_and_a_booking_is_compensated_by_cancelling(
    tmp_path: Path, restaurant: RestaurantProcess, api: RestaurantAPI
) -> None:
    runtime = await ActionRuntime.create(
        ROOT / "configs" / "restaurant.yaml",
        authorizer=AllowAll(),
        actions=build_actions(api),
        ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
    )
    session = SessionState(session_id="call-ada", principal="ada", active_agent="host")
    session.settle_generation(0)  # the reply that proposed them stood
    try:
        booked = await runtime.wait(
            (await runtime.propose("book_table", BOOKING, session))["operation_id"]
        )
        undone = await runtime.compensate(booked.operation_id, actor="test", reason="moved")
        asked = await runtime.propose(
            "refund_deposit", {"booking_id": "bk_0001", "amount": 2000}, session
        )
        (waiting,) = await runtime.pending_approvals()
        await runtime.approve(
            waiting.operation_id,
            approver=Approver("rosa", tenants={"default"}),
            reason="ok",
            args_hash=waiting.args_hash,
        )
        refunded = await runtime.wait(asked["operation_id"])
    finally:
        await runtime.close()
    assert booked.status is S.COMMITTED and undone.status is S.COMMITTED
    (booking,) = await restaurant.admin.bookings(guest_name="Ada")
    assert booking["status"] == "cancelled"
    assert booking["booking_id"] == booked.result["booking_id"]
    # What the approver was shown: the deposit as the restaurant held it before the refund.
    assert waiting.before_state == {
        "deposit": "dep_bk_0001",
        "paid_cents": 2000,
        "refunded_cents": 0,
    }
    assert refunded.status is S.COMMITTED and refunded.result["amount"] == 2000
    payment = await api.read("/payments/dep_bk_0001")
    assert payment is not None and payment["refunded_cents"] == 2000
    stats = await restaurant.admin.stats()
    assert stats["side_effects"] == {"book": 1, "cancel": 1, "refund": 1}


async def test_faults_and_latencies_are_armed_at_start_by_flag_and_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RESTAURANT_SERVICE_FAULTS", "refund=error_before_commit")
    flags = ["--fault", "book=drop_after_commit", "--latency", "cancel=0.01"]
    with RestaurantProcess.start(tmp_path / "restaurant.db", *flags) as restaurant:
        stats = await restaurant.admin.stats()
        async with httpx.AsyncClient(base_url=restaurant.url) as client:
            with pytest.raises(httpx.RemoteProtocolError):
                await client.post("/bookings", json=BOOKING, headers={"Idempotency-Key": "k1"})
            refund = await client.post(
                "/payments/dep_bk_0001/refunds",
                json={"amount_cents": 500},
                headers={"Idempotency-Key": "k2"},
            )
        after = await restaurant.admin.stats()
    assert stats["armed"] == {"book": 1, "refund": 1}
    assert refund.status_code == 503
    assert after["side_effects"] == {"book": 1}  # dropped after its commit; the refund never
    assert after["armed"] == {}


async def test_the_service_stops_when_the_process_that_started_it_lets_go(tmp_path: Path) -> None:
    service = RestaurantProcess.start(tmp_path / "restaurant.db")
    try:
        assert service.process.stdin is not None
        service.process.stdin.close()  # what a parent's death does to the pipe
        assert service.process.wait(timeout=30) is not None
    finally:
        service.stop()


async def test_the_daily_bot_books_at_the_restaurant_service_over_http(
    tmp_path: Path, restaurant: RestaurantProcess
) -> None:
    from pipecat.runner.types import DailyRunnerArguments

    from bots.daily_bot import build_bot, make_transport

    runner_args = DailyRunnerArguments(room_url="https://example.daily.co/room", session_id="s1")
    bot = await build_bot(
        await make_transport(runner_args),  # never joined: no connection to Daily
        openai_api_key="sk-test",
        session_id=runner_args.session_id,
        ledger_url=f"sqlite:///{tmp_path / 'ledger.db'}",
        restaurant_url=restaurant.url,
    )
    try:
        assert bot.restaurant is not None and bot.restaurant.base_url == restaurant.url
        bot.session.settle_generation(0)  # the reply that proposed it stood
        told = await bot.runtime.propose("book_table", BOOKING, bot.session)
        op = await bot.runtime.wait(told["operation_id"])
    finally:
        await bot.close()
    assert op.status is S.COMMITTED
    (booking,) = await restaurant.admin.bookings(guest_name="Ada")
    assert booking["idempotency_key"] == op.idempotency_key


async def test_a_lost_answer_is_found_by_its_booking_after_the_provider_forgot_the_key(
    tmp_path: Path,
) -> None:
    # --key-ttl-secs 0: the key's answer is forgotten by the time reconcile asks, as it is
    # at a real provider when recovery comes more than 24 h after the call.
    with RestaurantProcess.start(tmp_path / "restaurant.db", "--key-ttl-secs", "0") as service:
        await service.admin.arm("book", "drop_after_commit")
        api = RestaurantAPI(service.url)
        runtime = await _runtime(tmp_path, api)
        try:
            _, op = await _book(runtime)
        finally:
            await runtime.close()
            await api.aclose()
        (booking,) = await service.admin.bookings(guest_name="Ada")
    assert op.status is S.COMMITTED, op.error
    assert op.result == {"booking_id": booking["booking_id"], "date": "2030-05-01", "time": "21:00"}
