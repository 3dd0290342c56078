"""The parts of a tool policy: idempotency, confirmation, delivery, compensation, reconciliation.

Each is a frozen pydantic model with its own per-field checks; `pipecat_actions.policy.ToolPolicy`
holds one of each and checks the rules that tie them together.
"""

from __future__ import annotations

__all__ = [
    "CompensationPolicy",
    "ConfirmationPolicy",
    "DeliveryPolicy",
    "FillerPolicy",
    "IdempotencyPolicy",
    "ReconciliationPolicy",
]

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, Strict, model_validator

from pipecat_actions.policy.enums import (
    ConfirmationMode,
    DeliveryMode,
    IdempotencyScope,
)
from pipecat_actions.policy.fields import (
    Announcement,
    ApproverNames,
    ArgumentNames,
    SummaryTemplate,
    Template,
    ToolName,
)

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
