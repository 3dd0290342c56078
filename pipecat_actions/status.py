"""The status machine of an operation: every status and every allowed transition, in one table.

```
REQUESTED → ADMITTED → RUNNING → COMMITTED → COMPENSATING → COMPENSATED
   │           │          ├──→ FAILED_RETRYABLE → RUNNING (next attempt) | FAILED_FINAL | CANCELLED
   │           │          ├──→ FAILED_FINAL
   │           │          ├──→ UNKNOWN → (reconcile) COMMITTED | FAILED_FINAL | FAILED_RETRYABLE
   │           │          └──→ CANCEL_REQUESTED → CANCELLED (only when the provider confirms)
   │           │                                 | COMMITTED (too late) | FAILED_FINAL | UNKNOWN
   │           └──→ CANCELLED (nothing sent) | EXPIRED | FAILED_FINAL (refused before sending)
   ├──→ REJECTED (validation, authorization, limits, duplicate policy)
   └──→ AWAITING_CONFIRMATION / AWAITING_APPROVAL → ADMITTED | REJECTED | EXPIRED
```

Three edges go beyond the first sketch in DESIGN.md, all to keep the ledger truthful:

* ``UNKNOWN → FAILED_RETRYABLE``: reconciliation found that the system of record has no trace
  of the operation, so the attempt is known not to have happened and may be retried per policy.
* ``COMPENSATING → COMMITTED``: the compensation failed for good; the original effect stands.
* ``FAILED_FINAL → COMMITTED``: a conflict, never a step of a run: the system of record reports
  a commit for an operation the ledger held as failed. The ledger follows the system of record;
  the conflict is audited, counted and escalated, and the conversation is told the correction.

``REQUESTED`` is the status every operation starts from; the ledger records the first
transitions of a new operation (``REQUESTED → ADMITTED → RUNNING``) in the same transaction as
its insert, so a call costs one write before its effect.

Escalation of an ``UNKNOWN`` operation is not a status change: it is an audit event and a
timestamp on the operation, which stays ``UNKNOWN`` until the system of record answers.
"""

from __future__ import annotations

__all__ = [
    "AWAITING_PERSON_STATUSES",
    "HAPPENED_STATUSES",
    "IN_FLIGHT_STATUSES",
    "MAYBE_SENT_STATUSES",
    "REPEATABLE_STATUSES",
    "TERMINAL_STATUSES",
    "TRANSITIONS",
    "UNSENT_STATUSES",
    "ActionStatus",
    "check_transition",
    "is_terminal",
    "path_from_requested",
]

from collections import deque
from enum import StrEnum

from pipecat_actions.errors import IllegalTransition


class ActionStatus(StrEnum):
    """Status of one operation in the ledger."""

    REQUESTED = "REQUESTED"
    AWAITING_CONFIRMATION = "AWAITING_CONFIRMATION"
    AWAITING_APPROVAL = "AWAITING_APPROVAL"
    ADMITTED = "ADMITTED"
    RUNNING = "RUNNING"
    FAILED_RETRYABLE = "FAILED_RETRYABLE"
    UNKNOWN = "UNKNOWN"
    CANCEL_REQUESTED = "CANCEL_REQUESTED"
    COMMITTED = "COMMITTED"
    COMPENSATING = "COMPENSATING"
    COMPENSATED = "COMPENSATED"
    FAILED_FINAL = "FAILED_FINAL"
    CANCELLED = "CANCELLED"
    REJECTED = "REJECTED"
    EXPIRED = "EXPIRED"


S = ActionStatus

TRANSITIONS: dict[ActionStatus, frozenset[ActionStatus]] = {
    S.REQUESTED: frozenset({S.ADMITTED, S.REJECTED, S.AWAITING_CONFIRMATION, S.AWAITING_APPROVAL}),
    S.AWAITING_CONFIRMATION: frozenset({S.ADMITTED, S.REJECTED, S.EXPIRED}),
    S.AWAITING_APPROVAL: frozenset({S.ADMITTED, S.REJECTED, S.EXPIRED}),
    S.ADMITTED: frozenset({S.RUNNING, S.CANCELLED, S.EXPIRED, S.FAILED_FINAL}),
    S.RUNNING: frozenset(
        {S.COMMITTED, S.FAILED_RETRYABLE, S.FAILED_FINAL, S.UNKNOWN, S.CANCEL_REQUESTED}
    ),
    S.FAILED_RETRYABLE: frozenset({S.RUNNING, S.FAILED_FINAL, S.CANCELLED}),
    S.UNKNOWN: frozenset({S.COMMITTED, S.FAILED_FINAL, S.FAILED_RETRYABLE}),
    S.CANCEL_REQUESTED: frozenset({S.CANCELLED, S.COMMITTED, S.FAILED_FINAL, S.UNKNOWN}),
    S.COMMITTED: frozenset({S.COMPENSATING}),
    S.COMPENSATING: frozenset({S.COMPENSATED, S.COMMITTED}),
    S.COMPENSATED: frozenset(),
    S.FAILED_FINAL: frozenset({S.COMMITTED}),
    S.CANCELLED: frozenset(),
    S.REJECTED: frozenset(),
    S.EXPIRED: frozenset(),
}
"""Allowed transitions: ``TRANSITIONS[from_status]`` is the set of statuses it may move to."""

TERMINAL_STATUSES: frozenset[ActionStatus] = frozenset(
    {S.COMMITTED, S.COMPENSATED, S.FAILED_FINAL, S.CANCELLED, S.REJECTED, S.EXPIRED}
)
"""Statuses whose outcome is settled: nothing runs, nothing waits, nothing needs reconciling.

``COMMITTED`` is terminal although it may later move to ``COMPENSATING``: compensation is a new
operation started on purpose, not pending work of the original one.
"""

HAPPENED_STATUSES: frozenset[ActionStatus] = frozenset({S.COMMITTED, S.COMPENSATING, S.COMPENSATED})
"""Statuses of an operation whose effect took place, whether or not it was reversed since."""


IN_FLIGHT_STATUSES: frozenset[ActionStatus] = frozenset(
    {S.ADMITTED, S.RUNNING, S.FAILED_RETRYABLE, S.CANCEL_REQUESTED}
)
"""Statuses whose outcome is due by the deadline without anyone's answer: worth waiting for.

Not ``UNKNOWN`` (reconciliation may take longer than any caller waits) nor the statuses that wait
for a person (``AWAITING_APPROVAL``, ``AWAITING_CONFIRMATION``).
"""

AWAITING_PERSON_STATUSES: frozenset[ActionStatus] = frozenset(
    {S.AWAITING_CONFIRMATION, S.AWAITING_APPROVAL}
)
"""Statuses that wait for a person: the user's spoken yes, or an approver's decision.

Nothing was sent; a deadline expires them (``EXPIRED``), a cancel rejects them.
"""

UNSENT_STATUSES: frozenset[ActionStatus] = frozenset({S.ADMITTED, S.FAILED_RETRYABLE})
"""Statuses with no attempt in flight: admitted and not sent yet, or between two attempts.

A deadline fails them (``FAILED_FINAL``), a cancel withdraws them (``CANCELLED``), and recovery
runs them again or fails them (``recover_unsent``).
"""

MAYBE_SENT_STATUSES: frozenset[ActionStatus] = frozenset({S.RUNNING, S.CANCEL_REQUESTED})
"""Statuses in which an attempt may have reached the provider and its answer is awaited.

A deadline or a restart makes them ``UNKNOWN`` (then reconciled), never ``FAILED_FINAL``.
"""


REPEATABLE_STATUSES: frozenset[ActionStatus] = frozenset(
    {S.CANCELLED, S.FAILED_FINAL, S.EXPIRED, S.REJECTED, S.COMPENSATED}
)
"""Statuses after which nothing of an intent stands: a repeat of it is a new operation.

The operation did not happen (or was reversed), so its idempotency key no longer holds the
intent: the user's "go ahead" after a cancelled or failed booking makes a new booking instead of
joining the dead one. Every other status joins: in flight, waiting for a person, ``UNKNOWN``
(it may have happened), ``COMMITTED`` and ``COMPENSATING``.
"""


_MEMBERS: dict[str, ActionStatus] = {status.value: status for status in ActionStatus}


def is_terminal(status: ActionStatus | str) -> bool:
    """Return True when an operation in ``status`` needs no further work by the runtime."""
    return ActionStatus(status) in TERMINAL_STATUSES


def check_transition(
    from_status: ActionStatus | str,
    to_status: ActionStatus | str,
    *,
    operation_id: str | None = None,
) -> tuple[ActionStatus, ActionStatus]:
    """Raise `IllegalTransition` unless ``from_status → to_status`` is in the table.

    Args:
        from_status: The status the operation is in.
        to_status: The status it should move to.
        operation_id: Named in the error, when known.

    Returns:
        The two statuses, as `ActionStatus` members.

    Raises:
        IllegalTransition: The table does not allow this move (unknown names included).
    """
    try:
        # A dict lookup, not ActionStatus(...): a member is its own text, and every write
        # of a transition asks this.
        src, dst = _MEMBERS[from_status], _MEMBERS[to_status]
    except (KeyError, TypeError):
        raise IllegalTransition(
            operation_id=operation_id, from_status=str(from_status), to_status=str(to_status)
        ) from None
    if dst not in TRANSITIONS[src]:
        raise IllegalTransition(operation_id=operation_id, from_status=src, to_status=dst)
    return src, dst


def _shortest_paths() -> dict[ActionStatus, tuple[ActionStatus, ...]]:
    paths: dict[ActionStatus, tuple[ActionStatus, ...]] = {S.REQUESTED: (S.REQUESTED,)}
    queue = deque([S.REQUESTED])
    while queue:
        current = queue.popleft()
        for nxt in sorted(TRANSITIONS[current]):
            if nxt not in paths:
                paths[nxt] = (*paths[current], nxt)
                queue.append(nxt)
    return paths


_PATHS = _shortest_paths()


def path_from_requested(status: ActionStatus | str) -> tuple[ActionStatus, ...]:
    """Return the shortest chain of statuses from ``REQUESTED`` to ``status``, both included.

    The ledger uses it to audit every step of an operation that is inserted directly in a later
    status (``REQUESTED → ADMITTED → RUNNING`` for a call that starts at once).
    """
    return _PATHS[ActionStatus(status)]
