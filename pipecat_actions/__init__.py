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
import typing as _typing

if _typing.TYPE_CHECKING:
    from pipecat_actions.actions import (
        ActionContext,
        CancelOutcome,
        Reconciliation,
        action,
        action_context,
    )
    from pipecat_actions.adapters import (
        ActionResultGate,
        ActionStatusReporter,
        ActionTurnTracker,
        attach,
        build_pipeline,
        check_placement,
        instrument,
        tools_schema,
    )
    from pipecat_actions.admission.authorization import (
        AllowAll,
        AuthorizationRequest,
        Authorizer,
        Decision,
    )
    from pipecat_actions.approvals import (
        Approver,
    )
    from pipecat_actions.clock import (
        ManualClock,
    )
    from pipecat_actions.errors import (
        ApprovalRefused,
        ConfigurationError,
        LedgerError,
        LedgerUnavailable,
        PipecatActionsError,
        PolicyError,
        Refused,
    )
    from pipecat_actions.execution.outcomes import (
        EffectFailed,
        EffectNotSent,
        EffectOutcomeUnknown,
        EffectRetryable,
    )
    from pipecat_actions.ledger import (
        Operation,
    )
    from pipecat_actions.policy import (
        PolicySet,
        load_policy,
        load_policy_text,
    )
    from pipecat_actions.results import (
        ToolResult,
    )
    from pipecat_actions.runtime import (
        ActionRuntime,
    )
    from pipecat_actions.session import (
        SessionState,
    )
    from pipecat_actions.status import (
        ActionStatus,
    )

__version__ = "0.1.0"

__all__ = [
    # runtime
    "ActionRuntime",
    "SessionState",
    # wiring into a Pipecat LLM service
    "attach",
    "instrument",
    "tools_schema",
    # processors and the pipeline template
    "ActionResultGate",
    "ActionStatusReporter",
    "ActionTurnTracker",
    "build_pipeline",
    "check_placement",
    # actions
    "ActionContext",
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
    # what an operation is and was told
    "ActionStatus",
    "Operation",
    "ToolResult",
    # policies
    "PolicySet",
    "load_policy",
    "load_policy_text",
    # approvals
    "Approver",
    # time
    "ManualClock",
    # errors
    "ApprovalRefused",
    "ConfigurationError",
    "LedgerError",
    "LedgerUnavailable",
    "PipecatActionsError",
    "PolicyError",
]

# Where each exported name lives. A name is imported from its module when first used, so that
# `import pipecat_actions` (and the `pipecat-actions` command, an operator's tool) costs only
# what is used: the ledger's commands never import Pipecat (which logs a banner), and the ones
# that open no ledger never import SQLAlchemy. `tests/test_exported_members.py` checks that
# this table and `__all__` name the same things, and that each resolves.
_EXPORTS = {
    "ActionRuntime": "pipecat_actions.runtime",
    "ToolResult": "pipecat_actions.results",
    "attach": "pipecat_actions.adapters",
    "instrument": "pipecat_actions.adapters",
    "tools_schema": "pipecat_actions.adapters",
    "SessionState": "pipecat_actions.session",
    "ActionResultGate": "pipecat_actions.adapters",
    "ActionStatusReporter": "pipecat_actions.adapters",
    "ActionTurnTracker": "pipecat_actions.adapters",
    "build_pipeline": "pipecat_actions.adapters",
    "check_placement": "pipecat_actions.adapters",
    "ActionContext": "pipecat_actions.actions",
    "CancelOutcome": "pipecat_actions.actions",
    "Reconciliation": "pipecat_actions.actions",
    "Refused": "pipecat_actions.errors",
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
    "Operation": "pipecat_actions.ledger",
    "PolicySet": "pipecat_actions.policy",
    "load_policy": "pipecat_actions.policy",
    "load_policy_text": "pipecat_actions.policy",
    "Approver": "pipecat_actions.approvals",
    "ManualClock": "pipecat_actions.clock",
    "ApprovalRefused": "pipecat_actions.errors",
    "ConfigurationError": "pipecat_actions.errors",
    "LedgerError": "pipecat_actions.errors",
    "LedgerUnavailable": "pipecat_actions.errors",
    "PipecatActionsError": "pipecat_actions.errors",
    "PolicyError": "pipecat_actions.errors",
}

# Names the package exported until this release, now found in their sub-package only. For one
# release they still resolve here, with a DeprecationWarning naming their home (the CHANGELOG's
# compatibility rule: a deprecation warns for a release before it refuses).
_DEPRECATED = {
    "ActionDefinition": "pipecat_actions.actions",
    "Clock": "pipecat_actions.clock",
    "IdempotencyMismatch": "pipecat_actions.errors",
    "IllegalTransition": "pipecat_actions.errors",
    "Ledger": "pipecat_actions.ledger",
    "LedgerConfigurationError": "pipecat_actions.errors",
    "LedgerIntegrityError": "pipecat_actions.errors",
    "LedgerSettings": "pipecat_actions.ledger",
    "OperationNotFound": "pipecat_actions.errors",
    "PolicyProblem": "pipecat_actions.errors",
    "ReconcileSchedule": "pipecat_actions.execution.executor",
    "SchemaVersionMismatch": "pipecat_actions.errors",
    "SqlLedger": "pipecat_actions.ledger",
    "StaleFence": "pipecat_actions.errors",
    "StatusError": "pipecat_actions.errors",
    "SystemClock": "pipecat_actions.clock",
    "ToolPolicy": "pipecat_actions.policy",
    "TransitionRefused": "pipecat_actions.errors",
    "UnexpectedStatus": "pipecat_actions.errors",
    "rtvi_observer_params": "pipecat_actions.adapters",
}

# Names the package stopped exporting a release ago: asking for one says where it lives.
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
    if name in _DEPRECATED:
        import warnings

        home = _DEPRECATED[name]
        warnings.warn(
            f"pipecat_actions.{name} is deprecated and goes in the next release; import it "
            f"from {home} (from {home} import {name})",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(home), name)
    if name in _MOVED:
        raise AttributeError(
            f"pipecat_actions.{name} is no longer exported by the package; import it from "
            f"{_MOVED[name]} (from {_MOVED[name]} import {name})",
            name=name,
            obj=_sys.modules[__name__],
        )
    raise AttributeError(f"module 'pipecat_actions' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
