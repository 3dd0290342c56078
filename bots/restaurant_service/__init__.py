"""A restaurant booking and payments provider that is a real server: the demo's system of record.

The in-memory `pipecat_actions.testing.FakeSystemOfRecord` lives inside the process it serves;
this one does not. It is a small HTTP API (FastAPI on uvicorn, `app`) in a process of its own,
with its own SQLite database (`store`), so that a bot process can die while the restaurant keeps
its bookings, and a lost answer or a timeout happens on a real connection:

    python -m bots.restaurant_service --port 0 --db .pipecat_actions/restaurant.db

=================================  ==========================================================
``GET  /availability``              free times near a time (``restaurant_id, date, time,
                                    party_size``)
``POST /bookings``                  book a table (201)
``GET  /bookings``                  find bookings by their fields (``restaurant_id, date,
                                    time, guest_name, status, idempotency_key``)
``GET  /bookings/{id}``             one booking
``POST /bookings/{id}/move``        move it (date, time)
``POST /bookings/{id}/cancel``      cancel it
``GET  /payments/{id}``             a deposit: paid and refunded so far
``POST /payments/{id}/refunds``     refund part of it (201)
``GET  /idempotency-keys/{key}``    what became of the request sent with ``key``
``POST /admin/faults``              arm a fault for the next request(s) of a kind
``POST /admin/latency``             how long requests of a kind take
``GET  /admin/stats``               requests received, side effects committed
=================================  ==========================================================

`app` documents the contract a client relies on (idempotency keys, what 409, 422 and 5xx mean)
and the faults; `process.RestaurantProcess` starts it as a child and always stops it. The
adapter a team writes against an API like this one is `bots.restaurant_api`.
"""
