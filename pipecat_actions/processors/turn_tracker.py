"""`ActionTurnTracker`: keeps a session's turn and speaking state current from Pipecat's frames.

Place it right after the user aggregator::

    transport.input() → stt → user_agg → ActionTurnTracker → llm → tts → transport.output()
        → ActionResultGate → assistant_agg

There it sees the user's turn frames (broadcast by the user aggregator), every interruption,
and each ``LLMContextFrame`` the user aggregator sends to the LLM (the start of a generation).
Generations the assistant aggregator starts (after a tool result) are counted by the
`ActionResultGate`, which sees that aggregator's upstream context frames. The runtime reads the
session to tie each proposal to its generation and to refuse stale proposals.
"""

from __future__ import annotations

__all__ = ["ActionTurnTracker"]

from typing import Any

from pipecat.frames.frames import (
    Frame,
    InterruptionFrame,
    LLMContextFrame,
    UserStartedSpeakingFrame,
    UserStoppedSpeakingFrame,
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor

from pipecat_actions.session import SessionState

_WATCHED = (
    UserStartedSpeakingFrame,
    UserStoppedSpeakingFrame,
    InterruptionFrame,
    LLMContextFrame,
)


class ActionTurnTracker(FrameProcessor):
    """Updates `SessionState` from turn, interruption and inference frames; passes all on.

    Args:
        session: The session state to keep current.
        **kwargs: Passed to `FrameProcessor`.
    """

    def __init__(self, session: SessionState, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.session = session

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        """Record what ``frame`` says about the conversation, then push it on unchanged."""
        await super().process_frame(frame, direction)
        if isinstance(frame, _WATCHED) and direction is FrameDirection.DOWNSTREAM:
            if isinstance(frame, UserStartedSpeakingFrame):
                self.session.user_speaking = True
                self.session.start_user_turn()
            elif isinstance(frame, UserStoppedSpeakingFrame):
                self.session.user_speaking = False
            elif isinstance(frame, InterruptionFrame):
                self.session.interrupt()
            else:
                self.session.start_generation()
        await self.push_frame(frame, direction)
