"""The adapters' old import paths forward to pipecat_actions.adapters for one release, warning."""

from __future__ import annotations

import importlib
import re
import sys

import pytest

MOVED = {
    "pipecat_actions.binding": "pipecat_actions.adapters",
    "pipecat_actions.processors": "pipecat_actions.adapters",
    "pipecat_actions.processors.result_gate": "pipecat_actions.adapters.result_gate",
    "pipecat_actions.processors.status_reporter": "pipecat_actions.adapters.status_reporter",
    "pipecat_actions.processors.turn_tracker": "pipecat_actions.adapters.turn_tracker",
    "pipecat_actions.realtime": "pipecat_actions.adapters.realtime",
    "pipecat_actions.realtime.openai": "pipecat_actions.adapters.realtime.openai",
    "pipecat_actions.realtime.gemini": "pipecat_actions.adapters.realtime.gemini",
    "pipecat_actions.flows": "pipecat_actions.adapters.flows",
    "pipecat_actions.pipeline": "pipecat_actions.adapters.pipeline",
}


@pytest.mark.parametrize(("old", "new"), sorted(MOVED.items()))
def test_an_old_adapter_path_warns_with_its_new_home_and_gives_the_same_objects(
    old: str, new: str
) -> None:
    for name in [m for m in sys.modules if m == old or m.startswith(old + ".")]:
        del sys.modules[name]
    with pytest.warns(DeprecationWarning, match=rf"^{re.escape(old)} is deprecated") as seen:
        forwarder = importlib.import_module(old)
    assert any(new in str(w.message) for w in seen)
    assert forwarder.__all__, old
    for name in forwarder.__all__:
        home = getattr(importlib.import_module(new), name, None)
        if home is None:  # binding's names live in the adapters' submodules
            continue
        assert getattr(forwarder, name) is home, f"{old}.{name}"


def test_the_old_binding_path_still_gives_every_name_it_gave() -> None:
    sys.modules.pop("pipecat_actions.binding", None)
    with pytest.warns(DeprecationWarning, match="pipecat_actions.binding is deprecated"):
        binding = importlib.import_module("pipecat_actions.binding")
    from pipecat_actions import adapters
    from pipecat_actions.adapters import handlers

    assert binding.attach is adapters.attach
    assert binding.instrument is adapters.instrument
    assert binding.tools_schema is adapters.tools_schema
    assert binding.owns_tool is handlers.owns_tool
    assert binding.CONFIRM_TOOL == "confirm_action"
