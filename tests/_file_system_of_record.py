"""`FileSystemOfRecord`: a system of record in a SQLite file, which outlives a SIGKILLed process.

Used by the SIGKILL tests (``tests/runtime/test_recovery.py``, ``tests/crash``): the process that
runs the effects is killed, and the test then counts what really happened. It imports nothing
from Pipecat, so a child process that uses it starts quickly.
"""

from __future__ import annotations

import contextlib
import json
import sqlite3
from collections.abc import Mapping
from pathlib import Path
from typing import Any


class FileSystemOfRecord:
    """A system of record kept in a SQLite file: one row per committed side effect.

    Every request that reaches it is recorded too (``requests``), whether it committed
    something or not, so a test can tell a request the provider deduplicated from one that
    never came.

    Args:
        path: The file; created when missing.
        honours_idempotency_keys: Whether a repeated key returns the first row instead of
            committing a new side effect.
    """

    def __init__(self, path: Path, *, honours_idempotency_keys: bool = False) -> None:
        self.path = path
        self.honours_idempotency_keys = honours_idempotency_keys
        with contextlib.closing(self._connect()) as db:
            db.execute(
                "CREATE TABLE IF NOT EXISTS effects ("
                " id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL, kind TEXT NOT NULL,"
                " payload TEXT NOT NULL)"
            )
            db.execute(
                "CREATE TABLE IF NOT EXISTS requests ("
                " id INTEGER PRIMARY KEY AUTOINCREMENT, key TEXT NOT NULL, kind TEXT NOT NULL)"
            )

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=FULL")
        return db

    def receive(self, key: str, kind: str) -> None:
        """Record a request that reached the provider and has not been answered (yet)."""
        with contextlib.closing(self._connect()) as db:
            db.execute("INSERT INTO requests (key, kind) VALUES (?, ?)", (key, kind))

    def commit(self, key: str, kind: str, payload: Mapping[str, Any]) -> int:
        """Commit one side effect (or replay the key's first one); return its row id."""
        db = self._connect()
        try:
            db.execute("BEGIN IMMEDIATE")
            db.execute("INSERT INTO requests (key, kind) VALUES (?, ?)", (key, kind))
            if self.honours_idempotency_keys:
                row = db.execute("SELECT id FROM effects WHERE key = ?", (key,)).fetchone()
                if row is not None:
                    db.execute("COMMIT")
                    return int(row[0])
            cursor = db.execute(
                "INSERT INTO effects (key, kind, payload) VALUES (?, ?, ?)",
                (key, kind, json.dumps(dict(payload), sort_keys=True)),
            )
            db.execute("COMMIT")
            assert cursor.lastrowid is not None
            return cursor.lastrowid
        finally:
            db.close()

    def find(self, key: str) -> int | None:
        """Return the first row committed with ``key``, or None."""
        with contextlib.closing(self._connect()) as db:
            row = db.execute("SELECT min(id) FROM effects WHERE key = ?", (key,)).fetchone()
        return None if row is None or row[0] is None else int(row[0])

    def effects_by_key(self) -> dict[str, int]:
        """Return how many side effects each key committed."""
        with contextlib.closing(self._connect()) as db:
            rows = db.execute("SELECT key, count(*) FROM effects GROUP BY key").fetchall()
        return {key: count for key, count in rows}

    def requests_by_key(self) -> dict[str, int]:
        """Return how many requests reached the provider with each key."""
        with contextlib.closing(self._connect()) as db:
            rows = db.execute("SELECT key, count(*) FROM requests GROUP BY key").fetchall()
        return {key: count for key, count in rows}
