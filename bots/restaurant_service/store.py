"""The restaurant's own database: bookings, payments, refunds and idempotency keys, in SQLite.

One file, one connection, written by one process (the service). Every business change and the
idempotency record of the request that made it are written in one transaction, so a key is
never "completed" without its booking, nor a booking made without its key recorded.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SLOTS: tuple[str, ...] = tuple(f"{h:02d}:{m:02d}" for h in range(12, 23) for m in (0, 30))
"""Bookable times (12:00 to 22:30), as in the in-memory fake."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS restaurants (
    restaurant_id TEXT PRIMARY KEY, tables INTEGER NOT NULL, max_party INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS bookings (
    booking_id TEXT PRIMARY KEY, restaurant_id TEXT NOT NULL, date TEXT NOT NULL,
    time TEXT NOT NULL, party_size INTEGER NOT NULL, guest_name TEXT NOT NULL,
    status TEXT NOT NULL, idempotency_key TEXT, created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS payments (
    payment_id TEXT PRIMARY KEY, amount_cents INTEGER NOT NULL, principal TEXT NOT NULL,
    refunded_cents INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS refunds (
    refund_id TEXT PRIMARY KEY, payment_id TEXT NOT NULL, amount_cents INTEGER NOT NULL,
    status TEXT NOT NULL, idempotency_key TEXT, created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS idempotency_keys (
    key TEXT PRIMARY KEY, request_hash TEXT NOT NULL, state TEXT NOT NULL,
    status_code INTEGER, response TEXT, created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS side_effects (kind TEXT PRIMARY KEY, count INTEGER NOT NULL);
"""


class Refused(Exception):
    """The request is understood and refused for good (an HTTP 409); nothing changed."""


@dataclass(frozen=True)
class KeyRecord:
    """What the service remembers of a request sent with an idempotency key."""

    key: str
    request_hash: str
    state: str  # "in_progress" or "completed"
    status_code: int | None
    response: dict[str, Any] | None
    created_at: float


class Store:
    """The service's SQLite database.

    Args:
        path: The database file; created, with the demo restaurant, when it is new.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        new = not self.path.exists()
        self.db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self.db.row_factory = sqlite3.Row
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")  # a commit the service answered is on disk
        self.db.executescript(SCHEMA)
        if new:
            self.seed()

    def seed(self) -> None:
        """The demo's restaurant (4 tables a slot) and the deposit paid for ``bk_0001``."""
        with self.transaction():
            self.db.execute("INSERT OR IGNORE INTO restaurants VALUES ('trattoria', 4, 8)")
            self.db.execute(
                "INSERT OR IGNORE INTO payments VALUES ('dep_bk_0001', 2000, 'alice', 0)"
            )

    def close(self) -> None:
        """Close the database."""
        self.db.close()

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: committed when the block ends, rolled back on an error."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    # -- idempotency keys ---------------------------------------------------------------------

    def key(self, key: str) -> KeyRecord | None:
        """The record of ``key``, or None."""
        row = self.db.execute("SELECT * FROM idempotency_keys WHERE key = ?", (key,)).fetchone()
        if row is None:
            return None
        response = json.loads(row["response"]) if row["response"] is not None else None
        return KeyRecord(
            row["key"],
            row["request_hash"],
            row["state"],
            row["status_code"],
            response,
            row["created_at"],
        )

    def claim_key(self, key: str, request_hash: str, ttl_secs: float) -> KeyRecord | None:
        """Record ``key`` as in progress; return the existing record instead if there is one.

        A record older than ``ttl_secs`` is forgotten first: the key may be used again.
        """
        with self.transaction() as db:
            db.execute(
                "DELETE FROM idempotency_keys WHERE key = ? AND created_at < ?",
                (key, time.time() - ttl_secs),
            )
            existing = self.key(key)
            if existing is not None:
                return existing
            db.execute(
                "INSERT INTO idempotency_keys VALUES (?, ?, 'in_progress', NULL, NULL, ?)",
                (key, request_hash, time.time()),
            )
        return None

    def release_key(self, key: str) -> None:
        """Forget an in-progress key whose request committed nothing (a 5xx answer)."""
        with self.transaction() as db:
            db.execute(
                "DELETE FROM idempotency_keys WHERE key = ? AND state = 'in_progress'", (key,)
            )

    @staticmethod
    def complete_key(db: sqlite3.Connection, key: str, status_code: int, response: Any) -> None:
        """Record the answer to ``key``'s request, inside the transaction that made it."""
        db.execute(
            "UPDATE idempotency_keys SET state = 'completed', status_code = ?, response = ? "
            "WHERE key = ?",
            (status_code, json.dumps(response), key),
        )

    # -- reads ----------------------------------------------------------------------------

    def availability(self, restaurant_id: str, date: str, time_: str, party_size: int) -> list[str]:
        """Free times on ``date``, nearest to ``time_`` first."""
        restaurant = self._restaurant(restaurant_id)
        if not 1 <= party_size <= restaurant["max_party"]:
            return []
        free = [s for s in SLOTS if self._taken(restaurant_id, date, s) < restaurant["tables"]]
        wanted = _minutes(time_)
        return sorted(free, key=lambda slot: (abs(_minutes(slot) - wanted), slot))

    def booking(self, booking_id: str) -> dict[str, Any] | None:
        """A booking as the API shows it, or None."""
        row = self.db.execute("SELECT * FROM bookings WHERE booking_id = ?", (booking_id,))
        found = row.fetchone()
        return _booking(found) if found is not None else None

    def bookings(self, **fields: Any) -> list[dict[str, Any]]:
        """Bookings whose columns equal ``fields`` (None values ignored), oldest first."""
        given = {k: v for k, v in fields.items() if v is not None}
        where = " AND ".join(f"{name} = ?" for name in given) or "1"
        rows = self.db.execute(
            f"SELECT * FROM bookings WHERE {where} ORDER BY booking_id", tuple(given.values())
        )
        return [_booking(row) for row in rows]

    def payment(self, payment_id: str) -> dict[str, Any] | None:
        """A payment (what was paid and refunded), or None."""
        row = self.db.execute("SELECT * FROM payments WHERE payment_id = ?", (payment_id,))
        found = row.fetchone()
        return dict(found) if found is not None else None

    def side_effects(self) -> dict[str, int]:
        """Committed changes by kind (``book``, ``move``, ``cancel``, ``refund``)."""
        rows = self.db.execute("SELECT kind, count FROM side_effects ORDER BY kind")
        return {row["kind"]: row["count"] for row in rows}

    # -- changes: each runs inside the caller's transaction ---------------------------------

    def book(self, db: sqlite3.Connection, body: dict[str, Any], key: str | None) -> dict[str, Any]:
        """Book a table; `Refused` when there is none free or the request cannot be served."""
        self._check_slot(body["restaurant_id"], body["date"], body["time"], body["party_size"])
        count = db.execute("SELECT COUNT(*) FROM bookings").fetchone()[0]
        booking_id = f"bk_{count + 1:04d}"
        db.execute(
            "INSERT INTO bookings VALUES (?, ?, ?, ?, ?, ?, 'confirmed', ?, ?)",
            (
                booking_id,
                body["restaurant_id"],
                body["date"],
                body["time"],
                body["party_size"],
                body["guest_name"],
                key,
                time.time(),
            ),
        )
        self._count(db, "book")
        return _found(self.booking(booking_id))

    def move(
        self, db: sqlite3.Connection, booking_id: str, date: str, time_: str
    ) -> dict[str, Any]:
        """Move a confirmed booking to another slot."""
        booking = self._confirmed(booking_id)
        self._check_slot(booking["restaurant_id"], date, time_, booking["party_size"], booking_id)
        db.execute(
            "UPDATE bookings SET date = ?, time = ? WHERE booking_id = ?", (date, time_, booking_id)
        )
        self._count(db, "move")
        return _found(self.booking(booking_id))

    def cancel(self, db: sqlite3.Connection, booking_id: str) -> dict[str, Any]:
        """Cancel a confirmed booking; a cancelled one is refused."""
        self._confirmed(booking_id)
        db.execute("UPDATE bookings SET status = 'cancelled' WHERE booking_id = ?", (booking_id,))
        self._count(db, "cancel")
        return _found(self.booking(booking_id))

    def refund(
        self, db: sqlite3.Connection, payment_id: str, amount_cents: int, key: str | None
    ) -> dict[str, Any]:
        """Refund part of a payment; more than what is left is refused."""
        payment = self.payment(payment_id)
        if payment is None:
            raise Refused(f"no payment {payment_id!r}")
        left = payment["amount_cents"] - payment["refunded_cents"]
        if not 0 < amount_cents <= left:
            raise Refused(f"cannot refund {amount_cents} cents of {payment_id!r}: {left} left")
        count = db.execute("SELECT COUNT(*) FROM refunds").fetchone()[0]
        refund_id = f"rf_{count + 1:04d}"
        db.execute(
            "INSERT INTO refunds VALUES (?, ?, ?, 'succeeded', ?, ?)",
            (refund_id, payment_id, amount_cents, key, time.time()),
        )
        db.execute(
            "UPDATE payments SET refunded_cents = refunded_cents + ? WHERE payment_id = ?",
            (amount_cents, payment_id),
        )
        self._count(db, "refund")
        return {"refund_id": refund_id, "payment_id": payment_id, "amount_cents": amount_cents}

    # -- internals ------------------------------------------------------------------------

    def _count(self, db: sqlite3.Connection, kind: str) -> None:
        db.execute(
            "INSERT INTO side_effects VALUES (?, 1) "
            "ON CONFLICT (kind) DO UPDATE SET count = count + 1",
            (kind,),
        )

    def _restaurant(self, restaurant_id: str) -> sqlite3.Row:
        row = self.db.execute(
            "SELECT * FROM restaurants WHERE restaurant_id = ?", (restaurant_id,)
        ).fetchone()
        if row is None:
            raise Refused(f"no restaurant {restaurant_id!r}")
        return row  # type: ignore[no-any-return]

    def _taken(self, restaurant_id: str, date: str, time_: str, ignore: str = "") -> int:
        row = self.db.execute(
            "SELECT COUNT(*) FROM bookings WHERE restaurant_id = ? AND date = ? AND time = ? "
            "AND status = 'confirmed' AND booking_id != ?",
            (restaurant_id, date, time_, ignore),
        ).fetchone()
        return int(row[0])

    def _check_slot(
        self, restaurant_id: str, date: str, time_: str, party_size: int, ignore: str = ""
    ) -> None:
        restaurant = self._restaurant(restaurant_id)
        if time_ not in SLOTS:
            raise Refused(f"{time_!r} is not a bookable time at {restaurant_id!r}")
        if not 1 <= party_size <= restaurant["max_party"]:
            raise Refused(f"{restaurant_id!r} cannot seat a party of {party_size}")
        if self._taken(restaurant_id, date, time_, ignore) >= restaurant["tables"]:
            raise Refused(f"no table free at {restaurant_id!r} on {date} at {time_}")

    def _confirmed(self, booking_id: str) -> dict[str, Any]:
        booking = self.booking(booking_id)
        if booking is None:
            raise Refused(f"no booking {booking_id!r}")
        if booking["status"] != "confirmed":
            raise Refused(f"booking {booking_id!r} is already {booking['status']}")
        return booking


def _booking(row: sqlite3.Row) -> dict[str, Any]:
    return {name: row[name] for name in row.keys() if name != "created_at"}  # noqa: SIM118


def _found(value: dict[str, Any] | None) -> dict[str, Any]:
    assert value is not None
    return value


def _minutes(hhmm: str) -> int:
    hours, _, minutes = hhmm.partition(":")
    try:
        return int(hours) * 60 + int(minutes)
    except ValueError:
        raise Refused(f"{hhmm!r} is not a time (HH:MM)") from None
