"""Idempotency keys: the same intent gives the same key, whatever the provider's call id.

The key is built from the policy's ``key_fields`` (all arguments when empty) and ``scope``,
never from the provider's ``tool_call_id``, which can be empty, or repeated, or new for a
repeated intent (the model calling again after a lost result).
"""

from __future__ import annotations

__all__ = ["intent_key"]

from collections.abc import Callable, Mapping
from typing import Any

from pipecat_actions.ledger.records import hash_arguments
from pipecat_actions.policy import IdempotencyScope, ToolPolicy
from pipecat_actions.session import SessionState


def intent_key(
    tool: str,
    args: Mapping[str, Any],
    policy: ToolPolicy,
    session: SessionState,
    *,
    digest: Callable[[Mapping[str, Any]], str] = hash_arguments,
) -> str:
    """Return the idempotency key of calling ``tool`` with ``args`` in ``session``.

    The key reads ``<tool>|<scope>|<hash of the key fields>``: stable across processes and
    restarts, and short enough for any provider's idempotency header. ``digest`` hashes the
    key fields: the ledger's `Ledger.args_hash` (a keyed hash for a tool with sensitive
    values, so that the key, stored and sent as it is, cannot be turned back into them).
    """
    fields = policy.idempotency.key_fields or sorted(args)
    intent = {name: args.get(name) for name in fields}
    scope = policy.idempotency.scope
    if scope is IdempotencyScope.SESSION:
        scope_part = f"session:{session.session_id}"
    elif scope is IdempotencyScope.PRINCIPAL:
        scope_part = f"principal:{session.principal}"
    elif scope is IdempotencyScope.TENANT:
        scope_part = f"tenant:{session.tenant}"
    else:
        scope_part = "global"
    return f"{tool}|{scope_part}|{digest(intent)[:32]}"
