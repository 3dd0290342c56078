"""Where a tool's effect runs: in the call's process, or durably on a DBOS worker.

``execution: durable`` says that the tool's operations outlive the call that started them:
admission hands each one to a DBOS workflow in the same transaction as its ledger row, and a
``pipecat-actions worker --dbos`` process runs the effect (see ``docs/durable.md``). The
``durable:`` settings are that tool's DBOS queue: limits shared by every worker, where
``limits:`` are per process.
"""

from __future__ import annotations

__all__ = ["DurablePolicy", "Execution", "durable_violations"]

from enum import StrEnum
from typing import Protocol

from pydantic import BaseModel, ConfigDict, Field

from pipecat_actions.policy._violations import Violation
from pipecat_actions.policy.enums import AdmitWhen, OnDuplicate, ToolKind


class Execution(StrEnum):
    """Where a tool's effect runs.

    Attributes:
        IN_CALL: In the process of the call that admitted it (the runtime's own executor,
            leases and recovery). The default, and the only choice on SQLite.
        DURABLE: On a DBOS worker: the ledger row and the workflow enqueue commit together,
            and the operation finishes whether or not the call is still there (PostgreSQL).
    """

    IN_CALL = "in_call"
    DURABLE = "durable"


class DurablePolicy(BaseModel):
    """The DBOS queue of a durable tool: limits every worker shares.

    Left out, a durable tool runs on the default queue with no shared limit.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    global_concurrency: int | None = Field(
        default=None,
        ge=1,
        description=(
            "How many operations of this tool may run at once across every worker (DBOS queue "
            "concurrency). Leave out for no shared cap."
        ),
    )
    worker_concurrency: int | None = Field(
        default=None,
        ge=1,
        description=(
            "How many operations of this tool one worker runs at once. Leave out for no cap."
        ),
    )
    rate_per_minute: int | None = Field(
        default=None,
        ge=1,
        description=(
            "The most operations of this tool started per minute across every worker (DBOS "
            "queue rate limit). Leave out for no rate cap."
        ),
    )


class _Durable(Protocol):
    @property
    def kind(self) -> ToolKind: ...
    @property
    def execution(self) -> Execution: ...
    @property
    def durable(self) -> DurablePolicy | None: ...
    @property
    def admit_when(self) -> AdmitWhen: ...
    @property
    def on_duplicate(self) -> OnDuplicate: ...


def durable_violations(policy: _Durable) -> list[Violation]:
    """The rules of ``execution`` and ``durable``; empty when they fit the rest."""
    found: list[Violation] = []
    if policy.execution is not Execution.DURABLE:
        if policy.durable is not None:
            found.append(
                Violation(
                    ("durable",),
                    "sets a DBOS queue, which only a durable tool has; set execution: durable "
                    "or remove durable",
                )
            )
        return found
    if policy.kind is not ToolKind.MUTATION:
        found.append(
            Violation(
                ("execution",),
                "durable is for mutations: a read answers in the call and has nothing to finish "
                "after it",
            )
        )
    if policy.admit_when is AdmitWhen.TURN_CONFIRMED:
        found.append(
            Violation(
                ("admit_when",),
                "turn_confirmed holds the operation in the call until the reply ends, but a "
                "durable operation is handed to a worker when it is admitted; use immediately",
            )
        )
    if policy.on_duplicate in (OnDuplicate.CONFIRM, OnDuplicate.REPLACE, OnDuplicate.ALLOW):
        found.append(
            Violation(
                ("on_duplicate",),
                f"{policy.on_duplicate.value} is not supported with execution: durable: its "
                "workflow is deduplicated on the idempotency key; use join or reject",
            )
        )
    return found
