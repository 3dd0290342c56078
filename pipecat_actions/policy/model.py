"""The policy of one tool after merging ``defaults:``: what it is, how it runs, what is safe.

`ToolPolicy` checks its cross-field rules itself, so every instance (loaded or built in code)
is coherent: a mutation is never retried blindly, a risky one is always confirmed, a read is
never cancelled or compensated. Rules that need the other tools of the file (compensation
targets) are checked by `PolicyFile.resolve`.
"""

from __future__ import annotations

__all__ = [
    "CompensationPolicy",
    "ConfirmationPolicy",
    "DeliveryPolicy",
    "FillerPolicy",
    "IdempotencyPolicy",
    "ReconciliationPolicy",
    "ToolPolicy",
]

from collections.abc import Mapping
from typing import Annotated, Self

from pydantic import BaseModel, ConfigDict, Field, Strict, model_validator

from pipecat_actions.policy._rules import tool_policy_violations
from pipecat_actions.policy._violations import raise_violations
from pipecat_actions.policy.durable import DurablePolicy, Execution, durable_violations
from pipecat_actions.policy.enums import (
    AdmitWhen,
    ExecutionMode,
    OnDuplicate,
    OnInterruption,
    Risk,
    SensitiveMode,
    ToolKind,
)
from pipecat_actions.policy.fields import (
    AgentNames,
    Announcement,
    ArgumentNames,
    RedactPaths,
    SensitivePath,
    Template,
    render_template,
)
from pipecat_actions.policy.limits import LimitsPolicy
from pipecat_actions.policy.parts import (
    CompensationPolicy,
    ConfirmationPolicy,
    DeliveryPolicy,
    FillerPolicy,
    IdempotencyPolicy,
    ReconciliationPolicy,
)
from pipecat_actions.policy.retry import RetryPolicy

# YAML gives enum values as text; strict mode would accept only enum members, so enum fields
# are marked lax (pydantic still refuses any text that is not one of the values).
_LAX = Strict(False)


class ToolPolicy(BaseModel):
    """Everything pipecat_actions needs to know to run one tool safely.

    Built from the tool's entry in a policy file merged over the file's ``defaults:``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    description: str | None = Field(
        default=None, description="For reviewers: what the tool does, in plain words."
    )
    kind: Annotated[ToolKind, _LAX] = Field(
        description=(
            "Required. read: only looks things up. mutation: changes something in the real "
            "world (a booking, a payment). Decides which of the safety rules apply."
        ),
    )
    risk: Annotated[Risk, _LAX] = Field(
        default=Risk.LOW,
        description=(
            "How much harm a wrong call could do: low, medium or high. A high-risk mutation "
            "must have confirmation.mode verbal or approval."
        ),
    )
    arguments: ArgumentNames | None = Field(
        default=None,
        description=(
            "The names of the tool's arguments, for review. When given, every "
            "idempotency.key_fields entry, resource, prompt and summary placeholder and "
            "redact path must use one of them."
        ),
    )
    before_state_fields: ArgumentNames | None = Field(
        default=None,
        description=(
            "The fields of the before-state the action's snapshot hook returns, for review. "
            "When given, every {before.field} placeholder of confirmation.summary must use one "
            "of them."
        ),
    )
    coerce_arguments: bool = Field(
        default=False,
        description=(
            "False: each argument must have the JSON type its parameter declares: the number "
            "2 for a whole number (not 2.0, '2' or true), text for text, a date as its text "
            "('2026-12-03'). True: values are converted where they can be ('2' and 2.0 become "
            "2, 'yes' becomes true), for a model that writes numbers as text. NaN and "
            "infinity are refused either way."
        ),
    )
    mode: Annotated[ExecutionMode, _LAX] = Field(
        default=ExecutionMode.BLOCKING,
        description=(
            "blocking: the bot waits for the result, and a barge-in stops the waiting. "
            "background: the conversation goes on and the result is delivered when it arrives. "
            "This is about the conversation only; on_interruption decides the action's fate."
        ),
    )
    execution: Annotated[Execution, _LAX] = Field(
        default=Execution.IN_CALL,
        description=(
            "in_call: the effect runs in the process of the call that admitted it. durable: "
            "admission hands it to a DBOS workflow in the same transaction as its ledger row, "
            "and a `pipecat-actions worker --dbos` process runs it, whether or not the call is "
            "still there (PostgreSQL only; see docs/durable.md)."
        ),
    )
    durable: DurablePolicy | None = Field(
        default=None,
        description=(
            "The DBOS queue of a durable tool: concurrency and rate limits shared by every "
            "worker. execution: durable only."
        ),
    )
    admit_when: Annotated[AdmitWhen, _LAX] = Field(
        default=AdmitWhen.IMMEDIATELY,
        description=(
            "immediately: start as soon as the call is admitted. turn_confirmed: hold it until "
            "the reply that proposed it has finished without the user interrupting."
        ),
    )
    allow_stale_proposal: bool = Field(
        default=False,
        description=(
            "A mutation proposed in a reply the user already interrupted is refused, because "
            "the user may have changed their mind. True runs it anyway."
        ),
    )
    idempotency: IdempotencyPolicy = Field(
        default_factory=IdempotencyPolicy,
        description="What makes two calls the same request, so it is not done twice.",
    )
    on_duplicate: Annotated[OnDuplicate, _LAX] = Field(
        default=OnDuplicate.JOIN,
        description=(
            "When the same request comes again: join (give it the first call's outcome), "
            "reject, replace (supersede the earlier one; mutations only), allow (run it again) "
            "or confirm (ask the user)."
        ),
    )
    on_interruption: Annotated[OnInterruption, _LAX] = Field(
        default=OnInterruption.CONTINUE,
        description=(
            "What a barge-in does to the action itself: continue (it goes on), "
            "cancel_if_not_started (cancel only if nothing was sent yet) or request_cancel (ask "
            "the system of record to cancel; mutations only, and the tool must provide a cancel "
            "hook, which the runtime checks)."
        ),
    )
    cancellable_by_llm: bool = Field(
        default=False,
        description=(
            "True: the model may stop a call of this tool the user no longer wants, with the "
            "tool cancel_<name> (Pipecat's cancel_<tool>, LiveKit's ToolFlag.CANCELLABLE). It "
            "is told the truth: cancelled when nothing was sent yet; cancel requested, outcome "
            "to follow, when it runs (the cancel hook asks the system of record; without one "
            "it goes on); already happened when it committed (with the undo offered when "
            "compensation.tool is set). False: such a request is refused. Mutations only."
        ),
    )
    confirmation: ConfirmationPolicy = Field(
        default_factory=ConfirmationPolicy,
        description="Whether the user or an operator must say yes first.",
    )
    timeout_secs: float | None = Field(
        default=None,
        gt=0,
        description=(
            "Pipecat's timeout for the tool handler, in seconds. Left out: the LLM service's "
            "default. It only bounds the wait, not the action."
        ),
    )
    deadline_secs: float = Field(
        default=30.0,
        gt=0,
        description=(
            "Seconds from admission until the action must have a final outcome; after that the "
            "watchdog marks it failed (nothing sent) or unknown (maybe sent) and checks the "
            "system of record. At least timeout_secs."
        ),
    )
    reconciliation: ReconciliationPolicy = Field(
        default_factory=ReconciliationPolicy,
        description=(
            "When an unknown outcome may be settled as not happened: the provider's commit "
            "horizon, and whether a cancel by key may settle it sooner."
        ),
    )
    retry: RetryPolicy = Field(
        default_factory=RetryPolicy,
        description="How often a failed call is tried again, and how long to wait in between.",
    )
    limits: LimitsPolicy = Field(
        default_factory=LimitsPolicy,
        description="Caps on concurrent calls, rate and calls per conversation.",
    )
    delivery: DeliveryPolicy = Field(
        default_factory=DeliveryPolicy,
        description="How late, superseded and progress results reach the conversation.",
    )
    resource: Template | None = Field(
        default=None,
        description=(
            "What the action affects, built from its arguments, e.g. "
            "'table:{restaurant_id}:{date}'. A newer call on the same resource supersedes an "
            "older one. Left out: calls never supersede each other."
        ),
    )
    compensation: CompensationPolicy | None = Field(
        default=None,
        description=(
            "How to undo this action once committed, and whether a superseded change is undone "
            "automatically. Mutations only."
        ),
    )
    redact: RedactPaths = Field(
        default=(),
        description=(
            "Argument paths hidden from logs and traces, e.g. card.number or guests[*].phone."
        ),
    )
    sensitive: dict[SensitivePath, Annotated[SensitiveMode, _LAX]] = Field(
        default_factory=dict,
        description=(
            "Values the ledger stores sealed, by path: argument paths (card.number, "
            "guests[*].phone) and paths of the result or before-state (result.payment.card), "
            "each encrypt (the runtime runs with it; an operator with the key may reveal it) "
            "or hash (a keyed hash: only equality can be told; a read's arguments and "
            "results). Needs the keys in PIPECAT_ACTIONS_LEDGER_KEYS (encrypt) and "
            "PIPECAT_ACTIONS_LEDGER_HASH_KEY. Also hidden from logs, like redact."
        ),
    )
    visible_to: AgentNames = Field(
        default=(),
        description=(
            "The agents allowed to hear this tool's results in a multi-agent bot. Empty: every "
            "agent."
        ),
    )
    announce: Announcement | None = Field(
        default=None,
        description=(
            "What the bot says when a background action starts, e.g. 'Let me book that for "
            "you, one moment.'. It must not claim an outcome (no 'booked', 'done'). "
            "mode: background only."
        ),
    )
    max_payload_bytes: int = Field(
        default=65536,
        gt=0,
        description="Calls whose arguments are larger than this many bytes are refused unread.",
    )

    @model_validator(mode="after")
    def _check_rules(self) -> Self:
        raise_violations(tool_policy_violations(self) + durable_violations(self))
        return self

    @property
    def is_durable(self) -> bool:
        """True when a DBOS worker runs the tool's effect (``execution: durable``)."""
        return self.execution is Execution.DURABLE

    @property
    def is_mutation(self) -> bool:
        """True when the tool changes something in the real world."""
        return self.kind is ToolKind.MUTATION

    @property
    def redacted_paths(self) -> tuple[str, ...]:
        """The paths hidden from logs: ``redact`` and every ``sensitive`` path."""
        return (*self.redact, *(p for p in self.sensitive if p not in self.redact))

    @property
    def cancel_on_interruption(self) -> bool:
        """The value for Pipecat's ``cancel_on_interruption``: True for ``mode: blocking``."""
        return self.mode is ExecutionMode.BLOCKING

    def resource_key(self, args: Mapping[str, object]) -> str | None:
        """Return the resource a call with these arguments affects, or None without a template.

        Args:
            args: The call's arguments.

        Returns:
            The `resource` template filled in with ``str()`` of each named argument.

        Raises:
            KeyError: An argument the template names is missing.
        """
        if self.resource is None:
            return None
        return render_template(self.resource, args)
