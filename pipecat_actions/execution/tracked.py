"""`Tracked`: what this process keeps in memory about an operation it owns.

The runtime's registry of operations holds one per operation it runs; the executor, the expiry
rule, cancellation and recovery read and signal through it (its ``takeover`` event, its effect
task, its ``done`` future).
"""

from __future__ import annotations

__all__ = ["Takeover", "Tracked"]

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pipecat_actions.actions import Binding
from pipecat_actions.ledger.records import Operation
from pipecat_actions.status import ActionStatus


class Takeover:
    """Set once the watchdog, a confirmed cancel or a person took the operation over.

    An `asyncio.Event` that is also a future to wait on beside the effect's task (`future`):
    waiting for it takes no task of its own (issue 34 counted one per operation).
    """

    __slots__ = ("_future", "_set")

    def __init__(self) -> None:
        self._set = False
        self._future: asyncio.Future[None] | None = None

    def set(self) -> None:
        """Say the operation was taken over (once and for all)."""
        self._set = True
        if self._future is not None and not self._future.done():
            self._future.set_result(None)

    def is_set(self) -> bool:
        """Whether the operation was taken over."""
        return self._set

    def future(self) -> asyncio.Future[None]:
        """A future done once `set`; shared, never to be cancelled (`asyncio.wait` it)."""
        if self._future is None:
            self._future = asyncio.get_running_loop().create_future()
            if self._set:
                self._future.set_result(None)
        return self._future

    async def wait(self) -> None:
        """Wait until `set`."""
        if not self._set:
            await asyncio.shield(self.future())


@dataclass(eq=False)
class Tracked:
    """What the runtime keeps in memory about an operation it owns."""

    operation_id: str
    binding: Binding
    fence: int
    done: asyncio.Future[Operation]
    """The first truthful outcome its waiters hear (UNKNOWN ends a wait: see `settled`)."""
    takeover: Takeover = field(default_factory=Takeover)
    effect_task: asyncio.Task[Any] | None = None
    effect_ended_at: float | None = None
    """When the effect's task ended (clock time): until then it may still send its request."""
    on_finish: list[Callable[[], None]] = field(default_factory=list)
    reported: ActionStatus | None = None
    """The last outcome listeners were told (UNKNOWN first, then what reconciliation found)."""
    reported_escalated: bool = False
    """Whether listeners were told it was handed to a person (escalated)."""
    settled: asyncio.Future[Operation] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    """Its outcome once nothing more will change it here: terminal, or UNKNOWN and escalated."""
    unsettled: bool = False
    """An outcome is known here but the ledger does not hold it yet (its write is failing, or
    this process's execution of it broke down): the heartbeat stops renewing its lease, so that
    whoever claims it once the lease runs out reconciles it."""
