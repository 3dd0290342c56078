"""The words a policy file may use for its choices, one `StrEnum` per setting.

Each enum's value is exactly what a reviewer writes in YAML (``kind: mutation``). Members are
documented in the class docstring so the policy reference (docs/policies.md) can list them.
"""

from __future__ import annotations

__all__ = [
    "AdmitWhen",
    "ConfirmationMode",
    "DeliveryMode",
    "ExecutionMode",
    "IdempotencyScope",
    "OnDuplicate",
    "OnInterruption",
    "Overflow",
    "Risk",
    "SensitiveMode",
    "ToolKind",
]

from enum import StrEnum


class ToolKind(StrEnum):
    """Whether a tool only looks things up or changes something in the real world.

    Attributes:
        READ: Only reads (availability, order status); safe to repeat or drop.
        MUTATION: Changes something outside the conversation (a booking, a payment).
    """

    READ = "read"
    MUTATION = "mutation"


class Risk(StrEnum):
    """How much harm a wrong call could do; ``high`` mutations must be confirmed.

    Attributes:
        LOW: A mistake is cheap and easy to undo.
        MEDIUM: A mistake is noticeable but can be undone.
        HIGH: A mistake costs money or trust (refunds, cancellations).
    """

    LOW = "low"
    MEDIUM = "medium"
    HIGH = "high"


class ExecutionMode(StrEnum):
    """Whether the conversation waits for the tool's result.

    Attributes:
        BLOCKING: The bot waits for the result before it speaks again; a barge-in stops the
            waiting (Pipecat ``cancel_on_interruption=True``).
        BACKGROUND: The conversation goes on while the tool runs; the result is delivered when
            it arrives (Pipecat ``cancel_on_interruption=False``).
    """

    BLOCKING = "blocking"
    BACKGROUND = "background"


class AdmitWhen(StrEnum):
    """When a proposed call may start.

    Attributes:
        IMMEDIATELY: As soon as the model proposes it and admission passes.
        TURN_CONFIRMED: Only once the reply that proposed it finished without the user
            interrupting it.
    """

    IMMEDIATELY = "immediately"
    TURN_CONFIRMED = "turn_confirmed"


class IdempotencyScope(StrEnum):
    """Who shares one idempotency key space: two equal calls within it are the same intent.

    Attributes:
        SESSION: Only calls within the same conversation.
        PRINCIPAL: Calls on behalf of the same signed-in user, across conversations.
        TENANT: Calls within the same tenant (business), whoever makes them.
        GLOBAL: Every call, everywhere.
    """

    SESSION = "session"
    PRINCIPAL = "principal"
    TENANT = "tenant"
    GLOBAL = "global"


class OnInterruption(StrEnum):
    """What a barge-in does to the business action (not to the bot's speech).

    Attributes:
        CONTINUE: The action goes on; its result arrives later.
        CANCEL_IF_NOT_STARTED: Cancelled only if nothing was sent yet; otherwise it goes on.
        REQUEST_CANCEL: Ask the system of record to cancel, then report what it confirms.
    """

    CONTINUE = "continue"
    CANCEL_IF_NOT_STARTED = "cancel_if_not_started"
    REQUEST_CANCEL = "request_cancel"


class OnDuplicate(StrEnum):
    """What happens when the same intent (same idempotency key) is proposed again.

    Attributes:
        JOIN: The second call gets the first call's outcome; nothing runs twice.
        REJECT: The second call is refused with an explanation.
        REPLACE: The earlier call is cancelled or superseded by the new one.
        ALLOW: Both run (only for actions that really may happen twice).
        CONFIRM: Ask the user whether they really mean to do it again.
    """

    JOIN = "join"
    REJECT = "reject"
    REPLACE = "replace"
    ALLOW = "allow"
    CONFIRM = "confirm"


class ConfirmationMode(StrEnum):
    """Who must say yes before a mutation runs.

    Attributes:
        NONE: Nobody; it runs once admitted.
        VERBAL: The user confirms out loud in the conversation.
        APPROVAL: A human operator approves it outside the conversation.
    """

    NONE = "none"
    VERBAL = "verbal"
    APPROVAL = "approval"


class Overflow(StrEnum):
    """What happens to a call that would exceed a limit.

    Attributes:
        REJECT: Refuse it with an explanation the model can pass on.
        QUEUE: Wait for a free slot (needs ``max_concurrent`` and ``max_queued``).
        COALESCE: Share the result of an identical call already running (reads only).
        DEGRADE: Answer with ``degrade_result`` instead of calling the tool.
    """

    REJECT = "reject"
    QUEUE = "queue"
    COALESCE = "coalesce"
    DEGRADE = "degrade"


class SensitiveMode(StrEnum):
    """How the ledger stores a value a policy marks ``sensitive``.

    Attributes:
        ENCRYPT: Encrypted with the ledger keys: the runtime runs with it (after a restart
            too) and an operator with the key may reveal it.
        HASH: Only a keyed hash of it: whether two values are equal can be told, the value
            itself is kept nowhere (a read's arguments, results).
    """

    ENCRYPT = "encrypt"
    HASH = "hash"


class DeliveryMode(StrEnum):
    """How a result reaches the conversation.

    Attributes:
        IN_PLACE: As the tool call's own result, right away.
        WHEN_IDLE: Held until neither the user nor the bot is speaking, then delivered.
        SILENT: Added to the conversation's record without making the bot speak.
        INTERRUPT: Delivered right away, even if the bot has to stop talking.
        SUPPRESS: Not delivered at all (still recorded in the ledger).
    """

    IN_PLACE = "in_place"
    WHEN_IDLE = "when_idle"
    SILENT = "silent"
    INTERRUPT = "interrupt"
    SUPPRESS = "suppress"
