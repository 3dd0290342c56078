"""pipecat_actions: tool calls that change the real world, made safe for Pipecat voice agents.

The model proposes; the application admits; the system of record confirms; the conversation
communicates. This package admits and runs tool calls (`ActionRuntime`), keeps a durable ledger
of every operation with its status and audit trail, the status machine it obeys, and per-tool
policies in YAML.
"""

from pipecat_actions.actions import (
    ActionContext,
    ActionDefinition,
    CancelOutcome,
    Reconciliation,
    Refused,
    action,
    action_context,
)
from pipecat_actions.admission.authorization import (
    AllowAll,
    AuthorizationRequest,
    Authorizer,
    Decision,
)
from pipecat_actions.approvals import ApprovalRefused, Approver
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
from pipecat_actions.execution.executor import ReconcileSchedule
from pipecat_actions.execution.outcomes import (
    EffectFailed,
    EffectNotSent,
    EffectOutcomeUnknown,
    EffectRetryable,
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
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.session import SessionState
from pipecat_actions.status import TERMINAL_STATUSES, TRANSITIONS, ActionStatus, is_terminal

__version__ = "0.1.0"

__all__ = [
    # runtime
    "ActionRuntime",
    "ReconcileSchedule",
    "SessionState",
    # processors and the pipeline template
    "ActionResultGate",
    "ActionStatusReporter",
    "ActionTurnTracker",
    "build_pipeline",
    "check_placement",
    "rtvi_observer_params",
    # actions
    "ActionContext",
    "ActionDefinition",
    "CancelOutcome",
    "Reconciliation",
    "Refused",
    "action",
    "action_context",
    # effect failures
    "EffectFailed",
    "EffectNotSent",
    "EffectOutcomeUnknown",
    "EffectRetryable",
    # authorization
    "AllowAll",
    "AuthorizationRequest",
    "Authorizer",
    "Decision",
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
    # approvals
    "Approver",
    # time
    "Clock",
    "ManualClock",
    "SystemClock",
    # errors
    "ApprovalRefused",
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

# Names that need Pipecat are imported when first used, so that the ledger, the policies and
# the `pipecat-actions` command start without importing Pipecat (which logs a banner).
_LAZY = {
    "ActionResultGate": "pipecat_actions.processors",
    "ActionStatusReporter": "pipecat_actions.processors",
    "ActionTurnTracker": "pipecat_actions.processors",
    "build_pipeline": "pipecat_actions.pipeline",
    "check_placement": "pipecat_actions.pipeline",
    "rtvi_observer_params": "pipecat_actions.processors",
}


def __getattr__(name: str) -> object:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'pipecat_actions' has no attribute {name!r}")
