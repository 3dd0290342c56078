"""`Shelter`: a task whose cancellation waits until the ledger write it is making has landed.

A ledger write must outlive a cancelled caller. For a caller that anyone may cancel (a
Pipecat handler interrupted by a barge-in), the ledger runs the write in a task of its own and
shields it: a task and a shield per write. The runtime's own task that admits and runs a
mutation is cancelled by one party only, the runtime as it closes, and only through its
`Shelter`: a cancel asked for while that task writes is held until the write returns, and
lands then (the write's result is dropped, as a cancel does). So that task writes on the
driver directly, with no task or shield of the ledger's; any other caller gets them as before.

The ledger asks `sheltered` whether the calling task has a shelter; the shelter holds the
cancel (`Shelter.cancel`) and the ledger brackets each write with `Shelter.writing` /
`Shelter.wrote`. Tasks the sheltered task starts (an effect) are not sheltered: the shelter
names its one task.
"""

from __future__ import annotations

__all__ = ["Shelter", "sheltered"]

import asyncio
from contextvars import ContextVar
from typing import Any

_SHELTER: ContextVar[Shelter | None] = ContextVar("pipecat_actions_shelter", default=None)


class Shelter:
    """The cancel of one task, held while it writes to the ledger.

    Made in the task it shelters (`enter`); the task's owner cancels it with `cancel`, never
    with ``task.cancel()`` directly.
    """

    __slots__ = ("_held", "_writes", "task")

    def __init__(self, task: asyncio.Task[Any]) -> None:
        self.task = task
        self._writes = 0
        self._held = False

    @classmethod
    def enter(cls) -> Shelter:
        """Shelter the current task (from inside it) and return its shelter."""
        task = asyncio.current_task()
        if task is None:
            raise RuntimeError("a shelter is made inside the task it shelters")
        shelter = cls(task)
        _SHELTER.set(shelter)
        return shelter

    def cancel(self) -> None:
        """Cancel the task now, or, while it writes, as soon as the write returns."""
        if self._writes:
            self._held = True
        else:
            self.task.cancel()

    def writing(self) -> None:
        """A write starts; a cancel held already lands now, before anything is sent."""
        if self._held:
            raise asyncio.CancelledError
        self._writes += 1

    def wrote(self) -> None:
        """The write returned (or failed): a cancel held meanwhile lands now.

        Called in a ``finally``: raising here replaces the write's result or error with the
        cancel, which is what the task's owner asked for.
        """
        self._writes -= 1
        if self._held and not self._writes:
            raise asyncio.CancelledError


def sheltered() -> Shelter | None:
    """The shelter of the running task, if it has one (tasks it started do not)."""
    shelter = _SHELTER.get()
    if shelter is None or shelter.task is not asyncio.current_task():
        return None
    return shelter
