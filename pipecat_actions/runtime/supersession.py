"""Supersession: a later user turn that asked again about the same resource replaces a request.

"Book 21:00", then, while it runs, "no, make it 21:30": the 21:00 booking is superseded by the
21:30 one. Which request is the earlier is the user's order (the user turn each was proposed
in), never the order the ledger happened to insert them: two calls of one response on one
resource (the model booking two tables at once) do not supersede each other.

Supersession follows the operations, not the order they are told in. Whenever an operation is
told (a call's result, a late outcome, what a new pipeline is owed), the model hears both
directions: an older request that a newer one replaced says so (``superseded_by``), and a newer
request that committed while an older one of the user still stands says that too
(``earlier_still_standing``): "21:00 booked and told, then 21:30 booked" makes the 21:30
result say that 21:00 still stands and how to undo it. Whichever of the two is told last
carries the news, so the user hears it whatever the order of commits and tellings.

Used by the runtime when it renders a call's final result (in the handler's task, never in a
pipeline's frame path), by the delivery service before it tells a late outcome, and, when an
operation commits, to find the committed operations it replaces (`replaced_on_commit`), for
``compensation.automatic``.

What the model is told about a superseded operation follows its tool's ``compensation`` policy
(`superseded_fields`): a committed one that will be undone automatically is not offered for
undoing; otherwise the model offers to undo it, with ``compensation.tool`` when one is named.
"""

from __future__ import annotations

__all__ = ["SUPERSEDED_NOTE", "Supersession", "standing_fields", "superseded_fields"]

from collections.abc import Mapping
from typing import Any

from pipecat_actions.actions import Binding
from pipecat_actions.ledger import Ledger, Operation, OperationFilter
from pipecat_actions.policy import ToolKind, ToolPolicy
from pipecat_actions.session import turn_number
from pipecat_actions.status import HAPPENED_STATUSES, ActionStatus

S = ActionStatus

_CHANGED = "The user changed this request afterwards; this earlier one still has the outcome above."
SUPERSEDED_NOTE = f"{_CHANGED} Tell the user the real state and offer to undo it if unwanted."
"""The note on a superseded operation whose policy names no way to undo it."""


def superseded_fields(op: Operation, newer: str, policy: ToolPolicy | None) -> dict[str, Any]:
    """What is added to the rendering of ``op``, superseded by ``newer``, for the model.

    ``superseded_by`` and a ``note``; for a committed ``op`` the note follows the tool's
    ``compensation`` policy, and ``undo_tool`` names ``compensation.tool`` when there is one.

    Args:
        op: The superseded operation, as it is now.
        newer: The operation of the later user turn that supersedes it.
        policy: The policy of ``op``'s tool, if it is loaded here.
    """
    compensation = policy.compensation if policy is not None else None
    fields: dict[str, Any] = {"superseded_by": newer, "note": SUPERSEDED_NOTE}
    if compensation is None or op.status is not S.COMMITTED:
        return fields
    if compensation.automatic:
        fields["note"] = (
            f"{_CHANGED} The runtime undoes it automatically once the newer request {newer} "
            "has succeeded, and how that went is told separately: tell the user the real "
            "state, and offer to undo it only if told that the undo failed."
        )
    elif compensation.tool is not None:
        fields["note"] = (
            f"{_CHANGED} Tell the user the real state and offer to undo it with "
            f"{compensation.tool} if unwanted."
        )
    if compensation.tool is not None:
        fields["undo_tool"] = compensation.tool
    return fields


def standing_fields(
    op: Operation, standing: list[Operation], policy: ToolPolicy | None
) -> dict[str, Any]:
    """What is added to the rendering of ``op`` (committed) about earlier requests that stand.

    ``earlier_still_standing`` lists each earlier committed request of the user on the same
    resource (its operation, arguments and result), and a note says what to tell the user:
    both stand; the earlier one is undone automatically under ``compensation.automatic``,
    else the model offers to undo it (with ``compensation.tool`` when one is named).

    Args:
        op: The newer operation, committed.
        standing: The earlier ones that still stand (`Supersession.standing_before`).
        policy: The policy of their tool, if it is loaded here.
    """
    compensation = policy.compensation if policy is not None else None
    ids = ", ".join(o.operation_id for o in standing)
    fields: dict[str, Any] = {
        "earlier_still_standing": [
            {
                "operation_id": o.operation_id,
                "status": o.status.value.lower(),
                "arguments": o.args,
                **({"result": o.result} if o.result is not None else {}),
            }
            for o in standing
        ],
    }
    said = (
        f"The user's earlier request on the same thing ({ids}) also went through and still "
        "stands alongside this one."
    )
    if compensation is not None and compensation.automatic:
        fields["standing_note"] = (
            f"{said} The runtime undoes it automatically now that this one succeeded; how "
            "that went is told separately. Tell the user the real state."
        )
    elif compensation is not None and compensation.tool is not None:
        fields["standing_note"] = (
            f"{said} Tell the user both stand, and offer to undo the earlier one with "
            f"{compensation.tool} if unwanted."
        )
        fields["undo_tool"] = compensation.tool
    else:
        fields["standing_note"] = (
            f"{said} Tell the user both stand, and offer to undo the earlier one if unwanted."
        )
    return fields


def _turn(op: Operation) -> int | None:
    return turn_number(op.turn_id)


def _before(op: Operation, turn: int) -> bool:
    """Whether ``op`` was proposed in a user turn before ``turn`` (False if it has none)."""
    own = _turn(op)
    return own is not None and own < turn


def _earliest_later(ops: list[Operation], turn: int) -> Operation | None:
    """The one of ``ops`` proposed first in a user turn after ``turn``, if any."""
    later = [o for o in ops if (_turn(o) or 0) > turn]
    return min(later, key=lambda o: (_turn(o) or 0, o.created_at)) if later else None


class Supersession:
    """Finds the request of a later user turn that supersedes an operation, and the reverse.

    Args:
        ledger: Where the session's operations on the resource are read.
        bindings: The registered actions (only mutations with a ``resource`` can be superseded).
    """

    def __init__(self, ledger: Ledger, bindings: Mapping[str, Binding]) -> None:
        self._ledger = ledger
        self._bindings = bindings

    def _applies(self, tool: str) -> bool:
        """Whether an operation of ``tool`` can be superseded at all (no read needed if not)."""
        binding = self._bindings.get(tool)
        policy = binding.policy if binding else None
        return (
            policy is not None and policy.resource is not None and policy.kind is not ToolKind.READ
        )

    async def _rivals(self, op: Operation) -> tuple[int, list[Operation]] | None:
        """``op``'s user turn and the session's other operations of its tool on its resource.

        None when ``op`` cannot be superseded (no resource, no turn, a tool that cannot be):
        then nothing is read.
        """
        turn = _turn(op)
        if op.resource_key is None or turn is None or not self._applies(op.tool):
            return None
        candidates = await self._ledger.list(
            OperationFilter(session_id=op.session_id, resource_key=op.resource_key)
        )
        others = [o for o in candidates if o.tool == op.tool and o.operation_id != op.operation_id]
        return turn, others

    async def superseded_by(self, op: Operation) -> str | None:
        """The operation of a later user turn on the same resource and tool, if any."""
        rivals = await self._rivals(op)
        if rivals is None:
            return None
        turn, others = rivals
        asked = [o for o in others if o.status is not ActionStatus.REJECTED]
        newer = _earliest_later(asked, turn)
        return newer.operation_id if newer is not None else None

    async def standing_before(self, op: Operation) -> list[Operation]:
        """Committed operations of earlier user turns on ``op``'s resource and tool that stand.

        Asked of a committed ``op`` (the newer request): the earlier requests it replaced in
        the user's mind that still hold (COMMITTED, neither reversed nor being reversed).
        Empty for an ``op`` that did not commit, or cannot be superseded.
        """
        rivals = await self._rivals(op) if op.status is S.COMMITTED else None
        if rivals is None:
            return []
        turn, others = rivals
        return [o for o in others if o.status is S.COMMITTED and _before(o, turn)]

    async def replaced_on_commit(self, op: Operation) -> list[tuple[Operation, Operation]]:
        """The committed operations that stand although a committed newer one replaced them.

        Asked when ``op`` has just committed, with one read: each committed operation of an
        earlier user turn on ``op``'s resource and tool, paired with ``op``; and ``op`` itself
        when an operation of a later turn committed first (``op`` was still running then),
        paired with the earliest such one. A newer one that was reversed since still counts:
        the user replaced the request all the same.

        Returns:
            ``(superseded, newer)`` pairs, oldest first; empty when ``op`` is not committed.
        """
        rivals = await self._rivals(op) if op.status is S.COMMITTED else None
        if rivals is None:
            return []
        turn, others = rivals
        pairs = [
            (other, op) for other in others if other.status is S.COMMITTED and _before(other, turn)
        ]
        newer = _earliest_later([o for o in others if o.status in HAPPENED_STATUSES], turn)
        if newer is not None:
            pairs.append((op, newer))
        return pairs

    def fields(self, op: Operation, newer: str) -> dict[str, Any]:
        """What the model is told about ``op``, superseded by ``newer`` (`superseded_fields`)."""
        binding = self._bindings.get(op.tool)
        return superseded_fields(op, newer, binding.policy if binding else None)

    async def told(
        self, op: Operation, *, superseded_by: str | None = None, known: bool = False
    ) -> dict[str, Any]:
        """Everything the model is told about ``op``'s place among the user's requests.

        ``superseded_by`` and its note when a later request replaced ``op``; the earlier
        requests that still stand when ``op`` committed (`standing_fields`). One read of the
        session's operations on the resource (none for a tool that cannot be superseded).

        Args:
            op: The operation told.
            superseded_by: Its newer operation, when the caller looked it up already
                (``known``: then it is not looked up again).
            known: Whether ``superseded_by`` was looked up by the caller.
        """
        rivals = await self._rivals(op)
        if rivals is None:
            return {}
        turn, others = rivals
        if not known:
            asked = [o for o in others if o.status is not S.REJECTED]
            newer = _earliest_later(asked, turn)
            superseded_by = newer.operation_id if newer is not None else None
        fields: dict[str, Any] = {}
        if superseded_by is not None:
            fields.update(self.fields(op, superseded_by))
        if op.status is S.COMMITTED:
            standing = [o for o in others if o.status is S.COMMITTED and _before(o, turn)]
            if standing:
                binding = self._bindings.get(op.tool)
                fields.update(standing_fields(op, standing, binding.policy if binding else None))
        return fields

    async def note(self, result: dict[str, Any], op: Operation) -> dict[str, Any]:
        """``result`` (the rendering of ``op``) with what `told` adds, if anything."""
        fields = await self.told(op)
        if not fields:
            return result
        told = {**result, **fields}
        standing = fields.get("standing_note")
        if standing is not None:
            told["message"] = f"{told['message']} {standing}"
        return told
