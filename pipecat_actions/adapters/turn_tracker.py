"""`ActionTurnTracker`: keeps a session's turn and speaking state current from Pipecat's frames.

Place it right after the user aggregator::

    transport.input() → stt → user_agg → ActionTurnTracker → llm → tts → transport.output()
        → ActionResultGate → assistant_agg

There it sees the user's turn frames (broadcast by the user aggregator), every interruption,
and each ``LLMContextFrame`` the user aggregator sends to the LLM (the start of a generation).
Generations the assistant aggregator starts (after a tool result) are counted by the
`ActionResultGate`, which sees that aggregator's upstream context frames. The runtime reads the
session to tie each proposal to its generation and to refuse stale proposals.

With a speech-to-speech service (its ``LLMServiceMetadataFrame`` says ``is_realtime_service``)
the provider drives the turns: the user aggregator sends no context frame per turn, and a
generation is a response of the provider's, counted by the realtime adapter at the service
(`pipecat_actions.adapters.realtime`). The tracker then counts no generations itself; it still
records the user's turns and the interruptions the user aggregator broadcasts.
"""

from __future__ import annotations

__all__ = ["ActionTurnTracker"]

from typing import Any

from pipecat.frames.frames import (
    Frame,
    InterruptionFrame,
    LLMContextFrame,
    LLMServiceMetadataFrame,
    StartFrame,
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
        **kwargs: Passed to `FrameProcessor`. ``enable_direct_mode`` is on unless given: it
            only keeps state and pushes frames on, never waiting, so each frame goes through
            in the task that pushed it, without the input and process queues and the two
            tasks a queued processor keeps (and switches through for every frame).
    """

    def __init__(self, session: SessionState, **kwargs: Any) -> None:
        kwargs.setdefault("enable_direct_mode", True)
        super().__init__(**kwargs)
        self.session = session
        self.realtime = False
        """Whether the LLM service is a speech-to-speech one (it counts the generations)."""

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        """Record what ``frame`` says about the conversation, then push it on unchanged."""
        await super().process_frame(frame, direction)
        if isinstance(frame, StartFrame):
            # Before the frame goes on: the gate downstream looks for it when it starts.
            self.session.turns_tracked = True
        elif isinstance(frame, LLMServiceMetadataFrame):
            # Broadcast by the service when it starts: its upstream copy comes this way.
            self.realtime = frame.is_realtime_service
        elif isinstance(frame, _WATCHED) and direction is FrameDirection.DOWNSTREAM:
            if isinstance(frame, UserStartedSpeakingFrame):
                self.session.user_speaking = True
                self.session.start_user_turn()
            elif isinstance(frame, UserStoppedSpeakingFrame):
                self.session.user_speaking = False
            elif isinstance(frame, InterruptionFrame):
                self.session.interrupt()
            elif not self.realtime:
                self.session.start_generation()
        await self.push_frame(frame, direction)
