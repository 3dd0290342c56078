"""Tool policies: what each tool is, how it may run, and what makes running it safe.

A policy file (YAML) lists every tool the bot may call under ``tools:``, with shared settings
under ``defaults:``. `load_policy` reads one into a `PolicySet` of merged, checked
`ToolPolicy` objects, or raises `PolicyError` naming the file, key path and reason of every
problem; `check_policy_files` reports on files for the ``pipecat-actions policy check``
command. Checking a file costs time in proportion to its size: the ``MAX_*`` limits bound what
a file may hold, and how many of its problems are listed.
"""

from __future__ import annotations

__all__ = [
    "MAX_DEFAULTS_CHARS",
    "MAX_DEPTH",
    "MAX_LISTED_PROBLEMS",
    "MAX_NUMBER_CHARS",
    "MAX_POLICY_BYTES",
    "MAX_TOOLS",
    "MAX_VALUES",
    "AdmitWhen",
    "CompensationPolicy",
    "ConfirmationMode",
    "ConfirmationPolicy",
    "DeliveryMode",
    "DeliveryPolicy",
    "DurablePolicy",
    "Execution",
    "ExecutionMode",
    "FillerPolicy",
    "IdempotencyPolicy",
    "IdempotencyScope",
    "LimitsPolicy",
    "OnDuplicate",
    "OnInterruption",
    "Overflow",
    "PolicyError",
    "PolicyFile",
    "PolicyProblem",
    "PolicySet",
    "ReconciliationPolicy",
    "RetryPolicy",
    "Risk",
    "SensitiveMode",
    "ToolKind",
    "ToolPolicy",
    "check_policy_files",
    "load_policy",
    "load_policy_data",
    "load_policy_text",
]

from pipecat_actions.errors import PolicyError, PolicyProblem
from pipecat_actions.policy.document import PolicyFile, PolicySet
from pipecat_actions.policy.durable import DurablePolicy, Execution
from pipecat_actions.policy.enums import (
    AdmitWhen,
    ConfirmationMode,
    DeliveryMode,
    ExecutionMode,
    IdempotencyScope,
    OnDuplicate,
    OnInterruption,
    Overflow,
    Risk,
    SensitiveMode,
    ToolKind,
)
from pipecat_actions.policy.limits import LimitsPolicy
from pipecat_actions.policy.loader import (
    MAX_DEFAULTS_CHARS,
    MAX_DEPTH,
    MAX_LISTED_PROBLEMS,
    MAX_NUMBER_CHARS,
    MAX_POLICY_BYTES,
    MAX_TOOLS,
    MAX_VALUES,
    check_policy_files,
    load_policy,
    load_policy_data,
    load_policy_text,
)
from pipecat_actions.policy.model import (
    CompensationPolicy,
    ConfirmationPolicy,
    DeliveryPolicy,
    FillerPolicy,
    IdempotencyPolicy,
    ReconciliationPolicy,
    ToolPolicy,
)
from pipecat_actions.policy.retry import RetryPolicy
