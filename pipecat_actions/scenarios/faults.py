"""The runner's generic fault layer: faults around any action's effect, read or hook.

A scenario of version 2 names what a fault applies to by the action, not by the restaurant's
provider: ``target: book_table`` is the tool's effect (a mutation or a read), ``target:
book_table.reconcile`` one of its hooks (``reconcile``, ``compensate``, ``snapshot``,
``cancel``, ``preconditions``). The layer wraps every action the application's factory
returns, so a team's own actions and system of record meet the same faults the built-in
restaurant does, and it counts every request that reached each target (the ``requests``
expectation), whether or not it then failed.

What each fault does to the next ``times`` requests of its target, in the order a real request
meets them:

``error_before_send``
    Raise `ProviderUnavailable` (a `ConnectionRefusedError`) without calling: never sent.
``latency``
    Wait ``secs`` on the scenario's clock, then call. Unlike the others it stays until changed
    (``secs: 0`` removes it), as the restaurant's provider latency does.
``hang``
    Wait until a ``release_hung`` step, then call.
``fail_after_send``
    Raise `ProviderRejected` without calling: received and refused, nothing committed.
``raise``
    Raise a plain `RuntimeError`, as a bug in the application's code would.
``pending``
    (``reconcile`` only) Answer `Reconciliation.pending()` without calling.
``lose_response_after_commit``
    Call, so the effect commits, then raise `ProviderTimeout` (a `TimeoutError`) instead of
    returning: the answer was lost.
"""

from __future__ import annotations

__all__ = ["HOOKS", "FaultLayer", "FaultTargetError"]

import asyncio
import dataclasses
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from pipecat_actions.actions import ActionContext, ActionDefinition, Reconciliation
from pipecat_actions.clock import Clock
from pipecat_actions.testing._faults import ProviderRejected, ProviderTimeout, ProviderUnavailable

HOOKS = ("reconcile", "compensate", "snapshot", "cancel", "preconditions")
"""The hooks a fault can target, as ``TOOL.HOOK``."""

_SPENT = (
    "error_before_send",
    "hang",
    "fail_after_send",
    "raise",
    "pending",
    "lose_response_after_commit",
)


class FaultTargetError(ValueError):
    """A fault names a tool or hook the application does not have."""


class FaultLayer:
    """Faults armed by a scenario's steps, applied around the actions it wraps.

    Args:
        clock: The scenario's clock (latency waits on it).
    """

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self.requests: Counter[str] = Counter()
        """Requests that reached each target (``tool`` or ``tool.hook``), in all."""
        self._armed: dict[str, list[str]] = {}
        self._latency: dict[str, float] = {}
        self._hung: list[asyncio.Future[None]] = []
        self._targets: set[str] = set()
        self.started: dict[str, str] = {}
        """The operation of each Pipecat tool call whose effect was called, by call id.

        A read has no ledger row until its answer is recorded (after it is told): this is
        how a step knows a read was admitted and runs.
        """

    # --- what the steps do -----------------------------------------------------------------

    def arm(self, target: str, fault: str, *, times: int = 1, secs: float | None = None) -> None:
        """Arm ``fault`` for the next ``times`` requests of ``target``.

        Raises:
            FaultTargetError: No wrapped action has that target, or ``pending`` on a target
                that is not a ``reconcile`` hook.
        """
        if target not in self._targets:
            known = ", ".join(sorted(self._targets)) or "none"
            raise FaultTargetError(f"no effect or hook {target!r} to fault (there are: {known})")
        if fault == "pending" and not target.endswith(".reconcile"):
            raise FaultTargetError(f"pending is a reconcile hook's answer, not {target!r}'s")
        if fault == "latency":
            self._latency[target] = float(secs or 0.0)
            return
        if fault not in _SPENT:
            raise FaultTargetError(f"{fault!r} is not a fault of the generic layer")
        self._armed.setdefault(target, []).extend([fault] * times)

    def release_hung(self) -> None:
        """Let every hung request go on."""
        hung, self._hung = self._hung, []
        for waiting in hung:
            if not waiting.done():
                waiting.set_result(None)

    # --- wrapping --------------------------------------------------------------------------

    def wrap(self, actions: Sequence[ActionDefinition]) -> list[ActionDefinition]:
        """Return ``actions`` with their effects and hooks passing through the layer."""
        wrapped: list[ActionDefinition] = []
        for action in actions:
            changes: dict[str, Any] = {"effect": self._around(action.name, action.effect)}
            self._targets.add(action.name)
            for hook in HOOKS:
                fn = getattr(action, hook)
                if fn is not None:
                    target = f"{action.name}.{hook}"
                    self._targets.add(target)
                    changes[hook] = self._around(target, fn)
            wrapped.append(dataclasses.replace(action, **changes))
        return wrapped

    def _around(
        self, target: str, fn: Callable[..., Awaitable[Any]]
    ) -> Callable[..., Awaitable[Any]]:
        async def faulted(*args: Any, **kwargs: Any) -> Any:
            return await self._call(target, fn, args, kwargs)

        faulted.__name__ = getattr(fn, "__name__", target)
        faulted.__doc__ = getattr(fn, "__doc__", None)
        return faulted

    async def _call(
        self,
        target: str,
        fn: Callable[..., Awaitable[Any]],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        self.requests[target] += 1
        ctx = args[0] if args else kwargs.get("ctx")
        if "." not in target and isinstance(ctx, ActionContext) and ctx.tool_call_id:
            self.started.setdefault(ctx.tool_call_id, ctx.operation_id)
        armed = self._armed.get(target)
        fault = armed.pop(0) if armed else None
        where = f"injected by the scenario into {target}"
        if fault == "error_before_send":
            raise ProviderUnavailable(f"not sent: {where}")
        latency = self._latency.get(target, 0.0)
        if latency > 0:
            await self._clock.sleep(latency)
        if fault == "hang":
            waiting: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self._hung.append(waiting)
            await waiting
        if fault == "fail_after_send":
            raise ProviderRejected(f"refused: {where}")
        if fault == "raise":
            raise RuntimeError(f"a bug {where}")
        if fault == "pending":
            return Reconciliation.pending()
        result = await fn(*args, **kwargs)
        if fault == "lose_response_after_commit":
            raise ProviderTimeout(f"the answer was lost after committing: {where}")
        return result
