"""The public API: `__all__` lists every public name, sorted within each concept group."""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from pathlib import Path

import pipecat_actions
import pipecat_actions.ledger
import pipecat_actions.policy


def _groups_of_all(module: object) -> list[list[str]]:
    """Return the names of ``__all__`` in the groups its comments separate."""
    source = Path(inspect.getfile(module)).read_text()  # type: ignore[arg-type]
    lines = source[source.index("__all__ = [") :].splitlines()[1:]
    groups: list[list[str]] = [[]]
    for line in lines:
        stripped = line.strip()
        if stripped == "]":
            break
        if stripped.startswith("#"):
            groups.append([])
        elif stripped:
            groups[-1].append(ast.literal_eval(stripped.rstrip(",")))
    return [g for g in groups if g]


def test_every_public_name_of_the_package_is_exported() -> None:
    public = {name for name in vars(pipecat_actions) if not name.startswith("_")}
    modules = {name for name, value in vars(pipecat_actions).items() if inspect.ismodule(value)}
    lazy = set(pipecat_actions._LAZY)
    assert (public - modules) | lazy == set(pipecat_actions.__all__)


def test_importing_the_package_does_not_import_pipecat() -> None:
    code = "import sys, pipecat_actions, pipecat_actions.cli; print('pipecat' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    assert out.stderr == ""


def test_exported_names_resolve() -> None:
    for module in (pipecat_actions, pipecat_actions.ledger, pipecat_actions.policy):
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name}"


def test_all_is_sorted_within_each_group() -> None:
    for module in (pipecat_actions, pipecat_actions.ledger, pipecat_actions.policy):
        for group in _groups_of_all(module):
            assert group == sorted(group, key=lambda n: (not n.isupper(), n)), module.__name__
