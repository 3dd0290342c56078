"""pipecat_actions: tool calls that change the real world, made safe for Pipecat voice agents.

The model proposes; the application admits; the system of record confirms; the conversation
communicates. This package admits and runs tool calls (`ActionRuntime`), keeps a durable ledger
of every operation with its status and audit trail, the status machine it obeys, and per-tool
policies in YAML.

The package exports what an application needs to write actions, wire them into a pipeline and
handle their errors. The rest is importable from its sub-package: the ledger's records and
queries (`pipecat_actions.ledger`: ``NewOperation``, ``OperationFilter``, ...), the status
machine's tables (`pipecat_actions.status`: ``TRANSITIONS``, ``TERMINAL_STATUSES``), the
testing kit (`pipecat_actions.testing`).
"""

import dis as _dis
import sys as _sys
import types as _types

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
from pipecat_actions.ledger import Ledger, LedgerSettings, Operation, SqlLedger
from pipecat_actions.policy import PolicySet, ToolPolicy, load_policy, load_policy_text
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.session import SessionState
from pipecat_actions.status import ActionStatus

__version__ = "0.1.0"

_IMPORT_FROM = _dis.opmap["IMPORT_FROM"]

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
    "ActionStatus",
    # ledger
    "Ledger",
    "LedgerSettings",
    "Operation",
    "SqlLedger",
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


# Names the package exported before it kept only what an application needs. Each still lives
# in its sub-package; asking the package for one says where.
_MOVED = {
    "AdmitResult": "pipecat_actions.ledger",
    "EventKind": "pipecat_actions.ledger",
    "NewOperation": "pipecat_actions.ledger",
    "OperationEvent": "pipecat_actions.ledger",
    "OperationFilter": "pipecat_actions.ledger",
    "default_ledger_url": "pipecat_actions.ledger",
    "hash_arguments": "pipecat_actions.ledger",
    "TERMINAL_STATUSES": "pipecat_actions.status",
    "TRANSITIONS": "pipecat_actions.status",
    "is_terminal": "pipecat_actions.status",
}


def __getattr__(name: str) -> object:
    import importlib

    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _MOVED:
        message = (
            f"pipecat_actions.{name} is no longer exported by the package; "
            f"import it from {_MOVED[name]} (from {_MOVED[name]} import {name})"
        )
        # For `from pipecat_actions import X`, Python replaces an AttributeError raised here
        # with a bare "cannot import name", dropping the message: that statement gets the
        # ImportError it would raise anyway, with the message. Any other access (attribute,
        # getattr, hasattr) gets the AttributeError the protocol asks for.
        if _importing_from(_sys._getframe(1)):
            raise ImportError(message, name=__name__)
        raise AttributeError(message, name=name, obj=_sys.modules[__name__])
    raise AttributeError(f"module 'pipecat_actions' has no attribute {name!r}")


def _importing_from(frame: _types.FrameType) -> bool:
    """Whether ``frame`` is executing a ``from ... import`` (the IMPORT_FROM instruction)."""
    code = frame.f_code.co_code
    return 0 <= frame.f_lasti < len(code) and code[frame.f_lasti] == _IMPORT_FROM
