"""The cross-field rules of a tool policy: which settings may not go together, and why.

`tool_policy_violations` reads a tool policy through `RuledPolicy` (the settings it checks),
so this module needs nothing of `pipecat_actions.policy.model`, which calls it.
"""

from __future__ import annotations

__all__ = ["RuledPolicy", "tool_policy_violations"]

from collections.abc import Mapping
from typing import Protocol

from pipecat_actions._printable import bounded
from pipecat_actions.policy._violations import Violation
from pipecat_actions.policy.enums import (
    ConfirmationMode,
    DeliveryMode,
    ExecutionMode,
    OnDuplicate,
    OnInterruption,
    Overflow,
    Risk,
    SensitiveMode,
    ToolKind,
)
from pipecat_actions.policy.fields import number_text, redact_root, template_placeholders
from pipecat_actions.policy.limits import LimitsPolicy
from pipecat_actions.policy.parts import (
    CompensationPolicy,
    ConfirmationPolicy,
    DeliveryPolicy,
    IdempotencyPolicy,
)
from pipecat_actions.policy.retry import RetryPolicy
from pipecat_actions.policy.summary import BEFORE, summary_placeholders


class RuledPolicy(Protocol):
    """The settings of a tool policy the rules read (`pipecat_actions.policy.ToolPolicy`)."""

    @property
    def kind(self) -> ToolKind: ...
    @property
    def risk(self) -> Risk: ...
    @property
    def arguments(self) -> tuple[str, ...] | None: ...
    @property
    def mode(self) -> ExecutionMode: ...
    @property
    def on_duplicate(self) -> OnDuplicate: ...
    @property
    def on_interruption(self) -> OnInterruption: ...
    @property
    def cancellable_by_llm(self) -> bool: ...
    @property
    def idempotency(self) -> IdempotencyPolicy: ...
    @property
    def confirmation(self) -> ConfirmationPolicy: ...
    @property
    def timeout_secs(self) -> float | None: ...
    @property
    def deadline_secs(self) -> float: ...
    @property
    def retry(self) -> RetryPolicy: ...
    @property
    def limits(self) -> LimitsPolicy: ...
    @property
    def delivery(self) -> DeliveryPolicy: ...
    @property
    def resource(self) -> str | None: ...
    @property
    def compensation(self) -> CompensationPolicy | None: ...
    @property
    def redact(self) -> tuple[str, ...]: ...
    @property
    def sensitive(self) -> Mapping[str, SensitiveMode]: ...
    @property
    def announce(self) -> str | None: ...
    @property
    def before_state_fields(self) -> tuple[str, ...] | None: ...
    @property
    def is_mutation(self) -> bool: ...


def tool_policy_violations(policy: RuledPolicy) -> list[Violation]:
    """Check the rules that tie a tool policy's settings together.

    Args:
        policy: A tool policy whose fields are each valid on their own.

    Returns:
        Every broken rule, in a stable order; empty when the policy is coherent.
    """
    found = _read_violations(policy) if not policy.is_mutation else _mutation_violations(policy)
    found.extend(_approver_violations(policy))
    if policy.timeout_secs is not None and policy.deadline_secs < policy.timeout_secs:
        found.append(
            Violation(
                ("deadline_secs",),
                f"must be at least timeout_secs ({policy.timeout_secs:g}), got "
                f"{policy.deadline_secs:g}: the action's deadline cannot end before Pipecat "
                "stops waiting for it",
            )
        )
    if policy.announce is not None and policy.mode is ExecutionMode.BLOCKING:
        found.append(
            Violation(
                ("announce",),
                "is only spoken when a background action starts; set mode: background or "
                "remove announce",
            )
        )
    if policy.delivery.filler is not None and policy.mode is ExecutionMode.BACKGROUND:
        found.append(
            Violation(
                ("delivery", "filler"),
                "fills the silence while the bot waits for a blocking action; a background "
                "action does not keep the conversation waiting (use announce), or set "
                "mode: blocking",
            )
        )
    return (
        found
        + _sensitive_violations(policy)
        + _argument_violations(policy)
        + _summary_violations(policy)
    )


_PARTS = ("result", "before_state")


def _sensitive_violations(policy: RuledPolicy) -> list[Violation]:
    found: list[Violation] = []
    paths = list(policy.sensitive)
    for path, mode in policy.sensitive.items():
        where = ("sensitive", path)
        argument = redact_root(path) not in _PARTS
        if argument and mode is SensitiveMode.HASH and policy.is_mutation:
            found.append(
                Violation(
                    where,
                    "hash keeps only a keyed hash of the value, so a mutation could not be "
                    "sent with it after a restart or an approval: use encrypt (hash suits a "
                    "read's arguments, and results)",
                )
            )
        inside = next((p for p in paths if p != path and _is_inside(path, p)), None)
        if inside is not None:
            found.append(
                Violation(where, f"is inside {inside!r}, which is sensitive already: list one")
            )
    roots = {redact_root(p) for p in paths if redact_root(p) not in _PARTS}
    if policy.resource is not None:
        found.extend(
            Violation(
                ("resource",),
                f"placeholder {{{name}}} is a sensitive argument; a resource is stored and "
                "compared as it is written, so it must not hold one",
            )
            for name in dict.fromkeys(template_placeholders(policy.resource))
            if name in roots
        )
    return found


def _is_inside(path: str, other: str) -> bool:
    """Whether ``path`` names a value inside the value ``other`` names."""
    return path.startswith(other) and path[len(other)] in ".["


def _approver_violations(policy: RuledPolicy) -> list[Violation]:
    found: list[Violation] = []
    confirmation = policy.confirmation
    decides = confirmation.approvers or confirmation.approver_roles
    if confirmation.mode is ConfirmationMode.APPROVAL and not decides and policy.is_mutation:
        found.append(
            Violation(
                ("confirmation", "approvers"),
                "approval needs someone who may approve: list confirmation.approvers "
                "(operators' names) or confirmation.approver_roles",
            )
        )
    elif confirmation.mode is not ConfirmationMode.APPROVAL and decides:
        key = "approvers" if confirmation.approvers else "approver_roles"
        found.append(
            Violation(
                ("confirmation", key),
                f"{key} name who approves a request, so they need confirmation.mode: approval",
            )
        )
    if confirmation.mode is not ConfirmationMode.APPROVAL and confirmation.summary is not None:
        found.append(
            Violation(
                ("confirmation", "summary"),
                "is what an approver is shown, so it needs confirmation.mode: approval (a "
                "verbal confirmation asks with confirmation.prompt)",
            )
        )
    return found


def _summary_violations(policy: RuledPolicy) -> list[Violation]:
    """Each summary placeholder names a declared argument or before-state field."""
    summary = policy.confirmation.summary
    if summary is None:
        return []
    path = ("confirmation", "summary")
    found: list[Violation] = []
    declared = {BEFORE: policy.before_state_fields, None: policy.arguments}
    for placeholder in dict.fromkeys(summary_placeholders(summary)):
        reads_before = placeholder[0] == BEFORE
        known = declared[BEFORE if reads_before else None]
        name = placeholder[1] if reads_before else placeholder[0]
        if known is None or name in known:
            continue
        listed = bounded(", ".join(known), 300) if known else "it declares none"
        which = "before_state_fields" if reads_before else "arguments"
        found.append(
            Violation(
                path,
                f"placeholder {{{'.'.join(placeholder)}}} reads {name!r}, which is not one of "
                f"the tool's {which} ({listed})",
            )
        )
    if policy.arguments is not None and BEFORE in policy.arguments:
        found.append(
            Violation(
                path,
                "{before.…} reads the before-state, so an argument named 'before' cannot be "
                "placed in a summary; rename the argument",
            )
        )
    return found


def _read_violations(policy: RuledPolicy) -> list[Violation]:
    found: list[Violation] = []
    if policy.on_interruption is OnInterruption.REQUEST_CANCEL:
        found.append(
            Violation(
                ("on_interruption",),
                "request_cancel needs kind: mutation; a read has nothing to cancel "
                "(use continue or cancel_if_not_started)",
            )
        )
    if policy.cancellable_by_llm:
        found.append(
            Violation(
                ("cancellable_by_llm",),
                "needs kind: mutation; a read changes nothing, and it stops with its call",
            )
        )
    if policy.on_duplicate is OnDuplicate.REPLACE:
        found.append(
            Violation(
                ("on_duplicate",),
                "replace supersedes an earlier change, so it needs kind: mutation; "
                "use join for a read",
            )
        )
    if policy.confirmation.mode is not ConfirmationMode.NONE:
        found.append(
            Violation(
                ("confirmation", "mode"),
                f"{policy.confirmation.mode} confirmation needs kind: mutation; "
                "a read runs without asking",
            )
        )
    if policy.compensation is not None:
        found.append(Violation(("compensation",), "needs kind: mutation; a read changes nothing"))
    return found


def _mutation_violations(policy: RuledPolicy) -> list[Violation]:
    found: list[Violation] = []
    if policy.limits.overflow is Overflow.COALESCE:
        found.append(
            Violation(
                ("limits", "overflow"),
                "coalesce shares one result between identical calls, which is only safe for "
                "kind: read; use reject, queue or degrade for a mutation",
            )
        )
    if policy.retry.max_attempts > 1 and not policy.idempotency.provider_dedupes:
        attempts = number_text(policy.retry.max_attempts)
        found.append(
            Violation(
                ("retry", "max_attempts"),
                f"a mutation may be retried (max_attempts {attempts}) only "
                "when the system of record honours our idempotency key: set "
                "idempotency.provider_dedupes: true, or max_attempts: 1",
            )
        )
    if policy.risk is Risk.HIGH and policy.confirmation.mode is ConfirmationMode.NONE:
        found.append(
            Violation(
                ("confirmation", "mode"),
                "a risk: high mutation must be confirmed: set confirmation.mode to verbal or "
                "approval",
            )
        )
    found.extend(_compensation_violations(policy))
    for field in ("late", "superseded"):
        if getattr(policy.delivery, field) is DeliveryMode.SUPPRESS:
            found.append(
                Violation(
                    ("delivery", field),
                    "a mutation's result must reach the conversation, so nobody is left "
                    "believing a change did not happen; use when_idle, silent, in_place or "
                    "interrupt",
                )
            )
    return found


def _compensation_violations(policy: RuledPolicy) -> list[Violation]:
    compensation = policy.compensation
    if compensation is None:
        return []
    found: list[Violation] = []
    if compensation.tool is None and not compensation.automatic:
        found.append(
            Violation(
                ("compensation", "tool"),
                "is required unless automatic is true: name the tool the model may call to "
                "undo this one, or set automatic: true",
            )
        )
    if compensation.automatic and policy.resource is None:
        found.append(
            Violation(
                ("compensation", "automatic"),
                "undoes a change that a newer call on the same resource superseded, so it "
                "needs resource (e.g. 'table:{restaurant_id}:{date}'); without one nothing is "
                "ever superseded",
            )
        )
    return found


def _argument_violations(policy: RuledPolicy) -> list[Violation]:
    if policy.arguments is None:
        return []
    known = set(policy.arguments)
    listed = bounded(", ".join(policy.arguments), 300) if policy.arguments else "it declares none"
    not_an_argument = f"is not one of the tool's arguments ({listed})"
    found = [
        Violation(("idempotency", "key_fields", index), f"{name!r} {not_an_argument}")
        for index, name in enumerate(policy.idempotency.key_fields)
        if name not in known
    ]
    templates: dict[tuple[str | int, ...], str | None] = {
        ("resource",): policy.resource,
        ("confirmation", "prompt"): policy.confirmation.prompt,
    }
    for path, template in templates.items():
        if template is not None:
            found.extend(
                Violation(path, f"placeholder {{{name}}} {not_an_argument}")
                for name in dict.fromkeys(template_placeholders(template))
                if name not in known
            )
    found.extend(
        Violation(
            ("redact", index),
            f"{path!r} starts with {redact_root(path)!r}, which {not_an_argument}",
        )
        for index, path in enumerate(policy.redact)
        if redact_root(path) not in known
    )
    found.extend(
        Violation(
            ("sensitive", path),
            f"starts with {redact_root(path)!r}, which {not_an_argument} (result and "
            "before_state name those parts)",
        )
        for path in policy.sensitive
        if redact_root(path) not in known and redact_root(path) not in _PARTS
    )
    return found
