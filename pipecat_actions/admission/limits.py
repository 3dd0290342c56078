"""Limits and backpressure per tool: concurrency, per-principal, rate, session budget, overflow.

One `Limiter` per runtime (per process). A call that passes holds a `Slot` until its operation
has an outcome. When a limit is reached, the tool's ``overflow`` policy decides:

* ``reject``: refuse with a reason the model can relay;
* ``queue``: wait for a slot, at most ``max_queued`` callers at a time;
* ``coalesce`` (reads only): share the result of an identical call already running;
* ``degrade``: answer with the policy's ``degrade_result`` instead of running the tool.

The session budget and the rate are never queued: a runaway loop is stopped, not delayed.
"""

from __future__ import annotations

__all__ = [
    "SESSION_BUDGETS_KEPT",
    "Behind",
    "Coalesced",
    "Degraded",
    "LimitExceeded",
    "Limiter",
    "Slot",
]

import asyncio
from collections import OrderedDict, defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipecat_actions._recent import remember
from pipecat_actions.errors import LimitExceeded
from pipecat_actions.policy import Overflow, ToolPolicy

SESSION_BUDGETS_KEPT = 100_000
"""How many (session, tool) call counts of budgeted tools are kept, most recent first: memory
stays bounded in a long-running process; a conversation idle while this many others used a
budgeted tool starts its count again."""


@dataclass(frozen=True)
class Behind:
    """The principal's own earlier call holds the slot: wait for it (`Limiter.wait_for_slot`)."""


@dataclass(eq=False)
class Slot:
    """Permission to run one call; `release` it exactly once when the call has an outcome."""

    _release: Callable[[], None]
    _released: bool = False

    def release(self) -> None:
        """Give the slot back (a second call does nothing)."""
        if not self._released:
            self._released = True
            self._release()


@dataclass(frozen=True)
class Coalesced:
    """The call joins an identical read already running: await ``result``."""

    result: asyncio.Future[Any]


@dataclass(frozen=True)
class Degraded:
    """The call is answered with the policy's fallback result."""

    result: Any


@dataclass
class _ToolState:
    running: int = 0
    queued: int = 0
    waiting: int = 0
    per_principal: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    starts: deque[float] = field(default_factory=deque)
    inflight_reads: dict[str, asyncio.Future[Any]] = field(default_factory=dict)
    freed: asyncio.Condition = field(default_factory=asyncio.Condition)


class Limiter:
    """Counts what runs, per tool, principal and session, and applies each tool's limits.

    Args:
        now: The clock's ``now`` (epoch seconds), for the rate window.
    """

    def __init__(self, now: Callable[[], float]) -> None:
        self._now = now
        self._tools: dict[str, _ToolState] = defaultdict(_ToolState)
        self._session_calls: OrderedDict[tuple[str, str], int] = OrderedDict()

    def running(self, tool: str) -> int:
        """How many calls of ``tool`` hold a slot now."""
        return self._tools[tool].running

    def charge_session(self, tool: str, policy: ToolPolicy, session_id: str) -> None:
        """Count one call of ``tool`` against the session's budget.

        Raises:
            LimitExceeded: The session already used its budget for this tool.
        """
        budget = policy.limits.session_budget
        if budget is None:
            return
        key = (session_id, tool)
        if self._session_calls.get(key, 0) >= budget:
            raise LimitExceeded(
                f"{tool} was already used {budget} times in this conversation, the most "
                "allowed; tell the user it cannot be done again now",
                code="session_budget",
            )
        calls = self._session_calls.get(key, 0) + 1
        remember(self._session_calls, key, calls, keep=SESSION_BUDGETS_KEPT)

    async def acquire(
        self,
        tool: str,
        policy: ToolPolicy,
        principal: str,
        *,
        coalesce_key: str | None = None,
        behind_own: bool = False,
    ) -> Slot | Coalesced | Degraded | Behind:
        """Take a slot for a call of ``tool`` by ``principal``, or apply the overflow policy.

        With ``behind_own`` (mutations), a call refused only by ``per_principal`` because the
        same principal's earlier call runs is answered `Behind`: it is admitted and takes its
        slot when it is free, whatever the overflow policy says.

        Raises:
            LimitExceeded: The rate or a concurrency limit is reached and overflow rejects,
                or the queue is full.
        """
        limits = policy.limits
        state = self._tools[tool]
        if limits.rate_per_minute is not None:
            now = self._now()
            while state.starts and state.starts[0] <= now - 60.0:
                state.starts.popleft()
            if len(state.starts) >= limits.rate_per_minute:
                raise LimitExceeded(
                    f"{tool} is being called too often; try again in a minute", code="rate"
                )
        if self._full(state, policy, principal):
            if behind_own and not self._globally_full(state, policy):
                # Only this principal's own earlier call holds the slot: the new one (a
                # changed request) waits behind it instead of being bounced.
                return Behind()
            if limits.overflow is Overflow.COALESCE and coalesce_key in state.inflight_reads:
                return Coalesced(state.inflight_reads[coalesce_key])
            if limits.overflow is Overflow.DEGRADE:
                return Degraded(limits.degrade_result)
            if limits.overflow is not Overflow.QUEUE or state.queued >= limits.max_queued:
                raise LimitExceeded(
                    f"{tool} is busy right now; tell the user to try again shortly",
                    code="concurrency",
                )
            state.queued += 1
            try:
                await self._wait_until_free(state, policy, principal)
            finally:
                state.queued -= 1
        return self._take(tool, state, policy, principal)

    async def wait_for_slot(self, tool: str, policy: ToolPolicy, principal: str) -> Slot:
        """Wait, however long, for a slot: for work already admitted (approved, confirmed)."""
        state = self._tools[tool]
        await self._wait_until_free(state, policy, principal)
        return self._take(tool, state, policy, principal)

    async def _wait_until_free(self, state: _ToolState, policy: ToolPolicy, principal: str) -> None:
        state.waiting += 1
        try:
            async with state.freed:
                await state.freed.wait_for(lambda: not self._full(state, policy, principal))
        finally:
            state.waiting -= 1

    def register_read(self, tool: str, coalesce_key: str, result: asyncio.Future[Any]) -> None:
        """Let identical reads of ``tool`` join ``result`` while it is pending."""
        inflight = self._tools[tool].inflight_reads
        inflight[coalesce_key] = result
        result.add_done_callback(lambda _: inflight.pop(coalesce_key, None))

    @staticmethod
    def _globally_full(state: _ToolState, policy: ToolPolicy) -> bool:
        limits = policy.limits
        return limits.max_concurrent is not None and state.running >= limits.max_concurrent

    def _full(self, state: _ToolState, policy: ToolPolicy, principal: str) -> bool:
        limits = policy.limits
        if self._globally_full(state, policy):
            return True
        return (
            limits.per_principal is not None
            and state.per_principal.get(principal, 0) >= limits.per_principal
        )

    def _take(self, tool: str, state: _ToolState, policy: ToolPolicy, principal: str) -> Slot:
        state.running += 1
        state.per_principal[principal] += 1
        if policy.limits.rate_per_minute is not None:
            state.starts.append(self._now())

        def release() -> None:
            state.running -= 1
            state.per_principal[principal] -= 1
            if state.per_principal[principal] <= 0:
                del state.per_principal[principal]  # memory stays flat over many principals
            if state.waiting:
                asyncio.get_running_loop().create_task(self._notify(state))

        return Slot(release)

    async def _notify(self, state: _ToolState) -> None:
        async with state.freed:
            state.freed.notify_all()
