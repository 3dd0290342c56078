"""The restaurant's HTTP API (FastAPI), with its idempotency keys and its fault switches.

What a client may rely on, as a provider's API reference would say it:

* ``Idempotency-Key`` (optional, on every POST): the first answer to a key is kept for 24 hours
  (``key_ttl_secs``) and a repeat of the same request gets it again, with the header
  ``Idempotent-Replayed: true`` and no second change. The same key with another path or body is
  a **422** (``idempotency_key_reused``); a repeat while the first is still being processed is a
  **409** (``idempotency_key_in_progress``). ``GET /idempotency-keys/{key}`` says what became of
  a key: ``in_progress``, or ``completed`` with the status and body it was answered with.
* **409** ``refused``: understood and refused for good (no table free, already cancelled, more
  than the deposit); nothing changed. **422**: the request itself is invalid.
* **5xx**: nothing was committed (the transaction rolled back); retrying with the same key is
  safe.

The fault switches (`Faults`) make the failures a real provider has happen on the wire, to the
next request of a kind (``book``, ``move``, ``cancel``, ``refund``), armed at start (flags) or by
``POST /admin/faults``:

=======================  =========================================================================
``slow_before_commit``   wait ``secs`` (instead of the kind's latency), then commit and answer
``slow_after_commit``    commit, then wait ``secs`` before answering
``error_before_commit``  answer 503; nothing is committed and the key is released
``drop_after_commit``    commit, then close the connection without a byte of answer
=======================  =========================================================================

The work of a request runs in a task of its own: a client that goes away (a read timeout) never
changes what the restaurant does, as with a real provider.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from sqlite3 import Connection
from typing import Any, Literal

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from bots.restaurant_service.store import Refused, Store

KINDS = ("book", "move", "cancel", "refund")
FaultName = Literal[
    "slow_before_commit", "slow_after_commit", "error_before_commit", "drop_after_commit"
]
_DROP_HEADER = b"x-restaurant-service-drop"


@dataclass(frozen=True)
class Fault:
    """One armed fault: what happens to the next request of ``kind``."""

    kind: str
    name: FaultName
    secs: float = 0.0


@dataclass
class Faults:
    """The service's fault switches and latencies, per kind of change.

    Attributes:
        latency_secs: How long each request of a kind takes before it commits.
        honour_keys: Whether ``Idempotency-Key`` is honoured (False: a provider that ignores
            it; keys are still stored on what they created, for lookups by booking fields).
        key_ttl_secs: How long the answer to a key is kept.
        queued: Armed faults by kind, used one per request in the order they were armed.
        requests: Change requests received, by kind (replays and refusals too).
    """

    latency_secs: dict[str, float] = field(default_factory=dict)
    honour_keys: bool = True
    key_ttl_secs: float = 24 * 3600.0
    queued: dict[str, deque[Fault]] = field(default_factory=dict)
    requests: Counter[str] = field(default_factory=Counter)

    def arm(self, fault: Fault, times: int = 1) -> None:
        """Arm ``fault`` for the next ``times`` requests of its kind."""
        if fault.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {fault.kind!r}")
        self.queued.setdefault(fault.kind, deque()).extend([fault] * times)

    def take(self, kind: str) -> Fault | None:
        """The fault for this request of ``kind``, if one is armed (it is used up)."""
        queue = self.queued.get(kind)
        return queue.popleft() if queue else None


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid")


class BookingRequest(_Body):
    """``POST /bookings``."""

    restaurant_id: str
    date: str
    time: str
    party_size: int = Field(ge=1)
    guest_name: str = "guest"


class MoveRequest(_Body):
    """``POST /bookings/{booking_id}/move``."""

    date: str
    time: str


class CancelRequest(_Body):
    """``POST /bookings/{booking_id}/cancel`` (no fields)."""


class RefundRequest(_Body):
    """``POST /payments/{payment_id}/refunds``."""

    amount_cents: int


class FaultRequest(_Body):
    """``POST /admin/faults``: arm a fault for the next ``times`` requests of ``kind``."""

    kind: str
    fault: FaultName
    secs: float = Field(default=0.0, ge=0)
    times: int = Field(default=1, ge=1)


class LatencyRequest(_Body):
    """``POST /admin/latency``: how long every request of ``kind`` takes from now on."""

    kind: str
    secs: float = Field(ge=0)


Change = Callable[[Connection, str | None], dict[str, Any]]


def create_app(store: Store, faults: Faults) -> FastAPI:
    """The API on ``store``, with ``faults`` as its switches."""
    app = FastAPI(title="restaurant service", docs_url=None, redoc_url=None)

    async def mutate(request: Request, kind: str, body: BaseModel, change: Change, ok: int) -> Any:
        faults.requests[kind] += 1
        key = request.headers.get("idempotency-key")
        honoured = key if key and faults.honour_keys else None
        if honoured is not None:
            request_hash = hashlib.sha256(
                json.dumps([request.url.path, body.model_dump()], sort_keys=True).encode()
            ).hexdigest()
            known = store.claim_key(honoured, request_hash, faults.key_ttl_secs)
            if known is not None:
                return _replay(known, request_hash)
        fault = faults.take(kind)
        # Shielded: the request's outcome does not depend on whether its client still waits.
        work = asyncio.ensure_future(_commit(kind, key, honoured, change, ok, fault))
        status, payload = await asyncio.shield(work)
        if fault is not None and fault.name == "slow_after_commit":
            await _hold(request, fault.secs)
        if fault is not None and fault.name == "drop_after_commit":
            return Response(status_code=status, headers={_DROP_HEADER.decode(): "1"})
        return JSONResponse(payload, status_code=status)

    async def _commit(
        kind: str,
        key: str | None,
        honoured: str | None,
        change: Change,
        ok: int,
        fault: Fault | None,
    ) -> tuple[int, dict[str, Any]]:
        slow = fault is not None and fault.name == "slow_before_commit"
        await asyncio.sleep(fault.secs if slow and fault else faults.latency_secs.get(kind, 0.0))
        if fault is not None and fault.name == "error_before_commit":
            if honoured is not None:
                store.release_key(honoured)
            return 503, {"error": "unavailable", "detail": "nothing was committed; try again"}
        try:
            with store.transaction() as db:
                status, payload = ok, change(db, key)
                if honoured is not None:
                    store.complete_key(db, honoured, status, payload)
        except Refused as exc:
            status, payload = 409, {"error": "refused", "detail": str(exc)}
            if honoured is not None:
                with store.transaction() as db:
                    store.complete_key(db, honoured, status, payload)
        return status, payload

    # -- the provider's API ---------------------------------------------------------------

    @app.get("/availability")
    async def availability(restaurant_id: str, date: str, time: str, party_size: int) -> Any:
        try:
            return {"free_times": store.availability(restaurant_id, date, time, party_size)}
        except Refused as exc:
            return _refused(exc)

    @app.post("/bookings")
    async def book(body: BookingRequest, request: Request) -> Any:
        return await mutate(
            request, "book", body, lambda db, key: store.book(db, body.model_dump(), key), 201
        )

    @app.get("/bookings")
    async def find_bookings(
        restaurant_id: str | None = None,
        date: str | None = None,
        time: str | None = None,
        guest_name: str | None = None,
        status: str | None = None,
        idempotency_key: str | None = Query(default=None),
    ) -> Any:
        return {
            "bookings": store.bookings(
                restaurant_id=restaurant_id,
                date=date,
                time=time,
                guest_name=guest_name,
                status=status,
                idempotency_key=idempotency_key,
            )
        }

    @app.get("/bookings/{booking_id}")
    async def get_booking(booking_id: str) -> Any:
        found = store.booking(booking_id)
        return found if found is not None else _not_found(f"no booking {booking_id!r}")

    @app.post("/bookings/{booking_id}/move")
    async def move(booking_id: str, body: MoveRequest, request: Request) -> Any:
        return await mutate(
            request,
            "move",
            body,
            lambda db, key: store.move(db, booking_id, body.date, body.time),
            200,
        )

    @app.post("/bookings/{booking_id}/cancel")
    async def cancel(booking_id: str, request: Request, body: CancelRequest | None = None) -> Any:
        return await mutate(
            request,
            "cancel",
            body or CancelRequest(),
            lambda db, key: store.cancel(db, booking_id),
            200,
        )

    @app.get("/payments/{payment_id}")
    async def get_payment(payment_id: str) -> Any:
        found = store.payment(payment_id)
        return found if found is not None else _not_found(f"no payment {payment_id!r}")

    @app.post("/payments/{payment_id}/refunds")
    async def refund(payment_id: str, body: RefundRequest, request: Request) -> Any:
        return await mutate(
            request,
            "refund",
            body,
            lambda db, key: store.refund(db, payment_id, body.amount_cents, key),
            201,
        )

    @app.get("/idempotency-keys/{key}")
    async def get_key(key: str) -> Any:
        record = store.key(key) if faults.honour_keys else None
        if record is None or record.created_at < time.time() - faults.key_ttl_secs:
            return _not_found(f"no request with key {key!r}")
        return {
            "key": record.key,
            "state": record.state,
            "status_code": record.status_code,
            "response": record.response,
        }

    # -- administration: what the tests and the demo switch -------------------------------

    @app.post("/admin/faults")
    async def arm_fault(body: FaultRequest) -> Any:
        try:
            faults.arm(Fault(body.kind, body.fault, body.secs), body.times)
        except ValueError as exc:
            return JSONResponse({"error": "invalid", "detail": str(exc)}, status_code=422)
        return {"armed": {k: len(q) for k, q in faults.queued.items()}}

    @app.post("/admin/latency")
    async def set_latency(body: LatencyRequest) -> Any:
        if body.kind not in KINDS:
            return JSONResponse({"error": "invalid", "detail": body.kind}, status_code=422)
        faults.latency_secs[body.kind] = body.secs
        return {"latency_secs": faults.latency_secs}

    @app.get("/admin/stats")
    async def stats() -> Any:
        return {
            "requests": dict(faults.requests),
            "side_effects": store.side_effects(),
            "armed": {k: len(q) for k, q in faults.queued.items() if q},
        }

    return app


def with_dropped_connections(app: Any) -> Any:
    """Wrap ``app`` so that a response marked "drop" closes the connection instead.

    Outermost, so that ``send`` is the server's own: uvicorn's request cycle holds the
    connection's transport, and closing it is what a proxy that dies mid-answer does.
    """

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        dropped = False

        async def sending(message: dict[str, Any]) -> None:
            nonlocal dropped
            if message["type"] == "http.response.start" and any(
                name == _DROP_HEADER for name, _ in message.get("headers", [])
            ):
                dropped = True
                send.__self__.transport.close()
                return
            if not dropped:
                await send(message)

        try:
            await app(scope, receive, sending)
        except asyncio.CancelledError:
            # The service is stopping and its grace period is over: the request ends without
            # an answer, as it would at a provider that is shut down.
            return
        if dropped:
            cycle = send.__self__
            for _ in range(100):  # until uvicorn has seen the connection go
                if cycle.disconnected:
                    break
                await asyncio.sleep(0)

    return wrapped


async def _hold(request: Request, secs: float) -> None:
    """Wait ``secs`` before answering, or until the client has gone (nobody to answer)."""
    loop = asyncio.get_running_loop()
    until = loop.time() + secs
    while loop.time() < until and not await request.is_disconnected():
        await asyncio.sleep(min(0.05, max(0.0, until - loop.time())))


def _replay(known: Any, request_hash: str) -> Response:
    if known.request_hash != request_hash:
        return JSONResponse(
            {
                "error": "idempotency_key_reused",
                "detail": "this Idempotency-Key was sent with another request",
            },
            status_code=422,
        )
    if known.state == "in_progress":
        return JSONResponse(
            {"error": "idempotency_key_in_progress", "detail": "the first request still runs"},
            status_code=409,
        )
    return JSONResponse(
        known.response, status_code=known.status_code, headers={"Idempotent-Replayed": "true"}
    )


def _refused(exc: Refused) -> JSONResponse:
    return JSONResponse({"error": "refused", "detail": str(exc)}, status_code=409)


def _not_found(detail: str) -> JSONResponse:
    return JSONResponse({"error": "not_found", "detail": detail}, status_code=404)
