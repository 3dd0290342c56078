"""Fakes for the unit tests of the parts: a ledger in memory, and what it was asked.

`MemoryLedger` keeps the contract's rules that a part relies on (a key bound once per tenant,
a repeat of the same intent joining it, a change refused when the status or the fence moved)
and builds its rows with the SQL ledger's own row helpers, so an `Operation` read back is the
one the real ledger would return. It writes down every write it was asked for (`writes`), in
order, and a test can make the next writes fail (`fail_next`).
"""

from __future__ import annotations

import builtins
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pipecat_actions.clock import ManualClock
from pipecat_actions.errors import (
    IdempotencyMismatch,
    OperationNotFound,
    StaleFence,
    UnexpectedStatus,
)
from pipecat_actions.ledger import (
    AdmitResult,
    Ledger,
    NewOperation,
    Operation,
    OperationEvent,
    OperationFilter,
)
from pipecat_actions.ledger._rows import (
    EncodedOperation,
    column_changes,
    new_row,
    operation_from_row,
)
from pipecat_actions.ledger.records import First
from pipecat_actions.status import (
    REPEATABLE_STATUSES,
    TERMINAL_STATUSES,
    ActionStatus,
    check_transition,
)

S = ActionStatus


@dataclass(frozen=True)
class Write:
    """One write the ledger was asked for: its verb, the operation, and what it said."""

    verb: str
    operation_id: str
    to: ActionStatus | None = None
    detail: Mapping[str, Any] | None = None
    changes: Mapping[str, Any] | None = None


@dataclass(eq=False)
class MemoryLedger(Ledger):
    """A `Ledger` in memory on a `ManualClock` (see the module docstring)."""

    clock: ManualClock
    rows: dict[str, dict[str, Any]] = field(default_factory=dict)
    writes: list[Write] = field(default_factory=list)
    fail_next: list[Exception] = field(default_factory=list)
    """Raised, one each, by the next writes (before they change anything)."""
    _slots: dict[tuple[str, str], str] = field(default_factory=dict)

    @staticmethod
    def _change(row: dict[str, Any], changes: Mapping[str, Any] | None) -> None:
        """Set ``changes`` on ``row``; a `First` only where the column holds nothing yet."""
        for column, value in column_changes(changes).items():
            if isinstance(value, First):
                if row[column] is None:
                    row[column] = value.value
            else:
                row[column] = value

    def _failing(self) -> None:
        if self.fail_next:
            raise self.fail_next.pop(0)

    def _op(self, operation_id: str) -> Operation:
        return operation_from_row(self.rows[operation_id])

    def statuses(self, operation_id: str) -> list[ActionStatus | None]:
        """The statuses ``operation_id`` was written at, in order (None: an annotation)."""
        return [w.to for w in self.writes if w.operation_id == operation_id]

    # --- writes ----------------------------------------------------------------------------

    async def admit(self, new: NewOperation) -> AdmitResult:
        self._failing()
        encoded = EncodedOperation.of(new)
        slot = (new.tenant, new.idempotency_key)
        held_id = self._slots.get(slot)
        if held_id is not None:
            held = self._op(held_id)
            alive = held.key_expires_at > self.clock.now()
            if alive and held.status not in REPEATABLE_STATUSES:
                if held.args_hash != encoded.args_hash or held.tool != new.tool:
                    raise IdempotencyMismatch(
                        tenant=new.tenant,
                        idempotency_key=new.idempotency_key,
                        operation_id=held_id,
                        expected_args_hash=held.args_hash,
                        given_args_hash=encoded.args_hash,
                    )
                return AdmitResult(held, created=False)
        self.rows[new.operation_id] = new_row(
            encoded, self.clock.now(), key_slot=new.idempotency_key
        )
        self._slots[slot] = new.operation_id
        self.writes.append(Write("admit", new.operation_id, new.status, new.detail))
        return AdmitResult(self._op(new.operation_id), created=True)

    async def _insert(self, verb: str, new: NewOperation) -> Operation:
        self._failing()
        self.rows[new.operation_id] = new_row(
            EncodedOperation.of(new), self.clock.now(), key_slot=None
        )
        self.writes.append(Write(verb, new.operation_id, new.status, new.detail))
        return self._op(new.operation_id)

    async def record_refusal(self, new: NewOperation) -> Operation:
        return await self._insert("refusal", replace(new, status=S.REJECTED))

    async def record_completed(self, new: NewOperation) -> Operation:
        return await self._insert("completed", new)

    def _matching(
        self, operation_id: str, expected: ActionStatus | None, fence: int | None
    ) -> dict[str, Any]:
        row = self.rows.get(operation_id)
        if row is None:
            raise OperationNotFound(operation_id=operation_id)
        if fence is not None and row["fence"] != fence:
            raise StaleFence(
                operation_id=operation_id,
                given_fence=fence,
                actual_fence=row["fence"],
                actual_status=row["status"],
            )
        if expected is not None and row["status"] != expected.value:
            raise UnexpectedStatus(
                operation_id=operation_id,
                expected_status=str(expected),
                actual_status=row["status"],
            )
        return row

    async def transition(
        self,
        operation_id: str,
        *,
        expected: ActionStatus,
        to: ActionStatus,
        fence: int,
        actor: str,
        detail: Mapping[str, Any] | None = None,
        changes: Mapping[str, Any] | None = None,
    ) -> Operation:
        check_transition(expected, to, operation_id=operation_id)
        self._failing()
        row = self._matching(operation_id, expected, fence)
        now = self.clock.now()
        self._change(row, changes)
        row.update(status=to.value, updated_at=now)
        row["event_seq"] += 1
        if to is S.RUNNING:
            row["attempt"] += 1
            row["started_at"] = row["started_at"] or now
            row["sent_at"] = row["sent_at"] or now
        if to is S.COMMITTED and expected is not S.COMPENSATING:
            row["committed_at"] = now
        if to in TERMINAL_STATUSES:
            row["finished_at"] = now
        self.writes.append(Write("transition", operation_id, to, detail, changes))
        return self._op(operation_id)

    async def annotate(
        self,
        operation_id: str,
        *,
        actor: str,
        detail: Mapping[str, Any] | None = None,
        changes: Mapping[str, Any] | None = None,
        expected: ActionStatus | None = None,
        fence: int | None = None,
    ) -> Operation:
        self._failing()
        row = self._matching(operation_id, expected, fence)
        self._change(row, changes)
        row["updated_at"] = self.clock.now()
        row["event_seq"] += 1
        self.writes.append(Write("annotate", operation_id, None, detail, changes))
        return self._op(operation_id)

    # --- reads -----------------------------------------------------------------------------

    async def get(self, operation_id: str) -> Operation:
        if operation_id not in self.rows:
            raise OperationNotFound(operation_id=operation_id)
        return self._op(operation_id)

    async def find_by_key(self, tenant: str, idempotency_key: str) -> Operation | None:
        held_id = self._slots.get((tenant, idempotency_key))
        if held_id is None:
            return None
        held = self._op(held_id)
        live = held.key_expires_at > self.clock.now()
        return held if live and held.status not in REPEATABLE_STATUSES else None

    async def list(self, filters: OperationFilter | None = None) -> builtins.list[Operation]:
        f = filters or OperationFilter()
        wanted = None if f.status is None else {ActionStatus(s) for s in f.status}
        found = [
            op
            for op in (self._op(i) for i in self.rows)
            if (f.session_id is None or op.session_id == f.session_id)
            and (wanted is None or op.status in wanted)
            and (f.tool is None or op.tool == f.tool)
        ]
        return sorted(found, key=lambda op: (op.created_at, op.operation_id))[: f.limit]

    async def events(self, operation_id: str) -> builtins.list[OperationEvent]:
        return []

    async def claim_stale(
        self,
        owner: str,
        *,
        lease_secs: float,
        limit: int,
        except_ids: Collection[str] = (),
        gone: Collection[str] = (),
    ) -> builtins.list[Operation]:
        return []

    async def renew_lease(
        self, owner: str, *, lease_secs: float, except_ids: Collection[str] = ()
    ) -> int:
        return 0

    async def close(self) -> None:
        return None
