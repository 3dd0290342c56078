"""The restaurant's actions over HTTP: the adapter a team writes for its own provider.

This is the part of an application pipecat_actions cannot write for you: the calls to *your*
booking or payment API. Copy its shape. It is written against `bots.restaurant_service`, a real
server with its own database, and each rule below is one a real provider needs too.

1. **Send our key.** Every change carries ``Idempotency-Key: ctx.idempotency_key``. The key is
   the operation's, stable across retries, recovery and other processes; a provider that honours
   it answers a repeat with the first answer instead of booking twice.
2. **Say honestly what a failure means** (the executor decides on retries and reconciliation
   from it; see `pipecat_actions.execution.outcomes`):

   =====================================  =======================  ============================
   what happened                          raise                    the operation becomes
   =====================================  =======================  ============================
   no connection (refused, DNS, connect   `EffectNotSent`          FAILED_RETRYABLE: retried,
   timeout, no pooled connection free)                             nothing can have happened
   sent, then no answer (read timeout,    `EffectOutcomeUnknown`   UNKNOWN: never retried
   connection dropped, write cut off)                              blindly; ``reconcile`` asks
   409 refused, 422 invalid, 4xx          `EffectFailed`           FAILED_FINAL
   429, or 409 "key in progress"          `EffectRetryable`        retried (with the same key)
                                                                   when the policy allows
   5xx                                    `EffectRetryable` when   the same, or UNKNOWN
                                          the provider dedupes on
                                          our key, else
                                          `EffectOutcomeUnknown`
   =====================================  =======================  ============================

   A 5xx is only harmless to retry when the provider dedupes on our key: without that, a 5xx
   sent by a proxy after the provider committed would book twice, so it is "unknown" instead.
   ``provider_dedupes`` says what the provider does (this one honours keys unless it is
   started with ``--ignore-idempotency-keys``); a tool's policy may only be more careful
   (``move_booking`` says ``provider_dedupes: false`` and is never retried), never less.
3. **Reconcile by asking the provider** what became of our key (``GET
   /idempotency-keys/{key}``): completed → COMMITTED with the answer the effect would have
   returned; still in progress → pending (ask again later); unknown key → it did not happen.
   A key's answer is kept 24 h only, so a booking is also looked up by the key it was made
   under (``GET /bookings?idempotency_key=``): a recovery that asks later is not told "it did
   not happen" about a table that is booked. A provider that ignores keys can only be asked
   by the booking's own fields.
4. **Compensate with the provider's own undo** (cancel the booking), under the compensation's
   own key, and **snapshot the before-state** an approver needs (the deposit as it stands).

Nothing here retries, sleeps or catches an error to hide it: retries, deadlines and recovery are
the runtime's, driven by what these functions raise.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import httpx

from pipecat_actions import (
    ActionContext,
    EffectFailed,
    EffectNotSent,
    EffectOutcomeUnknown,
    EffectRetryable,
    Reconciliation,
    action,
)
from pipecat_actions.actions import ActionDefinition

__all__ = ["RESTAURANT", "RestaurantAPI", "build_actions"]

RESTAURANT = "trattoria"

DEFAULT_TIMEOUT = httpx.Timeout(connect=2.0, read=10.0, write=5.0, pool=2.0)
"""Per request. A read timeout after sending is an unknown outcome, so it is kept well below
the policy's ``deadline_secs``, leaving time to reconcile."""


class RestaurantAPI:
    """The restaurant's HTTP API, with each failure classified for the executor.

    Args:
        base_url: Where the service listens (``http://127.0.0.1:PORT``).
        provider_dedupes: Whether the provider honours ``Idempotency-Key`` (it decides what a
            5xx means). A policy must not say ``provider_dedupes: true`` when this is False.
        timeout: Per-request timeouts.
    """

    def __init__(
        self,
        base_url: str,
        *,
        provider_dedupes: bool = True,
        timeout: httpx.Timeout = DEFAULT_TIMEOUT,
    ) -> None:
        self.base_url = base_url
        self.provider_dedupes = provider_dedupes
        # One client, one connection pool, for every call of every session of this process.
        self.http = httpx.AsyncClient(base_url=base_url, timeout=timeout)

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self.http.aclose()

    async def change(self, path: str, body: Mapping[str, Any], *, key: str) -> dict[str, Any]:
        """POST a change under idempotency ``key``; its answer, or the classified failure."""
        try:
            response = await self.http.post(path, json=dict(body), headers={"Idempotency-Key": key})
        except (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            # No connection was made (or none was free): the request never left this process.
            raise EffectNotSent(f"POST {path}: {type(exc).__name__}: {exc}") from exc
        except httpx.TransportError as exc:
            # Sent, or partly sent, and no complete answer: it may have happened.
            raise EffectOutcomeUnknown(f"POST {path}: {type(exc).__name__}: {exc}") from exc
        if response.is_success:
            return dict(response.json())
        problem = _problem(response)
        if response.status_code == 429 or _in_progress(response):
            # Received and set aside, nothing done (rate limit; the first request under this
            # key still runs): the same request later is safe.
            raise EffectRetryable(f"POST {path}: {problem}")
        if response.status_code >= 500:
            if self.provider_dedupes:
                raise EffectRetryable(f"POST {path}: {problem}")
            raise EffectOutcomeUnknown(f"POST {path}: {problem} (the provider does not dedupe)")
        raise EffectFailed(problem)

    async def read(self, path: str, **params: Any) -> dict[str, Any] | None:
        """GET ``path``; None for a 404, `EffectFailed` for another 4xx.

        Any other failure is raised as it is: a read changes nothing, so the executor may
        retry it whatever happened (a hook's failure counts as "cannot tell yet").
        """
        response = await self.http.get(
            path, params={k: v for k, v in params.items() if v is not None}
        )
        if response.status_code == 404:
            return None
        if 400 <= response.status_code < 500:
            raise EffectFailed(_problem(response))
        response.raise_for_status()
        return dict(response.json())


def build_actions(api: RestaurantAPI) -> list[ActionDefinition]:
    """The restaurant tools of ``configs/restaurant.yaml``, calling ``api``.

    Same tools, arguments and results as `pipecat_actions.testing.restaurant.build_actions`
    (the in-memory fake the unit tests use), so a policy and a conversation run on either.
    """

    def reconcile(result_of: Callable[[dict[str, Any]], dict[str, Any]]) -> Any:
        async def find_by_key(ctx: ActionContext) -> Reconciliation:
            record = await api.read(f"/idempotency-keys/{ctx.idempotency_key}")
            if record is None:
                return Reconciliation.not_found()
            if record["state"] != "completed":
                return Reconciliation.pending()  # the provider is still working on it
            if 200 <= record["status_code"] < 300:
                return Reconciliation.committed(result_of(record["response"]))
            # Answered with a refusal the effect never heard: nothing changed.
            return Reconciliation.not_found()

        return find_by_key

    async def find_booking(ctx: ActionContext) -> Reconciliation:
        if api.provider_dedupes:
            answer = await reconcile(_booked)(ctx)
            if answer != Reconciliation.not_found():
                return answer
            # The provider forgets a key's answer after 24 h (a recovery after a long outage
            # asks later than that): "no such key" is then no proof. The booking itself keeps
            # the key it was made under, for good.
            found = await api.read("/bookings", idempotency_key=ctx.idempotency_key)
            made = (found or {}).get("bookings", [])
            return Reconciliation.committed(_booked(made[0])) if made else answer
        # A provider that ignores keys: the booking's own fields are all there is to ask by.
        args = ctx.args
        found = await api.read(
            "/bookings",
            restaurant_id=args["restaurant_id"],
            date=args["date"],
            time=args["time"],
            guest_name=args.get("guest_name", "guest"),
            status="confirmed",
        )
        bookings = (found or {}).get("bookings", [])
        return (
            Reconciliation.committed(_booked(bookings[0]))
            if bookings
            else (Reconciliation.not_found())
        )

    async def snapshot_slot(ctx: ActionContext) -> dict[str, Any]:
        args = ctx.args
        found = await api.read(
            "/availability",
            restaurant_id=args["restaurant_id"],
            date=args["date"],
            time=args["time"],
            party_size=args["party_size"],
        )
        return {"free_times": (found or {}).get("free_times", [])}

    async def undo_booking(ctx: ActionContext) -> dict[str, Any]:
        # ctx.operation is the booking being reversed; ctx.idempotency_key the undo's own key.
        assert ctx.operation is not None
        booking_id = str((ctx.operation.result or {}).get("booking_id"))
        cancelled = await api.change(f"/bookings/{booking_id}/cancel", {}, key=ctx.idempotency_key)
        return _cancelled(cancelled)

    async def snapshot_deposit(ctx: ActionContext) -> dict[str, Any]:
        # What the approver sees before deciding: the deposit as the provider holds it now.
        payment = await api.read(f"/payments/dep_{ctx.args['booking_id']}")
        if payment is None:
            return {"deposit": None}
        return {
            "deposit": payment["payment_id"],
            "paid_cents": payment["amount_cents"],
            "refunded_cents": payment["refunded_cents"],
        }

    @action
    async def search_availability(
        ctx: ActionContext, restaurant_id: str, date: str, time: str, party_size: int
    ) -> dict[str, Any]:
        """Look up free tables near a time."""
        found = await api.read(
            "/availability",
            restaurant_id=restaurant_id,
            date=date,
            time=time,
            party_size=party_size,
        )
        return {"free_times": (found or {}).get("free_times", [])[:4]}

    @action(reconcile=find_booking, compensate=undo_booking, snapshot=snapshot_slot)
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
        body = {
            "restaurant_id": restaurant_id,
            "date": date,
            "time": time,
            "party_size": party_size,
            "guest_name": guest_name,
        }  # the phone number stays with us: the restaurant does not need it
        return _booked(await api.change("/bookings", body, key=ctx.idempotency_key))

    @action(reconcile=reconcile(_booked))
    async def move_booking(
        ctx: ActionContext, booking_id: str, date: str, time: str, party_size: int = 2
    ) -> dict[str, Any]:
        """Move a booking to another date or time."""
        moved = await api.change(
            f"/bookings/{booking_id}/move", {"date": date, "time": time}, key=ctx.idempotency_key
        )
        return _booked(moved)

    @action(reconcile=reconcile(_cancelled))
    async def cancel_booking(ctx: ActionContext, booking_id: str) -> dict[str, Any]:
        """Cancel a booking by its reference."""
        cancelled = await api.change(f"/bookings/{booking_id}/cancel", {}, key=ctx.idempotency_key)
        return _cancelled(cancelled)

    @action(reconcile=reconcile(_refunded), snapshot=snapshot_deposit)
    async def refund_deposit(
        ctx: ActionContext, booking_id: str, amount: int, card: dict[str, str] | None = None
    ) -> dict[str, Any]:
        """Refund the deposit of a booking (amount in cents) to the card it was paid with."""
        refund = await api.change(
            f"/payments/dep_{booking_id}/refunds", {"amount_cents": amount}, key=ctx.idempotency_key
        )
        return _refunded(refund)

    return [search_availability, book_table, move_booking, cancel_booking, refund_deposit]


# What each effect returns, built from the provider's answer: the same whether the answer came
# back to the effect or was found later by `reconcile`.


def _booked(booking: Mapping[str, Any]) -> dict[str, Any]:
    return {"booking_id": booking["booking_id"], "date": booking["date"], "time": booking["time"]}


def _cancelled(booking: Mapping[str, Any]) -> dict[str, Any]:
    return {"booking_id": booking["booking_id"], "status": booking["status"]}


def _refunded(refund: Mapping[str, Any]) -> dict[str, Any]:
    return {"refund_id": refund["refund_id"], "amount": refund["amount_cents"]}


def _problem(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return f"HTTP {response.status_code}"
    detail = body.get("detail") if isinstance(body, dict) else None
    return f"HTTP {response.status_code}: {detail or body}"


def _in_progress(response: httpx.Response) -> bool:
    # The first request under this key is still running: asking again later is safe.
    if response.status_code != 409:
        return False
    try:
        return bool(response.json().get("error") == "idempotency_key_in_progress")
    except (ValueError, AttributeError):
        return False
