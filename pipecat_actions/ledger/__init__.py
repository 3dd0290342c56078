"""The durable action ledger: every operation, its status and its append-only audit trail."""

from pipecat_actions.ledger.base import Ledger
from pipecat_actions.ledger.engine import LedgerSettings, default_ledger_url
from pipecat_actions.ledger.forwarding import ForwardingLedger
from pipecat_actions.ledger.records import (
    AdmitResult,
    EventKind,
    NewOperation,
    Operation,
    OperationEvent,
    OperationFilter,
    canonical_json,
    hash_arguments,
    new_operation_id,
)
from pipecat_actions.ledger.sql import CHANGEABLE_FIELDS, SqlLedger

__all__ = [
    "CHANGEABLE_FIELDS",
    "AdmitResult",
    "EventKind",
    "ForwardingLedger",
    "Ledger",
    "LedgerSettings",
    "NewOperation",
    "Operation",
    "OperationEvent",
    "OperationFilter",
    "SqlLedger",
    "canonical_json",
    "default_ledger_url",
    "hash_arguments",
    "new_operation_id",
]
