"""Every private part of Pipecat the adapters touch is named in one module, and still there.

`pipecat_actions.adapters._pipecat_private` lists them per class; these tests check each name
against the installed Pipecat (pinned at 1.14.0 in pyproject.toml): a method or class
attribute of the class or one of its bases, or an instance attribute its ``__init__`` (or a
base's) assigns. A Pipecat release that renames or drops one fails here, by name.
"""

from __future__ import annotations

import importlib
import inspect
import re
from importlib.metadata import version
from pathlib import Path
from typing import Any

import pytest

from pipecat_actions.adapters._pipecat_private import PRIVATE_PARTS, llm_service

PACKAGE = Path(__file__).resolve().parents[2] / "pipecat_actions"


def _class(path: str) -> type[Any]:
    module, _, name = path.partition(":")
    cls = getattr(importlib.import_module(module), name)
    assert isinstance(cls, type)
    return cls


def _assigned_in_source(cls: type[Any], name: str) -> bool:
    pattern = re.compile(rf"self\.{re.escape(name)}\b\s*(:[^=\n]+)?=[^=]")
    for base in cls.__mro__:
        if base.__module__.split(".")[0] != "pipecat":
            continue
        if pattern.search(inspect.getsource(base)):
            return True
    return False


TOUCHES = re.compile(r"\b(llm|self\.llm|flow_manager|manager|params\.llm)\._(?!pipecat_actions)\w+")
"""A private attribute read or set on a service or a Flows manager (ours excepted)."""

PARTS = sorted((path, name) for path, names in PRIVATE_PARTS.items() for name in names)


def test_the_private_parts_are_checked_against_the_pinned_pipecat() -> None:
    assert version("pipecat-ai") == "1.14.0", (
        "Pipecat is not the pinned 1.14.0: check every name in "
        "pipecat_actions/adapters/_pipecat_private.py against the new release"
    )


@pytest.mark.parametrize(("path", "name"), PARTS)
def test_each_private_part_the_adapters_touch_exists_in_the_installed_pipecat(
    path: str, name: str
) -> None:
    cls = _class(path)
    assert hasattr(cls, name) or _assigned_in_source(cls, name), (
        f"{path} has no {name} any more: the adapters that touch it "
        "(pipecat_actions/adapters/_pipecat_private.py) need a new way in"
    )


def test_a_private_part_not_named_in_the_module_is_refused() -> None:
    class Service:
        _functions: dict[str, Any] = {}
        _elsewhere = 1

    view = llm_service(Service())
    assert view._functions == {}
    with pytest.raises(AttributeError, match="_elsewhere is a private part of Pipecat"):
        _ = view._elsewhere


def test_no_adapter_touches_a_private_part_of_pipecat_outside_the_one_module() -> None:
    """Outside ``_pipecat_private``, a service or manager is read only through its views."""
    offenders = []
    for path in sorted((PACKAGE / "adapters").rglob("*.py")):
        if path.name == "_pipecat_private.py":
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if TOUCHES.search(code) and not _through_a_view(path, code):
                offenders.append(f"{path.relative_to(PACKAGE)}:{number}: {line.strip()}")
    assert offenders == []


def _through_a_view(path: Path, code: str) -> bool:
    # The realtime adapters read their service through a view bound to ``llm`` at the top of
    # each method (``llm: Any = openai_realtime(self.llm)``).
    source = path.read_text()
    bound = "llm: Any = openai_realtime(self.llm)" in source
    bound = bound or "llm: Any = gemini_live(self.llm)" in source
    return bound and "self.llm._" not in code and bool(re.search(r"(?<![\w.])llm\._", code))


def test_the_rule_above_catches_a_touch_outside_the_views(tmp_path: Path) -> None:
    line = "        self.llm._create_response = creating_response"
    touches = re.compile(
        r"\b(llm|self\.llm|flow_manager|manager|params\.llm)\._(?!pipecat_actions)\w+"
    )
    assert touches.search(line)
    source = tmp_path / "openai.py"
    source.write_text("llm: Any = openai_realtime(self.llm)\n" + line + "\n")
    assert not _through_a_view(source, line)
