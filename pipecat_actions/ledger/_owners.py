"""The registry of lease owners (``pa_owners``): what `Ledger.hold_life` and its kin run.

Work functions of a SQLAlchemy `Connection`, run by the ledger's write or read path; the
locks themselves are `_life`'s.
"""

from __future__ import annotations

__all__ = [
    "forget",
    "gone_on_postgres",
    "lease_holders",
    "register",
    "registered",
    "unregister",
]

import os
import socket
from collections.abc import Collection

from sqlalchemy import Connection, bindparam, delete, exists, insert, select, text

from pipecat_actions.ledger._life import life_key
from pipecat_actions.ledger._rows import NON_TERMINAL
from pipecat_actions.ledger.schema import operations, owners

_OPEN = [s.value for s in NON_TERMINAL]


def register(conn: Connection, owner: str, *, now: float) -> None:
    """Register ``owner`` (again: a new incarnation of the name replaces the old row).

    One transaction (the caller's): the old row goes and the new one comes together.
    """
    conn.execute(delete(owners).where(owners.c.owner == owner))
    conn.execute(
        insert(owners).values(
            owner=owner,
            life_key=life_key(owner),
            started_at=now,
            host=socket.gethostname()[:256],
            pid=os.getpid(),
        )
    )


def unregister(conn: Connection, owner: str) -> None:
    """Remove ``owner`` from the registry (its clean close)."""
    conn.execute(delete(owners).where(owners.c.owner == owner))


def lease_holders(conn: Connection, *, besides: str, now: float) -> list[str]:
    """The owners of live leases of non-terminal operations, ``besides`` left out."""
    c = operations.c
    query = (
        select(c.lease_owner)
        .where(
            c.status.in_(_OPEN),
            c.lease_owner.is_not(None),
            c.lease_owner != besides,
            c.lease_expires_at > now,
        )
        .distinct()
    )
    return [row[0] for row in conn.execute(query)]


def registered(conn: Connection, candidates: Collection[str]) -> list[str]:
    """Those of ``candidates`` that are in the registry."""
    if not candidates:
        return []
    query = select(owners.c.owner).where(owners.c.owner.in_(list(candidates)))
    return [row[0] for row in conn.execute(query)]


_GONE_ON_POSTGRES = text(
    """
SELECT o.owner FROM pa_owners o
WHERE o.owner IN :owners
  AND NOT EXISTS (
    SELECT 1 FROM pg_locks l
    WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND l.classid::bigint = ((o.life_key >> 32) & 4294967295)
      AND l.objid::bigint = (o.life_key & 4294967295)
  )
"""
).bindparams(bindparam("owners", expanding=True))
"""The registered owners whose advisory lock (`_life.PostgresLife`) nobody holds."""


def gone_on_postgres(conn: Connection, candidates: Collection[str]) -> list[str]:
    """Those of ``candidates`` registered whose life lock is free (PostgreSQL)."""
    if not candidates:
        return []
    return [row[0] for row in conn.execute(_GONE_ON_POSTGRES, {"owners": list(candidates)})]


def forget(conn: Connection, gone: Collection[str]) -> list[str]:
    """Unregister those of ``gone`` that hold no non-terminal operation; return them."""
    if not gone:
        return []
    holding = exists().where(
        operations.c.lease_owner == owners.c.owner, operations.c.status.in_(_OPEN)
    )
    done = [
        row[0]
        for row in conn.execute(
            select(owners.c.owner).where(owners.c.owner.in_(list(gone)), ~holding)
        )
    ]
    if done:
        conn.execute(delete(owners).where(owners.c.owner.in_(done)))
    return done
