"""Key rotation: every sealed value re-encrypted with the first of the configured keys.

After a new key is put first in ``PIPECAT_ACTIONS_LEDGER_KEYS`` (the old ones kept after it),
``pipecat-actions ledger rotate-keys`` reads every operation, re-encrypts each ``$enc`` token
not made with the first key (what it holds and the operation it belongs to stay the same), and
writes the operation back with an annotation, only if it did not change meanwhile (else it is
read again). Then the old keys can be dropped. Hashed values are left as they are: the hash
key is not rotated (see `pipecat_actions.ledger.keys`).

A token that no configured key opens is reported, never a traceback, and left as it is.
"""

from __future__ import annotations

__all__ = ["render_rotation", "rotate_sealed_values"]

from dataclasses import replace
from typing import Any

from pipecat_actions._printable import printable
from pipecat_actions.ledger.keys import LedgerKeys
from pipecat_actions.ledger.records import Operation, OperationFilter
from pipecat_actions.ledger.sealing import Sealer, has_markers
from pipecat_actions.ledger.sql import SqlLedger

_PAGE = 500
_TRIES = 5
_COLUMNS = (("args_json", "args"), ("result_json", "result"), ("before_state_json", "before_state"))


async def rotate_sealed_values(
    ledger: SqlLedger, *, actor: str, keys: LedgerKeys | None = None
) -> dict[str, Any]:
    """Re-encrypt every sealed value of ``ledger`` with the first key; return what was done.

    Returns:
        ``operations`` (read), ``resealed`` (operations rewritten), ``values`` (tokens
        re-encrypted), ``unreadable`` (each token no key opens: operation and where) and
        ``busy`` (operations that kept changing while they were rotated: run it again).

    Raises:
        LedgerKeysError: ``PIPECAT_ACTIONS_LEDGER_KEYS`` is not set.
    """
    keys = keys if keys is not None else LedgerKeys.from_environment()
    keys.require(encryption=True, hashing=False, why="rotation re-encrypts sealed values")
    sealer = Sealer({}, keys)
    report: dict[str, Any] = {
        "operations": 0,
        "resealed": 0,
        "values": 0,
        "unreadable": [],
        "busy": [],
    }
    page = OperationFilter(limit=_PAGE)
    while True:
        ops = await ledger.list(page)
        for op in ops:
            report["operations"] += 1
            await _rotate_one(ledger, sealer, op, actor=actor, report=report)
        if len(ops) < _PAGE:
            return report
        page = replace(page, after=(ops[-1].created_at, ops[-1].operation_id))


async def _rotate_one(
    ledger: SqlLedger, sealer: Sealer, op: Operation, *, actor: str, report: dict[str, Any]
) -> None:
    for tried in range(1, _TRIES + 1):
        texts: dict[str, tuple[str, str]] = {}
        values = 0
        unreadable: list[str] = []
        for column, part in _COLUMNS:
            text: str | None = getattr(op, column)
            if text is None or not has_markers(text):
                continue
            new, count, lost = sealer.rotate_text(text, part=part)
            unreadable.extend(lost)
            if count:
                texts[column], values = (text, new), values + count
        if not texts:
            break
        detail = {"reason": "sealed values re-encrypted with the newest key", "values": values}
        if await ledger.reseal(op.operation_id, texts, actor=actor, detail=detail):
            report["resealed"] += 1
            report["values"] += values
            break
        if tried == _TRIES:
            report["busy"].append(op.operation_id)
            return
        op = await ledger.get(op.operation_id)  # it moved on meanwhile: rotate what it is now
    report["unreadable"].extend(
        {"operation_id": op.operation_id, "where": where} for where in unreadable
    )


def render_rotation(report: dict[str, Any]) -> str:
    """The outcome of `rotate_sealed_values` as text."""
    lines = [
        f"{report['operations']} operations read; {report['values']} sealed values "
        f"re-encrypted in {report['resealed']} operations"
    ]
    for lost in report["unreadable"]:
        lines.append(
            f"cannot be decrypted with any key: {lost['operation_id']} "
            f"{printable(lost['where'])} (left as it is)"
        )
    lines.extend(
        f"kept changing, not rotated (run rotate-keys again): {op_id}" for op_id in report["busy"]
    )
    return "\n".join(lines)
