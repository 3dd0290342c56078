"""`AutomaticCompensation`: a committed request that a newer committed one replaced is undone.

With ``compensation.automatic: true`` on a tool: "book 21:00", then, in a later user turn, "no,
make it 21:30". Once 21:30 has committed, the runtime reverses 21:00 itself with the action's
``compensate`` hook, exactly as `ActionRuntime.compensate` does (a linked operation under the
key ``compensate|<operation>``), audited with the runtime as actor and a reason naming the
newer operation. Its outcome reaches the conversation like every compensation of the session:
the result gate tells ``compensated``, ``compensation_failed`` or ``compensation_unknown``.

When it happens, for operations of one session, tool and resource (see `Supersession`):

* the newer operation commits: every earlier-turn one that is COMMITTED then is reversed;
* an earlier one commits after the newer one did (it was still running, waiting for a person,
  or UNKNOWN until reconciled): it is reversed as soon as it commits.

Only a commit this process records starts it (the run, a retry, a late answer, reconciliation
by the runtime, recovery), and only while the runtime is not closing. It runs in a task of the
runtime: the newer call's result never waits for it. Each operation is tried once: one that
has ever been COMPENSATING (an undo that failed, or one someone else started) is left as it
is, and concurrent triggers join one compensation. A process that stops between the commit
and the compensation's insert leaves the earlier operation committed; the model is then told
it was superseded, as it is with ``automatic: false``.
"""

from __future__ import annotations

__all__ = ["AutomaticCompensation"]

from collections.abc import Mapping

from pipecat_actions.actions import Binding
from pipecat_actions.errors import UnexpectedStatus
from pipecat_actions.ledger import Ledger, Operation
from pipecat_actions.observability.correlation import operation_logger
from pipecat_actions.runtime._operations import Operations
from pipecat_actions.runtime.compensation import Compensator
from pipecat_actions.runtime.supersession import Supersession
from pipecat_actions.status import ActionStatus

S = ActionStatus


class AutomaticCompensation:
    """Reverses superseded committed operations of ``automatic`` tools (see the module docstring).

    Args:
        bindings: The registered actions (their ``compensation`` policy).
        supersession: Finds what a commit replaces.
        compensator: Runs each compensation.
        operations: Whose outcomes are watched, and where the tasks run.
        ledger: Read for an operation's audit trail (was it ever being compensated?).
        actor: Recorded on the compensations started here (``runtime:<owner>``).
    """

    def __init__(
        self,
        *,
        bindings: Mapping[str, Binding],
        supersession: Supersession,
        compensator: Compensator,
        operations: Operations,
        ledger: Ledger,
        actor: str,
    ) -> None:
        self._bindings = bindings
        self._supersession = supersession
        self._compensator = compensator
        self._operations = operations
        self._ledger = ledger
        self._actor = actor
        self._undoing: set[str] = set()

    def applies(self, tool: str) -> bool:
        """Whether ``tool``'s policy has ``compensation.automatic: true``."""
        binding = self._bindings.get(tool)
        compensation = binding.policy.compensation if binding is not None else None
        return compensation is not None and compensation.automatic

    def on_outcome(self, op: Operation) -> None:
        """Watch every outcome; a commit of an ``automatic`` tool starts the check (no await)."""
        if op.status is not S.COMMITTED or op.compensates is not None:
            return
        if self._operations.closing or not self.applies(op.tool):
            return
        self._operations.spawn(self._after_commit(op))

    async def _after_commit(self, op: Operation) -> None:
        try:
            pairs = await self._supersession.replaced_on_commit(op)
        except Exception as exc:  # the superseded note still tells the model the real state
            operation_logger(op).warning(
                "could not look up what {} supersedes: {}", op.operation_id, exc
            )
            return
        for superseded, newer in pairs:
            if superseded.operation_id in self._undoing or self._operations.closing:
                continue  # the other trigger of the same pair got there first
            self._undoing.add(superseded.operation_id)
            self._operations.spawn(self._undo(superseded, newer))

    async def _undo(self, op: Operation, newer: Operation) -> None:
        log = operation_logger(op)
        try:
            if await self._tried(op.operation_id):
                log.info("{} was already being compensated once: not again", op.operation_id)
                return
            compensation = await self._compensator.compensate(
                op.operation_id,
                actor=self._actor,
                reason=(
                    f"superseded by {newer.operation_id}, a later request of the user on the "
                    "same resource, which committed (compensation.automatic)"
                ),
            )
            log.info(
                "{} superseded by {}: its compensation {} is {}",
                op.operation_id,
                newer.operation_id,
                compensation.operation_id,
                compensation.status,
            )
        except UnexpectedStatus as exc:
            log.info("{} moved meanwhile; not compensated: {}", op.operation_id, exc)
        except Exception as exc:
            if self._operations.closing:
                log.info("compensation of {} left to recovery: {}", op.operation_id, exc)
            else:
                log.warning("automatic compensation of {} failed: {}", op.operation_id, exc)
        finally:
            self._undoing.discard(op.operation_id)

    async def _tried(self, operation_id: str) -> bool:
        """Whether ``operation_id`` was ever being compensated (by anyone, with any outcome)."""
        events = await self._ledger.events(operation_id)
        return any(event.to_status is S.COMPENSATING for event in events)
