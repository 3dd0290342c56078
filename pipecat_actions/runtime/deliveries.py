"""`Deliveries`: what the conversation owes the user, owned by the runtime. No frames here.

For each operation of a session the ledger holds what the conversation was told last
(``delivered_status``, ``delivered_at``, ``delivered_agent``) and whether that telling was
heard to the end (``acknowledged_at``). What is **owed** follows from it: an outcome whose
status differs from the one told, or one told and not heard. That survives a reconnect and a
restart: a new pipeline of the session is given what it is still owed.

`Deliveries` is the runtime's part, the service: the durable records (what is owed, what was
told, what was heard, a handoff's brief) and the rules of each tool's delivery policy.
`Deliveries.open` gives one pipeline of one session its `SessionDelivery`
(`pipecat_actions.runtime.pipeline_delivery`), which decides when and with which words.
"""

from __future__ import annotations

__all__ = [
    "PENDING_STATUSES",
    "WATCH_SECS",
    "Deliveries",
    "NextStep",
    "Outlet",
    "SessionDelivery",
    "Speaker",
    "Told",
    "compensation_told",
]

import json
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from loguru import logger

from pipecat_actions._recent import remember
from pipecat_actions.actions import Binding
from pipecat_actions.clock import Clock
from pipecat_actions.ledger import Ledger, Operation, OperationFilter
from pipecat_actions.ledger.records import First, may_be_owed
from pipecat_actions.observability.telemetry import Telemetry
from pipecat_actions.policy import DeliveryMode, ToolKind
from pipecat_actions.results import reconcilable
from pipecat_actions.runtime._operations import RECENT_TOLD, Operations
from pipecat_actions.runtime.pipeline_delivery import (
    PENDING_STATUSES,
    WATCH_SECS,
    NextStep,
    Outlet,
    SessionDelivery,
    Speaker,
    Told,
    actor_of,
    compensation_told,
)
from pipecat_actions.runtime.progress import Progress
from pipecat_actions.runtime.supersession import Supersession
from pipecat_actions.session import SessionState
from pipecat_actions.status import ActionStatus

S = ActionStatus

_NEVER_OWED = frozenset({S.REQUESTED, S.AWAITING_CONFIRMATION})
"""Meaningless once the conversation that asked moved on (a confirmation is asked in it)."""


class Deliveries:
    """The runtime's delivery part: the durable records and the rules; see the module docstring.

    Args:
        ledger: Where deliveries and acknowledgements are recorded and owed outcomes read.
        bindings: The registered actions (their delivery policy and visibility).
        clock: The runtime's clock.
        telemetry: Delivery spans and counters.
        supersession: Which newer operation replaces an older one.
        operations: The registry whose outcomes sessions listen to.
        progress: The effects' progress reports, which sessions listen to as well.
    """

    def __init__(
        self,
        *,
        ledger: Ledger,
        bindings: Mapping[str, Binding],
        clock: Clock,
        telemetry: Telemetry,
        supersession: Supersession,
        operations: Operations,
        progress: Progress,
    ) -> None:
        self.ledger = ledger
        self.progress = progress
        self.bindings = bindings
        self.clock = clock
        self.telemetry = telemetry
        self.supersession = supersession
        self.operations = operations
        self._recorded: OrderedDict[str, ActionStatus] = OrderedDict()
        """The status this process last recorded as told, per operation (the most recent)."""

    def open(self, session: SessionState, outlet: Outlet) -> SessionDelivery:
        """Start delivering to one pipeline of ``session`` through ``outlet``.

        Its `SessionDelivery` asks this service (as its `DeliveryService`) what is owed, what
        each tool's policy says, and records what it told and what was heard.
        """
        return SessionDelivery(self, session, outlet)

    async def owed(self, session_id: str, *, before: float, mark: int) -> list[Operation]:
        """What the conversation of ``session_id`` is owed from before a pipeline started.

        ``before`` and ``mark`` bound it to operations from before the pipeline (its clock
        time and `Operations.call_mark`): the pipeline's own calls are told through their
        results. A compensation is told through the operation it reversed.
        """
        history = await self.ledger.list(OperationFilter(session_id=session_id))
        heard_compensations = {
            op.compensates
            for op in history
            if op.compensates is not None
            and op.delivered_status is op.status
            and op.acknowledged_at is not None
        }
        return [
            op
            for op in history
            if op.created_at <= before  # at the same instant: a manual clock, or a tie
            and not self.operations.noted_after(op.operation_id, mark)
            and op.compensates is None
            and may_be_owed(op)
            and _is_owed(op, compensation_heard=op.operation_id in heard_compensations)
        ]

    async def mark_delivered(self, op: Operation, *, session: SessionState, late: bool) -> None:
        """Record that ``op``, as it is, was told to ``session``'s conversation.

        Nothing is written if exactly this status was recorded as told already (told again,
        not heard the first time): its acknowledgement is still owed. This process remembers
        what it recorded (a burst of calls joined to one operation writes it once).
        """
        if op.delivered_status is op.status or self._recorded.get(op.operation_id) is op.status:
            return
        await self.ledger.annotate(
            op.operation_id,
            actor=actor_of(session),
            detail={"delivered": op.status.value, "agent": session.active_agent, "late": late},
            changes={
                "delivered_at": self.clock.now(),
                "delivered_agent": session.active_agent,
                "delivered_status": op.status.value,
                "acknowledged_at": None,
            },
        )
        remember(self._recorded, op.operation_id, op.status, keep=RECENT_TOLD)

    async def mark_acknowledged(self, operation_ids: list[str], *, session: SessionState) -> None:
        """Record that what was told about ``operation_ids`` was heard to the end.

        The first hearing of the status told is the one that counts (``acknowledged_at``,
        from which `stats` measures commit to acknowledgement): a later one (a call that
        joined the operation and was told it again) is an audit event of its own and leaves
        the time as it was. Telling a new status makes its hearing owed again
        (`mark_delivered`).
        """
        for operation_id in operation_ids:
            try:
                await self.ledger.annotate(
                    operation_id,
                    actor=actor_of(session),
                    detail={"acknowledged": True},
                    changes={"acknowledged_at": First(self.clock.now())},
                )
            except Exception as exc:  # a record of hearing must never break the conversation
                logger.bind(session_id=session.session_id, operation_id=operation_id).warning(
                    "acknowledgement of {} not recorded: {}", operation_id, exc
                )

    async def handoff(self, session: SessionState, agent: str) -> dict[str, Any] | None:
        """Make ``agent`` the active agent; return its brief on pending operations, if any.

        Operations belong to the session, not to the agent that started them. Each pending
        one is annotated, so that an operator can check no result was lost in the handoff.
        """
        session.active_agent = agent
        pending = await self.ledger.list(
            OperationFilter(session_id=session.session_id, status=sorted(PENDING_STATUSES))
        )
        if not pending:
            return None
        self.telemetry.handoff(agent, pending)
        for op in pending:
            await self.ledger.annotate(
                op.operation_id,
                actor=actor_of(session),
                detail={"handoff_to": agent, "status": op.status.value},
            )
        brief = [
            {
                "operation_id": op.operation_id,
                "tool": op.tool,
                "status": op.status.value,
                "arguments": op.args,
            }
            for op in pending
        ]
        return {
            "role": "developer",
            "content": "You are now handling this conversation. Operations still pending for "
            f"the user: {json.dumps(brief)}. Their outcomes will be reported here; do not start "
            "them again.",
        }

    def mode_for(self, op: Operation, *, superseded: bool) -> DeliveryMode:
        """The delivery mode of a late outcome of ``op`` (its tool's policy)."""
        binding = self.bindings.get(op.tool)
        if binding is None:
            return DeliveryMode.WHEN_IDLE
        delivery = binding.policy.delivery
        return delivery.superseded if superseded else delivery.late

    def visible(self, op: Operation, agent: str | None) -> bool:
        """Whether ``agent`` may hear about ``op`` (its tool's ``visible_to``)."""
        binding = self.bindings.get(op.tool)
        allowed = binding.policy.visible_to if binding else ()
        return not allowed or agent in allowed

    def intermediate_mode(self, tool: str) -> DeliveryMode:
        """How progress of ``tool`` reaches the conversation (``delivery.intermediate``)."""
        binding = self.bindings.get(tool)
        return binding.policy.delivery.intermediate if binding else DeliveryMode.SILENT

    def intermediate_runs_llm(self, tool: str) -> bool:
        """Whether an intermediate result of ``tool`` should make the model answer."""
        mode = self.intermediate_mode(tool)
        return mode not in (DeliveryMode.SILENT, DeliveryMode.SUPPRESS)

    def is_read(self, tool: str) -> bool:
        """Whether ``tool`` is a registered read (its record is written after its answer)."""
        binding = self.bindings.get(tool)
        return binding is not None and binding.policy.kind is ToolKind.READ

    def reconcilable(self, tool: str) -> bool | None:
        """Whether a reconcile hook checks an UNKNOWN ``tool`` here (None: not registered)."""
        return reconcilable(self.bindings, tool)


def _is_owed(op: Operation, *, compensation_heard: bool) -> bool:
    if op.status in _NEVER_OWED:
        return False
    if op.status is S.REJECTED and op.delivered_status in (None, S.REJECTED):
        return False  # refused at the call, and told so there
    if op.status in (S.COMPENSATED, S.COMPENSATING) and compensation_heard:
        return False  # told through its compensation, and heard
    return op.delivered_status is not op.status or op.acknowledged_at is None
