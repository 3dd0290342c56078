"""`ScriptedLLM`: an `LLMService` that answers from a script, through Pipecat's real tool path.

Each inference (each ``LLMContextFrame``) takes the next step of the script: text to say, or
tool calls to make. Tool calls go through ``LLMService.run_function_calls``, so Pipecat's real
aggregators, timeouts, interruption handling and parallel-call grouping all run::

    llm = ScriptedLLM([
        ToolCalls([("book_table", {"restaurant_id": "r1", "date": "2030-05-01"})]),
        Say("Your table is booked."),
    ])
"""

from __future__ import annotations

__all__ = ["Say", "ScriptStep", "ScriptedLLM", "ToolCalls"]

import itertools
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pipecat.frames.frames import (
    Frame,
    FunctionCallFromLLM,
    LLMContextFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    LLMTextFrame,
)
from pipecat.processors.frame_processor import FrameDirection
from pipecat.services.llm_service import LLMService
from pipecat.services.settings import LLMSettings


@dataclass(frozen=True)
class Say:
    """A script step: the model answers with ``text``."""

    text: str


@dataclass(frozen=True)
class ToolCalls:
    """A script step: the model calls tools, each ``(name, arguments)``, in one response.

    Attributes:
        calls: The tool calls.
        say: Text the model says in the same response, before the calls (real models do).
        ids: The calls' ``tool_call_id``s (see below).
    """

    calls: Sequence[tuple[str, Mapping[str, Any]]]
    say: str | None = None
    ids: Sequence[str] | None = None
    """The calls' ``tool_call_id``s, one per call; ``call_1``, ``call_2``... if left out."""

    def __post_init__(self) -> None:
        if self.ids is not None and len(self.ids) != len(self.calls):
            raise ValueError(f"{len(self.ids)} ids for {len(self.calls)} calls")


ScriptStep = Say | ToolCalls | Callable[[list[Any]], Say | ToolCalls]
"""A script step, or a function of the context messages that returns one."""


class ScriptedLLM(LLMService):
    """An LLM service whose answers come from a script (see the module docstring).

    Args:
        script: The steps, consumed one per inference; when it runs out the model says
            ``fallback``. A `collections.deque` is used as it is, not copied, so several
            models (one per pipeline, say across a reconnect) can share one script.
        fallback: What the model says once the script is exhausted.
        **kwargs: Passed to `LLMService` (``function_call_timeout_secs``, ...).
    """

    def __init__(
        self, script: Iterable[ScriptStep], *, fallback: str = "(done)", **kwargs: Any
    ) -> None:
        settings = LLMSettings(
            model="scripted",
            system_instruction=None,
            temperature=None,
            max_tokens=None,
            top_p=None,
            top_k=None,
            frequency_penalty=None,
            presence_penalty=None,
            seed=None,
            filter_incomplete_user_turns=None,
            user_turn_completion_config=None,
        )
        super().__init__(settings=settings, **kwargs)
        self._script = script if isinstance(script, deque) else deque(script)
        self._fallback = fallback
        self._ids = itertools.count(1)
        self.inferences = 0
        """How many times the model was asked to answer."""
        self.emitted: list[str] = []
        """The ``tool_call_id`` of every call the model made, in order."""

    def push_step(self, step: ScriptStep) -> None:
        """Append a step to the script."""
        self._script.append(step)

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        """Answer context frames from the script; pass every other frame on."""
        await super().process_frame(frame, direction)
        if not isinstance(frame, LLMContextFrame):
            # LLMService.process_frame does not forward frames; subclasses must.
            await self.push_frame(frame, direction)
            return
        self.inferences += 1
        # Logged as a real service logs each inference (the whole context, at DEBUG), so what
        # reaches the logs in tests is what reaches them in production.
        self._log_llm_response(frame.context)
        step = self._script.popleft() if self._script else Say(self._fallback)
        if callable(step):
            # A step decided at inference time from the conversation so far, as a model does
            # (an operation id or a confirmation token from an earlier tool result).
            step = step(list(frame.context.get_messages()))
        await self.push_frame(LLMFullResponseStartFrame())
        if isinstance(step, ToolCalls):
            if step.say:
                await self.push_frame(LLMTextFrame(step.say))
            calls = [
                FunctionCallFromLLM(
                    function_name=name,
                    tool_call_id=step.ids[index] if step.ids else f"call_{next(self._ids)}",
                    arguments=arguments,
                    context=frame.context,
                )
                for index, (name, arguments) in enumerate(step.calls)
            ]
            self.emitted.extend(call.tool_call_id for call in calls)
            await self.run_function_calls(calls)
        else:
            await self.push_frame(LLMTextFrame(step.text))
        await self.push_frame(LLMFullResponseEndFrame())
