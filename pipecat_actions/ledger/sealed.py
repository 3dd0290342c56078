"""`SealedLedger`: the runtime's ledger when a policy marks values sensitive.

Every write of an operation of a tool with sensitive paths is sealed on its way down (see
`pipecat_actions.ledger.sealing`): its arguments, result and before-state hold markers in
place of the values, its free text (error, rationale, audit details) holds ``••••`` in place
of them, and its arguments hash is keyed (`Sealer.args_hash`), so that a repeat still joins
and an approval still matches while nothing on disk can be turned back into the value.
Every operation read comes back opened: the runtime, its effects and its hooks see the real
values, in memory only.

A tool with no sensitive paths costs a dictionary look-up per write and a substring test per
JSON column read: no encryption, no hashing, no copy.

What this process sealed it keeps as plain text for a while (`_Known`), by operation, so that
the writes of an operation's life (running, committed, delivered) do not decrypt it again, and
so that a hashed value is still the real one for the effect of the call that gave it.
"""

from __future__ import annotations

__all__ = ["SealedLedger", "sealer_for", "stored_ledger"]

import builtins
import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from pipecat_actions.ledger.base import Ledger
from pipecat_actions.ledger.forwarding import ForwardingLedger
from pipecat_actions.ledger.keys import LedgerKeys
from pipecat_actions.ledger.records import (
    AdmitResult,
    NewOperation,
    Operation,
    OperationFilter,
    canonical_json,
)
from pipecat_actions.ledger.sealing import (
    SealedFields,
    Sealer,
    has_markers,
    scalar_texts,
    scrub,
    secret_texts,
)
from pipecat_actions.status import ActionStatus

_KEPT_OPERATIONS = 16_384
"""How many operations' plain texts and secrets are kept (the oldest are forgotten first)."""
_COLUMNS = (("args_json", "args"), ("result_json", "result"), ("before_state_json", "before_state"))


def sealer_for(
    sensitive: Mapping[str, Mapping[str, str]], keys: LedgerKeys | None = None
) -> Sealer | None:
    """The sealer of a policy's ``sensitive:`` paths (tool → path → mode), or None.

    None when no tool has sensitive paths and no key is configured: nothing to seal, nothing
    sealed to open. With keys but no sensitive paths, it opens what an earlier policy sealed.

    Raises:
        LedgerKeysError: A key the paths need is not set or malformed.
    """
    keys = keys if keys is not None else LedgerKeys.from_environment()
    tools = {name: SealedFields.of(paths) for name, paths in sensitive.items() if paths}
    if not tools and not keys.encryption and keys.hash_key is None:
        return None
    return Sealer(tools, keys)


def stored_ledger(ledger: Ledger) -> Ledger:
    """``ledger`` as stored: below the `SealedLedger` among its wrappers, if there is one.

    What an operator's view reads (the console given a runtime's ledger): sealed values stay
    sealed until the operator's own view masks or reveals them.
    """
    current = ledger
    while isinstance(current, ForwardingLedger):
        if isinstance(current, SealedLedger):
            return current.inner
        current = current.inner
    return ledger


@dataclass(slots=True)
class _Known:
    """What this process knows of one operation of a tool with sensitive values."""

    fields: SealedFields | None
    secrets: list[str] = field(default_factory=list)
    """The text of its sensitive values, masked in whatever free text it writes."""
    plain: dict[str, str] = field(default_factory=dict)
    """Its stored (sealed) JSON texts and their plain texts."""


class SealedLedger(ForwardingLedger):
    """Seals what ``inner`` stores and opens what it returns (see the module docstring).

    Args:
        inner: The ledger that stores everything.
        sealer: The tools' sensitive paths and the keys.
    """

    def __init__(self, inner: Ledger, sealer: Sealer) -> None:
        super().__init__(inner)
        self.sealer = sealer
        self._known: dict[str, _Known | None] = {}

    def args_hash(self, tool: str, args: Mapping[str, Any]) -> str:
        """See `Ledger.args_hash`: keyed for a tool with sensitive values."""
        return self.sealer.args_hash(tool, args)

    # --- writes of new operations ----------------------------------------------------------

    async def admit(self, new: NewOperation) -> AdmitResult:
        """See `Ledger.admit`."""
        fields = self.sealer.fields_for(new.tool)
        if fields is None:
            result = await super().admit(new)
        else:
            result = await super().admit(self._seal_new(new, fields))
        op = self._opened(result.operation)
        return result if op is result.operation else AdmitResult(op, result.created)

    async def record_refusal(self, new: NewOperation) -> Operation:
        """See `Ledger.record_refusal`.

        A refused call of a tool with sensitive values keeps its arguments sealed whole: what
        the model sent may not have the shape the paths name.
        """
        fields = self.sealer.fields_for(new.tool)
        if fields is None:
            return self._opened(await super().record_refusal(new))
        args = _encodable(new.args)
        secrets = secret_texts(args, fields.by_part["args"])
        sealed = dataclasses.replace(
            new,
            args=self.sealer.seal_whole(args, "args", new.operation_id),
            args_hash=self.sealer.args_hash(new.tool, args),
            error=scrub(new.error, secrets),
            rationale=scrub(new.rationale, secrets),
            detail=scrub(new.detail, secrets),
            before_state=None,
            result=None,
        )
        known = self._remember(new.operation_id, _Known(fields, secrets))
        known.plain[canonical_json(dict(sealed.args))] = canonical_json(args)
        return self._opened(await super().record_refusal(sealed))

    async def record_completed(self, new: NewOperation) -> Operation:
        """See `Ledger.record_completed`."""
        fields = self.sealer.fields_for(new.tool)
        if fields is not None:
            new = self._seal_new(new, fields)
        return self._opened(await super().record_completed(new))

    def _seal_new(self, new: NewOperation, fields: SealedFields) -> NewOperation:
        op_id, args = new.operation_id, dict(new.args)
        known = self._remember(op_id, _Known(fields, secret_texts(args, fields.by_part["args"])))
        sealed_args = self._seal_part(known, args, "args", op_id)
        result = self._seal_part(known, new.result, "result", op_id)
        before = self._seal_part(known, new.before_state, "before_state", op_id)
        return dataclasses.replace(
            new,
            args=sealed_args,
            args_hash=self.sealer.args_hash(new.tool, args),
            result=result,
            before_state=before,
            error=scrub(new.error, known.secrets),
            rationale=scrub(new.rationale, known.secrets),
            detail=scrub(new.detail, known.secrets),
        )

    def _seal_part(self, known: _Known, value: Any, part: str, operation_id: str) -> Any:
        """``value`` sealed by ``known``'s paths of ``part``; its plain text remembered."""
        if value is None or known.fields is None:
            return value
        if part != "args":
            known.secrets.extend(secret_texts(value, known.fields.by_part[part]))
        sealed = self.sealer.seal(value, known.fields, part, operation_id)
        known.plain[canonical_json(sealed)] = canonical_json(value)
        return sealed

    # --- writes of existing operations -----------------------------------------------------

    async def transition(
        self,
        operation_id: str,
        *,
        expected: ActionStatus,
        to: ActionStatus,
        fence: int,
        actor: str,
        detail: Mapping[str, Any] | None = None,
        changes: Mapping[str, Any] | None = None,
    ) -> Operation:
        """See `Ledger.transition`."""
        detail, changes = await self._sealed_changes(operation_id, detail, changes)
        return self._opened(
            await super().transition(
                operation_id,
                expected=expected,
                to=to,
                fence=fence,
                actor=actor,
                detail=detail,
                changes=changes,
            )
        )

    async def annotate(
        self,
        operation_id: str,
        *,
        actor: str,
        detail: Mapping[str, Any] | None = None,
        changes: Mapping[str, Any] | None = None,
        expected: ActionStatus | None = None,
        fence: int | None = None,
    ) -> Operation:
        """See `Ledger.annotate`."""
        detail, changes = await self._sealed_changes(operation_id, detail, changes)
        return self._opened(
            await super().annotate(
                operation_id,
                actor=actor,
                detail=detail,
                changes=changes,
                expected=expected,
                fence=fence,
            )
        )

    async def _sealed_changes(
        self,
        operation_id: str,
        detail: Mapping[str, Any] | None,
        changes: Mapping[str, Any] | None,
    ) -> tuple[Mapping[str, Any] | None, Mapping[str, Any] | None]:
        if detail is None and not changes:
            return detail, changes
        known = self._known.get(operation_id, _UNSEEN)
        if known is _UNSEEN:
            # Not read through this ledger yet (or forgotten): its tool decides.
            self._opened(await self.inner.get(operation_id))
            known = self._known.get(operation_id)
        if known is None or known is _UNSEEN:
            return detail, changes
        sealed = dict(changes or {})
        for part in ("result", "before_state"):
            if sealed.get(part) is not None:
                sealed[part] = self._seal_part(known, sealed[part], part, operation_id)
        if isinstance(sealed.get("error"), str):
            sealed["error"] = scrub(sealed["error"], known.secrets)
        return scrub(detail, known.secrets), (sealed if changes is not None else None)

    # --- reads -----------------------------------------------------------------------------

    async def get(self, operation_id: str) -> Operation:
        """See `Ledger.get`."""
        return self._opened(await super().get(operation_id))

    async def find_by_key(self, tenant: str, idempotency_key: str) -> Operation | None:
        """See `Ledger.find_by_key`."""
        found = await super().find_by_key(tenant, idempotency_key)
        return None if found is None else self._opened(found)

    async def list(self, filters: OperationFilter | None = None) -> builtins.list[Operation]:
        """See `Ledger.list`."""
        return [self._opened(op) for op in await super().list(filters)]

    async def claim_stale(
        self,
        owner: str,
        *,
        lease_secs: float,
        limit: int,
        except_ids: Collection[str] = (),
        gone: Collection[str] = (),
    ) -> builtins.list[Operation]:
        """See `Ledger.claim_stale`."""
        claimed = await super().claim_stale(
            owner, lease_secs=lease_secs, limit=limit, except_ids=except_ids, gone=gone
        )
        return [self._opened(op) for op in claimed]

    # --- opening ---------------------------------------------------------------------------

    def _opened(self, op: Operation) -> Operation:
        """``op`` with its sealed JSON columns opened (the runtime's view)."""
        known = self._known.get(op.operation_id, _UNSEEN)
        if known is _UNSEEN:
            fields = self.sealer.fields_for(op.tool)
            known = None if fields is None else _Known(fields)
            self._remember(op.operation_id, known)
        changed: dict[str, Any] = {}
        for column, part in _COLUMNS:
            text: str | None = getattr(op, column)
            if text is None:
                continue
            plain = None if known is None else known.plain.get(text)
            if plain is None and has_markers(text):
                opened: list[Any] = []
                plain = self.sealer.open_text(
                    text, operation_id=op.operation_id, part=part, opened=opened
                )
                if known is None:  # sealed under an earlier policy: its values are secrets too
                    known = self._remember(op.operation_id, _Known(None))
                known.plain[text] = plain
                for value in opened:
                    known.secrets.extend(scalar_texts(value))
            if plain is not None and plain != text:
                changed[column] = plain
        return dataclasses.replace(op, **changed) if changed else op

    def _remember(self, operation_id: str, known: _Known | None) -> Any:
        kept = self._known
        kept.pop(operation_id, None)
        kept[operation_id] = known
        while len(kept) > _KEPT_OPERATIONS:
            del kept[next(iter(kept))]
        return known


_UNSEEN: Any = _Known(None)
"""Stands for "never seen": an operation this ledger knows nothing of."""


def _encodable(args: Mapping[str, Any]) -> dict[str, Any]:
    """``args`` as a mapping JSON can encode (else its shape, bounded, as text)."""
    try:
        canonical_json(dict(args))
    except (TypeError, ValueError, RecursionError):
        try:
            shown = repr(dict(args))[:4096]
        except (ValueError, RecursionError):
            shown = "(arguments that cannot be shown)"
        return {"unencodable_arguments": shown}
    return dict(args)
