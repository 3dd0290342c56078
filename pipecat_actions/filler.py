"""`Filler`: the line a bot says while it waits in silence for a blocking action's outcome.

A blocking tool with ``delivery.filler: {after_secs: 4, text: "Still working on it."}`` keeps
the conversation waiting; after ``after_secs`` of silence (neither the user nor the bot
speaking, on the runtime's clock) the line is said, so the user does not ask again. Rules:

* silence is counted from the moment nobody speaks; anyone starting or stopping to speak
  starts the count again (the line itself is speech: a second line needs another stretch);
* at most ``times`` lines per wait;
* never once the outcome is known: the runtime is asked right before each line;
* never over the outcome: the binding stops the filler, and waits until it has stopped, before
  it hands the call's result to Pipecat; a line already pushed is ahead of the result in the
  pipeline, and the result's telling is spoken after it.
"""

from __future__ import annotations

__all__ = ["Filler"]

import asyncio
from collections.abc import Awaitable, Callable

from pipecat_actions.clock import Clock, sleep_from_now
from pipecat_actions.policy import FillerPolicy
from pipecat_actions.session import SessionState


class Filler:
    """Says a filler line after silence while an outcome is awaited (see the module docstring).

    Args:
        policy: The tool's ``delivery.filler``.
        clock: The runtime's clock (silence is measured on it).
        session: Whose speaking is watched.
        outcome_known: Whether the outcome is known now.
        say: Says a line (e.g. pushes a ``TTSSpeakFrame``).
    """

    def __init__(
        self,
        policy: FillerPolicy,
        *,
        clock: Clock,
        session: SessionState,
        outcome_known: Callable[[], bool],
        say: Callable[[str], Awaitable[None]],
    ) -> None:
        self._policy = policy
        self._clock = clock
        self._session = session
        self._outcome_known = outcome_known
        self._say = say
        self.said = 0
        """How many lines were said."""

    async def run(self) -> None:
        """Say the line whenever it is due, until ``times`` lines were said or it is cancelled."""
        while self.said < self._policy.times:
            await self._quiet_for(self._policy.after_secs)
            if self._outcome_known():
                return
            self.said += 1
            await self._say(self._policy.text)

    async def _quiet_for(self, secs: float) -> None:
        """Return once nobody has spoken for ``secs`` seconds in a row."""
        session = self._session
        while True:
            while not session.silent:
                await session.speech_changed(session.speech_changes)
            mark = session.speech_changes
            elapsed = asyncio.ensure_future(sleep_from_now(self._clock, secs))
            spoken = asyncio.ensure_future(session.speech_changed(mark))
            try:
                await asyncio.wait({elapsed, spoken}, return_when=asyncio.FIRST_COMPLETED)
            finally:
                elapsed.cancel()
                spoken.cancel()
            if elapsed.done() and not elapsed.cancelled() and session.speech_changes == mark:
                return
