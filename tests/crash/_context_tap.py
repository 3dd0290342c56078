"""`ContextTap`: a Pipecat observer that says what the `ActionResultGate` let into the context.

Kept apart from ``_child.py`` so that only the pipeline case pays for importing Pipecat.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from pipecat.frames.frames import FunctionCallResultFrame, LLMMessagesAppendFrame
from pipecat.observers.base_observer import BaseObserver, FramePushed
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor


class ContextTap(BaseObserver):
    """Says ``told`` for every tool result the gate pushes on to the assistant aggregator.

    Observers run apart from the frames' own path, so a line may come a little after the
    frame; a crash in between only means one acknowledgement fewer, never a false one.

    Args:
        gate: The gate whose output is watched.
        say: Prints one JSON line.
    """

    def __init__(self, gate: FrameProcessor, say: Callable[..., None]) -> None:
        super().__init__()
        self._gate = gate
        self._say = say

    async def on_push_frame(self, data: FramePushed) -> None:
        """Say what a result frame or a late-outcome message from the gate carries."""
        if data.source is not self._gate or data.direction is not FrameDirection.DOWNSTREAM:
            return
        frame = data.frame
        if isinstance(frame, FunctionCallResultFrame) and isinstance(frame.result, dict):
            self._tell(frame.result, via="result")
        elif isinstance(frame, LLMMessagesAppendFrame):
            for message in frame.messages:
                content = message.get("content") if isinstance(message, dict) else None
                if not isinstance(content, str):
                    continue
                _, _, payload = content.partition(": ")
                try:
                    told = json.loads(payload)
                except ValueError:
                    continue
                if isinstance(told, dict):
                    self._tell(told, via="late")

    def _tell(self, result: dict[str, Any], *, via: str) -> None:
        if result.get("operation_id"):
            self._say(
                event="told",
                operation_id=result["operation_id"],
                status=result.get("status"),
                via=via,
            )
