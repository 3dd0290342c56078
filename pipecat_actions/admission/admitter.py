"""Admission: the ordered checks a proposed tool call passes before anything happens.

Each step passes, or ends the call with a final tool result the model can relay (a refused call
still closes its tool call) and an audit record in the ledger:

unknown tool → stale proposal → payload cap (before parsing) → argument validation →
authorization of the session principal → preconditions → limits → idempotency key and the
duplicate policy → confirmation or approval → durable admission.
"""

from __future__ import annotations

__all__ = ["Admitter"]

import asyncio
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from loguru import logger

from pipecat_actions._printable import bounded
from pipecat_actions.actions import ActionContext, Binding, Refused
from pipecat_actions.admission._call import Audit, draft_operation
from pipecat_actions.admission.authorization import (
    AuthorizationRequest,
    Authorizer,
    AuthorizerFailed,
    ask,
)
from pipecat_actions.admission.decisions import (
    Admission,
    Decision,
    Joined,
    ReadAdmission,
    Refusal,
    Shared,
)
from pipecat_actions.admission.idempotency import intent_key
from pipecat_actions.admission.limits import Behind, Coalesced, Degraded, Limiter, Slot
from pipecat_actions.admission.validation import Invalid, read_arguments, validate_arguments
from pipecat_actions.approvals import APPROVAL_RULE, ApprovalRule
from pipecat_actions.clock import Clock
from pipecat_actions.errors import IdempotencyMismatch
from pipecat_actions.ledger import Ledger, NewOperation, Operation
from pipecat_actions.observability.redaction import log_redactor
from pipecat_actions.policy import AdmitWhen, ConfirmationMode, OnDuplicate, ToolKind, ToolPolicy
from pipecat_actions.results import refusal_result
from pipecat_actions.session import SessionState, turn_number
from pipecat_actions.status import AWAITING_PERSON_STATUSES, TERMINAL_STATUSES, ActionStatus

S = ActionStatus


class Admitter:
    """Runs the admission steps for one runtime; it decides, and returns its decision.

    Args:
        bindings: The registered actions, by tool name.
        ledger: Where admitted operations are inserted and refusals recorded.
        clock: The runtime's clock (deadlines).
        authorizer: Decides whether the session principal may make the call.
        limiter: Budgets, rates and concurrency.
        owner: The runtime's name in leases; admitted operations are leased to it.
        lease_secs: The lease they are admitted with.
        cancel: Withdraws an earlier operation that a newer call replaces
            (``on_duplicate: replace``); returns it as it then is.
    """

    def __init__(
        self,
        *,
        bindings: Mapping[str, Binding],
        ledger: Ledger,
        clock: Clock,
        authorizer: Authorizer,
        limiter: Limiter,
        owner: str,
        lease_secs: float,
        cancel: Callable[[Operation], Awaitable[Operation]],
    ) -> None:
        self._cancel = cancel
        self._bindings = bindings
        self._ledger = ledger
        self._clock = clock
        self._authorizer = authorizer
        self._limiter = limiter
        self._owner = owner
        self._lease_secs = lease_secs
        self._admitting: dict[str, asyncio.Future[Refusal | Joined | Admission | Shared]] = {}

    async def admit(
        self,
        tool: str,
        raw_args: Mapping[str, Any] | str,
        session: SessionState,
        *,
        tool_call_id: str | None = None,
        generation: int | None = None,
    ) -> Decision:
        """Run every admission step for one proposed call."""
        generation = session.generation if generation is None else generation
        base = Audit(tool, session, tool_call_id, str(session.user_turn), generation)
        binding = self._bindings.get(tool)
        if binding is None:
            return await self._refuse(
                base, "unknown_tool", f"There is no tool named '{bounded(tool)}'; nothing was done."
            )
        decision = await self._decide(base, binding, raw_args, session, generation)
        if not isinstance(decision, Refusal):
            # From here on the values at the policy's redact paths are masked in every log
            # line. Only an admitted call's (validated) values: a refused call's may be
            # anything the model made up, such as words that would blank every later line.
            log_redactor().arm(binding.policy.redacted_paths, base.args)
        return decision

    async def _decide(
        self,
        base: Audit,
        binding: Binding,
        raw_args: Mapping[str, Any] | str,
        session: SessionState,
        generation: int,
    ) -> Decision:
        tool = base.tool
        policy = binding.policy
        base.kind = _KIND_TEXT[policy.kind]
        mutation = policy.kind is ToolKind.MUTATION
        if mutation and session.is_interrupted(generation) and not policy.allow_stale_proposal:
            return await self._refuse(
                base,
                "stale_proposal",
                "The user interrupted before this was settled, so nothing was done; ask the "
                "user again if they still want it.",
            )
        parsed = read_arguments(raw_args, policy.max_payload_bytes)
        if isinstance(parsed, Invalid):
            if parsed.recorded is not None:
                base.args = parsed.recorded
            return await self._refuse(base, parsed.code, parsed.message)
        base.args = parsed
        args = validate_arguments(binding.action, parsed, coerce=policy.coerce_arguments)
        if isinstance(args, Invalid):
            return await self._refuse(base, args.code, args.message)
        base.args = args
        try:
            resource_key = policy.resource_key(args)
        except KeyError:
            resource_key = None
        base.resource_key = resource_key
        request = AuthorizationRequest(
            principal=session.principal,
            tenant=session.tenant,
            session_id=session.session_id,
            tool=tool,
            kind=base.kind,
            args=args,
            resource_key=resource_key,
        )
        decision = await ask(self._authorizer, request)
        if isinstance(decision, AuthorizerFailed):
            return await self._hook_failed(
                base, "the authorizer", decision.error, code="authorization_failed"
            )
        if not decision.allowed:
            return await self._refuse(
                base, "not_authorized", decision.reason or "This is not allowed for this user."
            )
        key = intent_key(
            tool, args, policy, session, digest=lambda a: self._ledger.args_hash(tool, a)
        )
        if policy.on_duplicate is OnDuplicate.ALLOW:
            key = f"{key}|{uuid.uuid4().hex[:12]}"
        try:
            if binding.action.preconditions is not None:
                await binding.action.preconditions(
                    ActionContext.of(draft_operation(base, key, session, self._ledger))
                )
            self._limiter.charge_session(tool, policy, session.session_id)
        except Refused as exc:
            return await self._refuse(base, exc.code, exc.message)
        except Exception as exc:
            return await self._hook_failed(
                base, "its preconditions", exc, code="precondition_failed"
            )
        if not mutation:
            # Reads change nothing: no duplicate check and no write-ahead; identical reads
            # running at once may share one result (overflow: coalesce).
            taken = await self._take_slot(base, binding, session, coalesce_key=key)
            if isinstance(taken, Refusal | Shared):
                return taken
            assert isinstance(taken, Slot)  # only mutations wait behind their own call
            return ReadAdmission(binding, args, taken, key, base.resource_key, base.turn_id)
        if policy.on_duplicate is not OnDuplicate.JOIN:
            return await self._admit_mutation(base, binding, key, args, session, generation)
        # Repeats of one intent arriving together in this process (five identical calls in
        # one response) wait for the first one's admission and join it, instead of racing it
        # for a capped slot and being told "busy" before its insert exists.
        first = self._admitting.get(key)
        if first is not None:
            try:
                earlier = await asyncio.shield(first)
            except Exception:
                earlier = None
            if isinstance(earlier, Admission | Joined):
                return Joined(earlier.operation)
        admitting: asyncio.Future[Refusal | Joined | Admission | Shared] = (
            asyncio.get_running_loop().create_future()
        )
        admitting.add_done_callback(_consume_exception)
        self._admitting[key] = admitting
        try:
            decided = await self._admit_mutation(base, binding, key, args, session, generation)
        except BaseException as exc:
            admitting.set_exception(exc if isinstance(exc, Exception) else RuntimeError(exc))
            raise
        else:
            admitting.set_result(decided)
            return decided
        finally:
            if self._admitting.get(key) is admitting:
                del self._admitting[key]

    async def _admit_mutation(
        self,
        base: Audit,
        binding: Binding,
        key: str,
        args: dict[str, Any],
        session: SessionState,
        generation: int,
    ) -> Refusal | Joined | Admission | Shared:
        policy = binding.policy
        existing = None
        if policy.on_duplicate not in (OnDuplicate.JOIN, OnDuplicate.ALLOW) or (
            policy.on_duplicate is OnDuplicate.JOIN and _capped(policy)
        ):
            # join needs no look-up (the insert itself returns the operation holding the key),
            # unless a cap could refuse the call first: a repeat of a call in flight joins it
            # instead of being told "busy, try again", which invites the model to loop.
            existing = await self._ledger.find_by_key(session.tenant, key)
        if existing is not None:
            if _changed_by_user(base, binding, existing, session, self._ledger):
                return await self._change(base, binding, key, args, session, generation, existing)
            duplicate = await self._duplicate(base, binding, existing, key, session)
            if duplicate is not None:
                return duplicate
            key = f"{key}|again:{existing.operation_id}"
        taken = await self._take_slot(base, binding, session, behind_own=True)
        if isinstance(taken, Behind):
            # Admitted now, sent once the principal's earlier call has let go of the slot.
            return await self._insert(base, binding, key, args, session, None, generation)
        if not isinstance(taken, Slot):
            return taken
        return await self._insert(base, binding, key, args, session, taken, generation)

    async def _take_slot(
        self,
        base: Audit,
        binding: Binding,
        session: SessionState,
        *,
        coalesce_key: str | None = None,
        behind_own: bool = False,
    ) -> Slot | Behind | Refusal | Shared:
        """Take a limiter slot, or answer by the overflow policy (refuse, share, degrade)."""
        try:
            taken = await self._limiter.acquire(
                base.tool,
                binding.policy,
                session.principal,
                coalesce_key=coalesce_key,
                behind_own=behind_own,
            )
        except Refused as exc:
            return await self._refuse(base, exc.code, exc.message)
        if isinstance(taken, Degraded):
            return Shared(taken.result)
        if isinstance(taken, Coalesced):
            return Shared(None, pending=taken)
        return taken

    async def _duplicate(
        self,
        base: Audit,
        binding: Binding,
        existing: Operation,
        key: str,
        session: SessionState,
    ) -> Refusal | Joined | None:
        """Apply ``on_duplicate`` to a call whose key is bound to ``existing``.

        Returns None when a new operation should be admitted (under a derived key).
        """
        if existing.args_hash != self._ledger.args_hash(base.tool, base.args) or (
            existing.tool != base.tool
        ):
            return await self._refuse(
                base,
                "idempotency_mismatch",
                "An earlier request with the same intent had different details "
                f"(operation {existing.operation_id}); nothing new was done.",
                operation_id=existing.operation_id,
            )
        mode = binding.policy.on_duplicate
        if mode is OnDuplicate.REJECT:
            return await self._refuse(
                base,
                "duplicate",
                f"This was already requested (operation {existing.operation_id}, "
                f"{existing.status.value.lower()}); it was not done again.",
                operation_id=existing.operation_id,
            )
        if mode is OnDuplicate.CONFIRM:
            return None
        if mode is OnDuplicate.REPLACE and existing.status not in TERMINAL_STATUSES:
            stopped = await self._cancel(existing)
            # Withdrawn before anything ran (cancelled, or a question no longer asked): the new
            # call replaces it. Otherwise the earlier one went ahead and the new call joins it.
            withdrawn = stopped.status in (S.CANCELLED, S.REJECTED, S.EXPIRED)
            return None if withdrawn else Joined(stopped)
        return Joined(existing)

    async def _change(
        self,
        base: Audit,
        binding: Binding,
        key: str,
        args: dict[str, Any],
        session: SessionState,
        generation: int,
        earlier: Operation,
    ) -> Refusal | Joined | Admission | Shared:
        """Admit the user's changed request (other details, a later turn) that ``earlier`` holds.

        "A table for two at nine", then "make it four": the same intent with other details.
        The earlier request is withdrawn if nothing was sent yet (else it goes on, and is told
        to the model as superseded: it stands, or is undone under ``compensation.automatic``),
        and the changed one is admitted under a key of its own, behind the earlier one if a
        per-principal limit holds it.
        """
        if earlier.status not in TERMINAL_STATUSES:
            await self._cancel(earlier)
        changed = f"{key}|changed:{earlier.operation_id}"
        if changed.count("|changed:") > _MAX_CHANGES:
            return await self._refuse(
                base,
                "too_many_changes",
                f"This request was changed more than {_MAX_CHANGES} times; nothing new was done.",
                operation_id=earlier.operation_id,
            )
        return await self._admit_mutation(base, binding, changed, args, session, generation)

    async def _insert(
        self,
        base: Audit,
        binding: Binding,
        key: str,
        args: dict[str, Any],
        session: SessionState,
        slot: Slot | None,
        generation: int,
    ) -> Refusal | Joined | Admission | Shared:
        """Insert the operation (with no ``slot``: ADMITTED, it takes its slot when it runs)."""
        policy = binding.policy
        now = self._clock.now()
        confirmation = policy.confirmation
        again = "|again:" in key
        if confirmation.mode is ConfirmationMode.APPROVAL:
            status, expires = S.AWAITING_APPROVAL, confirmation.expires_after_secs
        elif confirmation.mode is ConfirmationMode.VERBAL or (
            again and policy.on_duplicate is OnDuplicate.CONFIRM
        ):
            status, expires = S.AWAITING_CONFIRMATION, confirmation.expires_after_secs or 120.0
        elif policy.admit_when is AdmitWhen.TURN_CONFIRMED or slot is None:
            status, expires = S.ADMITTED, None
        else:
            status, expires = S.RUNNING, None
        deadline_at = now + (expires if expires is not None else policy.deadline_secs)

        def release() -> None:
            if slot is not None:
                slot.release()

        before_state = None
        # An approver sees the before-state the change starts from, so it is taken when the
        # request is made; it is what a compensation restores too.
        if binding.action.snapshot is not None and status in (
            S.RUNNING,
            S.ADMITTED,
            S.AWAITING_APPROVAL,
        ):
            try:
                before_state = await binding.action.snapshot(
                    ActionContext.of(draft_operation(base, key, session, self._ledger))
                )
            except Exception as exc:
                release()
                return await self._hook_failed(base, "its snapshot", exc, code="snapshot_failed")
        new = NewOperation(
            tool=base.tool,
            kind=base.kind,
            args=args,
            idempotency_key=key,
            session_id=session.session_id,
            principal=session.principal,
            tenant=session.tenant,
            status=status,
            idempotency_window_secs=policy.idempotency.window_secs,
            resource_key=base.resource_key,
            turn_id=base.turn_id,
            provider_call_id=base.tool_call_id,
            agent=session.active_agent,
            before_state=before_state,
            deadline_at=deadline_at,
            lease_owner=self._owner,
            lease_secs=self._lease_secs,
            actor=f"runtime:{self._owner}",
            detail={
                "generation": generation,
                "principal": session.principal,
                "reason": _ADMISSION_REASONS[status],
                **(
                    {APPROVAL_RULE: _approval_rule(binding).to_detail()}
                    if status is S.AWAITING_APPROVAL
                    else {}
                ),
            },
        )
        try:
            admitted = await self._ledger.admit(new)
        except IdempotencyMismatch as exc:
            release()
            holder = await self._ledger.get(exc.operation_id)
            if _changed_by_user(base, binding, holder, session, self._ledger):
                return await self._change(base, binding, key, args, session, generation, holder)
            return await self._refuse(
                base,
                "idempotency_mismatch",
                "An earlier request with the same intent had different details "
                f"(operation {exc.operation_id}); nothing new was done.",
                operation_id=exc.operation_id,
            )
        except BaseException:
            release()
            raise
        if not admitted.created:
            release()
            return Joined(admitted.operation)
        if status in AWAITING_PERSON_STATUSES:
            # Waiting for a person holds no capacity; the slot is taken again when it runs.
            release()
            return Admission(admitted.operation, binding, None, generation)
        return Admission(admitted.operation, binding, slot, generation, waits_for_slot=slot is None)

    async def _hook_failed(
        self, base: Audit, what: str, error: Exception | str, *, code: str
    ) -> Refusal:
        """Refuse a call because application code it depends on failed (never let it escape)."""
        described = (
            f"{type(error).__name__}: {error}"[:500] if isinstance(error, Exception) else error
        )
        logger.bind(tool=base.tool).warning(
            "tool call {} of {} refused: {} failed: {}",
            base.tool_call_id,
            base.tool,
            what,
            described,
        )
        return await self._refuse(
            base,
            code,
            f"It could not be checked ({what} failed); nothing was done.",
            detail={"hook_error": described},
        )

    async def _refuse(
        self,
        base: Audit,
        code: str,
        message: str,
        *,
        operation_id: str | None = None,
        detail: Mapping[str, Any] | None = None,
    ) -> Refusal:
        # The message is the model's answer and the record's error: whatever it quotes (an
        # application's reason naming an argument, say) is shown escaped and bounded.
        message = bounded(message, MAX_MESSAGE_CHARS)
        refused = await self._ledger.record_refusal(
            NewOperation(
                tool=base.tool[:64],
                kind=base.kind,
                args=base.args,
                idempotency_key=f"refused|{uuid.uuid4().hex}",
                session_id=base.session.session_id,
                principal=base.session.principal,
                tenant=base.session.tenant,
                resource_key=base.resource_key,
                turn_id=base.turn_id,
                provider_call_id=base.tool_call_id,
                agent=base.session.active_agent,
                error=message,
                actor=f"runtime:{self._owner}",
                detail={"reason": code, "duplicate_of": operation_id, **(detail or {})},
            )
        )
        # The result names this call's own (refused) record; an earlier operation it is about
        # is named apart, so that telling this refusal never counts as telling that one.
        extra = {"existing_operation_id": operation_id} if operation_id else {}
        return Refusal(
            refusal_result(message, code=code, operation_id=refused.operation_id, **extra),
            refused,
        )


MAX_MESSAGE_CHARS = 1000
"""The longest refusal message told to the model (and recorded as the refusal's error)."""

_KIND_TEXT = {kind: kind.value for kind in ToolKind}
"""Each tool kind's text (``.value`` is a descriptor call per read, on every admission)."""
_MAX_CHANGES = 8
"""How many times one request may be changed by later user turns (each change is a new key)."""


def _changed_by_user(
    base: Audit, binding: Binding, existing: Operation, session: SessionState, ledger: Ledger
) -> bool:
    """Whether ``base`` changes ``existing``'s details in a later user turn of its session.

    Only while ``existing`` is not finished, and unless the tool's ``on_duplicate`` is
    ``reject`` (a repeat of the intent is refused whatever it says). Two calls of one response
    with the same intent and other details stay a conflict (which one the user wants is not
    known); a call of an earlier turn never overrides a later one; what already happened (a
    committed refund) is not done again with other details.
    """
    if existing.session_id != session.session_id or existing.tool != base.tool:
        return False
    if binding.policy.on_duplicate is OnDuplicate.REJECT or existing.status in TERMINAL_STATUSES:
        return False
    if existing.args_hash == ledger.args_hash(base.tool, base.args):
        return False
    ours, theirs = turn_number(base.turn_id), turn_number(existing.turn_id)
    return ours is not None and theirs is not None and ours > theirs


_ADMISSION_REASONS = {
    S.AWAITING_APPROVAL: "admission checks passed; the policy asks a person to approve it",
    S.AWAITING_CONFIRMATION: "admission checks passed; the user must confirm it first",
    S.ADMITTED: "admission checks passed; it starts once the proposing reply ends unbroken",
    S.RUNNING: "admission checks passed; started at once",
}
"""Why an admitted operation starts in each status (the audit reason of its insert)."""


def _approval_rule(binding: Binding) -> ApprovalRule:
    """Who may decide, and what they are shown (the tool's description, the summary)."""
    policy = binding.policy
    confirmation = policy.confirmation
    # An action without a docstring is described by its own name: that tells nobody more.
    own = binding.action.description
    return ApprovalRule(
        approvers=tuple(confirmation.approvers),
        roles=tuple(confirmation.approver_roles),
        risk=policy.risk.value,
        description=policy.description or (own if own and own != binding.action.name else None),
        summary=confirmation.summary,
    )


def _consume_exception(future: asyncio.Future[Any]) -> None:
    # Nobody may be waiting for a failed admission; keep asyncio from logging its error.
    if not future.cancelled():
        future.exception()


def _capped(policy: ToolPolicy) -> bool:
    """Whether the tool's limits can refuse a call for want of capacity."""
    limits = policy.limits
    return (
        limits.max_concurrent is not None
        or limits.per_principal is not None
        or limits.rate_per_minute is not None
    )
