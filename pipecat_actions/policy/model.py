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
from typing import Annotated, Any, Self

from pydantic import BaseModel, ConfigDict, Field, Strict, model_validator

from pipecat_actions.policy._rules import raise_violations, tool_policy_violations
from pipecat_actions.policy.enums import (
    AdmitWhen,
    ConfirmationMode,
    DeliveryMode,
    ExecutionMode,
    IdempotencyScope,
    OnDuplicate,
    OnInterruption,
    Risk,
    SensitiveMode,
    ToolKind,
)
from pipecat_actions.policy.fields import (
    AgentNames,
    Announcement,
    ApproverNames,
    ArgumentNames,
    RedactPaths,
    SensitivePath,
    SummaryTemplate,
    Template,
    ToolName,
    render_template,
)
from pipecat_actions.policy.limits import LimitsPolicy
from pipecat_actions.policy.retry import RetryPolicy

# YAML gives enum values as text; strict mode would accept only enum members, so enum fields
# are marked lax (pydantic still refuses any text that is not one of the values).
_LAX = Strict(False)

_DEFAULT_EXPIRY_SECS = {ConfirmationMode.VERBAL: 120.0, ConfirmationMode.APPROVAL: 900.0}


class IdempotencyPolicy(BaseModel):
    """What makes two calls "the same intent", and for how long that is remembered."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    key_fields: ArgumentNames = Field(
        default=(),
        description=(
            "The arguments that identify the intent (e.g. restaurant_id, date, time, "
            "party_size). Two calls with equal values for these are the same request. Leave "
            "empty to use every argument."
        ),
    )
    scope: Annotated[IdempotencyScope, _LAX] = Field(
        default=IdempotencyScope.PRINCIPAL,
        description=(
            "Whose calls are compared: session (one conversation), principal (one signed-in "
            "user, across conversations), tenant (one business) or global (everyone)."
        ),
    )
    window_secs: float = Field(
        default=86400.0,
        gt=0,
        description=(
            "How long, in seconds, an intent is remembered; an equal call after this counts as "
            "new. The default is one day."
        ),
    )
    provider_dedupes: bool = Field(
        default=False,
        description=(
            "True when the system of record (the booking or payment API) honours the "
            "idempotency key we send, so sending the same request twice changes nothing. "
            "Required before a mutation may be retried."
        ),
    )


class ConfirmationPolicy(BaseModel):
    """Whether someone must say yes before a mutation runs, and how long the yes stays valid.

    When ``expires_after_secs`` is left out it depends on ``mode``: 120 seconds for ``verbal``
    (a spoken yes belongs to the moment), 900 seconds for ``approval`` (an operator needs time
    to look), and no expiry for ``none``.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    mode: Annotated[ConfirmationMode, _LAX] = Field(
        default=ConfirmationMode.NONE,
        description=(
            "Who must agree before the action runs: none (nobody), verbal (the user says yes in "
            "the conversation) or approval (a human operator approves it). Mutations only."
        ),
    )
    expires_after_secs: float | None = Field(
        default=None,
        gt=0,
        description=(
            "Seconds a pending confirmation or approval stays open before the request expires. "
            "Left out: 120 for verbal, 900 for approval."
        ),
    )
    prompt: Template | None = Field(
        default=None,
        description=(
            "What the bot asks to get a verbal yes, with {argument} placeholders, e.g. "
            "'Shall I refund {amount} to your card?'. Left out: the model words it."
        ),
    )
    approvers: ApproverNames = Field(
        default=(),
        description=(
            "mode approval: the operators who may approve or reject a request, by the name "
            "they sign in with (the console's credentials file, a proxy's user header, the "
            "CLI's --approver). The one who asked never decides on their own request. Give "
            "approvers, approver_roles or both."
        ),
    )
    approver_roles: ApproverNames = Field(
        default=(),
        description=(
            "mode approval: roles whose members may approve or reject a request (the roles "
            "of the console's credentials file, or a proxy's groups header)."
        ),
    )
    summary: SummaryTemplate | None = Field(
        default=None,
        description=(
            "mode approval: what the approver is asked to approve, in words, shown above the "
            "arguments (console, approvals show), with {argument} and {before.field} "
            "placeholders filled in from the call and the snapshot's before-state, e.g. "
            "'Transfer {rx_id} for {before.patient_name} to {to_pharmacy}'. A field the "
            "request does not hold is shown as missing."
        ),
    )

    @model_validator(mode="before")
    @classmethod
    def _default_expiry_for_mode(cls, data: Any) -> Any:
        if not isinstance(data, dict) or data.get("expires_after_secs") is not None:
            return data
        try:
            mode = ConfirmationMode(data.get("mode", ConfirmationMode.NONE))
        except (ValueError, TypeError):
            return data  # the field validator reports the bad mode
        if mode in _DEFAULT_EXPIRY_SECS:
            return {**data, "expires_after_secs": _DEFAULT_EXPIRY_SECS[mode]}
        return data


class FillerPolicy(BaseModel):
    """A line the bot says while it waits for a blocking action, so the user does not ask again.

    It is said only after ``after_secs`` of silence (nobody speaking) while the outcome is still
    unknown, at most ``times`` times per call, never once the outcome is known, and always
    before the outcome is told (never over it).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    after_secs: float = Field(
        gt=0,
        description=(
            "Required. Seconds of silence (neither the user nor the bot speaking) while the "
            "bot waits for the outcome, before the line is said."
        ),
    )
    text: Announcement = Field(
        description=(
            "Required. What the bot says, e.g. 'Still working on it, one moment.'. It must not "
            "claim an outcome (no 'booked', 'done')."
        ),
    )
    times: int = Field(
        default=1,
        ge=1,
        le=10,
        description=(
            "How many times at most the line is said during one wait, each after another "
            "after_secs of silence."
        ),
    )


class DeliveryPolicy(BaseModel):
    """How a result reaches the conversation when it is not simply on time.

    Each setting is one of in_place (as the call's own result, right away), when_idle (held
    until nobody is speaking), silent (recorded for the model without making the bot speak),
    interrupt (right away, even cutting the bot off) or suppress (not delivered, only logged).
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    late: Annotated[DeliveryMode, _LAX] = Field(
        default=DeliveryMode.WHEN_IDLE,
        description="A result that arrives after the conversation has moved on.",
    )
    superseded: Annotated[DeliveryMode, _LAX] = Field(
        default=DeliveryMode.WHEN_IDLE,
        description=(
            "A result of a call that a newer call on the same resource replaced (the user "
            "changed 21:00 to 21:30). A mutation's must be delivered so the model can offer to "
            "undo it."
        ),
    )
    intermediate: Annotated[DeliveryMode, _LAX] = Field(
        default=DeliveryMode.SILENT,
        description=(
            "A progress update sent by a long-running tool before its final result (the "
            "effect's ctx.report): silent puts it in the conversation without making the bot "
            "speak; when_idle, in_place or interrupt make the bot tell the user; suppress only "
            "records it in the audit trail. Never told once the outcome is known."
        ),
    )
    filler: FillerPolicy | None = Field(
        default=None,
        description=(
            "A line the bot says while it waits for a blocking action, e.g. {after_secs: 4, "
            "text: 'Still working on it.'}. mode: blocking only. Left out: the bot waits in "
            "silence."
        ),
    )


class CompensationPolicy(BaseModel):
    """How a committed change of this tool is undone, and whether the runtime does it unasked.

    The runtime undoes a change with the action's ``compensate`` hook (as a new, linked
    operation); ``tool`` is the tool the model may call to undo it. At least one of ``tool`` and
    ``automatic: true`` is required.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    tool: ToolName | None = Field(
        default=None,
        description=(
            "The tool the model may call to undo this one (book_table is undone by "
            "cancel_booking). When a newer request supersedes a committed one, the model is "
            "told its name so it can offer the undo. It must be another mutation in the same "
            "policy file. Required unless automatic is true."
        ),
    )
    automatic: bool = Field(
        default=False,
        description=(
            "True: when a newer call of this tool on the same resource, from a later user "
            "turn of the same conversation, commits, the runtime undoes the earlier committed "
            "one itself with the action's compensate hook (checked when the action is "
            "registered) and the user is told. Needs resource. False: the model is told the "
            "real state and offers to undo it, with tool when one is named."
        ),
    )
    description: str | None = Field(
        default=None,
        description="For reviewers: what undoing means here (fees, time limits).",
    )


class ReconciliationPolicy(BaseModel):
    """When "the system of record has no trace of it" may be believed.

    A request that was sent may still be applied by the provider for a while after the client
    stopped waiting (a queue, a slow worker, a retry on the provider's side). Until then a
    reconcile hook's "not found" is no evidence that it did not happen: the operation stays
    UNKNOWN, the user hears that it is still being checked, and the hook is asked again.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)

    commit_horizon_secs: float = Field(
        default=60.0,
        ge=0,
        le=86400,
        description=(
            "How long, in seconds, this provider may still apply a request after the last "
            "moment it could have been sent (the effect stopped, or its owner died). Before "
            "that, a reconcile hook's not_found leaves the operation UNKNOWN and it is checked "
            "again; after it, not_found means it did not happen (FAILED_FINAL). Set it to "
            "what the provider guarantees: its request timeout plus any queueing; 0 only for "
            "a system of record that applies a request while its call is open and never after "
            "(a database written in the effect's own transaction)."
        ),
    )
    cancel_to_settle: bool = Field(
        default=False,
        description=(
            "True: while the system of record has no trace of an UNKNOWN operation before "
            "its horizon, the action's cancel hook is asked to cancel it by its idempotency "
            "key; once the provider confirms (cancelled), nothing can happen any more and it "
            "is settled as not happened at once. Needs a cancel hook. False: only the horizon "
            "settles it."
        ),
    )


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
        raise_violations(tool_policy_violations(self))
        return self

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
