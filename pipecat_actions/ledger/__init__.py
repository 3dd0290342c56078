"""The durable action ledger: every operation, its status and its append-only audit trail.

Each name is imported from its module when first used: the records and the `Ledger` interface
cost no database library, and SQLAlchemy is imported by the code that opens a database
(`SqlLedger`, `LedgerSettings`, `default_ledger_url`).
"""

import typing as _typing

if _typing.TYPE_CHECKING:
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

_EXPORTS = {
    "CHANGEABLE_FIELDS": "pipecat_actions.ledger.sql",
    "AdmitResult": "pipecat_actions.ledger.records",
    "EventKind": "pipecat_actions.ledger.records",
    "ForwardingLedger": "pipecat_actions.ledger.forwarding",
    "Ledger": "pipecat_actions.ledger.base",
    "LedgerSettings": "pipecat_actions.ledger.engine",
    "NewOperation": "pipecat_actions.ledger.records",
    "Operation": "pipecat_actions.ledger.records",
    "OperationEvent": "pipecat_actions.ledger.records",
    "OperationFilter": "pipecat_actions.ledger.records",
    "SqlLedger": "pipecat_actions.ledger.sql",
    "canonical_json": "pipecat_actions.ledger.records",
    "default_ledger_url": "pipecat_actions.ledger.engine",
    "hash_arguments": "pipecat_actions.ledger.records",
    "new_operation_id": "pipecat_actions.ledger.records",
}


def __getattr__(name: str) -> object:
    import importlib

    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value  # found here from now on, without this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
