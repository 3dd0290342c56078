"""The crash checker: what must hold once the runtimes that recovered a crash are done.

`gather` reads the evidence (the ledger, its audit trails and undelivered query, the system
of record, what the dead child had acknowledged); `check` judges it. Every rule says what it
protects:

1. **Nothing left pending**: every operation is terminal, or handed to a person and listed,
   with why, in `Verdict.escalated`: an escalated UNKNOWN, or a COMPENSATING original
   escalated together with its escalated UNKNOWN compensation (nobody can tell whether it
   was reversed, so no other status would be true).
2. **Side effects match the ledger** (counted per idempotency key at the provider): a
   committed operation (COMMITTED, COMPENSATING, COMPENSATED) has exactly one; one that did
   not happen (FAILED_FINAL, CANCELLED, REJECTED, EXPIRED) has none; UNKNOWN at most one;
   no key has more than one, whether the provider dedupes or not; no side effect belongs to
   a key the ledger does not know (an operation lost after its effect). A committed result
   names the provider's first row for the key.
3. **Nothing acknowledged is lost**: every operation the child said was admitted or told is
   in the ledger; the status it was told had been written first (it is in the audit trail)
   and the final status follows from it (``committed`` stays committed or is compensated;
   ``unknown`` may settle either way).
4. **Nothing undelivered is silent**: every COMMITTED operation never delivered is listed by
   the ledger's undelivered query (`ActionRuntime.undelivered`); without a gate in the child
   nothing may claim a delivery.
5. **The ledger agrees with itself**: the last audit event of each operation ends in its
   status; a compensation and its original agree (COMPENSATED only with a committed
   compensation, and the other way round).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipecat_actions.ledger import Ledger
from pipecat_actions.ledger.records import Operation, OperationEvent
from pipecat_actions.status import TERMINAL_STATUSES, TRANSITIONS, ActionStatus
from tests._file_system_of_record import FileSystemOfRecord

S = ActionStatus
COMMITTED_FAMILY = frozenset({S.COMMITTED, S.COMPENSATING, S.COMPENSATED})
DID_NOT_HAPPEN = frozenset({S.FAILED_FINAL, S.CANCELLED, S.REJECTED, S.EXPIRED})


@dataclass
class Evidence:
    """Everything the checker looks at, read after the recovery window."""

    ops: list[Operation]
    trails: dict[str, list[OperationEvent]]
    effects: dict[str, int]
    requests: dict[str, int]
    first_rows: dict[str, int]
    undelivered: set[str]
    acks: list[dict[str, Any]]
    gate: bool
    """Whether the child ran a gate (the only writer of ``delivered_at``)."""


@dataclass
class Verdict:
    """What the checker found."""

    problems: list[str] = field(default_factory=list)
    escalated: list[str] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)
    deduplicated: dict[str, int] = field(default_factory=dict)
    """Keys the provider received more than once, with the number of requests."""

    def summary(self) -> str:
        """One line: statuses, escalations, requests the provider deduplicated."""
        parts = [", ".join(f"{k}={v}" for k, v in sorted(self.statuses.items()))]
        if self.escalated:
            parts.append(f"escalated: {'; '.join(self.escalated)}")
        if self.deduplicated:
            parts.append(f"repeated requests: {self.deduplicated}")
        return " | ".join(parts)


async def gather(
    ledger: Ledger,
    sor: FileSystemOfRecord,
    acks: Sequence[Mapping[str, Any]],
    *,
    undelivered: Iterable[Operation],
    gate: bool,
) -> Evidence:
    """Read the evidence from the ledger and the provider.

    Args:
        ledger: The ledger after the recovery window.
        sor: The provider.
        acks: The child's lines.
        undelivered: What the undelivered query answers (`ActionRuntime.undelivered`).
        gate: Whether the child ran a gate.
    """
    ops = await ledger.list()
    effects = sor.effects_by_key()
    first_rows = {key: row for key in effects if (row := sor.find(key)) is not None}
    return Evidence(
        ops=ops,
        trails={op.operation_id: await ledger.events(op.operation_id) for op in ops},
        effects=effects,
        requests=sor.requests_by_key(),
        first_rows=first_rows,
        undelivered={op.operation_id for op in undelivered},
        acks=[dict(a) for a in acks],
        gate=gate,
    )


def _name(op: Operation) -> str:
    ref = op.args.get("ref", "?") if isinstance(op.args, dict) else "?"
    return f"{op.operation_id} ({op.tool} {ref})"


def _reachable(start: ActionStatus) -> set[ActionStatus]:
    seen, todo = {start}, [start]
    while todo:
        for nxt in TRANSITIONS[todo.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return seen


def _handed_to_a_person(op: Operation, compensations: Sequence[Operation]) -> bool:
    """An escalated UNKNOWN, or a COMPENSATING original escalated with its compensation."""
    if op.escalated_at is None:
        return False
    if op.status is S.UNKNOWN:
        return True
    return op.status is S.COMPENSATING and any(
        c.status is S.UNKNOWN and c.escalated_at is not None for c in compensations
    )


def settled(op: Operation, ops: Sequence[Operation]) -> bool:
    """True when nothing is left to do for ``op``: terminal, or handed to a person."""
    compensations = [c for c in ops if c.compensates == op.operation_id]
    return op.status in TERMINAL_STATUSES or _handed_to_a_person(op, compensations)


def check(evidence: Evidence) -> Verdict:
    """Judge the evidence against the rules of the module docstring."""
    verdict = Verdict()
    ops = {op.operation_id: op for op in evidence.ops}
    by_key = {op.idempotency_key: op for op in evidence.ops if op.status is not S.REJECTED}
    compensations: dict[str, list[Operation]] = {}
    for op in evidence.ops:
        if op.compensates is not None:
            compensations.setdefault(op.compensates, []).append(op)
    verdict.statuses = dict(Counter(op.status.value for op in evidence.ops))
    problems = verdict.problems

    for op in evidence.ops:
        # 1. Nothing left pending.
        if _handed_to_a_person(op, compensations.get(op.operation_id, [])):
            reasons = [
                e.detail.get("escalated")
                for e in evidence.trails[op.operation_id]
                if isinstance(e.detail, dict) and e.detail.get("escalated")
            ]
            verdict.escalated.append(
                f"{_name(op)} {op.status.value}: {reasons[-1] if reasons else '?'}"
            )
        elif op.status not in TERMINAL_STATUSES:
            problems.append(f"{_name(op)} is still {op.status.value} after the recovery window")
        # 2. Side effects match the ledger.
        if op.kind == "mutation" and op.status is not S.REJECTED:
            count = evidence.effects.get(op.idempotency_key, 0)
            if op.status in COMMITTED_FAMILY and count != 1:
                problems.append(f"{_name(op)} is {op.status.value} with {count} side effects")
            elif op.status in DID_NOT_HAPPEN and count != 0:
                problems.append(f"{_name(op)} is {op.status.value} but made {count} side effects")
            elif count > 1:
                problems.append(f"{_name(op)} made {count} side effects")
            first = evidence.first_rows.get(op.idempotency_key)
            result = op.result if isinstance(op.result, dict) else {}
            if op.status in COMMITTED_FAMILY and result.get("row") != first:
                problems.append(
                    f"{_name(op)} records row {result.get('row')}, the provider's is {first}"
                )
        # 5. The ledger agrees with itself.
        trail = evidence.trails[op.operation_id]
        if not trail or trail[-1].to_status is not op.status:
            last = trail[-1].to_status.value if trail else None
            problems.append(f"{_name(op)} is {op.status.value}; its trail ends in {last}")
        if op.compensates is not None:
            original = ops.get(op.compensates)
            if original is None:
                problems.append(f"{_name(op)} compensates an operation not in the ledger")
            elif (original.status is S.COMPENSATED) != (op.status is S.COMMITTED):
                problems.append(
                    f"{_name(op)} is {op.status.value} but the operation it reverses is "
                    f"{original.status.value}"
                )
        # 4. Nothing undelivered is silent.
        silent = op.status is S.COMMITTED and op.delivered_at is None
        if silent and op.operation_id not in evidence.undelivered:
            problems.append(f"{_name(op)} is COMMITTED, undelivered and not listed as such")
        if op.delivered_at is not None and not evidence.gate:
            problems.append(f"{_name(op)} is marked delivered but nothing delivered it")

    for key, count in evidence.effects.items():
        if key not in by_key:
            problems.append(f"{count} side effect(s) under key {key!r}, unknown to the ledger")
    verdict.deduplicated = {k: n for k, n in evidence.requests.items() if n > 1}

    # 3. Nothing acknowledged is lost.
    for ack in evidence.acks:
        operation_id = ack.get("operation_id")
        if ack.get("event") not in ("admitted", "told", "crash", "crash_point"):
            continue
        if not operation_id:
            continue
        acked = ops.get(str(operation_id))
        if acked is None:
            problems.append(f"{ack.get('event')} {operation_id} ({ack}) is not in the ledger")
            continue
        status = ack.get("status") if ack.get("event") == "told" else None
        if status in (None, "refused"):
            continue
        told = ActionStatus(str(status).upper())
        written = {e.to_status for e in evidence.trails[acked.operation_id]}
        if told not in written:
            problems.append(f"{_name(acked)} was told {told.value} before the ledger had it")
        if acked.status not in _reachable(told):
            problems.append(
                f"{_name(acked)} was told {told.value} and ended {acked.status.value}, "
                "which does not follow from it"
            )
    return verdict
