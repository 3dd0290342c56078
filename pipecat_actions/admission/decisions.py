"""What admission decides about one proposed call: the five decisions `Admitter.admit` returns.

Each decision names its `DecisionKind` (``decision.kind``), so that whoever reports or acts on
it (telemetry, the runtime) needs no ``isinstance`` ladder over this module's classes, and
carries the ``operation`` the call became or joined (None when it has none of its own).
"""

from __future__ import annotations

__all__ = ["Admission", "Decision", "DecisionKind", "Joined", "ReadAdmission", "Refusal", "Shared"]

from dataclasses import dataclass
from enum import StrEnum
from typing import Any, ClassVar

from pipecat_actions.actions import Binding
from pipecat_actions.admission.limits import Coalesced, Slot
from pipecat_actions.ledger.records import Operation


class DecisionKind(StrEnum):
    """The kind of an admission decision, as reported in metrics and spans."""

    ADMITTED = "admitted"
    JOINED = "joined"
    REFUSED = "refused"
    READ = "read"
    SHARED = "shared"


@dataclass(frozen=True)
class Refusal:
    """The call was refused; ``result`` is its final tool result.

    ``operation`` is the refusal's own audit record, not an operation the call became.
    """

    kind: ClassVar[DecisionKind] = DecisionKind.REFUSED
    result: dict[str, Any]
    operation: Operation | None = None

    @property
    def reason(self) -> str:
        """The refusal's machine-readable reason (``"duplicate"``, ``"not_authorized"``...)."""
        return str(self.result.get("reason", "unknown"))


@dataclass(frozen=True)
class Joined:
    """The call is a duplicate of ``operation`` and shares its outcome."""

    kind: ClassVar[DecisionKind] = DecisionKind.JOINED
    reason: ClassVar[None] = None
    operation: Operation


@dataclass(frozen=True)
class Admission:
    """The call was admitted as ``operation`` (ADMITTED, RUNNING or AWAITING_*)."""

    kind: ClassVar[DecisionKind] = DecisionKind.ADMITTED
    reason: ClassVar[None] = None
    operation: Operation
    binding: Binding
    slot: Slot | None
    generation: int
    waits_for_slot: bool = False
    """Admitted behind the principal's own earlier call: it takes its slot when it runs."""


@dataclass(frozen=True)
class ReadAdmission:
    """A read passed admission; it runs at once and is recorded after the fact."""

    kind: ClassVar[DecisionKind] = DecisionKind.READ
    reason: ClassVar[None] = None
    operation: ClassVar[None] = None
    binding: Binding
    args: dict[str, Any]
    slot: Slot
    key: str
    resource_key: str | None
    turn_id: str


@dataclass(frozen=True)
class Shared:
    """The call is answered without an operation of its own (coalesced read or degraded)."""

    kind: ClassVar[DecisionKind] = DecisionKind.SHARED
    reason: ClassVar[None] = None
    operation: ClassVar[None] = None
    result: Any
    pending: Coalesced | None = None


Decision = Refusal | Joined | Admission | ReadAdmission | Shared
"""Any decision of `Admitter.admit`."""
