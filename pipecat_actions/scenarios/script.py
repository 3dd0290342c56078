"""The model's side of a scenario: its ``llm`` steps as a `ScriptedLLM` script.

Labelled calls get the tool call id ``call_<label>``, so the runtime's operation of each call
can be found again; calls with ``from_context`` are decided at inference time from the latest
tool result that holds the named fields (an operation id, a confirmation token), calls with
``from_call`` from the answer to one earlier labelled call.
"""

from __future__ import annotations

__all__ = ["model_script"]

import json
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from pipecat_actions.scenarios.loader import LoadedScenario
from pipecat_actions.scenarios.model import LlmStep
from pipecat_actions.testing import Say, ToolCalls


def model_script(loaded: LoadedScenario, unresolved: list[str] | None = None) -> deque[Any]:
    """The llm steps as `ScriptedLLM` steps, with ids that name labelled calls.

    Args:
        loaded: The scenario.
        unresolved: Told each ``from_context`` or ``from_call`` argument that found no value
            when its call was decided (it is sent as null, as a model would send a guess):
            the story did not go as the file says.
    """
    script: deque[Any] = deque()
    count = 0
    found_nothing = unresolved if unresolved is not None else []
    for index, step in enumerate(loaded.steps):
        if not isinstance(step, LlmStep):
            continue
        if not step.calls:
            script.append(Say(step.say or ""))
            continue
        ids = []
        for call in step.calls:
            count += 1
            ids.append(f"call_{call.as_}" if call.as_ else f"call_{count}")
        if any(call.from_context or call.from_call for call in step.calls):
            script.append(_reading_context(step, ids, f"steps[{index}].llm", found_nothing))
        else:
            calls = [(call.tool, dict(call.args)) for call in step.calls]
            script.append(ToolCalls(calls, say=step.say, ids=ids))
    return script


def _reading_context(
    step: LlmStep, ids: list[str], where: str, unresolved: list[str]
) -> Callable[[list[Any]], ToolCalls]:
    def decide(messages: list[Any]) -> ToolCalls:
        calls = []
        for index, call in enumerate(step.calls):
            args = dict(call.args)
            for argument, wanted in call.from_context.items():
                args[argument] = _latest_field(messages, wanted)
                if args[argument] is None:
                    unresolved.append(
                        f"{where}.calls[{index}].from_context.{argument}: no tool result so "
                        f"far has {wanted!r}"
                    )
            for argument, path in call.from_call.items():
                args[argument] = _call_field(messages, path)
                if args[argument] is None:
                    unresolved.append(
                        f"{where}.calls[{index}].from_call.{argument}: the answer to "
                        f"{path.partition('.')[0]!r} has nothing at {path!r}"
                    )
            calls.append((call.tool, args))
        return ToolCalls(calls, say=step.say, ids=ids)

    return decide


def _call_field(messages: list[Any], path: str) -> Any:
    """The value at ``label.a.b`` (``.0`` indexes a list) in the latest answer to ``label``."""
    label, *keys = path.split(".")
    for message in reversed(messages):
        if not isinstance(message, Mapping) or message.get("tool_call_id") != f"call_{label}":
            continue
        try:
            value: Any = json.loads(str(message.get("content", "")))
        except ValueError:
            return None
        for key in keys:
            if isinstance(value, list) and key.isdigit() and int(key) < len(value):
                value = value[int(key)]
            elif isinstance(value, Mapping) and key in value:
                value = value[key]
            else:
                return None
        return value
    return None


def _latest_field(messages: list[Any], name: str) -> Any:
    """The value of ``name`` in the latest tool result (or developer note) that has it."""
    for message in reversed(messages):
        content = message.get("content") if isinstance(message, Mapping) else None
        if not isinstance(content, str) or name not in content:
            continue
        start = content.find("{")
        try:
            data = json.loads(content[start:]) if start >= 0 else None
        except ValueError:
            continue
        if isinstance(data, Mapping) and name in data:
            return data[name]
    return None
