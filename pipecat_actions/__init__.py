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

import sys as _sys
import types as _types
import typing as _typing

if _typing.TYPE_CHECKING:
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
    from pipecat_actions.pipeline import build_pipeline, check_placement
    from pipecat_actions.policy import PolicySet, ToolPolicy, load_policy, load_policy_text
    from pipecat_actions.processors import (
        ActionResultGate,
        ActionStatusReporter,
        ActionTurnTracker,
        rtvi_observer_params,
    )
    from pipecat_actions.runtime import ActionRuntime
    from pipecat_actions.session import SessionState
    from pipecat_actions.status import ActionStatus

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

# Where each exported name lives. A name is imported from its module when first used, so that
# `import pipecat_actions` (and the `pipecat-actions` command, an operator's tool) costs only
# what is used: the ledger's commands never import Pipecat (which logs a banner), and the ones
# that open no ledger never import SQLAlchemy. `tests/test_exported_members.py` checks that
# this table and `__all__` name the same things, and that each resolves.
_EXPORTS = {
    "ActionRuntime": "pipecat_actions.runtime",
    "ReconcileSchedule": "pipecat_actions.execution.executor",
    "SessionState": "pipecat_actions.session",
    "ActionResultGate": "pipecat_actions.processors",
    "ActionStatusReporter": "pipecat_actions.processors",
    "ActionTurnTracker": "pipecat_actions.processors",
    "build_pipeline": "pipecat_actions.pipeline",
    "check_placement": "pipecat_actions.pipeline",
    "rtvi_observer_params": "pipecat_actions.processors",
    "ActionContext": "pipecat_actions.actions",
    "ActionDefinition": "pipecat_actions.actions",
    "CancelOutcome": "pipecat_actions.actions",
    "Reconciliation": "pipecat_actions.actions",
    "Refused": "pipecat_actions.actions",
    "action": "pipecat_actions.actions",
    "action_context": "pipecat_actions.actions",
    "EffectFailed": "pipecat_actions.execution.outcomes",
    "EffectNotSent": "pipecat_actions.execution.outcomes",
    "EffectOutcomeUnknown": "pipecat_actions.execution.outcomes",
    "EffectRetryable": "pipecat_actions.execution.outcomes",
    "AllowAll": "pipecat_actions.admission.authorization",
    "AuthorizationRequest": "pipecat_actions.admission.authorization",
    "Authorizer": "pipecat_actions.admission.authorization",
    "Decision": "pipecat_actions.admission.authorization",
    "ActionStatus": "pipecat_actions.status",
    "Ledger": "pipecat_actions.ledger",
    "LedgerSettings": "pipecat_actions.ledger",
    "Operation": "pipecat_actions.ledger",
    "SqlLedger": "pipecat_actions.ledger",
    "PolicySet": "pipecat_actions.policy",
    "ToolPolicy": "pipecat_actions.policy",
    "load_policy": "pipecat_actions.policy",
    "load_policy_text": "pipecat_actions.policy",
    "Approver": "pipecat_actions.approvals",
    "Clock": "pipecat_actions.clock",
    "ManualClock": "pipecat_actions.clock",
    "SystemClock": "pipecat_actions.clock",
    "ApprovalRefused": "pipecat_actions.approvals",
    "ConfigurationError": "pipecat_actions.errors",
    "IdempotencyMismatch": "pipecat_actions.errors",
    "IllegalTransition": "pipecat_actions.errors",
    "LedgerConfigurationError": "pipecat_actions.errors",
    "LedgerError": "pipecat_actions.errors",
    "LedgerIntegrityError": "pipecat_actions.errors",
    "LedgerUnavailable": "pipecat_actions.errors",
    "OperationNotFound": "pipecat_actions.errors",
    "PipecatActionsError": "pipecat_actions.errors",
    "PolicyError": "pipecat_actions.errors",
    "PolicyProblem": "pipecat_actions.errors",
    "SchemaVersionMismatch": "pipecat_actions.errors",
    "StaleFence": "pipecat_actions.errors",
    "StatusError": "pipecat_actions.errors",
    "TransitionRefused": "pipecat_actions.errors",
    "UnexpectedStatus": "pipecat_actions.errors",
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

    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value  # found here from now on, without this function
        return value
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


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def _importing_from(frame: _types.FrameType) -> bool:
    """Whether ``frame`` is executing a ``from ... import`` (the IMPORT_FROM instruction)."""
    import dis

    code = frame.f_code.co_code
    return 0 <= frame.f_lasti < len(code) and code[frame.f_lasti] == dis.opmap["IMPORT_FROM"]
