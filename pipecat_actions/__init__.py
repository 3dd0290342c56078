"""pipecat_actions: tool calls that change the real world, made safe for Pipecat voice agents.

The model proposes; the application admits; the system of record confirms; the conversation
communicates. This package keeps the durable part of that promise: a ledger of every operation
with its status and audit trail, the status machine it obeys, and per-tool policies in YAML.
"""

from pipecat_actions.clock import Clock, ManualClock, SystemClock
from pipecat_actions.errors import (
    ConfigurationError,
    IdempotencyMismatch,
    IllegalTransition,
    LedgerConfigurationError,
    LedgerError,
    LedgerIntegrityError,
    LedgerUnavailable,
    OperationNotFound,
    PipecatActionsError,
    PolicyError,
    PolicyProblem,
    SchemaVersionMismatch,
    StaleFence,
    StatusError,
    TransitionRefused,
    UnexpectedStatus,
)
from pipecat_actions.ledger import (
    AdmitResult,
    EventKind,
    Ledger,
    LedgerSettings,
    NewOperation,
    Operation,
    OperationEvent,
    OperationFilter,
    SqlLedger,
    default_ledger_url,
    hash_arguments,
)
from pipecat_actions.policy import PolicySet, ToolPolicy, load_policy, load_policy_text
from pipecat_actions.status import TERMINAL_STATUSES, TRANSITIONS, ActionStatus, is_terminal

__version__ = "0.1.0"

__all__ = [
    # status machine
    "TERMINAL_STATUSES",
    "TRANSITIONS",
    "ActionStatus",
    "is_terminal",
    # ledger
    "AdmitResult",
    "EventKind",
    "Ledger",
    "LedgerSettings",
    "NewOperation",
    "Operation",
    "OperationEvent",
    "OperationFilter",
    "SqlLedger",
    "default_ledger_url",
    "hash_arguments",
    # policies
    "PolicySet",
    "ToolPolicy",
    "load_policy",
    "load_policy_text",
    # time
    "Clock",
    "ManualClock",
    "SystemClock",
    # errors
    "ConfigurationError",
    "IdempotencyMismatch",
    "IllegalTransition",
    "LedgerConfigurationError",
    "LedgerError",
    "LedgerIntegrityError",
    "LedgerUnavailable",
    "OperationNotFound",
    "PipecatActionsError",
    "PolicyError",
    "PolicyProblem",
    "SchemaVersionMismatch",
    "StaleFence",
    "StatusError",
    "TransitionRefused",
    "UnexpectedStatus",
]
