"""Session state: who the conversation is with and where it stands, in memory, per pipeline.

The runtime reads it to tie each tool call to its session and to judge proposals; the
``ActionTurnTracker`` processor keeps it current from Pipecat's frames (and tests may drive it
directly). It is never the source of truth for what happened: that is the ledger.

Two counters matter:

* ``user_turn`` grows when the user starts a new turn. A verbal confirmation counts only if it
  comes from a later user turn than the proposal it confirms.
* ``generation`` grows when the LLM starts a new response. A tool call belongs to the
  generation that proposed it; if the user interrupted that generation before the call is
  admitted, the call is a stale proposal.
"""

from __future__ import annotations

__all__ = ["UNTRACKED_WARNING", "SessionState", "turn_number", "warn_if_untracked"]

import asyncio
from dataclasses import dataclass, field
from typing import Any

from loguru import logger

_SPEECH = frozenset({"user_speaking", "bot_speaking"})


def turn_number(turn_id: str | None) -> int | None:
    """The user turn an operation's ``turn_id`` names (it is ``str(user_turn)``), or None."""
    try:
        return int(turn_id) if turn_id is not None else None
    except ValueError:
        return None


@dataclass
class SessionState:
    """The live state of one conversation.

    Attributes:
        session_id: Identifies the conversation (and the operations it owns).
        principal: The authenticated user the agent acts for. Only the application sets it;
            ids in tool arguments are never taken as identity.
        tenant: The tenant the session belongs to.
        active_agent: The agent currently speaking for the bot, for handoffs and visibility.
        user_turn: Counter of user turns (see the module docstring).
        generation: Counter of LLM generations (see the module docstring).
        user_speaking: Whether the user is speaking now.
        bot_speaking: Whether the bot is speaking now.
        speech_changes: How many times either of them changed (see `speech_changed`).
        turns_tracked: Whether an ``ActionTurnTracker`` keeps this session current (it says
            so when its pipeline starts; see `warn_if_untracked`).
    """

    session_id: str
    principal: str
    tenant: str = "default"
    active_agent: str | None = None
    user_turn: int = 0
    generation: int = 0
    user_speaking: bool = False
    bot_speaking: bool = False
    speech_changes: int = field(default=0, compare=False)
    turns_tracked: bool = field(default=False, compare=False)
    _untracked_told: bool = field(default=False, repr=False, compare=False)
    _interrupted: set[int] = field(default_factory=set, repr=False)
    _settled: set[int] = field(default_factory=set, repr=False)
    _changed: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def __setattr__(self, name: str, value: Any) -> None:
        """Set an attribute; a change of who speaks is counted and wakes `speech_changed`."""
        if name not in _SPEECH:
            # Every field of a new session comes through here (the dataclass's __init__).
            object.__setattr__(self, name, value)
            return
        changed = getattr(self, name, value) != value
        object.__setattr__(self, name, value)
        if changed and "_changed" in self.__dict__:
            object.__setattr__(self, "speech_changes", self.speech_changes + 1)
            self._notify()

    @property
    def silent(self) -> bool:
        """Whether neither the user nor the bot is speaking now."""
        return not (self.user_speaking or self.bot_speaking)

    async def speech_changed(self, since: int) -> None:
        """Wait until someone starts or stops speaking after ``speech_changes`` was ``since``."""
        while self.speech_changes == since:
            self._changed.clear()
            await self._changed.wait()

    def start_user_turn(self) -> int:
        """Record that the user started a new turn; return its number."""
        self.user_turn += 1
        self._notify()
        return self.user_turn

    def start_generation(self) -> int:
        """Record that the LLM started a new response; return its number."""
        self.generation += 1
        self._notify()
        return self.generation

    def interrupt(self) -> None:
        """Record a barge-in: the current generation was interrupted."""
        if self.generation not in self._settled:
            self._interrupted.add(self.generation)
        self._notify()

    def settle_generation(self, generation: int | None = None) -> None:
        """Record that a generation finished without being interrupted."""
        number = self.generation if generation is None else generation
        if number not in self._interrupted:
            self._settled.add(number)
        self._notify()

    def is_interrupted(self, generation: int) -> bool:
        """True if the user interrupted ``generation``."""
        return generation in self._interrupted

    def is_settled(self, generation: int) -> bool:
        """True if ``generation`` finished without being interrupted."""
        return generation in self._settled

    async def wait_generation_outcome(self, generation: int) -> bool:
        """Wait until ``generation`` is settled (True) or interrupted (False)."""
        while True:
            if generation in self._interrupted:
                return False
            if generation in self._settled:
                return True
            self._changed.clear()
            await self._changed.wait()

    def _notify(self) -> None:
        self._changed.set()


UNTRACKED_WARNING = (
    "no ActionTurnTracker keeps session {session_id} current ({where}): a tool call from a "
    "reply the user interrupted would run, never refused as stale; put "
    "ActionTurnTracker(session) right after the user aggregator (build_pipeline does; "
    "check_placement(processors) says what else is missing)"
)
"""The one line `warn_if_untracked` logs (a pipeline without the tracker runs, unsafely)."""


def warn_if_untracked(session: SessionState, where: str) -> bool:
    """Log `UNTRACKED_WARNING` once per session if no tracker said it keeps ``session``.

    Called by the gate when its pipeline starts and by each Pipecat-facing entry at a call
    (``attach``'s handlers, ``instrument``'s, Flows'): without the tracker the session never
    learns of turns and interruptions, so stale proposals are never refused. A warning for
    this release; the next one refuses to start (CHANGELOG.md).

    Args:
        session: The session a pipeline serves.
        where: What noticed it, for the line (``"the ActionResultGate started"``).

    Returns:
        True if the session is untracked (whether or not this call logged the line).
    """
    if session.turns_tracked:
        return False
    if not session._untracked_told:
        session._untracked_told = True
        logger.warning(UNTRACKED_WARNING.format(session_id=session.session_id, where=where))
    return True
