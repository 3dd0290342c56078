"""Supersession: a later user turn that asked again about the same resource replaces a request.

"Book 21:00", then, while it runs, "no, make it 21:30": the 21:00 booking is superseded by the
21:30 one. Which request is the earlier is the user's order (the user turn each was proposed
in), never the order the ledger happened to insert them: two calls of one response on one
resource (the model booking two tables at once) do not supersede each other.

Used by the runtime when it renders a call's final result (in the handler's task, never in a
pipeline's frame path) and by the result gate before it tells a late outcome.
"""

from __future__ import annotations

__all__ = ["SUPERSEDED_NOTE", "Supersession"]

from collections.abc import Mapping
from typing import Any

from pipecat_actions.actions import Binding
from pipecat_actions.ledger import Ledger, Operation, OperationFilter
from pipecat_actions.policy import ToolKind
from pipecat_actions.status import ActionStatus

SUPERSEDED_NOTE = (
    "The user changed this request afterwards; this earlier one still has the outcome above. "
    "Tell the user the real state and offer to undo it if unwanted."
)


def _turn(op: Operation) -> int | None:
    try:
        return int(op.turn_id) if op.turn_id is not None else None
    except ValueError:
        return None


class Supersession:
    """Finds the request of a later user turn that supersedes an operation.

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

    async def superseded_by(self, op: Operation) -> str | None:
        """The operation of a later user turn on the same resource and tool, if any."""
        turn = _turn(op)
        if op.resource_key is None or turn is None or not self._applies(op.tool):
            return None
        candidates = await self._ledger.list(
            OperationFilter(session_id=op.session_id, resource_key=op.resource_key)
        )
        later = [
            other
            for other in candidates
            if other.tool == op.tool
            and other.operation_id != op.operation_id
            and other.status is not ActionStatus.REJECTED
            and (_turn(other) or 0) > turn
        ]
        if not later:
            return None
        return min(later, key=lambda o: (_turn(o) or 0, o.created_at)).operation_id

    async def note(self, result: dict[str, Any], op: Operation) -> dict[str, Any]:
        """``result`` (the rendering of ``op``) with ``superseded_by`` and a note if it was."""
        newer = await self.superseded_by(op)
        if newer is None:
            return result
        return {**result, "superseded_by": newer, "note": SUPERSEDED_NOTE}
