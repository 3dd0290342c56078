"""What admission knows about one call so far, and the stand-in record its early hooks get.

`Audit` fills in as the checks pass (kind, arguments, resource); a refusal is recorded from it.
`draft_operation` is what ``preconditions`` and ``snapshot`` see as ``ctx.operation``: they run
before the operation exists.
"""

from __future__ import annotations

__all__ = ["Audit", "draft_operation"]

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pipecat_actions.ledger.base import Ledger
from pipecat_actions.ledger.records import Operation, canonical_json
from pipecat_actions.session import SessionState
from pipecat_actions.status import ActionStatus


@dataclass
class Audit:
    """The facts of a call known so far, for its audit record."""

    tool: str
    session: SessionState
    tool_call_id: str | None
    turn_id: str
    generation: int
    kind: str = "unknown"
    args: Mapping[str, Any] = field(default_factory=dict)
    resource_key: str | None = None


def draft_operation(base: Audit, key: str, session: SessionState, ledger: Ledger) -> Operation:
    """A stand-in record for hooks that run before the operation exists (snapshot, checks).

    Its ``args_hash`` is the one ``ledger`` will store (`Ledger.args_hash`).
    """
    args_json = canonical_json(dict(base.args))
    return Operation(
        operation_id="(not yet admitted)",
        tenant=session.tenant,
        session_id=session.session_id,
        principal=session.principal,
        tool=base.tool,
        kind=base.kind,
        args_json=args_json,
        args_hash=ledger.args_hash(base.tool, base.args),
        idempotency_key=key,
        key_expires_at=0.0,
        resource_key=base.resource_key,
        turn_id=base.turn_id,
        provider_call_id=base.tool_call_id,
        model_response_id=None,
        rationale=None,
        agent=session.active_agent,
        delivered_agent=None,
        status=ActionStatus.REQUESTED,
        attempt=0,
        result_json=None,
        error=None,
        before_state_json=None,
        compensates=None,
        deadline_at=None,
        lease_owner=None,
        lease_expires_at=None,
        fence=0,
        event_seq=0,
        escalated_at=None,
        created_at=0.0,
        updated_at=0.0,
        admitted_at=None,
        started_at=None,
        sent_at=None,
        committed_at=None,
        finished_at=None,
        delivered_at=None,
        acknowledged_at=None,
    )
