"""Which stale operations `SqlLedger.claim_stale` takes: the statements that find them.

A claimable operation is open (non-terminal) and has no lease, or an expired one, or an owner
known gone. Claiming gives it to the claimer with a live lease, so that it no longer matches:
a pass of batches (claim until one comes back empty) needs no list of what it claimed already.

Each batch is found by seeks and ranges of the lease index ``(status, lease_owner,
lease_expires_at)`` (migration 0010) that a claimed row leaves, never by a walk over the rows
earlier batches claimed: the gone owners' rows; the unowned ones; then the expired leases of
the owners sorted before the claimer, its own, and those sorted after it. The claimer's own
live leases (what the pass claimed, what it runs) are the one range none of them reads, so a
batch reads the same index entries however many the batches before it claimed.
"""

from __future__ import annotations

__all__ = ["StaleQuery"]

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from sqlalchemy import CompoundSelect, Select, and_, or_, select, union_all

from pipecat_actions.ledger._rows import NON_TERMINAL
from pipecat_actions.ledger.schema import LEASE_INDEX, operations

_OPEN = [s.value for s in NON_TERMINAL]
_HINT = f"INDEXED BY {LEASE_INDEX}"  # SQLite's planner, from ANALYZE, may prefer another


@dataclass(frozen=True)
class StaleQuery:
    """The statements of one claim: ``owner`` claims up to ``limit`` stale operations at ``now``.

    Attributes:
        owner: The claimer (never one of ``gone``: its own rows are claimed once their lease
            ends, see `Ledger.end_leases`).
        now: The claim's time: leases ending by then are expired.
        limit: How many to claim at most.
        except_ids: Operations left alone (the claimer cannot run them; few).
        gone: Owners known gone: their operations are claimed whatever their lease says.
    """

    owner: str
    now: float
    limit: int
    except_ids: Collection[str] = ()
    gone: Collection[str] = ()

    def _groups(self) -> list[list[Any]]:
        c = operations.c
        expired = c.lease_expires_at <= self.now
        dead = [o for o in self.gone if o != self.owner]
        # A row with no lease has no owner (`_rows.new_row`, and a claim sets both).
        return [
            *([[c.lease_owner.in_(dead)]] if dead else []),
            [c.lease_owner.is_(None)],
            [c.lease_owner < self.owner, expired],
            [c.lease_owner == self.owner, expired],
            [c.lease_owner > self.owner, expired],
        ]

    def stale(self) -> Any:
        """The condition a row must meet to be claimed, checked again on the row it locks."""
        c = operations.c
        return and_(
            c.status.in_(_OPEN),
            or_(*(and_(*group) for group in self._groups())),
            *([c.operation_id.not_in(list(self.except_ids))] if self.except_ids else []),
        )

    def candidates(self) -> CompoundSelect[Any]:
        """The ids of up to ``limit`` stale operations, each group an index seek or range."""
        c = operations.c
        left = [c.operation_id.not_in(list(self.except_ids))] if self.except_ids else []
        branches: list[Select[Any]] = [
            select(c.operation_id)
            .with_hint(operations, _HINT, "sqlite")
            .where(c.status.in_(_OPEN), *group, *left)
            for group in self._groups()
        ]
        return union_all(*branches).limit(self.limit)

    def locking(self) -> Select[Any]:
        """Lock the candidates (skipping those another transaction holds) that are still stale.

        The condition is checked again on each row as it is locked (on PostgreSQL, on its
        newest version): one another claimer took meanwhile is not taken twice.
        """
        c = operations.c
        return (
            select(c.operation_id, c.lease_owner)
            .where(c.operation_id.in_(self.candidates()), self.stale())
            .with_for_update(skip_locked=True)
        )

    def waiting_for(self, operation_id: str) -> Select[Any]:
        """Lock ``operation_id`` if it is still stale, waiting for whoever holds it."""
        c = operations.c
        return (
            select(c.operation_id, c.lease_owner)
            .where(c.operation_id == operation_id, self.stale())
            .with_for_update()
        )
